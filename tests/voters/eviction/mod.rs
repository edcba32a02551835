//! Eviction: a master that may evict keys under memory pressure (`maxmemory` with an
//! `allkeys-*` or `volatile-*` policy — a Redis shared with a cache) can drop a lock or a
//! completion record before its ttl, and then a second holder or a second run follows.
//!
//! Each test makes real masters into caches (a `maxmemory` a little above what they use,
//! and an evicting policy) where it needs one. By default a voter over such a master
//! abstains, with an error that names the policy; `RedisNodeOptions::allow_eviction` lets
//! it vote, and then junk written until the lock key is really evicted lets a second client
//! in (`eviction_allowed_breaks_exclusion`: what every voter did before the check). The
//! policy is read on first use and after a reconnection (also of a Sentinel voter's new
//! master, and on every master of a Cluster), and inside every acquire, extension and
//! completion script, with no round trip added to a lock.
//!
//! Test names start with `eviction_`: `cargo test --all-features eviction` runs them. This
//! file holds what abstaining prevents; `checks.rs`, when and how the policy is read;
//! `runtime.rs`, a policy set on a live master between two requests (`eviction_runtime_`).

use std::time::Duration;

use tower_redlock::node::RedisNodeOptions;
use tower_redlock::{Error, LockOrRecord, Redlock, RedlockBuilder, Retry};
use tower_redlock_testkit as support;

use support::{eventually, Masters, RedisServer, NODE_TIMEOUT};

mod checks;
mod runtime;

const TTL: Duration = Duration::from_secs(30);
const DAY: Duration = Duration::from_secs(86_400);
/// How far above its current use a cache's `maxmemory` is set.
const HEADROOM: u64 = 1 << 20;
/// The junk written per round trip: 16 values of 8 KiB.
const BATCH: usize = 16;
const VALUE: usize = 8 << 10;
/// The most junk written before a test gives up on an eviction: 64 MiB.
const MAX_BATCHES: usize = 512;

/// A field of `INFO` (`name:value` lines).
fn info_field(info: &str, name: &str) -> String {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("no `{name}` in INFO:\n{info}"))
        .trim()
        .to_owned()
}

/// Makes `server` a cache: `maxmemory` [`HEADROOM`] above what it uses now, and `policy`.
async fn make_cache(server: &RedisServer, policy: &str) {
    let info: String = server.query(redis::cmd("INFO").arg("memory")).await;
    let used: u64 = info_field(&info, "used_memory").parse().expect("a number");
    let set = |name: &str, value: String| {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("SET").arg(name).arg(value);
        cmd
    };
    let _: () = server
        .query(&set("maxmemory-policy", policy.to_owned()))
        .await;
    let _: () = server
        .query(&set("maxmemory", (used + HEADROOM).to_string()))
        .await;
}

/// Writes junk (with a long ttl, so that `volatile-*` policies may evict it too) to `server`
/// until `key` is evicted; panics if it survives [`MAX_BATCHES`] rounds. Returns how many
/// bytes of junk that took.
async fn fill_until_evicted(server: &RedisServer, key: &str) -> usize {
    assert_eq!(
        server.query::<i64>(redis::cmd("EXISTS").arg(key)).await,
        1,
        "{key} must be on {} before the junk",
        server.addr()
    );
    let mut conn = server.conn().await;
    let value = vec![b'x'; VALUE];
    for round in 0..MAX_BATCHES {
        let mut pipe = redis::pipe();
        for i in 0..BATCH {
            pipe.cmd("SET")
                .arg(format!("junk:{round}:{i}"))
                .arg(&value)
                .arg("PX")
                .arg(3_600_000)
                .ignore();
        }
        let () = pipe
            .query_async(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("junk on {}: {e}", server.addr()));
        if server.query::<i64>(redis::cmd("EXISTS").arg(key)).await == 0 {
            let info: String = server.query(redis::cmd("INFO").arg("stats")).await;
            let evicted: u64 = info_field(&info, "evicted_keys").parse().expect("a number");
            assert!(
                evicted > 0,
                "{key} is gone from {}, but not evicted",
                server.addr()
            );
            return (round + 1) * BATCH * VALUE;
        }
    }
    panic!(
        "{key} survived {} MiB of junk on {}",
        (MAX_BATCHES * BATCH * VALUE) >> 20,
        server.addr()
    );
}

/// The bound of every wait for a voter to notice a change (a reconnection, a failover).
const WITHIN: Duration = Duration::from_secs(20);

/// A builder over `servers` with the tests' node timeout and no retries; the masters whose
/// index is in `allowed` may evict.
fn builder(servers: &[&RedisServer], allowed: &[usize]) -> RedlockBuilder {
    let allow = RedisNodeOptions::new().allow_eviction();
    servers
        .iter()
        .enumerate()
        .fold(Redlock::builder(), |b, (i, s)| {
            if allowed.contains(&i) {
                b.redis_with(&s.url(), &allow)
            } else {
                b.redis(&s.url())
            }
        })
        .node_timeout(NODE_TIMEOUT)
        .retry(Retry::never())
}

fn client(servers: &[&RedisServer], allowed: &[usize]) -> Redlock {
    builder(servers, allowed).build().expect("a valid client")
}

/// Whether `e` is a refusal because a master may evict under `policy`, with the fix in it.
fn refused_for_eviction(e: &Error, policy: &str) -> bool {
    let text = e.to_string();
    e.is_unavailable()
        && text.contains(&format!("maxmemory-policy {policy}"))
        && text.contains("abstains")
        && text.contains("noeviction")
        && text.contains("allow_eviction")
}

/// `(eviction_policy, evicts, is_abstaining)` of every node.
fn eviction_of(client: &Redlock) -> Vec<(Option<String>, bool, bool)> {
    client
        .node_status()
        .iter()
        .map(|s| {
            (
                s.eviction_policy().map(str::to_owned),
                s.evicts(),
                s.is_abstaining(),
            )
        })
        .collect()
}

/// Waits (bounded) until [`eviction_of`] is `expected`: a try decided by some voters does
/// not wait for the others' checks.
async fn eviction_settles(client: &Redlock, expected: &[(Option<String>, bool, bool)]) {
    eventually(format!("the nodes report {expected:?}"), WITHIN, || async {
        eviction_of(client) == expected
    })
    .await;
}

/// Two of three masters are caches: both abstain, so nobody gets a lock that their
/// evictions could hand to a second client (the scenario of
/// `eviction_allowed_breaks_exclusion`, refused up front).
#[tokio::test]
async fn eviction_never_lets_a_second_holder_in() {
    const KEY: &str = "eviction:payment:42";
    let m = Masters::start(3);
    make_cache(&m[0], "allkeys-lru").await;
    make_cache(&m[1], "allkeys-lru").await;
    let (a, b) = (m.client(), m.client());

    let e = a
        .try_lock(KEY, TTL)
        .await
        .expect_err("two abstaining voters");
    assert!(refused_for_eviction(&e, "allkeys-lru"), "{e}");
    let cache = (Some("allkeys-lru".to_owned()), true, true);
    let safe = (Some("noeviction".to_owned()), false, false);
    eviction_settles(&a, &[cache.clone(), cache, safe]).await;
    // The first requests went out beside the check: the failed try released what landed.
    eventually("nothing is left locked", WITHIN, || {
        m.absent_everywhere(KEY)
    })
    .await;
    let e = b.try_lock(KEY, TTL).await.expect_err("B is refused too");
    assert!(refused_for_eviction(&e, "allkeys-lru"), "{e}");
}

/// The same scenario with eviction allowed on the caches: they vote, A locks, memory
/// pressure evicts A's key from both, and B gets the lock while A's lease is valid. This
/// is what the opt-out costs (and what every voter did before the check).
#[tokio::test]
async fn eviction_allowed_breaks_exclusion() {
    const KEY: &str = "eviction:payment:43";
    let m = Masters::start(3);
    make_cache(&m[0], "allkeys-lru").await;
    make_cache(&m[1], "allkeys-lru").await;
    let servers = [&m[0], &m[1], &m[2]];
    let (a, b) = (client(&servers, &[0, 1]), client(&servers, &[0, 1]));

    let cache = (Some("allkeys-lru".to_owned()), true, false);
    let safe = (Some("noeviction".to_owned()), false, false);
    let warm = a
        .try_lock("eviction:warm-up", TTL)
        .await
        .expect("allowed: A locks");
    warm.release().await.expect("released");
    eviction_settles(&a, &[cache.clone(), cache, safe]).await;
    // A lease whose lock landed on every master (a grant decided at two need not have sent
    // the third request yet: then it is never sent, and A tries again).
    let mut tries = 0;
    let lease = loop {
        tries += 1;
        let lease = a.try_lock(KEY, TTL).await.expect("allowed: A locks");
        let everywhere = tokio::time::timeout(Duration::from_secs(2), async {
            while !m.everywhere(KEY, lease.value()).await {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        if everywhere.is_ok() {
            break lease;
        }
        assert!(tries < 20, "A's lock never landed on every master");
        lease.release().await.expect("released");
        eventually("released", WITHIN, || m.absent_everywhere(KEY)).await;
    };
    for cache in [&m[0], &m[1]] {
        fill_until_evicted(cache, KEY).await;
    }
    assert_eq!(
        m.values(KEY).await,
        [None, None, Some(lease.value().to_owned())],
        "A's key was evicted from both caches, and only from them"
    );

    let second = b.try_lock(KEY, TTL).await.expect("the caches vote for B");
    assert!(
        lease.is_valid(),
        "two holders at once: A's lease is valid for {:?} more",
        lease.validity()
    );
    assert_ne!(second.value(), lease.value());
}

/// One master of three is a cache: it abstains (a key that lands there beside its first
/// check does not count, so its eviction changes nothing), and the other two keep
/// exclusion.
#[tokio::test]
async fn eviction_a_minority_abstains_and_the_quorum_holds() {
    const KEY: &str = "eviction:payment:44";
    let m = Masters::start(3);
    make_cache(&m[0], "allkeys-random").await;
    let (a, b) = (m.client(), m.client());

    let lease = a.try_lock(KEY, TTL).await.expect("a quorum of two");
    let cache = (Some("allkeys-random".to_owned()), true, true);
    let safe = (Some("noeviction".to_owned()), false, false);
    eviction_settles(&a, &[cache, safe.clone(), safe]).await;
    assert!(m[1].get(KEY).await.as_deref() == Some(lease.value()));
    assert!(m[2].get(KEY).await.as_deref() == Some(lease.value()));
    // Whatever the cache holds or evicts, it votes for nobody.
    m[0].del(KEY).await;
    let e = b.try_lock(KEY, TTL).await.expect_err("A holds it");
    assert!(e.is_contended(), "{e}");
    lease.release().await.expect("released");
    eventually("released everywhere", WITHIN, || m.absent_everywhere(KEY)).await;
}

/// One master, a cache whose policy evicts only keys with a ttl (`volatile-lru`): a
/// completion record has one (its retention). The voter abstains from the replay acquire,
/// so no work runs whose record it could evict and then run again.
#[tokio::test]
async fn eviction_never_lets_work_run_twice() {
    const KEY: &str = "eviction:order:7";
    let server = RedisServer::start();
    make_cache(&server, "volatile-lru").await;
    let client = client(&[&server], &[]);

    let e = client
        .lock_unless_completed(KEY, TTL, Retry::never())
        .await
        .expect_err("the voter abstains");
    assert!(refused_for_eviction(&e, "volatile-lru"), "{e}");
    eventually("nothing is left locked, nothing stored", WITHIN, || async {
        server.dbsize().await == 0
    })
    .await;

    // With eviction allowed the record is stored, evicted under pressure, and the work runs
    // a second time.
    let allowed = builder(&[&server], &[0]).build().expect("a client");
    let LockOrRecord::Locked(lease) = allowed
        .lock_unless_completed(KEY, TTL, Retry::never())
        .await
        .expect("allowed: the first run locks")
    else {
        panic!("nothing ran before");
    };
    lease
        .complete("shipped: parcel 1", DAY)
        .await
        .expect("stored");
    fill_until_evicted(&server, &format!("{KEY}:record")).await;
    let again = allowed
        .lock_unless_completed(KEY, TTL, Retry::never())
        .await;
    assert!(
        matches!(again, Ok(LockOrRecord::Locked(_))),
        "allowed, the evicted record lets the work run again: {again:?}"
    );
}
