//! Waking waiters on a Cluster voter while the key's slot moves: the voter's subscriber
//! `SSUBSCRIBE`s to the key's channel on the slot's owner; when the slot migrates, the
//! former owner drops the channel (a `sunsubscribe` push) and the subscriber must listen on
//! the new owner for as long as the key has waiters, or a hot key falls back to polling.
//! And after the subscriber's connection to a node dropped, it listens again on every key
//! with waiters there, whatever their slots (`wake_no_leak_cluster_*`, the subscriptions
//! that must not outlive their waiters, is in `wake_cluster_leak.rs`).

use tower_redlock_testkit as support;

use std::time::{Duration, Instant};

use support::cluster::Cluster;
use support::pubsub::{shard_subscribers, subscribers, Subscriber, Waiter};
use support::{eventually, Masters};
use tower_redlock::{Redlock, Retry};

use crate::wake::woken;

const TTL: Duration = Duration::from_secs(20);
/// The bound of the first lock (the Cluster's slot map) and of the subscribers' first
/// subscriptions.
const WITHIN: Duration = Duration::from_secs(20);
/// A poll so long that a waiter that gets the lock within it was woken.
const LONG_POLL: Duration = Duration::from_secs(12);
/// How soon the Cluster voter's subscriber must listen on the slot's new owner once every
/// node names it.
const FOLLOW_WITHIN: Duration = Duration::from_secs(4);

/// A waiter's policy: polls every [`LONG_POLL`], for up to 40 s.
fn long_poll() -> Retry {
    Retry::until(Duration::from_secs(40))
        .delay(LONG_POLL)
        .jitter(Duration::ZERO)
}

/// Three voters — a Cluster and two masters, one of them stopped: the waiter needs a quorum
/// (2) of releases heard, the running master's and the Cluster's, so only a Cluster voter
/// whose subscriber followed the key's slot to its new owner wakes it before its poll.
#[tokio::test(flavor = "multi_thread")]
async fn wake_cluster_migration_a_waiter_is_woken_after_its_keys_slot_moved() {
    let cluster = tokio::task::spawn_blocking(|| Cluster::start(3))
        .await
        .unwrap();
    let masters = Masters::start(2);
    // Its voter can neither vote nor hear: every wake-up needs the two others.
    masters[1].stop();
    let client = || {
        Redlock::builder()
            .redis(&format!("redis+cluster://{}", cluster.addrs().join(",")))
            .redis(&masters[0].url())
            .redis(&masters[1].url())
            .retry(Retry::never())
            .wake_waiters(true)
            .build()
            .expect("three voters")
    };
    let (holder, waiter) = (client(), client());
    let key = "wake-migration";

    // Held on the Cluster and the running master (the first lock waits for the slot map).
    let start = Instant::now();
    let lease = loop {
        match holder.try_lock(key, TTL).await {
            Ok(lease) => break lease,
            Err(e) if start.elapsed() > WITHIN => panic!("no lock within {WITHIN:?}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let from = cluster.node_for_key(key).await;
    let to = (from + 1) % cluster.len();

    let started = Instant::now();
    let waiting = Waiter::start(&waiter, key, TTL, long_poll());
    eventually(
        "the running master and the Cluster's slot owner have a subscriber on the key",
        WITHIN,
        || async {
            subscribers(&masters[0], key).await >= 1
                && shard_subscribers(&cluster[from], key).await >= 1
        },
    )
    .await;

    // The slot moves, with the lock's keys; the former owner drops the channel.
    cluster.migrate_slot_of(key, to).await;
    let moved = Instant::now();
    let followed = async {
        while shard_subscribers(&cluster[to], key).await < 1 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    if tokio::time::timeout(FOLLOW_WITHIN, followed).await.is_err() {
        panic!(
            "the Cluster voter's subscriber did not follow slot {} of {key} from node {from} \
             to node {to} within {FOLLOW_WITHIN:?} (set up {:?} after the waiter started): \
             shard subscribers on the former owner {}, on the new owner {}",
            cluster.slot(key).await,
            moved.saturating_duration_since(started),
            shard_subscribers(&cluster[from], key).await,
            shard_subscribers(&cluster[to], key).await,
        );
    }
    // Someone else listening on the new owner (after the count above) hears the release.
    let mut on_cluster = Subscriber::sharded(cluster[to].port(), &[key]).await;

    // The holder's release follows the slot (MOVED) and publishes on the new owner.
    let released = Instant::now();
    lease.release().await.unwrap();
    on_cluster.released(key).await;
    woken(waiting, started, released, LONG_POLL).await;
}

/// The subscriber's connection to a node killed (`CLIENT KILL TYPE pubsub`) while waiters
/// wait on two keys of that node in different slots: it listens on both again, and a
/// release wakes a waiter before its poll. (redis-rs makes a node's subscriptions again in
/// one `SSUBSCRIBE`, which the node refuses with `CROSSSLOT` when they span several slots;
/// the subscriber subscribes each key again itself, also once redis-rs has replaced the
/// connection: without that second round, one of the two keys was seen left out.)
#[tokio::test(flavor = "multi_thread")]
async fn wake_cluster_reconnect_keys_in_several_slots_of_a_node_are_listened_on_again() {
    let cluster = tokio::task::spawn_blocking(|| Cluster::start(3))
        .await
        .unwrap();
    let client = || {
        Redlock::builder()
            .redis(&format!("redis+cluster://{}", cluster.addrs().join(",")))
            .retry(Retry::never())
            .wake_waiters(true)
            .build()
            .expect("a Cluster voter")
    };
    let (holder, waiter) = (client(), client());
    // Two keys owned by the same node, in different slots.
    let first = "wake-reconnect:0".to_owned();
    let node = cluster.node_for_key(&first).await;
    let mut second = None;
    for i in 1..10_000 {
        let key = format!("wake-reconnect:{i}");
        if cluster.node_for_key(&key).await == node
            && cluster.slot(&key).await != cluster.slot(&first).await
        {
            second = Some(key);
            break;
        }
    }
    let second = second.expect("a second key of the node in another slot");
    let keys = [first.as_str(), second.as_str()];
    let mut leases = Vec::new();
    for key in keys {
        let start = Instant::now();
        leases.push(loop {
            match holder.try_lock(key, TTL).await {
                Ok(lease) => break lease,
                Err(e) if start.elapsed() > WITHIN => panic!("no lock within {WITHIN:?}: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        });
    }
    let started = Instant::now();
    let waiting: Vec<Waiter> = keys
        .iter()
        .map(|key| Waiter::start(&waiter, key, TTL, long_poll()))
        .collect();
    eventually("the node has a subscriber on both keys", WITHIN, || async {
        shard_subscribers(&cluster[node], keys[0]).await >= 1
            && shard_subscribers(&cluster[node], keys[1]).await >= 1
    })
    .await;
    let mut kill = redis::cmd("CLIENT");
    kill.arg("KILL").arg("TYPE").arg("pubsub");
    let killed: i64 = cluster[node].query(&kill).await;
    assert!(
        killed >= 1,
        "could not set up the scenario: no pub/sub client to kill"
    );
    eventually(
        "the node has a subscriber on both keys again",
        WITHIN,
        || async {
            shard_subscribers(&cluster[node], keys[0]).await >= 1
                && shard_subscribers(&cluster[node], keys[1]).await >= 1
        },
    )
    .await;
    let mut waiting = waiting.into_iter();
    let released = Instant::now();
    leases.remove(0).release().await.unwrap();
    woken(waiting.next().unwrap(), started, released, LONG_POLL).await;
    leases.remove(0).release().await.unwrap();
}
