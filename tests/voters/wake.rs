//! Waking waiters on every kind of voter at once — a Sentinel group, a Redis Cluster and a
//! plain master, from one `REDLOCK_URLS`-style list: each voter's release publishes on the
//! key's channel (`PUBLISH` on the Sentinel group's master and the master, `SPUBLISH` on the
//! Cluster's slot owner), each voter's subscriber listens there while a waiter waits, and the
//! waiter has the lock well before its next poll.

use tower_redlock_testkit as support;

use std::time::{Duration, Instant};

use support::eventually;
use support::pubsub::{shard_subscribers, subscribers, Subscriber, Waiter};
use tower_redlock::node::split_urls;
use tower_redlock::{Redlock, Retry};

use crate::operate::mixed_voters;

const TTL: Duration = Duration::from_secs(10);
/// The bound of the first lock (the Sentinel voter's discovery, the Cluster's slot map).
const WITHIN: Duration = Duration::from_secs(20);
/// A poll so long that a waiter that gets the lock within it was woken.
const LONG_POLL: Duration = Duration::from_secs(8);

/// Asserts that `waiter`, started at `started` with polls every `poll`, got the lock, woken
/// by the release made at `released`, and releases it. A waiter that is not woken tries
/// again no sooner than `poll` (no jitter) after its failed try, itself after `started`: a
/// grant before `started + poll` was a wake-up — an exact bound, no slack guessed. The
/// release must leave the wake-up half the poll, or the machine could not set up the
/// scenario.
pub(crate) async fn woken(waiter: Waiter, started: Instant, released: Instant, poll: Duration) {
    let set_up = released.saturating_duration_since(started);
    assert!(
        set_up < poll / 2,
        "could not set up the scenario: released {set_up:?} after the waiter started \
         (poll {poll:?})"
    );
    let (lease, waited) = waiter.answer(started).await;
    let lease = lease.expect("the waiter gets the lock");
    assert!(
        waited < poll,
        "granted {waited:?} after the waiter started (released after {set_up:?}): it waited \
         for its poll ({poll:?}), it was not woken"
    );
    lease.release().await.expect("released");
}

#[tokio::test(flavor = "multi_thread")]
async fn wake_a_waiter_on_a_sentinel_group_a_cluster_and_a_master() {
    let (g, cluster, masters, list) = mixed_voters("tr-wake").await;
    let client = || {
        split_urls(&list)
            .iter()
            .fold(Redlock::builder(), |b, url| b.redis(url))
            .retry(Retry::never())
            .wake_waiters(true)
            .build()
            .expect("three voters")
    };
    let (holder, waiter) = (client(), client());
    let key = "wake-mixed";

    // Held on all three voters (the first lock waits for discovery and the slot map).
    let start = Instant::now();
    let lease = loop {
        assert!(
            start.elapsed() < WITHIN,
            "no lock on all three voters in {WITHIN:?}"
        );
        let Ok(lease) = holder.try_lock(key, TTL).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let seen = holder.inspect(key).await.unwrap();
        if seen
            .voters()
            .iter()
            .all(|v| v.key().is_some_and(|k| k.holder.is_some()))
        {
            break lease;
        }
        lease.release().await.unwrap();
    };
    let owner = cluster.node(cluster.node_for_key(key).await);

    let started = Instant::now();
    let waiting = Waiter::start(&waiter, key, TTL, long_poll());
    // Each voter's subscriber listens on the key: plain channels on the Sentinel group's
    // master and the master, the sharded channel on the Cluster's slot owner.
    eventually(
        "every voter has a subscriber on the key",
        WITHIN,
        || async {
            subscribers(g.master(), key).await >= 1
                && subscribers(&masters[0], key).await >= 1
                && shard_subscribers(owner, key).await >= 1
        },
    )
    .await;
    let mut on_sentinel = Subscriber::on(g.master().port(), &[key]).await;
    let mut on_master = Subscriber::on(masters[0].port(), &[key]).await;
    let mut on_cluster = Subscriber::sharded(owner.port(), &[key]).await;

    let released = Instant::now();
    lease.release().await.unwrap();
    // Each kind of voter published the release.
    on_sentinel.released(key).await;
    on_master.released(key).await;
    on_cluster.released(key).await;
    woken(waiting, started, released, LONG_POLL).await;
}

/// A Sentinel voter's subscriber follows a failover: it listens on the new master, whose
/// releases wake a waiter before its poll — no new client.
#[tokio::test(flavor = "multi_thread")]
async fn wake_a_sentinel_voters_subscriber_follows_a_failover() {
    use support::sentinel::SentinelGroup;
    use tower_redlock::node::{RedisNode, RedisNodeOptions, Sentinel};

    let g = SentinelGroup::start("tr-wake-failover");
    let client = || {
        let group = Sentinel::new(g.master_name(), g.sentinel_addrs()).expect("a valid group");
        let voter = RedisNode::sentinel(group, &RedisNodeOptions::new().no_protection());
        Redlock::builder()
            .node(voter.expect("a voter"))
            .retry(Retry::never())
            .wake_waiters(true)
            .build()
            .expect("a client")
    };
    let (holder, waiter) = (client(), client());
    let key = "wake-failover";
    // The waiter listens on the first master.
    let lease = eventually_locked(&holder, key).await;
    let started = Instant::now();
    let first = Waiter::heard(&waiter, key, TTL, long_poll(), [g.master()]).await;
    let released = Instant::now();
    lease.release().await.unwrap();
    woken(first, started, released, LONG_POLL).await;

    g.failover().await;
    // Both clients follow the new master (the old one answers as a master for a while: a
    // client that has not looked yet may still lock there).
    on_new_master(&g, &waiter, "wake-failover-probe")
        .await
        .release()
        .await
        .unwrap();
    let lease = on_new_master(&g, &holder, key).await;
    let started = Instant::now();
    let second = Waiter::heard(&waiter, key, TTL, long_poll(), [g.master()]).await;
    let released = Instant::now();
    lease.release().await.unwrap();
    woken(second, started, released, LONG_POLL).await;
}

/// A waiter's policy: polls every [`LONG_POLL`], for up to 30 s.
fn long_poll() -> Retry {
    Retry::until(Duration::from_secs(30))
        .delay(LONG_POLL)
        .jitter(Duration::ZERO)
}

/// Locks `key` until the lease is on the group's current master (bounded by [`WITHIN`]).
async fn on_new_master(
    g: &support::sentinel::SentinelGroup,
    redlock: &Redlock,
    key: &str,
) -> tower_redlock::Lease {
    let start = Instant::now();
    loop {
        let lease = eventually_locked(redlock, key).await;
        if g.master().get(key).await.as_deref() == Some(lease.value()) {
            return lease;
        }
        lease.release().await.unwrap();
        assert!(
            start.elapsed() < WITHIN,
            "{key}: not on the new master within {WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Tries until `key` is granted (bounded by [`WITHIN`]: discovery, a failover followed).
async fn eventually_locked(redlock: &Redlock, key: &str) -> tower_redlock::Lease {
    let start = Instant::now();
    loop {
        match redlock.try_lock(key, TTL).await {
            Ok(lease) => return lease,
            Err(e) if start.elapsed() > WITHIN => panic!("no lock on {key} within {WITHIN:?}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}
