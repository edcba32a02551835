//! Eviction: a master that may evict keys under memory pressure (`maxmemory` with an
//! `allkeys-*` or `volatile-*` policy — a Redis shared with a cache) can drop a lock or a
//! completion record before its ttl, and then a second holder or a second run follows.
//!
//! Each test makes real masters into caches (a `maxmemory` a little above what they use,
//! and an evicting policy), then writes junk until the key in question is really evicted.

use std::time::Duration;

use tower_redlock::{Claim, Redlock, Retry};
use tower_redlock_testkit as support;

use support::{Masters, RedisServer, NODE_TIMEOUT};

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

/// Two of three masters are caches. A holds a lock; memory pressure evicts A's key from
/// both caches; B must still not get the lock while A's lease is valid.
#[tokio::test]
async fn eviction_never_lets_a_second_holder_in() {
    const KEY: &str = "eviction:payment:42";
    let m = Masters::start(3);
    make_cache(&m[0], "allkeys-lru").await;
    make_cache(&m[1], "allkeys-lru").await;
    let (a, b) = (m.client(), m.client());

    let lease = a.try_lock(KEY, TTL).await.expect("A locks");
    assert!(m.everywhere(KEY, lease.value()).await);
    for cache in [&m[0], &m[1]] {
        fill_until_evicted(cache, KEY).await;
    }
    assert_eq!(
        m.values(KEY).await,
        [None, None, Some(lease.value().to_owned())],
        "A's key was evicted from both caches, and only from them"
    );

    let second = b.try_lock(KEY, TTL).await;
    assert!(lease.is_valid(), "A's lease is still valid");
    assert!(
        second.is_err(),
        "B got the lock while A's lease is valid for {:?} more: two caches evicted A's key \
         and voted for B",
        lease.validity()
    );
}

/// One master, a cache whose policy evicts only keys with a ttl (`volatile-lru`): a
/// completion record has one (its retention). Once the work is done and its record
/// evicted, the same work must not run again.
#[tokio::test]
async fn eviction_never_lets_work_run_twice() {
    const KEY: &str = "eviction:order:7";
    let server = RedisServer::start();
    make_cache(&server, "volatile-lru").await;
    let client = Redlock::builder()
        .redis(&server.url())
        .node_timeout(NODE_TIMEOUT)
        .retry(Retry::never())
        .build()
        .expect("a valid client");

    match client
        .lock_unless_completed(KEY, TTL, Retry::never())
        .await
        .expect("the first run locks")
    {
        Claim::Locked(lease) => lease
            .complete("shipped: parcel 1", DAY)
            .await
            .expect("the record is stored"),
        Claim::Completed(_) => panic!("nothing ran before"),
    }
    fill_until_evicted(&server, &format!("{KEY}:record")).await;

    let again = client.lock_unless_completed(KEY, TTL, Retry::never()).await;
    assert!(
        !matches!(again, Ok(Claim::Locked(_))),
        "the work runs a second time: the master evicted its completion record"
    );
}
