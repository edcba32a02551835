//! Sentinel groups as Redlock voters, against real processes: a master, its replica and
//! three sentinels per group (`support::sentinel::SentinelGroup`).
//!
//! Test names start with `sentinel_` or `failover_`: `cargo test --all-features sentinel`
//! and `… failover` run each group. The failover tests reproduce the hole asynchronous
//! replication opens (a promoted replica lacking a lock its old master granted) and show
//! tenure protection closing it.

use tower_redlock_testkit as support;

use std::time::{Duration, Instant};

use support::sentinel::SentinelGroup;
use support::{eventually, Masters, NODE_TIMEOUT};
use tower_redlock::node::{split_urls, Node, RedisNode, RedisNodeOptions, Sentinel};
use tower_redlock::{Lease, Redlock, Retry};

/// The bound of every wait for the voter to follow a failover (the group's own failover
/// waits are bounded by the test kit).
const FOLLOW: Duration = Duration::from_secs(20);

fn group_of(g: &SentinelGroup) -> Sentinel {
    Sentinel::new(g.master_name(), g.sentinel_addrs()).expect("a valid group")
}

/// A client whose only voter is the group.
fn client(g: &SentinelGroup, options: &RedisNodeOptions) -> Redlock {
    Redlock::builder()
        .node(RedisNode::sentinel(group_of(g), options).expect("a voter"))
        .node_timeout(NODE_TIMEOUT)
        .retry(Retry::never())
        .build()
        .expect("a client")
}

/// Tries until the lock is granted (bounded); what the tries answered on the way.
async fn lock_eventually(redlock: &Redlock, key: &str, ttl: Duration, within: Duration) -> Lease {
    let start = Instant::now();
    loop {
        match redlock.try_lock(key, ttl).await {
            Ok(lease) => return lease,
            Err(e) if start.elapsed() > within => panic!("no lock on {key} within {within:?}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn sentinel_voter_locks_extends_and_releases_on_the_master() {
    let g = SentinelGroup::start("tr-basic");
    let opts = RedisNodeOptions::new().no_protection();
    let (a, b) = (client(&g, &opts), client(&g, &opts));
    assert_eq!(a.node_count(), 1);

    let ttl = Duration::from_secs(10);
    // The first request waits for the discovery (bounded by the node timeout, generous for
    // a first connection): retried until the voter knows the master.
    let lease = lock_eventually(&a, "basic", ttl, FOLLOW).await;
    assert_eq!(
        g.master().get("basic").await.as_deref(),
        Some(lease.value())
    );
    let err = b.try_lock("basic", ttl).await.unwrap_err();
    assert!(err.is_contended(), "{err:?}");

    lease.extend(Duration::from_secs(60)).await.unwrap();
    assert!(
        g.master().pttl("basic").await > 30_000,
        "the extend reached the master"
    );
    lease.release().await.unwrap();
    assert_eq!(g.master().get("basic").await, None);
    let again = b.try_lock("basic", ttl).await.unwrap();
    again.release().await.unwrap();
    assert_eq!(
        RedisNode::sentinel(group_of(&g), &RedisNodeOptions::default())
            .unwrap()
            .name(),
        "sentinel:tr-basic"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn sentinel_voter_by_url_in_a_mixed_list() {
    let g = SentinelGroup::start("tr-url");
    let masters = Masters::start(2);
    let list = format!(
        "redis+sentinel://{}/{}?protection=off, {}",
        g.sentinel_addrs().join(","),
        g.master_name(),
        masters.urls().join(",")
    );
    let urls = split_urls(&list);
    assert_eq!(urls.len(), 3, "{urls:?}");
    let redlock = Redlock::builder()
        .retry(Retry::never())
        .node_timeout(NODE_TIMEOUT);
    let redlock = urls
        .iter()
        .fold(redlock, |b, url| b.redis(url))
        .build()
        .expect("three voters");
    assert_eq!((redlock.node_count(), redlock.quorum()), (3, 2));
    // Every voter, the group's master included, holds the lock.
    eventually("all three voters grant the lock", FOLLOW, || async {
        let Ok(lease) = redlock.try_lock("mixed", Duration::from_secs(10)).await else {
            return false;
        };
        let on_group = g.master().get("mixed").await.as_deref() == Some(lease.value());
        let on_masters = masters[0].get("mixed").await.as_deref() == Some(lease.value())
            && masters[1].get("mixed").await.as_deref() == Some(lease.value());
        lease.release().await.unwrap();
        on_group && on_masters
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn sentinel_down_the_voter_still_finds_and_follows_the_master() {
    let g = SentinelGroup::start("tr-down");
    // The first sentinel listed is gone before the voter ever asks.
    g.kill_sentinel(0);
    let redlock = client(&g, &RedisNodeOptions::new().no_protection());
    let lease = lock_eventually(&redlock, "down", Duration::from_secs(10), FOLLOW).await;
    assert_eq!(g.master().get("down").await.as_deref(), Some(lease.value()));
    lease.release().await.unwrap();

    // Two sentinels still fail the group over, and the voter follows (no new client).
    let old = g.master_addr();
    g.failover().await;
    assert_ne!(g.master_addr(), old);
    eventually("a lock lands on the new master", FOLLOW, || async {
        let Ok(lease) = redlock.try_lock("down-2", Duration::from_secs(10)).await else {
            return false;
        };
        let there = g.master().get("down-2").await.as_deref() == Some(lease.value());
        lease.release().await.unwrap();
        there
    })
    .await;
}

/// Client `a` holds `key` on the group's master; the replica loses it (what asynchronous
/// replication does when the master fails before the write reached it — made deterministic
/// here by deleting the key on the replica), and the sentinels promote the replica.
async fn lose_the_lock_in_a_failover(g: &SentinelGroup, key: &str) {
    let replica = g.replica().addr();
    let _: () = g
        .replica()
        .query(
            redis::cmd("CONFIG")
                .arg("SET")
                .arg("replica-read-only")
                .arg("no"),
        )
        .await;
    eventually("the replica has the lock", FOLLOW, || async {
        g.replica().get(key).await.is_some()
    })
    .await;
    assert!(g.replica().del(key).await, "deleted on the replica");
    g.failover().await;
    assert_eq!(g.master_addr(), replica);
}

#[tokio::test(flavor = "multi_thread")]
async fn failover_without_protection_lets_a_second_client_win() {
    let g = SentinelGroup::start("tr-hole");
    let opts = RedisNodeOptions::new().no_protection();
    let (a, b) = (client(&g, &opts), client(&g, &opts));
    let ttl = Duration::from_secs(30);
    let first = lock_eventually(&a, "hole", ttl, FOLLOW).await;

    lose_the_lock_in_a_failover(&g, "hole").await;

    // `b` follows the new master, which lacks the key: it wins while `first` is valid.
    let second = lock_eventually(&b, "hole", ttl, FOLLOW).await;
    assert!(
        first.is_valid() && Instant::now() < first.deadline(),
        "the first lease is still valid"
    );
    assert_eq!(
        g.master().get("hole").await.as_deref(),
        Some(second.value())
    );
    assert_ne!(first.value(), second.value());
    // Two holders: the hole tenure protection closes (next test).
}

#[tokio::test(flavor = "multi_thread")]
async fn failover_with_protection_keeps_the_promoted_master_out() {
    let g = SentinelGroup::start("tr-guard");
    let max_ttl = Duration::from_secs(3);
    let opts = RedisNodeOptions::new().restart_protection(max_ttl);
    let (a, b) = (client(&g, &opts), client(&g, &opts));
    // A fresh master's tenure starts at its first lock: no vote until it is max_ttl old.
    let err = loop {
        match a.try_lock("young", max_ttl).await {
            Err(e) if e.is_unavailable() && e.to_string().contains("protection") => break e,
            Err(e) if e.is_unavailable() => tokio::time::sleep(Duration::from_millis(50)).await,
            other => panic!("a young tenure abstains, not {other:?}"),
        }
    };
    assert!(err.is_unavailable(), "{err:?}");
    let first = lock_eventually(&a, "guarded", max_ttl, max_ttl * 4).await;
    let expires = first.deadline();

    lose_the_lock_in_a_failover(&g, "guarded").await;
    // On a loaded machine the failover can outlast the first lease: `b` then wins at once,
    // rightly, and there is no abstention to see.
    let failed_over_in_time = Instant::now() < expires;

    // `b` now reaches the promoted master (its abstention says so) but never wins while
    // the first lease may be valid; once the tenure is old enough it does.
    let mut abstained = false;
    let second = loop {
        match b.try_lock("guarded", max_ttl).await {
            Ok(lease) => break lease,
            Err(e) => {
                abstained |= e.to_string().contains("protection");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    let granted = Instant::now();
    assert!(
        granted >= expires,
        "a second holder {:?} before the first lease's end",
        expires - granted
    );
    assert!(
        abstained || !failed_over_in_time,
        "the promoted master abstained before voting"
    );
    // The second lease is on the promoted master — read while it is valid: on a loaded
    // machine the read may come after its 3 s ttl, and then the key is rightly gone. Or, if
    // `b` had not yet followed the failover when the first lease ended, on the old master:
    // it still answers as a master until the sentinels reconfigure it (a CI run saw this;
    // `min-replicas-to-write` is what keeps an old master from taking writes, see the
    // voters guide).
    let on_master = g.master().get("guarded").await;
    let on_old = g.replica().get("guarded").await;
    assert!(
        on_master.as_deref() == Some(second.value())
            || on_old.as_deref() == Some(second.value())
            || !second.is_valid(),
        "the second lease is on neither server: {on_master:?}, {on_old:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn failover_of_a_frozen_master_keeps_the_quorum_and_is_followed() {
    // Voters: the group and two plain masters. The group's master freezes (SIGSTOP): its
    // requests time out, the other two keep granting; the sentinels fail it over on their
    // own and the voter votes again, on the new master.
    let g = SentinelGroup::start("tr-frozen");
    let masters = Masters::start(2);
    let redlock = masters
        .urls()
        .iter()
        .fold(Redlock::builder(), |b, url| b.redis(url))
        .node(RedisNode::sentinel(group_of(&g), &RedisNodeOptions::new().no_protection()).unwrap())
        .node_timeout(NODE_TIMEOUT)
        .retry(Retry::never())
        .build()
        .unwrap();
    let ttl = Duration::from_secs(10);
    let lease = lock_eventually(&redlock, "frozen-0", ttl, FOLLOW).await;
    lease.release().await.unwrap();

    g.freeze_master();
    for i in 0..20 {
        let key = format!("frozen-{}", i + 1);
        let lease = redlock
            .try_lock(&key, ttl)
            .await
            .expect("two voters of three");
        lease.release().await.unwrap();
    }
    g.await_failover().await;
    eventually(
        "the group votes again, on the new master",
        FOLLOW,
        || async {
            let Ok(lease) = redlock.try_lock("frozen-after", ttl).await else {
                return false;
            };
            let there = g.master().get("frozen-after").await.as_deref() == Some(lease.value());
            lease.release().await.unwrap();
            there
        },
    )
    .await;
    g.thaw_master();
}

/// The mix: three voters of three kinds — a Sentinel group, a Cluster and a plain
/// master — from one `REDLOCK_URLS`-style list. The lock lands on each; with any one of
/// them down the other two still grant it.
#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread")]
async fn sentinel_cluster_and_master_mixed_by_urls() {
    let (g, cluster, masters, list) = crate::operate::mixed_voters("tr-mix").await;
    let redlock = Redlock::new(split_urls(&list)).expect("three voters");
    assert_eq!((redlock.node_count(), redlock.quorum()), (3, 2));
    let names: Vec<String> = redlock
        .node_status()
        .iter()
        .map(|s| s.name().to_owned())
        .collect();
    assert!(
        names[0].starts_with("sentinel:") && names[1].starts_with("cluster:"),
        "{names:?}"
    );

    let ttl = Duration::from_secs(10);
    for i in 0..6 {
        let key = format!("mix-{i}");
        let owner = cluster.node_for_key(&key).await;
        eventually(
            format!("{key} is held on all three voters"),
            FOLLOW,
            || async {
                let Ok(lease) = redlock.try_lock(&key, ttl).await else {
                    return false;
                };
                let v = Some(lease.value().to_owned());
                let everywhere = g.master().get(&key).await == v
                    && cluster[owner].get(&key).await == v
                    && masters[0].get(&key).await == v;
                lease.release().await.unwrap();
                everywhere
            },
        )
        .await;
    }

    // One voter down (the plain master): the Sentinel group and the Cluster still grant.
    masters[0].stop();
    let lease = lock_eventually(&redlock, "mix-degraded", ttl, FOLLOW).await;
    let owner = cluster.node_for_key("mix-degraded").await;
    assert_eq!(
        cluster[owner].get("mix-degraded").await.as_deref(),
        Some(lease.value())
    );
    assert_eq!(
        g.master().get("mix-degraded").await.as_deref(),
        Some(lease.value())
    );
    lease.release().await.unwrap();
}

/// A frozen sentinel (SIGSTOP: connected, never answering) costs the discovery nothing: it
/// goes with the majority of the sentinels that answer, and does not wait out the frozen
/// one's timeout. The timeout here is 10 s, and so is the bound on the first lock: waiting for
/// the frozen sentinel even once would take at least that long, so a lock before it proves
/// the promise, and every second of it below is slack a loaded machine may use.
#[tokio::test(flavor = "multi_thread")]
async fn sentinel_frozen_costs_the_discovery_no_time() {
    let g = SentinelGroup::start("tr-frozen-sentinel");
    g.sentinel(0).freeze();
    let opts = RedisNodeOptions::new()
        .no_protection()
        .connect_timeout(Duration::from_secs(10));
    let redlock = client(&g, &opts);
    let start = Instant::now();
    let lease = lock_eventually(&redlock, "fs", Duration::from_secs(10), FOLLOW).await;
    let took = start.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "the first lock took {took:?}: the discovery waited for the frozen sentinel"
    );
    assert_eq!(g.master().get("fs").await.as_deref(), Some(lease.value()));
    lease.release().await.unwrap();
    g.sentinel(0).thaw();
}

/// Credentials for the master and for the sentinels, from the URL. The group's default
/// users may not do what a voter does (the master's: `SET`, scripts; the sentinels':
/// `SENTINEL get-master-addr-by-name`) — ACL users with passwords may. A voter with the
/// credentials locks; one without them cannot.
#[tokio::test(flavor = "multi_thread")]
async fn sentinel_with_passwords_for_the_master_and_the_sentinels() {
    let g = SentinelGroup::start("tr-auth");
    for server in [g.master(), g.replica()] {
        let _: () = server
            .query(
                redis::cmd("ACL")
                    .arg("SETUSER")
                    .arg("locker")
                    .arg("on")
                    .arg(">m-secret")
                    .arg("~*")
                    .arg("+@all"),
            )
            .await;
        let _: () = server
            .query(
                redis::cmd("ACL")
                    .arg("SETUSER")
                    .arg("default")
                    .arg("-set")
                    .arg("-eval")
                    .arg("-evalsha"),
            )
            .await;
    }
    for i in 0..3 {
        let s = g.sentinel(i);
        let _: () = s
            .query(
                redis::cmd("ACL")
                    .arg("SETUSER")
                    .arg("watcher")
                    .arg("on")
                    .arg(">s-secret")
                    .arg("+@all"),
            )
            .await;
        let _: () = s
            .query(
                redis::cmd("ACL")
                    .arg("SETUSER")
                    .arg("default")
                    .arg("-sentinel|get-master-addr-by-name"),
            )
            .await;
    }
    let hosts = g.sentinel_addrs().join(",");
    let name = g.master_name();
    let client = |url: String| {
        Redlock::builder()
            .redis(&url)
            .node_timeout(NODE_TIMEOUT)
            .retry(Retry::never())
            .build()
            .unwrap()
    };
    let with = client(format!(
        "redis+sentinel://locker:m-secret@{hosts}/{name}?sentinel_username=watcher&sentinel_password=s-secret&protection=off"
    ));
    let lease = lock_eventually(&with, "auth", Duration::from_secs(10), FOLLOW).await;
    assert_eq!(g.master().get("auth").await.as_deref(), Some(lease.value()));
    lease.release().await.unwrap();

    // Without the sentinels' credentials no master is found; without the master's, the
    // master refuses the lock. Either way: unavailable, never granted.
    for url in [
        format!("redis+sentinel://locker:m-secret@{hosts}/{name}?protection=off"),
        format!("redis+sentinel://{hosts}/{name}?sentinel_username=watcher&sentinel_password=s-secret&protection=off"),
    ] {
        let without = client(url);
        for _ in 0..10 {
            let err = without.try_lock("auth-2", Duration::from_secs(10)).await.unwrap_err();
            assert!(err.is_unavailable(), "{err:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert_eq!(g.master().get("auth-2").await, None);
}

/// A Sentinel voter votes only while a majority of its sentinels has named its master
/// recently: cut from two of three sentinels, it stops granting and extending within its
/// window (two refresh intervals and two connect timeouts), even though the one sentinel it
/// still hears names the same master. Then it is cut from that one too and the others fail the master over:
/// another client locks on the promoted master — after every lease the cut-off voter may
/// have granted or extended has expired (the promoted master's tenure protection covers the
/// window and the longest ttl).
#[tokio::test(flavor = "multi_thread")]
async fn sentinel_majority_lost_the_voter_stops_granting_and_extending_within_its_window() {
    let g = SentinelGroup::start("tr-majority");
    let refresh = Duration::from_millis(200);
    let connect = Duration::from_millis(200);
    // The window: two refresh intervals and two connect timeouts.
    let window = refresh * 2 + connect * 2;
    let max_ttl = Duration::from_secs(3);
    let opts = RedisNodeOptions::new()
        .restart_protection(max_ttl)
        .connect_timeout(connect);
    // Client `a` asks the sentinels as a user of its own, so it can be cut from them (the
    // user switched off there) while they go on talking to one another. (A proxy would not
    // do: the voter also asks the sentinels the group names, at their own addresses.)
    for i in 0..3 {
        g.allow_user(i, "cut-off", "c-secret").await;
    }
    let voter = |user: Option<&str>| {
        let mut group = Sentinel::new(g.master_name(), g.sentinel_addrs())
            .unwrap()
            .refresh_interval(refresh);
        if let Some(user) = user {
            group = group.sentinel_password(Some(user), "c-secret");
        }
        Redlock::builder()
            .node(RedisNode::sentinel(group, &opts).unwrap())
            .node_timeout(NODE_TIMEOUT)
            .retry(Retry::never())
            .build()
            .unwrap()
    };
    let (a, b) = (voter(Some("cut-off")), voter(None));
    let ttl = Duration::from_secs(1);
    let mut lease = lock_eventually(&a, "job", ttl, FOLLOW).await;
    lease.keep_alive();
    let handle = lease.handle();

    // `a` hears only sentinel 0 from now on, which still names the same master.
    g.cut_user(1, "cut-off").await;
    g.cut_user(2, "cut-off").await;
    let cut = Instant::now();
    let mut i = 0;
    eventually("a stops granting", window + Duration::from_secs(2), || {
        i += 1;
        let key = format!("after-cut-{i}");
        let a = &a;
        async move {
            match a.try_lock(&key, ttl).await {
                Ok(lease) => {
                    lease.release().await.unwrap();
                    false
                }
                Err(e) => e.is_unavailable() && e.to_string().contains("majority"),
            }
        }
    })
    .await;
    let abstained = cut.elapsed();
    assert!(a.node_status()[0].is_abstaining(), "node_status says so");
    eventually("a's lease is lost", window + ttl * 2, || async {
        handle.is_lost()
    })
    .await;
    let last_valid = handle.deadline();
    assert!(
        last_valid <= cut + window + ttl + Duration::from_millis(500),
        "a extended {:?} past the cut",
        last_valid - cut
    );

    // Cut from every sentinel; the others fail the master over.
    g.cut_user(0, "cut-off").await;
    g.failover().await;
    // (`b`'s first grant may still come from the old master, within `b`'s own window: the
    // promoted master's protection covers that too.)
    let second = lock_eventually(&b, "job", ttl, FOLLOW).await;
    let granted = Instant::now();
    assert!(
        granted >= last_valid,
        "a second holder {:?} before a's last validity ended",
        last_valid - granted
    );
    second.release().await.unwrap();
    eventually("b locks on the promoted master", FOLLOW, || async {
        let Ok(lease) = b.try_lock("job", ttl).await else {
            return false;
        };
        let there = g.master().get("job").await.as_deref() == Some(lease.value());
        lease.release().await.unwrap();
        there
    })
    .await;
    let err = a.try_lock("job-2", ttl).await.unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    println!("a abstained {abstained:?} after the cut (window {window:?})");
    drop(lease);
}

/// With every sentinel up, the majority window never lapses, whatever the refresh interval:
/// a voter asked to refresh faster than its discovery can run (20 ms) still confirms its
/// master well inside the window, and never abstains. (The window covers the discovery's own
/// pace and duration, not just the interval.) It runs at least 3 s and 50 tries, however slow
/// the machine; a try that got no answer in its node timeout on a loaded machine is no
/// abstention and is not counted — any refusal is.
#[tokio::test(flavor = "multi_thread")]
async fn sentinel_majority_window_never_lapses_with_every_sentinel_up() {
    let g = SentinelGroup::start("tr-window");
    let group = group_of(&g).refresh_interval(Duration::from_millis(20));
    let redlock = Redlock::builder()
        .node(RedisNode::sentinel(group, &RedisNodeOptions::new().no_protection()).unwrap())
        .node_timeout(NODE_TIMEOUT)
        .retry(Retry::never())
        .build()
        .unwrap();
    lock_eventually(&redlock, "warm", Duration::from_secs(10), FOLLOW)
        .await
        .release()
        .await
        .unwrap();
    let start = Instant::now();
    let (mut tries, mut granted) = (0, 0);
    while start.elapsed() < Duration::from_secs(3) || granted <= 50 {
        tries += 1;
        match redlock
            .try_lock(&format!("w-{tries}"), Duration::from_secs(10))
            .await
        {
            Ok(lease) => {
                granted += 1;
                lease.release().await.unwrap();
            }
            Err(e) if e.is_timeout() => {}
            Err(e) => panic!("try {tries} after {:?}: {e}", start.elapsed()),
        }
        assert!(
            start.elapsed() < FOLLOW * 3,
            "could not set up the scenario: {granted} grants of {tries} tries in {:?}",
            FOLLOW * 3
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}
