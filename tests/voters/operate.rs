//! The operator's verbs on every kind of voter at once — a Sentinel group, a Redis Cluster
//! and a plain master, from one `REDLOCK_URLS`-style list: `Redlock::inspect` (the lock, the
//! fencing counter and the completion record, which a Cluster keeps in the lock key's slot),
//! `Error::votes`, `Redlock::force_release` and `Redlock::scan` (a Cluster's keys are spread
//! over its masters: it answers an error).

use tower_redlock_testkit as support;

use std::time::Duration;

use support::cluster::Cluster;
use support::sentinel::SentinelGroup;
use support::{eventually, Masters};
use tower_redlock::node::split_urls;
use tower_redlock::operate::{ForceRelease, Summary};
use tower_redlock::{LockOrRecord, Redlock, Retry, VoteKind};

const TTL: Duration = Duration::from_secs(10);
/// The bound of the first lock (the Sentinel voter's discovery, the Cluster's slot map).
const WITHIN: Duration = Duration::from_secs(20);

/// Three voters of three kinds — a Sentinel group named `name` (without tenure protection),
/// a Cluster of three masters and a plain master — and their `REDLOCK_URLS`-style list.
pub(crate) async fn mixed_voters(name: &str) -> (SentinelGroup, Cluster, Masters, String) {
    let g = SentinelGroup::start(name);
    let cluster = tokio::task::spawn_blocking(|| Cluster::start(3))
        .await
        .unwrap();
    let masters = Masters::start(1);
    let list = format!(
        "redis+sentinel://{}/{}?protection=off,redis+cluster://{},{}",
        g.sentinel_addrs().join(","),
        g.master_name(),
        cluster.addrs().join(","),
        masters[0].url()
    );
    (g, cluster, masters, list)
}

#[tokio::test(flavor = "multi_thread")]
async fn inspect_explain_and_force_on_a_sentinel_group_a_cluster_and_a_master() {
    let (_g, _cluster, _masters, list) = mixed_voters("tr-operate").await;
    let redlock = split_urls(&list)
        .iter()
        .fold(Redlock::builder(), |b, url| b.redis(url))
        .fencing(true)
        .retry(Retry::never())
        .build()
        .expect("three voters");

    // Every voter takes part: held on all three, each with its counter.
    let start = std::time::Instant::now();
    let lease = loop {
        assert!(
            start.elapsed() < WITHIN,
            "no lock on all three voters in {WITHIN:?}"
        );
        let Ok(lease) = redlock.try_lock("op-job", TTL).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let seen = redlock.inspect("op-job").await.unwrap();
        let on_all = seen.voters().iter().all(|v| {
            v.key()
                .is_some_and(|k| k.holder.is_some() && k.fence.is_some())
        });
        if on_all {
            break lease;
        }
        lease.release().await.unwrap();
    };
    let seen = redlock.inspect("op-job").await.unwrap();
    assert_eq!(seen.summary(), Summary::Held);
    assert!(lease
        .value()
        .starts_with(&seen.holder().unwrap().token_prefix));

    // Explained: each kind of voter answers "held".
    let err = redlock.try_lock("op-job", TTL).await.unwrap_err();
    let held = err
        .votes()
        .filter(|v| matches!(v.kind(), VoteKind::Held { .. }))
        .count();
    assert!(held >= 2, "{err}");
    assert!(err.to_string().contains("cluster:") && err.to_string().contains("sentinel:"));

    // Forced: gone on all three, and the next lock is taken.
    std::mem::forget(lease);
    let cleared = redlock
        .force_release("op-job", ForceRelease::by("test").any_holder())
        .await
        .unwrap();
    assert_eq!(cleared.locks_deleted(), 3, "{cleared:?}");
    assert_eq!(
        redlock.inspect("op-job").await.unwrap().summary(),
        Summary::Free
    );
    redlock
        .try_lock("op-job", TTL)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    // A completion record, in the Cluster key's slot: seen, then forgotten on request.
    let LockOrRecord::Locked(lease) = redlock
        .lock_unless_completed("op-done", TTL, Retry::never())
        .await
        .unwrap()
    else {
        panic!("nothing completed yet")
    };
    lease.complete(b"done".to_vec(), TTL).await.unwrap();
    let seen = redlock.inspect("op-done").await.unwrap();
    assert_eq!(seen.summary(), Summary::Completed);
    // A completion returns at a quorum; the last voter's record may land a moment later.
    eventually(
        "every voter has the record",
        Duration::from_secs(5),
        || async {
            let seen = redlock.inspect("op-done").await.unwrap();
            seen.voters()
                .iter()
                .all(|v| v.key().is_some_and(|k| k.record.is_some()))
        },
    )
    .await;
    let forgotten = redlock
        .force_release(
            "op-done",
            ForceRelease::by("test").any_holder().with_record(),
        )
        .await
        .unwrap();
    assert_eq!(forgotten.records_deleted(), 3);

    // Listing: the Sentinel group and the master list their locks; the Cluster says it cannot.
    let _listed = redlock.try_lock("op-list:1", TTL).await.unwrap();
    // A lock returns at a quorum; the last voter's `SET` may land a moment later.
    let listed_on_both = || async {
        let scans = redlock.scan("op-list:", 10).await;
        [0, 2]
            .iter()
            .all(|&i| scans[i].locks().is_some_and(|l| !l.is_empty()))
    };
    eventually(
        "both listing voters hold the lock",
        Duration::from_secs(5),
        listed_on_both,
    )
    .await;
    let scans = redlock.scan("op-list:", 10).await;
    assert_eq!(scans[0].locks().unwrap()[0].key, "op-list:1");
    assert!(scans[1].error().is_some());
    assert_eq!(scans[2].locks().unwrap()[0].key, "op-list:1");
}
