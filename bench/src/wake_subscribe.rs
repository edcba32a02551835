//! The wake-up bench's subscriber section (`benches/wake.rs`,
//! `REDLOCK_BENCH_WAKE_SUBSCRIBE`): how fast one voter's subscriber follows many keys that
//! become contended at once, and lets them go.
//!
//! With `wake_waiters(true)`, each voter has one subscriber connection that `SUBSCRIBE`s to a
//! key's channels (the key, and its keyspace channel `__keyspace@<db>__:<key>`) once the key
//! has a waiter in the client, and `UNSUBSCRIBE`s when its last waiter leaves. Each round, on
//! 3 masters this section starts:
//!
//! 1. K keys are held by "another client" (`SET key <token> NX PX 300000`, pipelined, on every
//!    master); the client with the wake-up (node timeout 500 ms) first tries them once each,
//!    all at once (`try_lock`: no waiter, no subscription), timed: a bound on what the
//!    waiters' first tries cost in the next step;
//! 2. **subscribe**: one waiter task per key is spawned, all at once (`lock_with(key, 10 s,
//!    Retry::until(4 × deadline).delay(2 × deadline))`: after its first, failed try each
//!    waits and does not poll); timed from the spawn until every master counts `K ×
//!    channels per key` subscribed channels (`INFO stats`' `pubsub_channels`, polled every
//!    5 ms; the channels per key are found in a warm-up), then checked key by key
//!    (`PUBSUB NUMSUB`, untimed);
//! 3. **unsubscribe**: every waiter task is aborted; timed until no master counts a
//!    subscribed channel.
//!
//! The rate of a phase is K over the time of its **slowest voter** (each voter's subscriber
//! works on its own connection, in parallel with the others): keys per second per voter (a
//! key is all its channels). The fastest voter's rate is shown too. Every wait has a
//! deadline (`REDLOCK_BENCH_WAKE_DEADLINE_S`, 60 s): past it the bench panics ("could not set
//! up"), and the masters are stopped as the stack unwinds.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use redis::aio::MultiplexedConnection;
use tokio::task::JoinHandle;
use tower_redlock::{Redlock, Retry};
use tower_redlock_testkit::proxy::{Fault, FaultProxy};
use tower_redlock_testkit::Masters;

use crate::{fmt_dur, fmt_rate, median};

/// How often the masters' channel counts are polled.
const POLL: Duration = Duration::from_millis(5);
/// The masters of the section.
const MASTERS: usize = 3;
/// The node timeout of the client with the wake-up: generous, so that K tries at once on a
/// busy machine fail for the holder, not for a timeout.
const NODE_TIMEOUT: Duration = Duration::from_millis(500);
/// The lock ttl the waiters ask for (they never get the lock).
const TTL: Duration = Duration::from_secs(10);
/// How many channel names one `PUBSUB NUMSUB` asks about.
const NUMSUB_BATCH: usize = 500;

/// The section's settings, from the environment.
#[derive(Debug, Clone, Copy)]
pub struct Settings {
    /// `REDLOCK_BENCH_WAKE_KEYS` (2000): the keys contended at once.
    pub keys: usize,
    /// `REDLOCK_BENCH_ROUNDS` (3).
    pub rounds: usize,
    /// `REDLOCK_BENCH_WAKE_DEADLINE_S` (60): the bound of every wait.
    pub deadline: Duration,
    /// `REDLOCK_BENCH_WAKE_RTT_US` (0): a round trip added between the waiters' client and
    /// each master (a testkit `FaultProxy`, half of it each way), as between hosts.
    pub rtt: Duration,
}

impl Settings {
    pub fn from_env() -> Self {
        let num = |name: &str, default: u64| {
            std::env::var(name).map_or(default, |v| {
                v.trim()
                    .parse()
                    .unwrap_or_else(|_| panic!("{name}: a number"))
            })
        };
        Self {
            keys: num("REDLOCK_BENCH_WAKE_KEYS", 2000).max(1) as usize,
            rounds: num("REDLOCK_BENCH_ROUNDS", 3).max(1) as usize,
            deadline: Duration::from_secs(num("REDLOCK_BENCH_WAKE_DEADLINE_S", 60).max(1)),
            rtt: Duration::from_micros(num("REDLOCK_BENCH_WAKE_RTT_US", 0)),
        }
    }
}

/// One round's times: the first tries, and each voter's subscribe and unsubscribe.
struct Round {
    tries: Duration,
    subscribe: Vec<Duration>,
    unsubscribe: Vec<Duration>,
}

/// Runs the section and writes its table to `o`.
pub async fn run(o: &mut String, s: Settings) {
    let started = Instant::now();
    let masters = Masters::start(MASTERS);
    let urls = masters.urls();
    let mut conns = Vec::with_capacity(MASTERS);
    for url in &urls {
        conns.push(connect(url).await);
    }
    // With a round trip to add, the waiters' client reaches each master through a proxy.
    let mut proxies = Vec::new();
    let waiter_urls = if s.rtt.is_zero() {
        urls.clone()
    } else {
        for m in masters.iter() {
            let proxy = FaultProxy::start(([127, 0, 0, 1], m.port()).into()).await;
            proxy.set(Fault::Latency(s.rtt / 2));
            proxies.push(proxy);
        }
        proxies.iter().map(FaultProxy::url).collect()
    };
    let waiter = crate::wake::client(&waiter_urls, NODE_TIMEOUT, true);
    let per_key = warm_up(&waiter, &conns, s.deadline).await;
    let mut rounds = Vec::with_capacity(s.rounds);
    for r in 0..s.rounds {
        rounds.push(round(&waiter, &conns, s, per_key, r).await);
    }
    drop(waiter);
    drop(proxies);
    drop(masters);

    let k = s.keys as f64;
    let secs = |f: &dyn Fn(&Round) -> Duration| -> Vec<f64> {
        rounds.iter().map(|r| f(r).as_secs_f64()).collect()
    };
    let slowest = |v: &[Duration]| v.iter().copied().max().unwrap_or_default();
    let fastest = |v: &[Duration]| v.iter().copied().min().unwrap_or_default();
    let row = |o: &mut String, phase: &str, times: Vec<f64>, fast: Option<Vec<f64>>| {
        let (lo, hi) = range(&times);
        let rates: Vec<f64> = times.iter().map(|t| k / t.max(1e-9)).collect();
        let (rlo, rhi) = range(&rates);
        // The first tries have no rate of a voter's subscriber (nor a fastest voter).
        let (rate, fast) = match fast {
            None => ("—".into(), "—".into()),
            Some(f) => {
                let fast: Vec<f64> = f.iter().map(|t| k / t.max(1e-9)).collect();
                (
                    format!(
                        "{} ({}–{})",
                        fmt_rate(median(&rates)),
                        fmt_rate(rlo),
                        fmt_rate(rhi)
                    ),
                    fmt_rate(median(&fast)),
                )
            }
        };
        writeln!(
            o,
            "| {phase} | {} ({}–{}) | {rate} | {fast} |",
            fmt_secs(median(&times)),
            fmt_secs(lo),
            fmt_secs(hi),
        )
        .unwrap();
    };
    writeln!(
        o,
        "\n### Wake: the subscriber: K = {} keys contended at once, {MASTERS} masters, {} rounds \
         ({per_key} channels per key, {:?} round trip added)\n\n\
         | phase | time p50 (range) | keys/s per voter, slowest voter, p50 (range) | \
         keys/s, fastest voter, p50 |\n|---|---|---|---|",
        s.keys, s.rounds, s.rtt
    )
    .unwrap();
    row(
        o,
        "first tries alone: K failed `try_lock`s at once",
        secs(&|r| r.tries),
        None,
    );
    row(
        o,
        "subscribe: K waiters spawned → every key's channels subscribed",
        secs(&|r| slowest(&r.subscribe)),
        Some(secs(&|r| fastest(&r.subscribe))),
    );
    row(
        o,
        "unsubscribe: K waiters aborted → no channel left",
        secs(&|r| slowest(&r.unsubscribe)),
        Some(secs(&|r| fastest(&r.unsubscribe))),
    );
    writeln!(o, "\nThe section took {}.", fmt_dur(started.elapsed())).unwrap();
}

/// The lowest and highest of `v`.
fn range(v: &[f64]) -> (f64, f64) {
    v.iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &x| {
            (lo.min(x), hi.max(x))
        })
}

fn fmt_secs(s: f64) -> String {
    fmt_dur(Duration::from_secs_f64(s.max(0.0)))
}

/// A raw connection to a master, with a response timeout long enough for pipelines of
/// thousands of commands on a busy machine.
async fn connect(url: &str) -> MultiplexedConnection {
    let config = redis::AsyncConnectionConfig::new()
        .set_response_timeout(Some(Duration::from_secs(10)))
        .set_connection_timeout(Some(Duration::from_secs(5)));
    redis::Client::open(url)
        .expect("a valid url")
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .unwrap_or_else(|e| panic!("could not set up: cannot connect to {url}: {e}"))
}

/// The subscribed channels a master counts (`INFO stats`' `pubsub_channels`).
async fn channels(conn: &MultiplexedConnection) -> u64 {
    let mut conn = conn.clone();
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(&mut conn)
        .await
        .expect("INFO stats");
    info.lines()
        .find_map(|l| l.strip_prefix("pubsub_channels:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("INFO stats has pubsub_channels")
}

/// Polls every master's channel count until `done` holds on all of them: the time from `t0`
/// to each master's first such poll. Panics past `deadline`.
async fn until_all(
    conns: &[MultiplexedConnection],
    t0: Instant,
    deadline: Duration,
    what: &str,
    done: impl Fn(u64) -> bool,
) -> Vec<Duration> {
    let mut at: Vec<Option<Duration>> = vec![None; conns.len()];
    loop {
        let counts = join_all(conns.iter().map(channels)).await;
        let now = t0.elapsed();
        for (slot, &count) in at.iter_mut().zip(&counts) {
            if slot.is_none() && done(count) {
                *slot = Some(now);
            }
        }
        if at.iter().all(Option::is_some) {
            return at.into_iter().flatten().collect();
        }
        if now > deadline {
            panic!(
                "could not set up: {what}: not done within {deadline:?} \
                 (subscribed channels per master: {counts:?})"
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// `SET key token NX PX 300000` for every key on every master, pipelined: the holder.
async fn hold(conns: &[MultiplexedConnection], keys: &[String]) {
    let token = uuid::Uuid::new_v4().to_string();
    let set = join_all(conns.iter().map(|c| {
        let mut c = c.clone();
        let mut pipe = redis::pipe();
        for key in keys {
            pipe.cmd("SET")
                .arg(key)
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(300_000);
        }
        async move {
            let replies: Vec<Option<String>> =
                pipe.query_async(&mut c).await.expect("the holder's SETs");
            replies.iter().filter(|r| r.is_some()).count()
        }
    }))
    .await;
    assert!(
        set.iter().all(|&n| n == keys.len()),
        "could not set up: the holder set {set:?} of {} keys per master",
        keys.len()
    );
}

/// `FLUSHDB` on every master.
async fn flush(conns: &[MultiplexedConnection]) {
    for c in conns {
        let mut c = c.clone();
        let () = redis::cmd("FLUSHDB")
            .query_async(&mut c)
            .await
            .expect("FLUSHDB");
    }
}

/// One waiter per key, spawned at once; each waits without polling.
fn waiters(redlock: &Redlock, keys: &[String], deadline: Duration) -> Vec<JoinHandle<()>> {
    keys.iter()
        .map(|key| {
            let (redlock, key) = (redlock.clone(), key.clone());
            tokio::spawn(async move {
                let retry = Retry::until(deadline * 4).delay(deadline * 2);
                let _ = redlock.lock_with(&key, TTL, retry).await;
            })
        })
        .collect()
}

/// Panics when a waiter's call ended before it was aborted (it would not be waiting).
fn all_waiting(handles: &[JoinHandle<()>]) {
    if let Some(i) = handles.iter().position(JoinHandle::is_finished) {
        panic!("could not set up: waiter {i}'s lock call ended while it should wait");
    }
}

/// Aborts `handles` and waits until they end.
async fn abort(handles: Vec<JoinHandle<()>>) {
    for h in &handles {
        h.abort();
    }
    for h in handles {
        let _ = h.await;
    }
}

/// The client's subscribers connected (one waiter, until its key's channel is subscribed on
/// every master), and the channels a key takes on a master (the key's, and its keyspace
/// channel's: counted once the key's own channel is there and the count is steady).
async fn warm_up(redlock: &Redlock, conns: &[MultiplexedConnection], deadline: Duration) -> u64 {
    let key = "bench:wake:sub:warm".to_owned();
    let keys = std::slice::from_ref(&key);
    hold(conns, keys).await;
    let t0 = Instant::now();
    let handles = waiters(redlock, keys, deadline);
    until_all(conns, t0, deadline, "warm-up: one key subscribed", |n| {
        n >= 1
    })
    .await;
    // The key's other channels follow at once (the same connection, in order).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let counts = join_all(conns.iter().map(channels)).await;
    all_waiting(&handles);
    let mut subscribed = numsub(conns, keys).await;
    subscribed.sort_unstable();
    assert!(
        subscribed.iter().all(|&n| n == 1) && counts.iter().all(|&n| n == counts[0] && n >= 1),
        "could not set up: warm-up: the key's channel has {subscribed:?} subscribers, the \
         masters count {counts:?} channels"
    );
    abort(handles).await;
    until_all(
        conns,
        Instant::now(),
        deadline,
        "warm-up: unsubscribed",
        |n| n == 0,
    )
    .await;
    flush(conns).await;
    counts[0]
}

/// The subscribers of each key's own channel on each master (`PUBSUB NUMSUB`, in batches).
async fn numsub(conns: &[MultiplexedConnection], keys: &[String]) -> Vec<i64> {
    let mut out = Vec::with_capacity(conns.len() * keys.len());
    for c in conns {
        let mut c = c.clone();
        for batch in keys.chunks(NUMSUB_BATCH) {
            let counts: std::collections::HashMap<String, i64> = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(batch)
                .query_async(&mut c)
                .await
                .expect("PUBSUB NUMSUB");
            out.extend(batch.iter().map(|k| counts.get(k).copied().unwrap_or(0)));
        }
    }
    out
}

async fn round(
    redlock: &Redlock,
    conns: &[MultiplexedConnection],
    s: Settings,
    per_key: u64,
    r: usize,
) -> Round {
    let keys: Vec<String> = (0..s.keys)
        .map(|i| format!("bench:wake:sub:{r}:{i}"))
        .collect();
    hold(conns, &keys).await;
    until_all(
        conns,
        Instant::now(),
        s.deadline,
        "no channel before",
        |n| n == 0,
    )
    .await;

    // The first tries alone: K failed tries at once, no waiter.
    let t0 = Instant::now();
    let tries = join_all(keys.iter().map(|key| {
        let redlock = redlock.clone();
        let key = key.clone();
        tokio::spawn(async move { redlock.try_lock(&key, TTL).await.is_ok() })
    }));
    let granted = tokio::time::timeout(s.deadline, tries)
        .await
        .expect("could not set up: the first tries took longer than the deadline")
        .into_iter()
        .filter(|t| *t.as_ref().expect("a try"))
        .count();
    let tries = t0.elapsed();
    assert_eq!(granted, 0, "could not set up: a held key was granted");

    // Subscribe.
    let want = per_key * s.keys as u64;
    let t0 = Instant::now();
    let handles = waiters(redlock, &keys, s.deadline);
    let subscribe = until_all(conns, t0, s.deadline, "subscribe", |n| n >= want).await;
    all_waiting(&handles);
    let counts = numsub(conns, &keys).await;
    let wrong = counts.iter().filter(|&&n| n != 1).count();
    assert_eq!(
        wrong,
        0,
        "could not set up: {wrong} of {} key channels do not have one subscriber",
        counts.len()
    );

    // Unsubscribe.
    let t0 = Instant::now();
    for h in &handles {
        h.abort();
    }
    let unsubscribe = until_all(conns, t0, s.deadline, "unsubscribe", |n| n == 0).await;
    abort(handles).await;
    flush(conns).await;
    Round {
        tries,
        subscribe,
        unsubscribe,
    }
}
