//! Tenure protection against real masters: a master whose dataset is younger than the longest
//! ttl does not vote. A restart or a promotion starts its clock again — also the promotion
//! of a former master that was demoted, re-synced and cut off (it never restarted, so the
//! process alone does not tell), and the tenure markers of two versions of this crate on one
//! master (a rolling deploy) never start each other's clock again.
//!
//! Test names start with `tenure_`: `cargo test --all-features tenure`.

use tower_redlock_testkit as support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use support::proxy::{Fault, FaultProxy};
use support::{eventually, RedisServer, NODE_TIMEOUT};
use tower_redlock::node::{RedisNode, RedisNodeOptions};
use tower_redlock::{Lease, Redlock, Retry, VoteKind};

/// The bound of every wait (a replica syncing, a tenure growing old).
const WITHIN: Duration = Duration::from_secs(20);

/// A client whose only voter is `server`, behind tenure protection for ttls up to `max_ttl`.
fn guarded(server: &RedisServer, max_ttl: Duration) -> Redlock {
    let options = RedisNodeOptions::new().restart_protection(max_ttl);
    Redlock::builder()
        .node(RedisNode::open_with(&server.url(), &options).expect("a voter"))
        .node_timeout(NODE_TIMEOUT)
        .retry(Retry::never())
        .build()
        .expect("a client")
}

/// Tries until the lock is granted (bounded): a voter abstains while its tenure is young.
async fn lock_eventually(redlock: &Redlock, key: &str, ttl: Duration) -> Lease {
    let start = Instant::now();
    loop {
        match redlock.try_lock(key, ttl).await {
            Ok(lease) => return lease,
            Err(e) if start.elapsed() > WITHIN => panic!("no lock on {key} within {WITHIN:?}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

/// `REPLICAOF host port` (or `REPLICAOF NO ONE`: a promotion).
async fn replicaof(server: &RedisServer, master: Option<SocketAddr>) {
    let mut cmd = redis::cmd("REPLICAOF");
    match master {
        Some(addr) => cmd.arg(addr.ip().to_string()).arg(addr.port()),
        None => cmd.arg("NO").arg("ONE"),
    };
    let _: String = server.query(&cmd).await;
}

/// A field of `INFO replication`.
async fn replication(server: &RedisServer, field: &str) -> String {
    let info: String = server.query(redis::cmd("INFO").arg("replication")).await;
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .map(|v| v.trim().to_owned())
        .unwrap_or_default()
}

/// Waits until `replica` replicates from `port` with its link up and its sync done.
async fn in_sync(replica: &RedisServer, port: u16) {
    eventually(
        format!("{} replicates from port {port}", replica.addr()),
        WITHIN,
        || async {
            replication(replica, "master_port").await == port.to_string()
                && replication(replica, "master_link_status").await == "up"
                && replication(replica, "master_sync_in_progress").await == "0"
        },
    )
    .await;
}

/// The interleaving of a master demoted without a restart: X is master (its tenure old), Y
/// is promoted, X re-syncs from Y — taking Y's dataset, and with it X's own old tenure
/// marker, which Y has not rewritten yet — then replication between them breaks. Y waits
/// out its tenure and grants a lock; Y dies; X is promoted again. X never restarted, so its
/// `run_id` matches the marker; it must still abstain until every lock Y may have granted
/// has expired (its replication history changed with the promotion).
#[tokio::test(flavor = "multi_thread")]
async fn tenure_repromoted_master_abstains_for_the_protection_window() {
    let max_ttl = Duration::from_secs(2);
    let (x, y) = (RedisServer::start(), RedisServer::start());
    let (on_x, on_y) = (guarded(&x, max_ttl), guarded(&y, max_ttl));
    let addr = |s: &RedisServer| -> SocketAddr { s.addr().parse().expect("an address") };

    // Y replicates X; X's tenure grows old and X votes.
    replicaof(&y, Some(addr(&x))).await;
    in_sync(&y, x.port()).await;
    lock_eventually(&on_x, "warm-up", max_ttl)
        .await
        .release()
        .await
        .unwrap();

    // Y is promoted; X, demoted, replicates Y through a proxy (so the link can be cut).
    let y_proxy = FaultProxy::start(addr(&y)).await;
    replicaof(&y, None).await;
    replicaof(&x, Some(y_proxy.addr())).await;
    in_sync(&x, y_proxy.addr().port()).await;
    // Replication breaks: nothing Y writes from now on reaches X.
    y_proxy.set(Fault::Reset);
    eventually("X's replication link is down", WITHIN, || async {
        replication(&x, "master_link_status").await == "down"
    })
    .await;

    // Y votes once its own tenure is old, and grants a lock.
    let on_y_lease = lock_eventually(&on_y, "job", max_ttl).await;
    // Y dies; X is promoted again, lacking Y's lock.
    y.stop();
    replicaof(&x, None).await;
    // X's first answer (a try that timed out on a loaded machine got none: asked again).
    let start = Instant::now();
    let first = loop {
        match on_x.try_lock("job", max_ttl).await {
            Err(e) if e.is_timeout() && start.elapsed() < WITHIN => continue,
            Err(e) if e.is_timeout() => {
                panic!("could not set up the scenario: X never answered within {WITHIN:?}: {e}")
            }
            answer => break answer,
        }
    };
    let abstained = match &first {
        Ok(_) if Instant::now() >= on_y_lease.deadline() => panic!(
            "could not set up the scenario: X's first answer came after the lock on Y expired"
        ),
        Ok(lease) => panic!(
            "the re-promoted master granted {:?} at once, {:?} before the lock on Y expires",
            lease.value(),
            on_y_lease
                .deadline()
                .saturating_duration_since(Instant::now())
        ),
        Err(e) => e,
    };
    assert!(
        abstained.votes().any(|v| v.kind() == VoteKind::Protected),
        "{abstained}"
    );
    let second = lock_eventually(&on_x, "job", max_ttl).await;
    assert!(
        Instant::now() >= on_y_lease.deadline(),
        "a second holder before the lock on Y expired"
    );
    second.release().await.unwrap();
}

/// The guarded acquire of the versions of this crate before the second tenure marker, as
/// they ship it (`KEYS`: lock, marker; `ARGV`: token, ttl, the longest ttl; -4 while young,
/// -3 when set, else the holder's `PTTL`): a rolling deploy runs it beside this version's.
const GUARDED_ACQUIRE_BEFORE_MARKER_2: &str = r#"local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local me = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
local mark = redis.call('get', KEYS[#KEYS])
local who, since
if mark then
  who, since = string.match(mark, '^(%x+):(%d+)$')
end
local young = true
if who ~= me then
  redis.call('set', KEYS[#KEYS], me .. ':' .. now)
elseif now - tonumber(since) >= tonumber(ARGV[3]) then
  young = false
end
if young then
  return -4
end
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return -3
end
return redis.call('pttl', KEYS[1])
"#;

/// What the earlier version's guarded acquire answers for `key` on `server`.
async fn earlier_version_acquires(server: &RedisServer, key: &str, max_ttl: Duration) -> i64 {
    let marker = format!("tower-redlock:restart-guard:{}", max_ttl.as_millis());
    let token = format!("{:032x}", fastrand::u128(..));
    server
        .query(
            redis::cmd("EVAL")
                .arg(GUARDED_ACQUIRE_BEFORE_MARKER_2)
                .arg(2)
                .arg(key)
                .arg(&marker)
                .arg(&token)
                .arg(10_000)
                .arg(max_ttl.as_millis() as u64),
        )
        .await
}

/// The tenure markers are a format two versions meet on one master during a rolling
/// deploy: neither starts the other's clock again. Upgrade: the earlier version's tenure has
/// grown old, and this version votes at once (it takes the first marker's time for its
/// second marker), and the earlier one still does after it. The other way round: this
/// version's tenure has grown old, and the earlier version votes at once.
#[tokio::test(flavor = "multi_thread")]
async fn tenure_markers_of_two_versions_keep_each_others_clock() {
    let max_ttl = Duration::from_millis(1500);
    const SET: i64 = -3;
    const YOUNG: i64 = -4;

    // The earlier version first, then this one.
    let upgraded = RedisServer::start();
    assert_eq!(
        earlier_version_acquires(&upgraded, "up-0", max_ttl).await,
        YOUNG
    );
    let mut n = 0;
    eventually("the earlier version's tenure is old", WITHIN, || {
        n += 1;
        let key = format!("up-{n}");
        let server = &upgraded;
        async move { earlier_version_acquires(server, &key, max_ttl).await == SET }
    })
    .await;
    let this = guarded(&upgraded, max_ttl);
    // The first request also connects, and a loaded machine may time it out: tries that got
    // no answer are asked again, but no answer may be an abstention (its clock started
    // again) — a fact of the answers, not of how long they took.
    let start = Instant::now();
    let lease = loop {
        match this.try_lock("up-this", max_ttl).await {
            Ok(lease) => break lease,
            Err(e) if e.is_timeout() && start.elapsed() <= WITHIN => {}
            Err(e) if e.is_timeout() => {
                panic!("could not set up the scenario: no answer within {WITHIN:?}: {e}")
            }
            Err(e) => panic!("this version did not vote: {e}"),
        }
    };
    lease.release().await.unwrap();
    assert_eq!(
        earlier_version_acquires(&upgraded, "up-after", max_ttl).await,
        SET,
        "the earlier version votes after this one wrote its markers"
    );

    // This version first, then the earlier one.
    let mixed = RedisServer::start();
    let this = guarded(&mixed, max_ttl);
    let started = Instant::now();
    lock_eventually(&this, "mix-this", max_ttl)
        .await
        .release()
        .await
        .unwrap();
    assert!(
        started.elapsed() >= max_ttl,
        "a fresh tenure abstains first"
    );
    assert_eq!(
        earlier_version_acquires(&mixed, "mix-earlier", max_ttl).await,
        SET,
        "the earlier version votes at once beside this one's old tenure"
    );
    this.try_lock("mix-again", max_ttl)
        .await
        .expect("this version still votes")
        .release()
        .await
        .unwrap();
}
