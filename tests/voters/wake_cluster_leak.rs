//! No Cluster subscription outlives the waiters of its key, however they leave — not even
//! one whose `SSUBSCRIBE` timed out and landed later, which redis-rs would make again after
//! every reconnection.

use tower_redlock_testkit as support;

use std::future::Future;
use std::time::{Duration, Instant};

use support::cluster::Cluster;
use support::pubsub::{
    shard_subscriber_clients, shard_subscribers, shard_subscribers_each, unread_bytes, Waiter,
};
use support::{eventually, RedisServer};
use tokio::task::JoinHandle;
use tower_redlock::{Lease, Redlock, Retry};

use crate::wake::woken;

const TTL: Duration = Duration::from_secs(20);
/// The bound of the first lock (the Cluster's slot map) and of the subscribers' first
/// subscriptions.
const WITHIN: Duration = Duration::from_secs(20);

/// Keys per group of `wake_no_leak_cluster_no_subscription_outlives_its_waiters`: four
/// groups, 1,000 keys in all.
const PER_GROUP: usize = 250;
/// The ttl of the holder's locks: they outlast each group's waiters.
const HELD: Duration = Duration::from_secs(120);
/// The polls of the waiters that wait until they are woken or cancelled: long enough that a
/// grant before one was a wake-up.
const SLOW_POLL: Duration = Duration::from_secs(30);
/// The whole wait of the waiters that give up (polling every quarter of it).
const GIVE_UP: Duration = Duration::from_secs(8);
/// The Cluster voter's subscriber's response timeout: `RedisNodeOptions`' default, 1 s (the
/// client's node timeout does not set it: `limits` in `src/node/redis/mod.rs`) — how long
/// it waits for the answer to an `SSUBSCRIBE` sent to a frozen node.
const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(1);
/// `cluster-node-timeout` while a node is frozen: the others do not deem it failing (its
/// slots stay served, so its delayed `SSUBSCRIBE`s subscribe once it is thawed).
const FROZEN_NODE_TIMEOUT: Duration = Duration::from_secs(120);
/// How soon the subscriptions of keys whose waiters left must be gone.
const GONE_WITHIN: Duration = Duration::from_secs(20);
/// How long no node may run an `SSUBSCRIBE` or `SUNSUBSCRIBE` before the subscriber counts
/// as settled: longer than the gaps between its own resubscriptions after a disconnection
/// (1 s, then 2 s) and its first retry of a failed one (1 s).
const QUIET: Duration = Duration::from_secs(4);
/// How long the keys must stay without a subscriber once the subscriber reconnected.
const STAYS_GONE: Duration = Duration::from_secs(3);

/// A waiter's policy: polls every `poll`, for up to three polls.
fn polls(poll: Duration) -> Retry {
    Retry::until(poll * 3).delay(poll).jitter(Duration::ZERO)
}

/// Panics "could not set up the scenario" unless `check` holds within `within`: something
/// the machine did not produce in time, not the promise breaking.
async fn set_up<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        if start.elapsed() > within {
            panic!("could not set up the scenario: {what} within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A task's output; its panic, raised again.
async fn joined<T>(task: JoinHandle<T>) -> T {
    task.await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

/// The holder's locks on `keys`, taken concurrently (the first ones wait for the slot map).
async fn hold(holder: &Redlock, keys: &[String], ttl: Duration) -> Vec<Lease> {
    let tasks: Vec<_> = (keys.iter())
        .map(|key| {
            let (holder, key) = (holder.clone(), key.clone());
            tokio::spawn(async move {
                let start = Instant::now();
                loop {
                    match holder.try_lock(&key, ttl).await {
                        Ok(lease) => return lease,
                        Err(e) if start.elapsed() > WITHIN => panic!(
                            "could not set up the scenario: no lock on {key} within \
                             {WITHIN:?}: {e}"
                        ),
                        Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                    }
                }
            })
        })
        .collect();
    let mut leases = Vec::with_capacity(tasks.len());
    for task in tasks {
        leases.push(joined(task).await);
    }
    leases
}

/// Releases `leases`, concurrently.
async fn release_all(leases: Vec<Lease>) {
    let tasks: Vec<_> = (leases.into_iter())
        .map(|lease| tokio::spawn(async move { lease.release().await.expect("released") }))
        .collect();
    for task in tasks {
        joined(task).await;
    }
}

/// A waiter per key, each in a task of its own that can be aborted.
fn waiters(
    client: &Redlock,
    keys: &[String],
    retry: Retry,
) -> Vec<JoinHandle<tower_redlock::Result<Lease>>> {
    (keys.iter())
        .map(|key| {
            let (client, key) = (client.clone(), key.clone());
            tokio::spawn(async move { client.lock_with(&key, HELD, retry).await })
        })
        .collect()
}

/// Aborts the waiters' `tasks` and waits (bounded) until each has ended: their lock calls
/// are dropped, and with them their keys' registrations.
async fn cancel<T: Send + 'static>(tasks: Vec<JoinHandle<T>>) {
    for task in &tasks {
        task.abort();
    }
    for task in tasks {
        match tokio::time::timeout(Duration::from_secs(10), task).await {
            Ok(Err(e)) if e.is_cancelled() => {}
            Ok(Err(e)) => std::panic::resume_unwind(e.into_panic()),
            Ok(Ok(_)) => {
                panic!("could not set up the scenario: a waiter ended before it was cancelled")
            }
            Err(_) => panic!("an aborted waiter did not end within 10 s"),
        }
    }
}

/// Each key's shard subscribers on each node: `[node][key]`.
async fn shard_counts(cluster: &Cluster, keys: &[String]) -> Vec<Vec<i64>> {
    let mut counts = Vec::with_capacity(cluster.len());
    for node in cluster.iter() {
        counts.push(shard_subscribers_each(node, keys).await);
    }
    counts
}

/// Whether every one of `keys` has a subscriber (on the node that serves it).
async fn all_subscribed(cluster: &Cluster, keys: &[String]) -> bool {
    let counts = shard_counts(cluster, keys).await;
    (0..keys.len()).all(|k| counts.iter().any(|node| node[k] > 0))
}

/// The keys of `groups` that some node still counts a subscriber on, by group (`None`: no
/// key).
async fn leaks(cluster: &Cluster, groups: &[(&str, &[String])]) -> Option<String> {
    let mut found = Vec::new();
    for (group, keys) in groups {
        let counts = shard_counts(cluster, keys).await;
        let left: Vec<String> = (0..keys.len())
            .filter_map(|k| {
                let on: Vec<String> = (counts.iter().enumerate())
                    .filter(|(_, node)| node[k] > 0)
                    .map(|(i, node)| format!("node {i}: {}", node[k]))
                    .collect();
                (!on.is_empty()).then(|| format!("{} ({})", keys[k], on.join(", ")))
            })
            .collect();
        if !left.is_empty() {
            let some = left.iter().take(3).cloned().collect::<Vec<_>>().join("; ");
            found.push(format!(
                "{} of the {} keys {group} (e.g. {some})",
                left.len(),
                keys.len()
            ));
        }
    }
    (!found.is_empty()).then(|| found.join(" | "))
}

/// How many `SSUBSCRIBE`s `node` has run (`INFO commandstats`).
async fn ssubscribe_calls(node: &RedisServer) -> u64 {
    let info: String = node.query(redis::cmd("INFO").arg("commandstats")).await;
    let Some(stats) = (info.lines()).find_map(|l| l.strip_prefix("cmdstat_ssubscribe:")) else {
        return 0;
    };
    let field = |name: &str| {
        (stats.split(','))
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
            .unwrap_or(0)
    };
    field("calls")
}

/// How many commands `node` refused with `CROSSSLOT` (`INFO errorstats`): a resubscription
/// by redis-rs of channels of several slots. (Not any refusal: while redis-rs repairs a
/// connection it may send a command to another node, which answers `MOVED`.)
async fn crossslot_errors(node: &RedisServer) -> u64 {
    let info: String = node.query(redis::cmd("INFO").arg("errorstats")).await;
    (info.lines())
        .find_map(|l| l.strip_prefix("errorstat_CROSSSLOT:count="))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0)
}

/// How many `SSUBSCRIBE`s and `SUNSUBSCRIBE`s `node` has been sent (run or rejected).
async fn shard_commands(node: &RedisServer) -> u64 {
    let info: String = node.query(redis::cmd("INFO").arg("commandstats")).await;
    let mut sum = 0;
    for line in info.lines() {
        let Some(stats) = (line.strip_prefix("cmdstat_ssubscribe:"))
            .or_else(|| line.strip_prefix("cmdstat_sunsubscribe:"))
        else {
            continue;
        };
        for field in ["calls", "rejected_calls", "failed_calls"] {
            sum += (stats.split(','))
                .find_map(|f| {
                    f.strip_prefix(field)?
                        .strip_prefix('=')?
                        .parse::<u64>()
                        .ok()
                })
                .unwrap_or(0);
        }
    }
    sum
}

/// Waits (bounded) until no node has been sent an `SSUBSCRIBE` or `SUNSUBSCRIBE` for
/// [`QUIET`]: what the subscriber had in flight (a retry, a late leave, a resubscription
/// after a disconnection) has landed — a node that counts no subscriber while a command is
/// on its way shows nothing of it.
async fn settled(cluster: &Cluster) {
    let sample = || async {
        let mut all = Vec::with_capacity(cluster.len());
        for node in cluster.iter() {
            all.push(shard_commands(node).await);
        }
        all
    };
    let start = Instant::now();
    let (mut last, mut since) = (sample().await, Instant::now());
    while since.elapsed() < QUIET {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "could not set up the scenario: the subscriber sent (un)subscriptions for 60 s \
             without a pause of {QUIET:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = sample().await;
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
}

/// The bytes of the subscriber's `SSUBSCRIBE key` (one key per command: redis-rs' RESP).
fn ssubscribe_bytes(key: &str) -> u64 {
    let cmd = format!("*2\r\n$10\r\nSSUBSCRIBE\r\n${}\r\n{key}\r\n", key.len());
    cmd.len() as u64
}

/// A client whose only voter is a 3-node Cluster (quorum 1) subscribes to a key's shard
/// channel while the key has waiters, and must unsubscribe once the last one leaves —
/// whichever way it leaves. 1,000 keys (all distinct), four groups of 250 ([`PER_GROUP`]),
/// one after the other, each held by a second client (which publishes its releases):
///
/// 1. *granted*: the holder releases, each waiter is woken (granted before its first
///    poll), and releases;
/// 2. *timed out*: the waiters (`Retry::until(8 s)`, a poll every 2 s) give up, contended;
/// 3. *cancelled*: the waiters' tasks are aborted;
/// 4. *behind a delayed subscribe*: keys that node 0 serves, their waiters started while node
///    0 is frozen (`SIGSTOP`), so that their `SSUBSCRIBE`s sit unread in its socket
///    (checked, in `/proc/net/tcp`) until the subscriber gives up on them (its response
///    timeout, [`SUBSCRIBE_TIMEOUT`]); then the waiters are aborted and the node thawed: it
///    runs the delayed `SSUBSCRIBE`s (checked, `INFO commandstats`), which subscribe, then
///    whatever the subscriber sent after them.
///
/// Then no node counts a subscriber on any of the 1,000 keys (within [`GONE_WITHIN`]), nor
/// once the subscriber has settled (no (un)subscription sent for [`QUIET`]) — and
/// still none once every node killed the subscriber's connections (`CLIENT KILL TYPE
/// pubsub`) and redis-rs reconnected and subscribed again to what it tracks (a control key
/// per node, its waiter kept waiting, shows that it did): a subscription the server
/// confirmed after the client forgot the key would be tracked by redis-rs and come back.
#[tokio::test(flavor = "multi_thread")]
async fn wake_no_leak_cluster_no_subscription_outlives_its_waiters() {
    let cluster = tokio::task::spawn_blocking(|| Cluster::start(3))
        .await
        .unwrap();
    let url = format!("redis+cluster://{}", cluster.addrs().join(","));
    let client = || {
        Redlock::builder()
            .redis(&url)
            // Roomy on a busy machine; the tries to the frozen node fail after it.
            .node_timeout(Duration::from_millis(500))
            .retry(Retry::never())
            .wake_waiters(true)
            .build()
            .expect("one voter")
    };
    let (holder, waiter) = (client(), client());
    let named = |group: &str, n: usize| -> Vec<String> {
        (0..n)
            .map(|i| format!("wake-no-leak:{group}:{i}"))
            .collect()
    };

    // 1. Granted: woken by the holder's releases.
    let granted = named("granted", PER_GROUP);
    let leases = hold(&holder, &granted, HELD).await;
    let started = Instant::now();
    let waiting: Vec<Waiter> = (granted.iter())
        .map(|key| Waiter::start(&waiter, key, TTL, polls(SLOW_POLL)))
        .collect();
    set_up(
        "every key of the granted group has a subscriber",
        WITHIN,
        || all_subscribed(&cluster, &granted),
    )
    .await;
    let released = Instant::now();
    release_all(leases).await;
    for w in waiting {
        woken(w, started, released, SLOW_POLL).await;
    }

    // 2. Timed out: they give up, the holder keeps the locks.
    let timed_out = named("timed-out", PER_GROUP);
    let leases_timed_out = hold(&holder, &timed_out, HELD).await;
    let give_up = Retry::until(GIVE_UP)
        .delay(GIVE_UP / 4)
        .jitter(Duration::ZERO);
    let waiting: Vec<Waiter> = (timed_out.iter())
        .map(|key| Waiter::start(&waiter, key, TTL, give_up))
        .collect();
    set_up(
        "every key of the timed-out group has a subscriber before its waiters give up",
        GIVE_UP,
        || all_subscribed(&cluster, &timed_out),
    )
    .await;
    let since = Instant::now();
    for w in waiting {
        let (lease, _) = w.answer(since).await;
        let e = lease.expect_err("the holder keeps the lock: the waiter gives up");
        assert!(e.is_contended(), "the waiter gave up contended, not: {e}");
    }

    // 3. Cancelled: their tasks are aborted.
    let cancelled = named("cancelled", PER_GROUP);
    let leases_cancelled = hold(&holder, &cancelled, HELD).await;
    let tasks = waiters(&waiter, &cancelled, polls(SLOW_POLL));
    set_up(
        "every key of the cancelled group has a subscriber",
        WITHIN,
        || all_subscribed(&cluster, &cancelled),
    )
    .await;
    cancel(tasks).await;
    release_all(leases_timed_out).await;
    release_all(leases_cancelled).await;

    // A control key per node, its waiter kept waiting until the end: its subscription shows
    // the subscriber's connection to the node, and that redis-rs subscribed again after the
    // reconnection.
    let candidates = named("control", 64);
    let owners = cluster.nodes_for_keys(&candidates).await;
    let control: Vec<String> = (0..cluster.len())
        .map(|i| match owners.iter().position(|&o| o == i) {
            Some(at) => candidates[at].clone(),
            None => panic!("could not set up the scenario: no control key on node {i}"),
        })
        .collect();
    let control_held = HELD * 5;
    let control_leases = hold(&holder, &control, control_held).await;
    let control_tasks = waiters(&waiter, &control, polls(control_held / 3));
    set_up(
        "every control key has a subscriber on its node",
        WITHIN,
        || async {
            for (i, key) in control.iter().enumerate() {
                if shard_subscribers(&cluster[i], key).await < 1 {
                    return false;
                }
            }
            true
        },
    )
    .await;

    // 4. Behind a delayed subscribe: node 0's keys, their SSUBSCRIBEs held up by its freeze.
    let frozen = 0;
    set_up(
        "one connection of node 0 (the waiters' subscriber's) has shard subscriptions",
        WITHIN,
        || async { shard_subscriber_clients(&cluster[frozen]).await.len() == 1 },
    )
    .await;
    let (_, peer) = shard_subscriber_clients(&cluster[frozen]).await[0];
    let candidates = named("delayed", PER_GROUP * 8);
    let owners = cluster.nodes_for_keys(&candidates).await;
    let delayed: Vec<String> = (candidates.into_iter().zip(owners))
        .filter(|(_, owner)| *owner == frozen)
        .map(|(key, _)| key)
        .take(PER_GROUP)
        .collect();
    assert_eq!(
        delayed.len(),
        PER_GROUP,
        "could not set up the scenario: too few keys on node {frozen}"
    );
    for node in cluster.iter() {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("SET")
            .arg("cluster-node-timeout")
            .arg(FROZEN_NODE_TIMEOUT.as_millis() as u64);
        let () = node.query(&cmd).await;
    }
    let ran_before = ssubscribe_calls(&cluster[frozen]).await;
    let sent: u64 = delayed.iter().map(|key| ssubscribe_bytes(key)).sum();
    cluster[frozen].freeze();
    let tasks = waiters(&waiter, &delayed, polls(SLOW_POLL));
    let port = cluster[frozen].port();
    set_up(
        "the frozen node has every SSUBSCRIBE of the delayed group unread",
        Duration::from_secs(60),
        || async { unread_bytes(port, peer).unwrap_or(0) >= sent },
    )
    .await;
    // The subscriber gives up on each (its waiters would poll).
    tokio::time::sleep(SUBSCRIBE_TIMEOUT * 2).await;
    cancel(tasks).await;
    cluster[frozen].thaw();
    cluster.wait_ok().await;
    set_up(
        "the thawed node ran the delayed group's SSUBSCRIBEs",
        WITHIN,
        || async { ssubscribe_calls(&cluster[frozen]).await >= ran_before + PER_GROUP as u64 },
    )
    .await;

    // No subscription outlives its waiters...
    let groups: [(&str, &[String]); 4] = [
        ("granted", &granted[..]),
        ("timed out", &timed_out[..]),
        ("cancelled", &cancelled[..]),
        ("behind a delayed subscribe", &delayed[..]),
    ];
    let start = Instant::now();
    while let Some(left) = leaks(&cluster, &groups).await {
        assert!(
            start.elapsed() < GONE_WITHIN,
            "subscriptions outlived their keys' waiters ({GONE_WITHIN:?} after the last \
             left): {left}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // What the subscriber still had in flight lands (a leave taken late, after a long wait
    // on the frozen node) — and then still none.
    settled(&cluster).await;
    if let Some(left) = leaks(&cluster, &groups).await {
        panic!("subscriptions outlived their keys' waiters once the subscriber settled: {left}");
    }

    // ...nor comes back when redis-rs reconnects and subscribes again to what it tracks.
    // redis-rs makes a node's shard subscriptions again in one `SSUBSCRIBE`, which the node
    // rejects (`CROSSSLOT`) when the channels are of several slots: then not even the control
    // key comes back, and the rejection shows that redis-rs tracked another channel on the
    // node — one whose waiters had left (only the control keys have waiters now).
    let mut before = Vec::new();
    let mut killed = 0;
    for node in cluster.iter() {
        let rejected = crossslot_errors(node).await;
        before.push((shard_subscriber_clients(node).await, rejected));
        let n: u64 = node
            .query(redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("pubsub"))
            .await;
        killed += n;
    }
    assert!(
        killed >= cluster.len() as u64,
        "could not set up the scenario: CLIENT KILL TYPE pubsub killed {killed} connections"
    );
    let start = Instant::now();
    'reconnected: loop {
        let mut back = 0;
        for (i, node) in cluster.iter().enumerate() {
            let (old, rejected_before) = &before[i];
            let rejected = crossslot_errors(node).await;
            assert!(
                rejected == *rejected_before,
                "after the subscriber's reconnection, node {i} refused {} resubscription(s) \
                 by redis-rs (one SSUBSCRIBE for channels of several slots): redis-rs tracked \
                 channels beside the control key {}, subscriptions kept for keys whose waiters \
                 had left",
                rejected - rejected_before,
                control[i]
            );
            let now = shard_subscriber_clients(node).await;
            if now.iter().any(|c| !old.contains(c))
                && shard_subscribers(node, &control[i]).await >= 1
            {
                back += 1;
            }
        }
        if back == cluster.len() {
            break 'reconnected;
        }
        assert!(
            start.elapsed() < WITHIN,
            "could not set up the scenario: the subscriber reconnected to {back} of the {} \
             nodes and subscribed again to their control keys within {WITHIN:?}",
            cluster.len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let start = Instant::now();
    while start.elapsed() < STAYS_GONE {
        if let Some(back) = leaks(&cluster, &groups).await {
            panic!(
                "after the subscriber's reconnection, redis-rs subscribed again to keys whose \
                 waiters had left: {back}"
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    cancel(control_tasks).await;
    release_all(control_leases).await;
    eventually(
        "no node counts a subscriber on the control keys",
        GONE_WITHIN,
        || async {
            leaks(&cluster, &[("control", &control[..])])
                .await
                .is_none()
        },
    )
    .await;
}
