//! Redis Clusters as Redlock voters (feature `cluster`), against real processes: three
//! cluster-enabled masters per cluster (`support::cluster::Cluster`), plain masters beside
//! them where a test needs more voters.
//!
//! Test names start with `cluster_`: `cargo test --all-features cluster` runs them. The
//! conformance suite (tests/voters/conformance/) runs the node checks and the quorum flow with
//! Cluster voters too; these tests check what is particular to a Cluster: each key on its
//! slot's master, a master down (the voter fails, the others keep the quorum) and back, and
//! the keys a script uses beside the lock key (the completion record, the tenure marker)
//! kept in the lock key's slot.

use tower_redlock_testkit as support;

use std::cell::Cell;
use std::time::{Duration, Instant};

use support::cluster::Cluster;
use support::{eventually, Masters, RedisServer, NODE_TIMEOUT};
use tower_redlock::node::{
    self, split_urls, Acquire, AcquireRequest, Node, RedisNode, RedisNodeOptions, ReleaseRequest,
};
use tower_redlock::{Lease, LockOrRecord, Redlock, Retry};

const TTL: Duration = Duration::from_secs(10);
const DAY: Duration = Duration::from_secs(86_400);
/// The bound of every wait (a restarted node rejoining, a voter reconnecting).
const WITHIN: Duration = Duration::from_secs(20);
const T1: &str = "00000000000000000000000000000001";

fn cluster_of(c: &Cluster) -> node::Cluster {
    node::Cluster::new(c.addrs()).expect("valid addresses")
}

/// A Cluster voter that has answered once: connected, its slot map known, so that a client's
/// 200 ms node timeout measures the requests, not the connection's set-up.
async fn voter(c: &Cluster, options: &RedisNodeOptions) -> RedisNode {
    let voter = RedisNode::cluster(cluster_of(c), options).expect("a cluster voter");
    answered(&voter).await;
    voter
}

/// Waits (bounded) until `node` answers a request: a release of a key nobody holds.
async fn answered(node: &RedisNode) {
    eventually(format!("{} answers", node.name()), WITHIN, || async {
        let release = node.release(ReleaseRequest::new("warm-up", T1));
        let answer = tokio::time::timeout(Duration::from_secs(1), release).await;
        matches!(answer, Ok(Ok(false)))
    })
    .await;
}

/// A client over `nodes` with the tests' node timeout and no retries.
fn client(nodes: impl IntoIterator<Item = RedisNode>) -> Redlock {
    nodes
        .into_iter()
        .fold(Redlock::builder(), |b, n| b.node(n))
        .node_timeout(NODE_TIMEOUT)
        .retry(Retry::never())
        .build()
        .expect("a client")
}

/// One key served by each node of the cluster, in node order (`{prefix}{i}`, the first `i`
/// that lands there).
async fn key_per_node(c: &Cluster, prefix: &str) -> Vec<String> {
    let mut keys: Vec<Option<String>> = vec![None; c.len()];
    for i in 0..500 {
        let key = format!("{prefix}{i}");
        let owner = c.node_for_key(&key).await;
        keys[owner].get_or_insert(key);
        if keys.iter().all(Option::is_some) {
            break;
        }
    }
    keys.into_iter()
        .enumerate()
        .map(|(i, k)| k.unwrap_or_else(|| panic!("no key of 500 lands on node {i}")))
        .collect()
}

/// Tries until the lock is granted (bounded): for a client whose first request also
/// connects, or a voter that abstains for a while.
async fn lock_eventually(client: &Redlock, key: &str, ttl: Duration) -> Lease {
    let start = Instant::now();
    loop {
        match client.try_lock(key, ttl).await {
            Ok(lease) => return lease,
            Err(e) if start.elapsed() > WITHIN => panic!("no lock on {key} in {WITHIN:?}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// The keys on node `i` of `c` matching the glob `pattern` (`KEYS` is answered by each
/// node for its own slots, without redirection).
async fn keys_on(c: &Cluster, i: usize, pattern: &str) -> Vec<String> {
    c[i].query(redis::cmd("KEYS").arg(pattern)).await
}

/// The server process' `run_id` (`INFO server`).
async fn run_id(server: &RedisServer) -> String {
    let info: String = server.query(redis::cmd("INFO").arg("server")).await;
    let line = info.lines().find_map(|l| l.strip_prefix("run_id:"));
    line.expect("INFO has run_id").trim().to_owned()
}

/// A key of the same hash slot as `key`: `{key}suffix` (for keys without braces).
fn same_slot(key: &str, suffix: &str) -> String {
    assert!(!key.contains('{'), "{key}");
    format!("{{{key}}}{suffix}")
}

#[tokio::test]
async fn cluster_lock_extend_release_on_each_slot_owner() {
    let c = Cluster::start(3);
    let options = RedisNodeOptions::new();
    let a = client([voter(&c, &options).await]);
    let b = client([voter(&c, &options).await]);
    assert_eq!(
        (a.node_count(), a.quorum()),
        (1, 1),
        "a whole cluster is one voter"
    );
    let name = format!("cluster:{}", c.addrs()[0]);
    assert_eq!(a.node_status()[0].name(), name);

    for (owner, key) in key_per_node(&c, "account:").await.iter().enumerate() {
        let lease = a.try_lock(key, TTL).await.unwrap();
        assert_eq!(c.node_for_key(lease.key()).await, owner);
        let server = &c[owner];
        assert_eq!(server.get(key).await.as_deref(), Some(lease.value()));
        let pttl = server.pttl(key).await;
        assert!(pttl > 5_000 && pttl <= 10_000, "node {owner}: pttl {pttl}");
        // Only the slot's master stores anything.
        for other in (0..3).filter(|&i| i != owner) {
            assert_eq!(
                c[other].dbsize().await,
                0,
                "node {other} while {key} is held"
            );
        }

        // A second client is contended, told the holder's ttl (`PTTL`, routed to the slot).
        let err = b.try_lock(key, TTL).await.unwrap_err();
        assert!(err.is_contended(), "{err:?}");
        assert_eq!(err.held_by(), 1);
        let wait = err.retry_after().expect("the holder's remaining ttl");
        assert!(wait > TTL / 2 && wait <= TTL, "{wait:?}");

        lease.extend(Duration::from_secs(60)).await.unwrap();
        let pttl = server.pttl(key).await;
        assert!(
            pttl > 30_000,
            "the extend reached node {owner}: pttl {pttl}"
        );
        assert_eq!(server.get(key).await.as_deref(), Some(lease.value()));

        lease.release().await.unwrap();
        assert_eq!(server.get(key).await, None, "released on node {owner}");
        let again = b.try_lock(key, TTL).await.unwrap();
        assert_eq!(server.get(key).await.as_deref(), Some(again.value()));
        again.release().await.unwrap();
        assert_eq!(server.get(key).await, None);
    }
}

#[tokio::test]
async fn cluster_by_url_alone_and_in_a_mixed_list() {
    let c = Cluster::start(3);
    let m = Masters::start(2);
    let url = format!("redis+cluster://{}", c.addrs().join(","));

    // Alone, with `Redlock::new`'s defaults: its first requests connect, hence tried until
    // granted.
    let alone = Redlock::new([url.as_str()]).unwrap();
    assert_eq!(alone.node_count(), 1);
    assert_eq!(
        alone.node_status()[0].name(),
        format!("cluster:{}", c.addrs()[0])
    );
    let keys = key_per_node(&c, "by-url:").await;
    for (owner, key) in keys.iter().enumerate() {
        let lease = lock_eventually(&alone, key, TTL).await;
        assert_eq!(c[owner].get(key).await.as_deref(), Some(lease.value()));
        lease.release().await.unwrap();
        assert_eq!(c[owner].get(key).await, None);
    }

    // In a list with two plain masters: three voters.
    let list = format!("{url}, {},{}", m[0].url(), m[1].url());
    let urls = split_urls(&list);
    assert_eq!(urls, [url.clone(), m[0].url(), m[1].url()]);
    assert_eq!(Redlock::new(&urls).unwrap().node_count(), 3);
    let build = || {
        urls.iter()
            .fold(Redlock::builder(), |b, u| b.redis(u))
            .node_timeout(NODE_TIMEOUT)
            .retry(Retry::never())
            .build()
            .unwrap()
    };
    let (mixed, other) = (build(), build());
    assert_eq!((mixed.node_count(), mixed.quorum()), (3, 2));
    let names: Vec<String> = mixed
        .node_status()
        .iter()
        .map(|s| s.name().to_owned())
        .collect();
    assert_eq!(
        names,
        [
            format!("cluster:{}", c.addrs()[0]),
            m[0].addr(),
            m[1].addr()
        ]
    );
    let (owner, key) = (2, &keys[2]);
    let lease = lock_eventually(&mixed, key, TTL).await;
    let value = lease.value().to_owned();
    eventually("every voter holds the lock", WITHIN, || async {
        c[owner].get(key).await.as_deref() == Some(value.as_str())
            && m.everywhere(key, &value).await
    })
    .await;
    let err = other.try_lock(key, TTL).await.unwrap_err();
    assert!(err.is_contended() && err.held_by() >= 2, "{err:?}");
    lease.release().await.unwrap();
    eventually("every voter released it", WITHIN, || async {
        c[owner].get(key).await.is_none() && m.absent_everywhere(key).await
    })
    .await;
    other
        .try_lock(key, TTL)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    // Without the `cluster` feature such a URL is an invalid-input error; with it, a path is.
    let err = Redlock::new([format!("redis+cluster://{}/0", c.addrs()[0])]).unwrap_err();
    assert!(err.is_invalid_input(), "{err:?}");
}

#[tokio::test]
async fn cluster_master_down_leaves_a_quorum_and_the_voter_returns() {
    let c = Cluster::start(3);
    let m = Masters::start(2);
    let cluster = voter(&c, &RedisNodeOptions::new()).await;
    let masters: Vec<RedisNode> = m
        .iter()
        .map(|s| RedisNode::open(&s.url()).unwrap())
        .collect();
    for master in &masters {
        answered(master).await;
    }
    let client = client([cluster, masters[0].clone(), masters[1].clone()]);
    assert_eq!(client.quorum(), 2);
    let keys = key_per_node(&c, "down:").await;
    let (down, up) = (1, 0);

    // A probe that needs the cluster's vote: master 0 holds a foreign value, so the lock is
    // granted only by the cluster and master 1. Fresh keys (of `key`'s slot) every time.
    let probes = Cell::new(0);
    let probe = |key: &str| {
        probes.set(probes.get() + 1);
        same_slot(key, &format!(":probe-{}", probes.get()))
    };
    let try_probe = |key: String| {
        let (m, client) = (&m, &client);
        async move {
            assert!(m[0].set_nx(&key, "foreign", Some(60_000)).await);
            (client.try_lock(&key, TTL).await, key)
        }
    };
    /// Whether the error reports the cluster voter (node 0), and only it, failing.
    fn cluster_failed(err: &tower_redlock::Error) -> bool {
        let failed: Vec<usize> = err.node_errors().iter().map(|e| e.node()).collect();
        assert!(failed.iter().all(|&i| i == 0), "a master failed: {err}");
        failed == [0] && err.node_errors()[0].node_name().starts_with("cluster:")
    }

    // All up: the cluster votes.
    let (lease, key) = try_probe(probe(&keys[down])).await;
    let lease = lease.unwrap();
    assert_eq!(c[down].get(&key).await.as_deref(), Some(lease.value()));
    lease.release().await.unwrap();

    c.stop_node(down);
    // The two masters still grant locks, on every slot; the cluster holds none of them.
    for key in [&keys[down], &keys[up]] {
        let lease = client.try_lock(key, TTL).await.unwrap();
        assert!(m.everywhere(key, lease.value()).await, "{key}");
        lease.release().await.unwrap();
        // A release returns once a quorum released: the third voter's may still be on its
        // way (a loaded machine) — it lands.
        eventually("released everywhere", WITHIN, || m.absent_everywhere(key)).await;
    }
    // A lock that needs the cluster's vote fails, and says the cluster voter failed.
    let (got, _) = try_probe(probe(&keys[down])).await;
    let err = got.expect_err("no vote from a slot whose master is down");
    assert!(err.is_contended(), "master 0 said held: {err:?}");
    assert!(cluster_failed(&err), "{err}");
    // Once the other masters see the node fail, the cluster refuses every slot
    // (`cluster-require-full-coverage yes`): the voter fails for the live slots too.
    eventually("the voter fails on a live slot too", WITHIN, || async {
        match try_probe(probe(&keys[up])).await {
            (Err(err), _) => cluster_failed(&err),
            (Ok(lease), _) => {
                lease.release().await.unwrap();
                false
            }
        }
    })
    .await;

    // Back (empty, same slots): the voter votes again, without a new client.
    c.restart_node(down).await;
    eventually("the cluster voter votes again", WITHIN, || async {
        match try_probe(probe(&keys[down])).await {
            (Ok(lease), key) => {
                assert_eq!(c[down].get(&key).await.as_deref(), Some(lease.value()));
                lease.release().await.unwrap();
                true
            }
            (Err(err), _) => {
                assert!(err.is_contended(), "{err:?}");
                false
            }
        }
    })
    .await;
    // A plain lock on the restarted node's slot, and its release (the node lost its script
    // cache: `NOSCRIPT`, then `EVAL`).
    let lease = client.try_lock(&keys[down], TTL).await.unwrap();
    let value = lease.value().to_owned();
    eventually("the restarted node holds the lock", WITHIN, || async {
        c[down].get(&keys[down]).await.as_deref() == Some(value.as_str())
    })
    .await;
    lease.release().await.unwrap();
    eventually("the restarted node released it", WITHIN, || async {
        c[down].get(&keys[down]).await.is_none()
    })
    .await;
    eventually("released on the masters", WITHIN, || {
        m.absent_everywhere(&keys[down])
    })
    .await;
}

#[tokio::test]
async fn cluster_replay_records_stay_in_the_lock_keys_slot() {
    let c = Cluster::start(3);
    let voter = voter(&c, &RedisNodeOptions::new()).await;
    let client = client([voter.clone()]);
    let claim = |key: String| {
        let client = &client;
        async move {
            client
                .lock_unless_completed(&key, TTL, Retry::never())
                .await
        }
    };

    for (owner, res) in key_per_node(&c, "payment-").await.iter().enumerate() {
        let record_key = format!("{res}:record");
        // As named, the record would be in another slot: one script over both keys would be
        // refused (CROSSSLOT).
        assert_ne!(c.slot(res).await, c.slot(&record_key).await, "{res}");

        let lease = match claim(res.clone()).await {
            Ok(LockOrRecord::Locked(lease)) => lease,
            other => panic!("{res}: expected a lease, got {other:?}"),
        };
        assert_eq!(c[owner].get(res).await.as_deref(), Some(lease.value()));
        let busy = claim(res.clone()).await.unwrap_err();
        assert!(busy.is_contended(), "{busy:?}");
        let record = format!("paid {res}");
        lease.complete(record.clone(), DAY).await.unwrap();
        // The record ended the lock, and answers from now on.
        assert_eq!(c[owner].get(res).await, None);
        for _ in 0..2 {
            match claim(res.clone()).await {
                Ok(LockOrRecord::Completed(got)) => assert_eq!(got, record.as_bytes()),
                other => panic!("{res}: expected the record, got {other:?}"),
            }
        }

        // Where it is: `{tag}<resource>:record`, in the resource's slot, on its master only.
        let stored = keys_on(&c, owner, &format!("*{record_key}")).await;
        assert_eq!(stored.len(), 1, "node {owner}: {stored:?}");
        let stored = &stored[0];
        assert!(
            stored.starts_with('{') && stored.ends_with(&format!("}}{record_key}")),
            "{stored}"
        );
        assert_eq!(c.slot(stored).await, c.slot(res).await, "{stored}");
        assert_eq!(c[owner].get(stored).await, Some(format!("TRR1\n{record}")));
        for other in (0..3).filter(|&i| i != owner) {
            let elsewhere = keys_on(&c, other, "*record*").await;
            assert!(elsewhere.is_empty(), "node {other}: {elsewhere:?}");
        }

        // A lock at the record's very key (this node's form of the conformance check
        // `records_never_take_a_lock_for_one`) is never taken for a record, and a completion
        // does not overwrite it.
        assert!(c[owner].del(stored).await);
        assert_eq!(
            voter
                .acquire(AcquireRequest::new(stored, T1, TTL))
                .await
                .unwrap(),
            Acquire::Acquired
        );
        let lease = match claim(res.clone()).await {
            Ok(LockOrRecord::Locked(lease)) => lease,
            other => panic!("{res}: a lock taken for a record: {other:?}"),
        };
        let value = lease.value().to_owned();
        let err = lease.complete("second", DAY).await.unwrap_err();
        assert!(err.is_lost(), "{err:?}");
        assert_eq!(c[owner].get(stored).await.as_deref(), Some(T1));
        // Nothing stored, so the lock stays (until its ttl): duplicates are refused.
        assert_eq!(c[owner].get(res).await.as_deref(), Some(value.as_str()));
        assert!(voter
            .release(ReleaseRequest::new(stored, T1))
            .await
            .unwrap());
    }
}

#[tokio::test]
async fn cluster_restart_protection_abstains_per_slot_until_old_enough() {
    let c = Cluster::start(3);
    // A ttl the machine's load cannot eat between a grant and the reads of the key after it
    // (the protection must cover it, and the test waits the protection out twice).
    let max_ttl = Duration::from_secs(2);
    let options = RedisNodeOptions::new().restart_protection(max_ttl);
    let voter = voter(&c, &options).await;
    assert_eq!(voter.capabilities().max_ttl, Some(max_ttl));
    let client = client([voter.clone()]);
    let ttl = Duration::from_millis(1500);
    let keys = key_per_node(&c, "guarded:").await;
    let (owner, key) = (0, &keys[0]);
    let marker_glob = "*tower-redlock:restart-guard:2000";
    let abstains = |e: &tower_redlock::Error| {
        e.is_unavailable()
            && (e.to_string().contains("abstains")
                || e.to_string().contains("delayed-restart protection"))
    };

    // A ttl above the protection's is refused up front: nothing is sent.
    let err = client
        .try_lock(key, Duration::from_secs(3))
        .await
        .unwrap_err();
    assert!(err.is_invalid_input(), "{err:?}");
    assert_eq!(c[owner].dbsize().await, 0);

    // The slot's first lock abstains, and starts the slot's clock: a marker in the key's
    // slot naming the master's process.
    // (A try that timed out on a loaded machine got no answer: asked again, while the
    // tenure is surely young; a grant after that is a scenario the machine could not set
    // up, not a young tenure that voted.)
    let start = Instant::now();
    let err = loop {
        match client.try_lock(key, ttl).await {
            Err(e) if e.is_timeout() && start.elapsed() < max_ttl => continue,
            Err(e) if e.is_timeout() => {
                panic!(
                    "could not set up the scenario: no answer within the {max_ttl:?} tenure: {e}"
                )
            }
            Err(e) => break e,
            Ok(_) if start.elapsed() >= max_ttl => {
                panic!("could not set up the scenario: no answer within the {max_ttl:?} tenure")
            }
            Ok(lease) => panic!("a young tenure voted: {lease:?}"),
        }
    };
    assert!(abstains(&err), "{err:?}");
    assert_eq!(c[owner].get(key).await, None);
    let markers = keys_on(&c, owner, marker_glob).await;
    assert_eq!(markers.len(), 1, "{markers:?}");
    let marker = &markers[0];
    assert!(marker.starts_with('{'), "{marker}");
    assert_eq!(c.slot(marker).await, c.slot(key).await);
    let first_run = run_id(&c[owner]).await;
    let mark = c[owner].get(marker).await.expect("the marker");
    let (who, since) = mark.split_once(':').expect("<run_id>:<since_ms>");
    assert_eq!(who, first_run);
    since.parse::<u64>().expect("since, in ms");

    // It votes once the tenure is `max_ttl` old.
    let lease = lock_eventually(&client, key, ttl).await;
    assert!(start.elapsed() >= max_ttl - Duration::from_millis(50));
    assert_eq!(c[owner].get(key).await.as_deref(), Some(lease.value()));
    lease.release().await.unwrap();
    // The clock is the slot's: another key of that slot votes at once...
    let same = same_slot(key, ":again");
    client
        .try_lock(&same, ttl)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // ...while another slot's first lock abstains (its own marker, on its own master).
    let err = client.try_lock(&keys[1], ttl).await.unwrap_err();
    assert!(abstains(&err), "{err:?}");
    let markers = keys_on(&c, 1, marker_glob).await;
    assert_eq!(markers.len(), 1, "{markers:?}");
    assert_eq!(c.slot(&markers[0]).await, c.slot(&keys[1]).await);

    // A restarted master (a new process, its dataset empty): its slots abstain again.
    c.stop_node(owner);
    c.restart_node(owner).await;
    let restarted = same_slot(key, ":restarted");
    eventually("the restarted master abstains", WITHIN, || async {
        // Directly (no node timeout, so the answer is never lost): the connection may first
        // fail while it follows the restart; a vote would be a bug.
        let ask = voter.acquire(AcquireRequest::new(&restarted, T1, ttl));
        match tokio::time::timeout(Duration::from_secs(2), ask).await {
            Ok(Ok(got)) => panic!("a restarted master voted at once: {got:?}"),
            Ok(Err(e)) => e.to_string().contains("abstains"),
            Err(_) => false,
        }
    })
    .await;
    let lease = lock_eventually(&client, &restarted, ttl).await;
    assert_eq!(
        c[owner].get(&restarted).await.as_deref(),
        Some(lease.value())
    );
    lease.release().await.unwrap();
    let mark = c[owner].get(marker).await.expect("a new marker");
    let second_run = run_id(&c[owner]).await;
    assert_ne!(second_run, first_run);
    assert!(mark.starts_with(&format!("{second_run}:")), "{mark}");
}

/// redis-rs' cluster connection sends a command again after its connection dropped (its
/// retries also follow `MOVED`/`ASK`, which resharding needs). When the first send ran — the
/// connection reset after the command was forwarded, before its reply came back — the
/// second finds the voter's own token on the key. That is a grant, for the plain, replay and
/// fenced acquires alike: the lock is ours (not "held by another", which would strand it for
/// its ttl and report the try as contended against itself).
#[tokio::test(flavor = "multi_thread")]
async fn cluster_retry_after_a_reset_finds_its_own_token_acquired() {
    let c = tokio::task::spawn_blocking(|| Cluster::start(3))
        .await
        .unwrap();
    let mut proxies = Vec::new();
    for i in 0..c.len() {
        let upstream = c[i].addr().parse().expect("a socket address");
        proxies.push(support::proxy::FaultProxy::start(upstream).await);
    }
    for (i, proxy) in proxies.iter().enumerate() {
        c.announce_port(i, proxy.addr().port()).await;
    }
    let seeds: Vec<String> = proxies.iter().map(|p| p.addr().to_string()).collect();
    let options = RedisNodeOptions::new().no_protection();
    for mode in ["plain", "replay", "fenced"] {
        let voter = RedisNode::cluster(node::Cluster::new(&seeds).unwrap(), &options)
            .expect("a cluster voter");
        answered(&voter).await;
        let client = Redlock::builder()
            .node(voter)
            // Room for the reconnection and the command sent again.
            .node_timeout(Duration::from_secs(2))
            .retry(Retry::never())
            .fencing(mode == "fenced")
            .build()
            .unwrap();
        let key = format!("reset-{mode}");
        let owner = c.node_for_key(&key).await;
        proxies[owner].drop_next_reply();
        let lease = if mode == "replay" {
            match client
                .lock_unless_completed(&key, TTL, Retry::never())
                .await
            {
                Ok(LockOrRecord::Locked(lease)) => Ok(lease),
                Ok(other) => panic!("{mode}: nothing was completed: {other:?}"),
                Err(e) => Err(e),
            }
        } else {
            client.try_lock(&key, TTL).await
        };
        assert!(
            proxies[owner].reply_dropped(),
            "{mode}: the reply to the acquire was dropped"
        );
        let lease = lease.unwrap_or_else(|e| panic!("{mode}: the lock is ours: {e}"));
        assert_eq!(
            c[owner].get(&key).await.as_deref(),
            Some(lease.value()),
            "{mode}"
        );
        if mode == "fenced" {
            assert!(lease.fencing_token().is_some_and(|t| t > 0), "{mode}");
        }
        lease.release().await.unwrap();
        assert_eq!(c[owner].get(&key).await, None, "{mode}: released");
    }
}
