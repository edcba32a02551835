//! Redis: [`FencedRedis`] against real `redis-server` processes, with the tokens of a real
//! Redlock (`.fencing(true)` over three masters) where the order of holders matters.
//! Every test name starts with `fenced_store_redis_`.
//!
//! Sequential holders (both write, the same holder twice, over a master and over a separate
//! data Redis, after `SCRIPT FLUSH`), the paused holder refused after the next one wrote —
//! for `set`, `hset` and `xadd` —, contended writers with paused ones checked from the
//! stream's history, tokens compared as numbers, foreign values and wrong types refused
//! (nothing written), and (feature `cluster`) a hash-tagged key on a real Cluster.

use tower_redlock_testkit as support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::ErrorKind;
use support::{warm_up, Masters, RedisServer};
use tower_redlock::fenced::{FencedRedis, StaleToken};
use tower_redlock::{Lease, Redlock, Retry};

const TTL: Duration = Duration::from_secs(10);

pub(super) async fn fencing_client(m: &Masters) -> Redlock {
    let redlock = m.builder().fencing(true).build().expect("a valid client");
    warm_up(&redlock, m).await;
    redlock
}

/// The lock on `resource`, retried until the last holder's lock expired.
pub(super) async fn lock_when_free(redlock: &Redlock, resource: &str, ttl: Duration) -> Lease {
    redlock
        .lock_with(
            resource,
            ttl,
            Retry::times(200).delay(Duration::from_millis(20)),
        )
        .await
        .expect("the lock, once the last holder's expired")
}

pub(super) async fn store(server: &RedisServer) -> FencedRedis<MultiplexedConnection> {
    FencedRedis::new(server.conn().await)
}

/// The three kinds of fenced write, each to a key of its own.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Set,
    Hset,
    Xadd,
}

impl Kind {
    /// Writes `value` with `token`: the value, the hash's field `status`, or an entry
    /// `status = value`.
    async fn write<C: ConnectionLike>(
        self,
        store: &mut FencedRedis<C>,
        key: &str,
        value: &str,
        token: u64,
    ) -> Result<(), StaleToken> {
        let reply = match self {
            Kind::Set => store.set(key, value, token).await,
            Kind::Hset => store.hset(key, "status", value, token).await,
            Kind::Xadd => {
                let id = store.xadd(key, &[("status", value)], token).await;
                id.map(|id| id.map(|id| assert!(id.contains('-'), "a stream id: {id}")))
            }
        };
        reply.unwrap_or_else(|e| panic!("{self:?} {key} with {token}: {e}"))
    }

    /// What the data says now: the value, the field, or the last entry's `status`.
    async fn read(self, server: &RedisServer, key: &str) -> Option<String> {
        match self {
            Kind::Set => server.get(key).await,
            Kind::Hset => {
                server
                    .query(redis::cmd("HGET").arg(key).arg("status"))
                    .await
            }
            Kind::Xadd => entries(server, key).await.last().map(|e| e.field("status")),
        }
    }
}

/// A stream entry: its id and its fields.
struct Entry(String, Vec<String>);

impl Entry {
    fn field(&self, name: &str) -> String {
        let fields = &self.1;
        let at = fields.chunks(2).position(|p| p[0] == name);
        at.map(|i| fields[2 * i + 1].clone())
            .unwrap_or_else(|| panic!("entry {} has no {name}: {fields:?}", self.0))
    }
}

/// `XRANGE key - +`.
async fn entries(server: &RedisServer, key: &str) -> Vec<Entry> {
    let raw: Vec<(String, Vec<String>)> = server
        .query(redis::cmd("XRANGE").arg(key).arg("-").arg("+"))
        .await;
    raw.into_iter().map(|(id, f)| Entry(id, f)).collect()
}

/// Two holders one after the other, from two clients of one fenced Redlock: each writes
/// (the first twice with its token, the second after the first released), every kind, to
/// data kept on one of the lock's own masters — and once more after `SCRIPT FLUSH` (the
/// `EVAL` fallback).
#[tokio::test]
async fn fenced_store_redis_sequential_holders_both_write() {
    let m = Masters::start(3);
    let (a, b) = (fencing_client(&m).await, fencing_client(&m).await);
    let mut data = store(&m[0]).await;
    let key = |kind: Kind| format!("{{order:1}}:{kind:?}");

    let first = a.try_lock("order:1", TTL).await.unwrap();
    let t1 = first.fencing_token().expect("fencing is on");
    for kind in [Kind::Set, Kind::Hset, Kind::Xadd] {
        assert_eq!(data.fence(&key(kind)).await.unwrap(), None);
        kind.write(&mut data, &key(kind), "first", t1)
            .await
            .unwrap();
        // The same holder writes again with its token.
        kind.write(&mut data, &key(kind), "first, again", t1)
            .await
            .unwrap();
        assert_eq!(data.fence(&key(kind)).await.unwrap(), Some(t1));
    }
    first.release().await.unwrap();

    let second = b.try_lock("order:1", TTL).await.unwrap();
    let t2 = second.fencing_token().unwrap();
    assert!(t2 > t1, "{t2} after {t1}");
    m[0].script_flush().await;
    for kind in [Kind::Set, Kind::Hset, Kind::Xadd] {
        kind.write(&mut data, &key(kind), "second", t2)
            .await
            .unwrap();
        assert_eq!(
            kind.read(&m[0], &key(kind)).await.as_deref(),
            Some("second")
        );
        assert_eq!(data.fence(&key(kind)).await.unwrap(), Some(t2));
        // Stored beside the data, tagged.
        let token_key = data.token_key(&key(kind));
        assert_eq!(m[0].get(&token_key).await, Some(format!("TRW1:{t2}")));
        assert_eq!(m[0].pttl(&token_key).await, -1, "kept as long as the data");
    }
    let log = entries(&m[0], &key(Kind::Xadd)).await;
    let statuses: Vec<_> = log.iter().map(|e| e.field("status")).collect();
    assert_eq!(statuses, ["first", "first, again", "second"]);
    second.release().await.unwrap();
}

/// Kleppmann's scenario with `kind`: holder 1 writes, pauses until its lease expired; holder
/// 2 takes the lock and writes; holder 1's late write is refused with holder 2's token as
/// the stored one, and the data keeps holder 2's value. The data lives in a Redis of its
/// own, reached through a `ConnectionManager`.
async fn paused_holder_refused(kind: Kind) {
    let m = Masters::start(3);
    let server = RedisServer::start();
    let conn = redis::Client::open(server.url())
        .unwrap()
        .get_connection_manager()
        .await
        .unwrap();
    let mut data = FencedRedis::new(conn);
    let (paused_client, next_client) = (fencing_client(&m).await, fencing_client(&m).await);
    let key = "{order:7}";
    let short = Duration::from_millis(300);

    // (Retried: on a loaded machine one try may leave no validity of a 300 ms ttl.)
    let paused = lock_when_free(&paused_client, "order:7", short).await;
    let stale = paused.fencing_token().unwrap();
    kind.write(&mut data, key, "before the pause", stale)
        .await
        .unwrap();
    // "The pause": holder 1 does nothing while its lock expires and holder 2 takes it.
    let next = lock_when_free(&next_client, "order:7", short).await;
    assert!(!paused.is_valid());
    let token = next.fencing_token().unwrap();
    assert!(token > stale, "{token} after {stale}");
    kind.write(&mut data, key, "written by holder 2", token)
        .await
        .unwrap();

    let late = kind
        .write(&mut data, key, "holder 1's late write", stale)
        .await;
    assert_eq!(late, Err(StaleToken::new(stale, token)), "{kind:?}");
    assert_eq!(
        kind.read(&server, key).await.as_deref(),
        Some("written by holder 2")
    );
    assert_eq!(data.fence(key).await.unwrap(), Some(token));
    if let Kind::Xadd = kind {
        let statuses: Vec<_> = entries(&server, key).await;
        assert_eq!(statuses.len(), 2, "the late entry was appended");
    }
    next.release().await.unwrap();
}

#[tokio::test]
async fn fenced_store_redis_stale_writer_refused_after_a_newer_write_set() {
    paused_holder_refused(Kind::Set).await;
}

#[tokio::test]
async fn fenced_store_redis_stale_writer_refused_after_a_newer_write_hset() {
    paused_holder_refused(Kind::Hset).await;
}

#[tokio::test]
async fn fenced_store_redis_stale_writer_refused_after_a_newer_write_xadd() {
    paused_holder_refused(Kind::Xadd).await;
}

/// What the contended writers saw.
#[derive(Default)]
struct Seen {
    /// The `set`s that landed, in the order their writer saw them land: (token, value).
    sets: Vec<(u64, String)>,
    /// The `xadd`s that landed.
    appended: usize,
    /// The refusals (of either write).
    refused: usize,
}

/// Six writers of three clients fight over one resource with a short ttl; every lease writes
/// twice (a `set` of the last writer, then an entry in the log), and every third lease pauses
/// between its two writes until past its validity and a newer holder wrote. From the log's
/// history: tokens never go down, and grow strictly whenever the writer changed; some writes
/// landed and some were refused; the value and the fences are the last holder's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_store_redis_contended_writers_never_go_back() {
    const LEASES: usize = 36;
    const LOG: &str = "{account:9}:log";
    const LAST: &str = "{account:9}:last";
    let m = Masters::start(3);
    let server = RedisServer::start();
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(fencing_client(&m).await);
    }
    let ttl = Duration::from_millis(200);
    let taken = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(Mutex::new(Seen::default()));

    let mut tasks = Vec::new();
    for i in 0..6 {
        let redlock = clients[i % 3].clone();
        let (taken, seen) = (taken.clone(), seen.clone());
        let mut data = store(&server).await;
        tasks.push(tokio::spawn(async move {
            let retry = Retry::times(200)
                .delay(Duration::from_millis(5))
                .jitter(Duration::from_millis(5));
            while taken.load(Ordering::SeqCst) < LEASES {
                let Ok(lease) = redlock.lock_with("account:9", ttl, retry).await else {
                    continue;
                };
                let n = taken.fetch_add(1, Ordering::SeqCst);
                let token = lease.fencing_token().unwrap();
                let writer = lease.value().to_owned();
                write_both(&mut data, &seen, &writer, token, 0).await;
                if n % 3 == 0 && n < LEASES - 3 {
                    // The pause: past the lease's validity (its lock expires on the masters),
                    // then until a newer holder wrote — or 3 s without one.
                    tokio::time::sleep_until((lease.deadline() + ttl / 2).into()).await;
                    let start = Instant::now();
                    while data.fence(LOG).await.unwrap().unwrap_or(0) <= token
                        && start.elapsed() < Duration::from_secs(3)
                    {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                } else {
                    tokio::task::yield_now().await;
                }
                write_both(&mut data, &seen, &writer, token, 1).await;
                let _ = lease.release().await;
            }
        }));
    }
    for t in tasks {
        t.await.expect("no writer panicked");
    }

    let seen = std::mem::take(&mut *seen.lock().unwrap());
    let log = entries(&server, LOG).await;
    let history: Vec<(u64, String)> = log
        .iter()
        .map(|e| (e.field("token").parse().unwrap(), e.field("writer")))
        .collect();
    for w in history.windows(2) {
        let ((t0, w0), (t1, w1)) = (&w[0], &w[1]);
        assert!(t1 >= t0, "the log went back: {t0} then {t1}");
        assert!(w0 == w1 || t1 > t0, "a new writer with {t1} after {t0}");
    }
    eprintln!(
        "{} entries, {} sets landed, {} writes refused",
        log.len(),
        seen.sets.len(),
        seen.refused
    );
    assert_eq!(
        log.len(),
        seen.appended,
        "every landed append is in the log"
    );
    assert!(log.len() >= LEASES, "{} entries", log.len());
    // A stale write that landed would have sent the log back (checked above); none refused
    // means no paused writer came back after a newer one wrote: no scenario.
    assert!(
        seen.refused > 0,
        "could not set up the scenario: no paused writer came back after a newer one wrote"
    );
    let max = history.iter().map(|h| h.0).max().unwrap();
    let data = &mut store(&server).await;
    assert_eq!(data.fence(LOG).await.unwrap(), Some(max));
    // The value is the last `set` of the largest token that landed one (`max_by_key`: the
    // last of equal maxima).
    let (top, last) = seen.sets.iter().max_by_key(|s| s.0).unwrap();
    assert_eq!(server.get(LAST).await.as_ref(), Some(last));
    assert_eq!(data.fence(LAST).await.unwrap(), Some(*top));
}

/// One lease's write `n`: the last writer's value, then a log entry.
async fn write_both(
    data: &mut FencedRedis<MultiplexedConnection>,
    seen: &Mutex<Seen>,
    writer: &str,
    token: u64,
    n: u8,
) {
    let value = format!("{writer}/{n}");
    let set = data.set("{account:9}:last", &value, token).await.unwrap();
    let fields = [
        ("writer", writer.to_owned()),
        ("token", token.to_string()),
        ("n", n.to_string()),
    ];
    let append = data.xadd("{account:9}:log", &fields, token).await.unwrap();
    let mut seen = seen.lock().unwrap();
    match set {
        Ok(()) => seen.sets.push((token, value)),
        Err(stale) => refused(&mut seen, stale, token),
    }
    match append {
        Ok(_) => seen.appended += 1,
        Err(stale) => refused(&mut seen, stale, token),
    }
}

fn refused(seen: &mut Seen, stale: StaleToken, token: u64) {
    assert_eq!(stale.token(), token);
    assert!(stale.stored() > token, "refused {token} beside {stale:?}");
    seen.refused += 1;
}

/// Tokens are compared as numbers, for any `u64` (the scripts compare decimal strings:
/// length first), and an equal token is accepted.
#[tokio::test]
async fn fenced_store_redis_tokens_compare_as_numbers() {
    let server = RedisServer::start();
    let mut data = store(&server).await;
    let k = "{n}";
    for (token, stored) in [(0, None), (9, Some(0)), (10, Some(9)), (10, Some(10))] {
        assert_eq!(data.fence(k).await.unwrap(), stored);
        data.set(k, token.to_string(), token)
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(
        data.set(k, "x", 9).await.unwrap(),
        Err(StaleToken::new(9, 10))
    );
    assert_eq!(
        data.set(k, "x", 1).await.unwrap(),
        Err(StaleToken::new(1, 10))
    );
    data.set(k, "100", 100).await.unwrap().unwrap();
    assert_eq!(
        data.set(k, "x", 99).await.unwrap(),
        Err(StaleToken::new(99, 100))
    );
    data.set(k, "max", u64::MAX).await.unwrap().unwrap();
    let below = u64::MAX - 1;
    assert_eq!(
        data.set(k, "x", below).await.unwrap(),
        Err(StaleToken::new(below, u64::MAX))
    );
    assert_eq!(server.get(k).await.as_deref(), Some("max"));
    assert_eq!(data.fence(k).await.unwrap(), Some(u64::MAX));
}

/// A foreign value at the token key — a string without the tag, another type — is refused
/// with `WRONGTYPE`, neither the data nor the value written; `fence` says so too.
#[tokio::test]
async fn fenced_store_redis_foreign_value_at_the_token_key_refused() {
    let server = RedisServer::start();
    let mut data = store(&server).await;
    let (k, h) = ("{order:3}", "{order:4}");
    assert!(
        server
            .set_nx(&data.token_key(k), "a lock's value", None)
            .await
    );
    let _: i64 = server
        .query(redis::cmd("HSET").arg(data.token_key(h)).arg("f").arg("v"))
        .await;
    for key in [k, h] {
        for kind in [Kind::Set, Kind::Hset, Kind::Xadd] {
            let e = match kind {
                Kind::Set => data.set(key, "v", 5).await.map(drop),
                Kind::Hset => data.hset(key, "f", "v", 5).await.map(drop),
                Kind::Xadd => data.xadd(key, &[("f", "v")], 5).await.map(drop),
            }
            .expect_err("a foreign token key");
            assert_eq!(e.code(), Some("WRONGTYPE"), "{kind:?} {key}: {e}");
            assert!(e.to_string().contains("fencing token key"), "{e}");
        }
        assert_eq!(data.fence(key).await.unwrap_err().code(), Some("WRONGTYPE"));
        let exists: i64 = server.query(redis::cmd("EXISTS").arg(key)).await;
        assert_eq!(exists, 0, "{key} written beside a foreign token key");
    }
    assert_eq!(
        server.get(&data.token_key(k)).await.as_deref(),
        Some("a lock's value")
    );
    // A lookalike of the tag with no number is foreign too.
    assert!(server.set_nx("{order:5}:fenced-token", "TRW1:", None).await);
    let e = data.set("{order:5}", "v", 5).await.unwrap_err();
    assert_eq!(e.code(), Some("WRONGTYPE"), "{e}");
}

/// A write to a key of another type than its own is a `WRONGTYPE` error: nothing written,
/// not even a `set` over a hash (which a plain `SET` would replace), and no token stored.
/// An entry without fields is refused before anything is sent.
#[tokio::test]
async fn fenced_store_redis_wrong_type_at_the_data_key_is_an_error() {
    let server = RedisServer::start();
    let mut data = store(&server).await;
    assert!(server.set_nx("{s}", "a string", None).await);
    let _: i64 = server
        .query(redis::cmd("HSET").arg("{h}").arg("f").arg("v"))
        .await;
    let wrong = [
        (Kind::Set, "{h}"),
        (Kind::Hset, "{s}"),
        (Kind::Xadd, "{s}"),
        (Kind::Xadd, "{h}"),
    ];
    for (kind, key) in wrong {
        let e = match kind {
            Kind::Set => data.set(key, "v", 5).await.map(drop),
            Kind::Hset => data.hset(key, "f", "v", 5).await.map(drop),
            Kind::Xadd => data.xadd(key, &[("f", "v")], 5).await.map(drop),
        }
        .expect_err("a key of another type");
        assert_eq!(e.code(), Some("WRONGTYPE"), "{kind:?} {key}: {e}");
        assert_eq!(data.fence(key).await.unwrap(), None, "{kind:?} {key}");
    }
    assert_eq!(server.get("{s}").await.as_deref(), Some("a string"));
    let field: Option<String> = server.query(redis::cmd("HGET").arg("{h}").arg("f")).await;
    assert_eq!(field.as_deref(), Some("v"));
    let none: &[(&str, &str)] = &[];
    let e = data.xadd("{e}", none, 5).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Client, "{e}");
    assert_eq!(server.dbsize().await, 2);
}

/// On a real Redis Cluster, over redis-rs' cluster connection: a key with a hash tag has its
/// token key in its slot, and the writes and refusals work as on one server; a key without
/// one whose token key hashes elsewhere fails with `CROSSSLOT`, nothing written.
#[cfg(feature = "cluster")]
#[tokio::test]
async fn fenced_store_redis_cluster_key_with_a_hash_tag() {
    use support::cluster::Cluster;

    let c = Cluster::start(3);
    let urls = c
        .addrs()
        .iter()
        .map(|a| format!("redis://{a}"))
        .collect::<Vec<_>>();
    let conn = redis::cluster::ClusterClient::new(urls)
        .unwrap()
        .get_async_connection()
        .await
        .unwrap();
    let mut data = FencedRedis::new(conn);
    for key in ["{order:1}", "{order:1}:items", "{order:1}:events"] {
        assert_eq!(c.slot(key).await, c.slot(&data.token_key(key)).await);
    }
    data.set("{order:1}", "paid", 5).await.unwrap().unwrap();
    data.hset("{order:1}:items", "sku-7", "2", 5)
        .await
        .unwrap()
        .unwrap();
    let id = data.xadd("{order:1}:events", &[("status", "paid")], 5);
    id.await.unwrap().unwrap();
    let late = data.set("{order:1}", "late", 4).await.unwrap();
    assert_eq!(late, Err(StaleToken::new(4, 5)));
    assert_eq!(data.fence("{order:1}").await.unwrap(), Some(5));
    let owner = &c[c.node_for_key("{order:1}").await];
    assert_eq!(owner.get("{order:1}").await.as_deref(), Some("paid"));

    let untagged = "order:1";
    assert_ne!(
        c.slot(untagged).await,
        c.slot(&data.token_key(untagged)).await
    );
    let e = data.set(untagged, "paid", 5).await.unwrap_err();
    assert_eq!(e.code(), Some("CROSSSLOT"), "{e}");
    let owner = &c[c.node_for_key(untagged).await];
    assert_eq!(owner.get(untagged).await, None);
}
