//! The comparison runner: this crate side by side with the raw limit and the peer crates, in
//! one process, on masters it starts itself. Prints one markdown table per subject (the lock
//! clients, the HTTP layer) with ratios, and the issue's targets as met / not met.
//!
//! ```text
//! cargo bench -p tower-redlock-bench --bench compare
//! REDLOCK_BENCH_SCALE=3 REDLOCK_BENCH_ROUNDS=5 cargo bench -p tower-redlock-bench --bench compare   # longer, steadier
//! ```
//!
//! Settings (environment):
//! - `REDLOCK_BENCH_SCALE` (1.0): multiplies every duration and cycle count.
//! - `REDLOCK_BENCH_ROUNDS` (3): rounds; in each round every client runs every workload once,
//!   in a rotated order, so that a noisy moment hits all clients alike. Rates are the median
//!   of the rounds; latencies are pooled.
//! - `REDLOCK_BENCH_N` (`3,5`): the numbers of masters (`0`: skip the lock clients).
//! - `REDLOCK_BENCH_NODE_TIMEOUT_MS` (50): the per-node timeout of the limit and this crate.
//! - `REDLOCK_BENCH_PEERS` (`rslock,redlock`): the peer crates to run (empty: none).
//! - `REDLOCK_BENCH_LAYER` (1): 0 skips the HTTP layer section.
//! - `REDLOCK_BENCH_STALL` (1): 0 skips the stall workload (3 of 5 masters paused 300 ms
//!   under contention; the limit and this crate only, on 5 masters; see
//!   `bench/src/stall.rs`). Skipped too when `REDLOCK_BENCH_N` is `0`.
//! - `REDLOCK_BENCH_REPLAY` (1): 0 skips the replay workloads (idempotent work, one task at a
//!   time, on each N). Client level: this crate's lock cycle, a replay hit with
//!   `lock_unless_completed`, a first execution with `lock_unless_completed` +
//!   `Lease::complete` (see [`replay`]). HTTP level, when `REDLOCK_BENCH_LAYER` is on too: one
//!   axum app over real HTTP with a plain locked route and an idempotent (replay) route; a
//!   replay hit, a first execution and a plain locked request (see [`http_replay`]).
//! - `REDLOCK_BENCH_OUT`: also write the report (markdown) to this file.
//!
//! Run only by `cargo bench` (it does nothing without the `--bench` argument cargo passes),
//! never as a test.

use tower_redlock_bench as common;
use tower_redlock_testkit as support;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use common::stall::{Plan, Stall, MASTERS as STALL_MASTERS};
use common::{fmt_dur, fmt_rate, median, percentile, Extras, Latency, Limit, Locker, Rate};
use http_body_util::{BodyExt, Empty, Full};
use support::proxy::{Fault, FaultProxy};
use support::{HttpApp, Masters};
use tower::ServiceExt;
use tower_redlock::http::{IdempotencyKey, KeyExtractorExt, LockPolicy, REPLAYED_HEADER};
use tower_redlock::{Claim, Redlock, RedlockLayer, Retry};

#[derive(Debug, Clone)]
struct Settings {
    scale: f64,
    rounds: usize,
    ns: Vec<usize>,
    node_timeout: Duration,
    rslock: bool,
    redlock_rs: bool,
    layer: bool,
    stall: bool,
    replay: bool,
    out: Option<String>,
}

impl Settings {
    fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let peers =
            std::env::var("REDLOCK_BENCH_PEERS").unwrap_or_else(|_| "rslock,redlock".into());
        Self {
            scale: var("REDLOCK_BENCH_SCALE")
                .map_or(1.0, |v| v.parse().expect("REDLOCK_BENCH_SCALE: a number")),
            rounds: var("REDLOCK_BENCH_ROUNDS")
                .map_or(3, |v| v.parse().expect("REDLOCK_BENCH_ROUNDS: an integer")),
            ns: var("REDLOCK_BENCH_N").map_or(vec![3, 5], |v| {
                v.split(',')
                    .map(|n| n.trim().parse().expect("REDLOCK_BENCH_N: e.g. 3,5"))
                    .filter(|&n| n > 0)
                    .collect()
            }),
            node_timeout: Duration::from_millis(
                var("REDLOCK_BENCH_NODE_TIMEOUT_MS").map_or(50, |v| {
                    v.parse().expect("REDLOCK_BENCH_NODE_TIMEOUT_MS: ms")
                }),
            ),
            rslock: peers.split(',').any(|p| p.trim() == "rslock"),
            redlock_rs: peers.split(',').any(|p| p.trim() == "redlock"),
            layer: var("REDLOCK_BENCH_LAYER").is_none_or(|v| v != "0"),
            stall: var("REDLOCK_BENCH_STALL").is_none_or(|v| v != "0"),
            replay: var("REDLOCK_BENCH_REPLAY").is_none_or(|v| v != "0"),
            out: var("REDLOCK_BENCH_OUT"),
        }
    }

    fn dur(&self, secs: f64) -> Duration {
        Duration::from_secs_f64(secs * self.scale)
    }

    fn count(&self, n: usize) -> usize {
        ((n as f64) * self.scale).ceil().max(1.0) as usize
    }
}

/// The clients, in table order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Who {
    Limit,
    Ours,
    Rslock,
    RedlockRs,
}

impl Who {
    fn name(self) -> &'static str {
        match self {
            Who::Limit => "limit (raw redis-rs)",
            Who::Ours => "tower-redlock",
            Who::Rslock => "rslock 0.10",
            Who::RedlockRs => "redlock-rs 2.0",
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Who::Limit => "bench:limit",
            Who::Ours => "bench:ours",
            Who::Rslock => "bench:rslock",
            Who::RedlockRs => "bench:redlockrs",
        }
    }
}

/// A client of either kind.
#[derive(Clone)]
enum Client {
    Async(Locker),
    Sync(Arc<redlock::RedLock>),
}

/// Everything measured for one client at one N.
#[derive(Debug, Default)]
struct Row {
    /// Acquisitions only, each lock released in the background (a busy loop).
    healthy_acquire: Latency,
    healthy: Latency,
    many: Vec<Rate>,
    one_key: Vec<Rate>,
    slowed: Fault2,
    black: Fault2,
    keys_left: u64,
}

#[derive(Debug, Default)]
struct LayerRow {
    oneshot: Vec<Duration>,
    http1: Vec<Duration>,
    http64: Vec<Duration>,
    http64_rates: Vec<f64>,
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("the comparison runner runs only under `cargo bench -p tower-redlock-bench --bench compare`");
        return;
    }
    if std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!(
            "the comparison needs `redis-server` (7.x) on PATH; install it with \
             `apt-get update && apt-get install -y redis-server` (Debian/Ubuntu) or \
             `brew install redis` (macOS), then run `cargo bench -p tower-redlock-bench --bench compare` again"
        );
        std::process::exit(1);
    }
    let s = Settings::from_env();
    let started = Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // The fault proxies run on their own thread, out of the measured runtime's way.
    let proxy_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("fault-proxy")
        .enable_all()
        .build()
        .expect("proxy runtime");
    let stall_on = s.stall && !s.ns.is_empty();
    let mut max_n = s.ns.iter().copied().max().unwrap_or(3).max(3);
    if stall_on {
        max_n = max_n.max(STALL_MASTERS);
    }
    eprintln!("starting {max_n} redis-server masters …");
    let masters = Masters::start(max_n);

    let mut table: BTreeMap<(usize, Who), Row> = BTreeMap::new();
    for &n in &s.ns {
        eprintln!("N = {n}: healthy masters …");
        for (who, row) in rt.block_on(healthy(&s, &masters, n)) {
            table.insert((n, who), row);
        }
        eprintln!("N = {n}: one master slowed, then black-holed …");
        let faults = faults(&s, &rt, &proxy_rt, &masters, n);
        for (who, (slowed, black)) in faults {
            let row = table.entry((n, who)).or_default();
            row.slowed = slowed;
            row.black = black;
        }
        // Background releases (bounded by the node timeout) settle, then count what is left.
        std::thread::sleep(s.node_timeout * 4 + Duration::from_millis(300));
        for (&(rn, who), row) in table.iter_mut() {
            if rn == n {
                row.keys_left = rt.block_on(keys_left(&masters, n, who.prefix()));
            }
        }
        rt.block_on(flush_all(&masters));
    }

    let mut replays = Vec::new();
    let mut http_replays = Vec::new();
    if s.replay {
        for &n in &s.ns {
            eprintln!("N = {n}: replay (idempotent work, one task) …");
            replays.push((n, rt.block_on(replay(&s, &masters, n))));
            rt.block_on(flush_all(&masters));
            if s.layer {
                eprintln!("N = {n}: replay over HTTP (idempotent endpoint, one connection) …");
                http_replays.push((n, rt.block_on(http_replay(&s, &masters, n))));
                rt.block_on(flush_all(&masters));
            }
        }
    }

    let stall = if stall_on {
        eprintln!("stall: 3 of {STALL_MASTERS} masters paused …");
        stall(&s, &rt, &masters)
    } else {
        Vec::new()
    };

    let layer = if s.layer {
        eprintln!("HTTP layer …");
        Some(rt.block_on(layer(&s, &masters)))
    } else {
        None
    };

    let report = report(
        &s,
        &table,
        &replays,
        &http_replays,
        &stall,
        layer.as_ref(),
        started.elapsed(),
    );
    println!("{report}");
    if let Some(path) = &s.out {
        std::fs::write(path, &report).expect("write REDLOCK_BENCH_OUT");
    }
    drop(masters);
    // The proxies' and the runtimes' leftover tasks end with the process.
    rt.shutdown_timeout(Duration::from_millis(100));
    proxy_rt.shutdown_timeout(Duration::from_millis(100));
}

/// The clients over `urls`, connected and warmed up (script caches, connections).
async fn clients(s: &Settings, urls: &[String]) -> Vec<(Who, Client)> {
    let limit = Limit::connect(urls, s.node_timeout, Extras::default()).await;
    let mut out = vec![
        (Who::Limit, Client::Async(Locker::Limit(Arc::new(limit)))),
        (
            Who::Ours,
            Client::Async(Locker::Ours(common::ours(urls, s.node_timeout))),
        ),
    ];
    if s.rslock {
        out.push((
            Who::Rslock,
            Client::Async(Locker::Rslock(common::rslock(urls))),
        ));
    }
    if s.redlock_rs {
        out.push((
            Who::RedlockRs,
            Client::Sync(Arc::new(common::redlock_rs(urls))),
        ));
    }
    for (who, c) in &out {
        let key = format!("{}:warmup", who.prefix());
        let w = run_latency(c, &key, 50, Duration::from_secs(5), Duration::from_secs(5)).await;
        assert!(
            w.failures == 0 && !w.hung,
            "{} failed its warm-up: {w:?}",
            who.name()
        );
    }
    out
}

async fn run_latency(
    c: &Client,
    key: &str,
    cycles: usize,
    budget: Duration,
    cap: Duration,
) -> Latency {
    match c {
        Client::Async(l) => common::latency(l, key, cycles, budget, cap).await,
        Client::Sync(m) => {
            let (m, key) = (m.clone(), key.to_owned());
            let (tx, rx) = tokio::sync::oneshot::channel();
            // A detached thread: redlock-rs has no timeout and may block for good (it ends
            // when its connection is reset).
            std::thread::spawn(move || {
                let _ = tx.send(common::latency_sync(&m, &key, cycles, budget));
            });
            match tokio::time::timeout(budget + cap, rx).await {
                Ok(Ok(l)) => l,
                _ => Latency {
                    hung: true,
                    ..Latency::default()
                },
            }
        }
    }
}

/// Acquisitions timed alone, each lock released in the background (see
/// [`common::acquire_hot`]); redlock-rs, which blocks, releases in line.
async fn run_acquire(
    c: &Client,
    prefix: &str,
    count: usize,
    budget: Duration,
    cap: Duration,
) -> Latency {
    match c {
        Client::Async(l) => common::acquire_hot(l, prefix, count, budget, cap).await,
        Client::Sync(_) => run_latency(c, &format!("{prefix}:0"), count, budget, cap).await,
    }
}

async fn healthy(s: &Settings, masters: &Masters, n: usize) -> Vec<(Who, Row)> {
    let urls = &masters.urls()[..n];
    let clients = clients(s, urls).await;
    let mut rows: Vec<(Who, Row)> = clients.iter().map(|(w, _)| (*w, Row::default())).collect();
    let k = clients.len();
    for round in 0..s.rounds {
        for j in 0..k {
            let i = (j + round) % k;
            let (who, c) = &clients[i];
            let key = format!("{}:lat", who.prefix());
            let l = run_latency(c, &key, s.count(600), s.dur(10.0), Duration::from_secs(5)).await;
            rows[i].1.healthy.merge(l);
            let prefix = format!("{}:acq", who.prefix());
            let a = run_acquire(c, &prefix, s.count(300), s.dur(5.0), Duration::from_secs(5)).await;
            rows[i].1.healthy_acquire.merge(a);
        }
        for j in 0..k {
            let i = (j + round) % k;
            let (who, c) = &clients[i];
            let prefix = format!("{}:many", who.prefix());
            let dur = s.dur(1.0);
            let r = match c {
                Client::Async(l) => common::throughput(l, &prefix, 64, dur).await,
                Client::Sync(m) => {
                    let m = m.clone();
                    tokio::task::spawn_blocking(move || {
                        common::throughput_sync(&m, &prefix, 64, dur)
                    })
                    .await
                    .expect("redlock-rs throughput")
                }
            };
            rows[i].1.many.push(r);
        }
        for j in 0..k {
            let i = (j + round) % k;
            let (who, c) = &clients[i];
            let key = format!("{}:one", who.prefix());
            let dur = s.dur(1.0);
            let r = match c {
                Client::Async(l) => common::one_key(l, &key, 32, dur).await,
                Client::Sync(m) => {
                    let m = m.clone();
                    tokio::task::spawn_blocking(move || common::one_key_sync(&m, &key, 32, dur))
                        .await
                        .expect("redlock-rs one key")
                }
            };
            rows[i].1.one_key.push(r);
        }
    }
    rows
}

/// Under one fault: the acquisitions alone, then whole cycles.
#[derive(Debug, Default)]
struct Fault2 {
    acquire: Latency,
    cycle: Latency,
}

/// One master (index 0) behind a fault proxy: slowed by 2 ms each way, then black-holed.
fn faults(
    s: &Settings,
    rt: &tokio::runtime::Runtime,
    proxy_rt: &tokio::runtime::Runtime,
    masters: &Masters,
    n: usize,
) -> Vec<(Who, (Fault2, Fault2))> {
    let upstream: SocketAddr = masters[0].addr().parse().expect("address");
    let proxy = proxy_rt.block_on(FaultProxy::start(upstream));
    let mut urls = masters.urls()[..n].to_vec();
    urls[0] = proxy.url();
    let clients = rt.block_on(clients(s, &urls));
    let mut out: Vec<(Who, (Fault2, Fault2))> = clients
        .iter()
        .map(|(w, _)| (*w, (Fault2::default(), Fault2::default())))
        .collect();

    proxy.set(Fault::Latency(Duration::from_millis(2)));
    rt.block_on(async {
        for (i, (who, c)) in clients.iter().enumerate() {
            let key = format!("{}:slow", who.prefix());
            out[i].1 .0.acquire = run_acquire(
                c,
                &format!("{key}:acq"),
                s.count(300),
                s.dur(2.0),
                Duration::from_secs(5),
            )
            .await;
            out[i].1 .0.cycle =
                run_latency(c, &key, s.count(150), s.dur(2.0), Duration::from_secs(5)).await;
        }
    });

    // Let the slowed phase's background work (late SETs and their releases) finish under
    // that fault: a partition that starts while a release is on its way strands the key on
    // that master for a ttl, for every client, and would be counted as left over.
    std::thread::sleep(s.node_timeout * 4 + Duration::from_millis(100));
    proxy.set(Fault::BlackHole);
    rt.block_on(async {
        for (i, (who, c)) in clients.iter().enumerate() {
            let key = format!("{}:black", who.prefix());
            // The steady state of a dead master, as in production where it stays dead for
            // seconds or more: each client first works against it for 4 node timeouts (this
            // crate suspends a master after 3 timeouts in a row; the limit and the peers have
            // nothing to learn, and redlock-rs would block here for good). Without this, the
            // whole measurement would fit inside the first node timeout.
            if let Client::Async(l) = c {
                common::acquire_hot(
                    l,
                    &format!("{key}:warm"),
                    usize::MAX,
                    s.node_timeout * 4,
                    Duration::from_secs(3),
                )
                .await;
            }
            // A client that waits for every node pays the dead one's timeout each time:
            // a small budget bounds it. A client that blocks for good is reported as hung.
            out[i].1 .1.acquire = run_acquire(
                c,
                &format!("{key}:acq"),
                s.count(300),
                s.dur(2.0),
                Duration::from_secs(3),
            )
            .await;
            out[i].1 .1.cycle =
                run_latency(c, &key, s.count(30), s.dur(2.0), Duration::from_secs(3)).await;
        }
    });
    // Reset: stalled traffic is dropped (never reaches the master), blocked clients fail.
    proxy.set(Fault::Reset);
    std::thread::sleep(Duration::from_millis(200));
    drop(clients);
    drop(proxy);
    out
}

/// `FLUSHALL` on every master.
async fn flush_all(masters: &Masters) {
    for m in masters.iter() {
        let _: () = m.query(&redis::cmd("FLUSHALL")).await;
    }
}

/// Keys under `prefix` on the first `n` masters.
async fn keys_left(masters: &Masters, n: usize, prefix: &str) -> u64 {
    let mut total = 0;
    for m in masters.iter().take(n) {
        let keys: Vec<String> = m.query(redis::cmd("KEYS").arg(format!("{prefix}:*"))).await;
        if !keys.is_empty() && std::env::var_os("REDLOCK_BENCH_DEBUG").is_some() {
            eprintln!("left on {}: {keys:?}", m.addr());
        }
        total += keys.len() as u64;
    }
    total
}

// ---------------------------------------------------------------------------------------------
// Replay: idempotent work (`lock_unless_completed`, then `Lease::complete`), one task

/// The completion record of the replay workload: a small answer, as an idempotent API keeps.
const RECORD_LEN: usize = 200;

/// How long the replay workload's records are kept: longer than the run.
const RETENTION: Duration = Duration::from_secs(600);

/// The replay workload at one N: sequential single-task latencies, all on the same masters
/// in the same rounds (see [`replay`]).
#[derive(Debug, Default)]
struct ReplayRow {
    /// The limit's lock + release cycle.
    limit: Latency,
    /// This crate's lock cycle, `try_lock` + `Lease::release`; its `acquire` is one write
    /// round on the quorum (`SET NX PX` to every master, decided at quorum).
    cycle: Latency,
    /// `lock_unless_completed` answering `Completed` (a resource completed beforehand).
    hit: Latency,
    /// A first execution on a fresh resource: `lock_unless_completed` answering `Locked`
    /// (`acquire`), then `Lease::complete` with the record (`cycle`: the whole).
    first: Latency,
    /// One `SET` of the record on one master: a write round trip without a quorum.
    write: Latency,
    /// Lock keys (not completion records) left under the workload's prefix once everything
    /// settled: `complete` ends the lock, so 0 is expected.
    locks_left: u64,
}

/// Up to `count` runs of `one(i)`, one at a time, stopping early after `budget`, or when one
/// run takes longer than `cap`. A run gives its two times (`acquire`, `cycle` of
/// [`Latency`]), or `None` for a wrong answer or an error (a failure).
async fn sequential<F, Fut>(count: usize, budget: Duration, cap: Duration, mut one: F) -> Latency
where
    F: FnMut(usize) -> Fut,
    Fut: std::future::Future<Output = Option<(Duration, Duration)>>,
{
    let mut out = Latency::default();
    let started = Instant::now();
    for i in 0..count {
        if started.elapsed() > budget {
            break;
        }
        match tokio::time::timeout(cap, one(i)).await {
            Ok(Some((a, c))) => {
                out.acquire.push(a);
                out.cycle.push(c);
            }
            Ok(None) => out.failures += 1,
            Err(_) => {
                out.hung = true;
                break;
            }
        }
    }
    out
}

/// Replay hits: `lock_unless_completed` on `resource`, completed beforehand, answering
/// `Completed` with the record.
async fn replay_hits(
    r: &Redlock,
    resource: &str,
    count: usize,
    budget: Duration,
    cap: Duration,
) -> Latency {
    sequential(count, budget, cap, |_| async move {
        let t0 = Instant::now();
        match r
            .lock_unless_completed(resource, common::TTL, Retry::never())
            .await
        {
            Ok(Claim::Completed(record)) if record.len() == RECORD_LEN => {
                let d = t0.elapsed();
                Some((d, d))
            }
            Ok(Claim::Locked(lease)) => {
                // Not completed after all (a bug): counted as a failure, the lock released.
                let _ = lease.release().await;
                None
            }
            _ => None,
        }
    })
    .await
}

/// First executions: `lock_unless_completed` on a fresh resource (`{prefix}:{i}`) answering
/// `Locked`, then `Lease::complete` with `record`.
async fn first_executions(
    r: &Redlock,
    prefix: &str,
    record: &Bytes,
    count: usize,
    budget: Duration,
    cap: Duration,
) -> Latency {
    sequential(count, budget, cap, |i| {
        let resource = format!("{prefix}:{i}");
        let record = record.clone();
        async move {
            let t0 = Instant::now();
            match r
                .lock_unless_completed(&resource, common::TTL, Retry::never())
                .await
            {
                Ok(Claim::Locked(lease)) => {
                    let claimed = t0.elapsed();
                    lease.complete(record, RETENTION).await.ok()?;
                    Some((claimed, t0.elapsed()))
                }
                _ => None,
            }
        }
    })
    .await
}

/// One `SET key record` on one master's multiplexed connection, a round trip each.
async fn single_writes(
    conn: &redis::aio::MultiplexedConnection,
    key: &str,
    record: &Bytes,
    count: usize,
    budget: Duration,
    cap: Duration,
) -> Latency {
    sequential(count, budget, cap, |_| {
        let mut conn = conn.clone();
        let mut cmd = redis::cmd("SET");
        cmd.arg(key).arg(&record[..]);
        async move {
            let t0 = Instant::now();
            let ok: redis::RedisResult<()> = cmd.query_async(&mut conn).await;
            let d = t0.elapsed();
            ok.ok().map(|()| (d, d))
        }
    })
    .await
}

/// The replay workload on the first `n` masters: in each round, in a rotated order, the
/// limit's lock cycle, this crate's lock cycle (`try_lock` + `release`), replay hits on one
/// resource completed beforehand, first executions on fresh resources
/// (`lock_unless_completed` + `complete` of a [`RECORD_LEN`]-byte record), and one master's
/// `SET` of that record. One task, one operation at a time; latencies are pooled.
async fn replay(s: &Settings, masters: &Masters, n: usize) -> ReplayRow {
    const PREFIX: &str = "bench:replay";
    let urls = &masters.urls()[..n];
    let limit = Locker::Limit(Arc::new(
        Limit::connect(urls, s.node_timeout, Extras::default()).await,
    ));
    let redlock = common::ours(urls, s.node_timeout);
    let ours = Locker::Ours(redlock.clone());
    let one = redis::Client::open(urls[0].as_str())
        .expect("valid url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let record = Bytes::from(vec![b'r'; RECORD_LEN]);
    let (write_key, done) = ("bench:rtt:write", format!("{PREFIX}:done"));
    let claim = redlock
        .lock_unless_completed(&done, common::TTL, Retry::never())
        .await
        .expect("the replay resource's claim");
    match claim {
        Claim::Locked(lease) => lease
            .complete(record.clone(), RETENTION)
            .await
            .expect("the replay resource completed"),
        Claim::Completed(_) => panic!("{done} was completed before the run"),
    }

    // Warm-up: connections, script caches.
    let warm = Duration::from_secs(5);
    let w = [
        common::latency(&limit, &format!("{PREFIX}:warm:limit"), 50, warm, warm).await,
        common::latency(&ours, &format!("{PREFIX}:warm:cycle"), 50, warm, warm).await,
        replay_hits(&redlock, &done, 50, warm, warm).await,
        first_executions(
            &redlock,
            &format!("{PREFIX}:warm:first"),
            &record,
            50,
            warm,
            warm,
        )
        .await,
        single_writes(&one, write_key, &record, 50, warm, warm).await,
    ];
    for w in &w {
        assert!(w.failures == 0 && !w.hung, "replay warm-up failed: {w:?}");
    }

    let mut row = ReplayRow::default();
    let (count, budget, cap) = (s.count(600), s.dur(10.0), Duration::from_secs(5));
    const K: usize = 5;
    for round in 0..s.rounds {
        for j in 0..K {
            match (j + round) % K {
                0 => row.limit.merge(
                    common::latency(&limit, &format!("{PREFIX}:limit"), count, budget, cap).await,
                ),
                1 => row.cycle.merge(
                    common::latency(&ours, &format!("{PREFIX}:cycle"), count, budget, cap).await,
                ),
                2 => row
                    .hit
                    .merge(replay_hits(&redlock, &done, count, budget, cap).await),
                3 => {
                    let prefix = format!("{PREFIX}:first:{round}");
                    row.first.merge(
                        first_executions(&redlock, &prefix, &record, count, budget, cap).await,
                    )
                }
                _ => row
                    .write
                    .merge(single_writes(&one, write_key, &record, count, budget, cap).await),
            }
        }
    }

    // The slower masters' completions (in the background) settle, then count the lock keys.
    tokio::time::sleep(s.node_timeout * 4 + Duration::from_millis(300)).await;
    for m in masters.iter().take(n) {
        let keys: Vec<String> = m.query(redis::cmd("KEYS").arg(format!("{PREFIX}:*"))).await;
        let locks: Vec<_> = keys.iter().filter(|k| !k.ends_with(":record")).collect();
        if !locks.is_empty() && std::env::var_os("REDLOCK_BENCH_DEBUG").is_some() {
            eprintln!("replay: locks left on {}: {locks:?}", m.addr());
        }
        row.locks_left += locks.len() as u64;
    }
    row
}

// ---------------------------------------------------------------------------------------------
// Replay over HTTP: an idempotent endpoint (`RedlockLayer::idempotent`) in an axum app

/// The idempotent endpoint's response body: a small JSON answer, as a payment API returns.
const ORDER_RESPONSE: &str = concat!(
    r#"{"id":"ord_8f2c1e9a4b7d","status":"paid","amount":1999,"currency":"EUR","#,
    r#""customer":"cus_0001","created":"2026-01-01T00:00:00Z","#,
    r#""receipt":"https://example.com/receipts/ord_8f2c1e9a4b7d","#,
    r#""note":"idempotent request, replayed on retry"}"#
);

/// The request body every request carries (fingerprinted on the idempotent route).
const ORDER_REQUEST: &str = r#"{"amount":1999,"currency":"EUR","customer":"cus_0001"}"#;

async fn order() -> impl axum::response::IntoResponse {
    (
        [(http::header::CONTENT_TYPE, "application/json")],
        ORDER_RESPONSE,
    )
}

/// The HTTP replay workload at one N: sequential requests on one keep-alive connection, and
/// the client-level round trips they are compared with, all in the same rounds (see
/// [`http_replay`]).
#[derive(Debug, Default)]
struct HttpReplayRow {
    /// `/bare`: the handler without a lock.
    bare: Latency,
    /// `/locked` (plain `RedlockLayer`, no replay), a fresh key each request: acquire,
    /// handler, release, response — one lock cycle over HTTP.
    plain: Latency,
    /// `/idempotent`, the one key completed before the rounds: the stored response replayed.
    hit: Latency,
    /// `/idempotent`, a fresh key each request: body buffered and fingerprinted, claim,
    /// handler, response stored on a quorum (the write is the release), response.
    first: Latency,
    /// The app's own client, `try_lock` (`acquire`: one write round on the quorum) +
    /// `release` (`cycle`), no HTTP.
    client: Latency,
    /// One master: `SET` of a value the size of the stored record (one round trip).
    write: Latency,
    /// `plain`, `hit` and `first` in process (`Router::oneshot`, no sockets): what the HTTP
    /// stack adds is the difference.
    plain_oneshot: Latency,
    hit_oneshot: Latency,
    first_oneshot: Latency,
    /// The stored record's size on a master (status, headers, body, fingerprint).
    record_len: usize,
    /// Lock keys (not completion records) left once settled: expected 0.
    locks_left: u64,
}

type OrderSender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

fn order_request(path: &str, key: &str) -> http::Request<Full<Bytes>> {
    http::Request::post(path)
        .header("host", "bench")
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(ORDER_REQUEST.as_bytes())))
        .expect("request")
}

/// What a request must answer for it to count: `200` with the handler's body, and the
/// replay marker exactly when a replay is expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Ran,
    Replayed,
}

/// Where [`order_requests`] sends: over the keep-alive connection, or in process.
enum Via<'a> {
    Http(&'a mut OrderSender),
    Oneshot(&'a Router),
}

/// Up to `count` requests to `path`, one at a time `via` the connection or in process, each
/// with `key` or (`None`) a fresh key; stopping early after `budget`, or when one takes
/// longer than `cap`. The time runs from sending the request to the response body's end. A
/// wrong answer is a failure.
async fn order_requests(
    mut via: Via<'_>,
    path: &str,
    key: Option<&str>,
    expect: Expect,
    count: usize,
    budget: Duration,
    cap: Duration,
) -> Latency {
    let mut out = Latency::default();
    let started = Instant::now();
    for _ in 0..count {
        if started.elapsed() > budget {
            break;
        }
        let req = order_request(path, &key.map_or_else(next_key, str::to_owned));
        let run = async {
            let (t0, res) = match &mut via {
                Via::Http(sender) => {
                    sender.ready().await.ok()?;
                    let t0 = Instant::now();
                    let res = sender.send_request(req).await.ok()?;
                    (t0, res.map(axum::body::Body::new))
                }
                Via::Oneshot(router) => {
                    let t0 = Instant::now();
                    let res = (*router).clone().oneshot(req).await.ok()?;
                    (t0, res)
                }
            };
            let status = res.status();
            let replayed = res
                .headers()
                .get(REPLAYED_HEADER)
                .is_some_and(|v| v == "true");
            let body = res.into_body().collect().await.ok()?.to_bytes();
            let d = t0.elapsed();
            let right = status == http::StatusCode::OK
                && replayed == (expect == Expect::Replayed)
                && body == ORDER_RESPONSE.as_bytes();
            if !right && std::env::var_os("REDLOCK_BENCH_DEBUG").is_some() {
                eprintln!("{path}: {status}, replayed {replayed}, body {body:?}");
            }
            right.then_some(d)
        };
        match tokio::time::timeout(cap, run).await {
            Ok(Some(d)) => {
                out.acquire.push(d);
                out.cycle.push(d);
            }
            Ok(None) => out.failures += 1,
            Err(_) => {
                out.hung = true;
                break;
            }
        }
    }
    out
}

/// What the HTTP replay workloads run against (see [`http_replay`]).
struct HttpReplayCtx<'a> {
    app: &'a Router,
    done: &'a str,
    ours: &'a Locker,
    one: &'a redis::aio::MultiplexedConnection,
    write_key: &'a str,
    record: &'a Bytes,
}

impl HttpReplayCtx<'_> {
    /// Workload `w`, up to `count` times: 0–3 over HTTP (`/bare`, `/locked`, a replay hit,
    /// a first execution), 4–6 in process (`/locked`, a replay hit, a first execution),
    /// 7 the client's `try_lock` + `release`, 8 one master's `SET` of the record's size.
    async fn run(
        &self,
        w: usize,
        sender: &mut OrderSender,
        count: usize,
        budget: Duration,
        cap: Duration,
    ) -> Latency {
        let (via, path, key, expect) = match w {
            0 => (Via::Http(sender), "/bare", None, Expect::Ran),
            1 => (Via::Http(sender), "/locked", None, Expect::Ran),
            2 => (
                Via::Http(sender),
                "/idempotent",
                Some(self.done),
                Expect::Replayed,
            ),
            3 => (Via::Http(sender), "/idempotent", None, Expect::Ran),
            4 => (Via::Oneshot(self.app), "/locked", None, Expect::Ran),
            5 => (
                Via::Oneshot(self.app),
                "/idempotent",
                Some(self.done),
                Expect::Replayed,
            ),
            6 => (Via::Oneshot(self.app), "/idempotent", None, Expect::Ran),
            7 => {
                let key = "bench:http-replay:client";
                return common::latency(self.ours, key, count, budget, cap).await;
            }
            _ => {
                return single_writes(self.one, self.write_key, self.record, count, budget, cap)
                    .await
            }
        };
        order_requests(via, path, key, expect, count, budget, cap).await
    }
}

/// The HTTP replay workload on the first `n` masters. One axum app, served over loopback,
/// with three routes on the same handler ([`order`]): `/bare` (no lock), `/locked` (a plain
/// `RedlockLayer`, default policy, key `Idempotency-Key` scoped by route) and `/idempotent`
/// (`RedlockLayer::idempotent`: the same key, replay with [`Replay::new`]'s defaults, the
/// request body fingerprinted). Both layers share one client. In each round, in a rotated
/// order, one request at a time: on one keep-alive connection, the bare route, a plain
/// locked request per fresh key, replay hits on one key completed before the rounds, first
/// executions per fresh key; the last three again in process (`Router::oneshot`); then,
/// without HTTP, the client's `try_lock` + `release` and one master's `SET` of a value the
/// size of the stored record. Latencies are pooled.
///
/// [`Replay::new`]: tower_redlock::http::Replay::new
async fn http_replay(s: &Settings, masters: &Masters, n: usize) -> HttpReplayRow {
    let urls = &masters.urls()[..n];
    let redlock = common::ours(urls, s.node_timeout);
    let plain = RedlockLayer::with_policy(
        LockPolicy::builder(
            redlock.clone(),
            IdempotencyKey::required().scoped_by_route(),
        )
        .build()
        .expect("the plain policy"),
    );
    let idempotent = RedlockLayer::idempotent(redlock.clone()).expect("the idempotent layer");
    let app = Router::new()
        .route("/bare", post(order))
        .route("/locked", post(order).layer(plain))
        .route("/idempotent", post(order).layer(idempotent));
    let server = HttpApp::serve(app.clone()).await;
    let mut sender: OrderSender = connect(server.addr()).await;
    let ours = Locker::Ours(redlock.clone());
    let one = redis::Client::open(urls[0].as_str())
        .expect("valid url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");

    // The replayed key, completed once; then the size of what was stored.
    let done = format!("done-{n}");
    let first = order_requests(
        Via::Http(&mut sender),
        "/idempotent",
        Some(&done),
        Expect::Ran,
        1,
        Duration::from_secs(5),
        Duration::from_secs(5),
    )
    .await;
    assert!(
        first.cycle.len() == 1,
        "the replayed key's first request: {first:?}"
    );
    let mut m0 = one.clone();
    let stored: Vec<String> = redis::cmd("KEYS")
        .arg("*:record")
        .query_async(&mut m0)
        .await
        .expect("KEYS");
    assert_eq!(stored.len(), 1, "one record stored: {stored:?}");
    let record_len: usize = redis::cmd("STRLEN")
        .arg(&stored[0])
        .query_async(&mut m0)
        .await
        .expect("STRLEN");
    let record = Bytes::from(vec![b'r'; record_len]);
    let write_key = "bench:rtt:http-record";

    // The workloads, each run by `run(w, count, budget, cap)`.
    const WORKLOADS: usize = 9;
    let ctx = HttpReplayCtx {
        app: &app,
        done: &done,
        ours: &ours,
        one: &one,
        write_key,
        record: &record,
    };
    // Warm-up: the connections to the masters, the scripts, the HTTP connection.
    let warm = Duration::from_secs(5);
    for w in 0..WORKLOADS {
        let l = ctx.run(w, &mut sender, 50, warm, warm).await;
        assert!(
            l.failures == 0 && !l.hung,
            "HTTP replay warm-up of workload {w} failed: {l:?}"
        );
    }

    let mut row = HttpReplayRow {
        record_len,
        ..HttpReplayRow::default()
    };
    let (count, budget, cap) = (s.count(600), s.dur(10.0), Duration::from_secs(5));
    for round in 0..s.rounds {
        for j in 0..WORKLOADS {
            let w = (j + round) % WORKLOADS;
            let l = ctx.run(w, &mut sender, count, budget, cap).await;
            match w {
                0 => &mut row.bare,
                1 => &mut row.plain,
                2 => &mut row.hit,
                3 => &mut row.first,
                4 => &mut row.plain_oneshot,
                5 => &mut row.hit_oneshot,
                6 => &mut row.first_oneshot,
                7 => &mut row.client,
                _ => &mut row.write,
            }
            .merge(l);
        }
    }

    // Background work (the slower masters' writes and releases) settles, then count the
    // lock keys: everything on the masters but the completion records and the write key.
    tokio::time::sleep(s.node_timeout * 4 + Duration::from_millis(300)).await;
    for m in masters.iter().take(n) {
        let keys: Vec<String> = m.query(redis::cmd("KEYS").arg("*")).await;
        let locks: Vec<_> = keys
            .iter()
            .filter(|k| !k.ends_with(":record") && *k != write_key)
            .collect();
        if !locks.is_empty() && std::env::var_os("REDLOCK_BENCH_DEBUG").is_some() {
            eprintln!("HTTP replay: locks left on {}: {locks:?}", m.addr());
        }
        row.locks_left += locks.len() as u64;
    }
    drop(sender);
    drop(server);
    row
}

// ---------------------------------------------------------------------------------------------
// Stall: a quorum of masters paused under contention

fn stall_plan(s: &Settings) -> Plan {
    Plan::standard(s.dur(1.0), s.dur(4.0), s.node_timeout)
}

/// The stall workload ([`common::stall`]) for the limit and this crate (no peers).
fn stall(s: &Settings, rt: &tokio::runtime::Runtime, masters: &Masters) -> Vec<(Who, Stall)> {
    let urls = &masters.urls()[..STALL_MASTERS];
    let plan = stall_plan(s);
    let mut out = Vec::new();
    for who in [Who::Limit, Who::Ours] {
        let l = rt.block_on(async {
            match who {
                Who::Ours => Locker::Ours(common::ours(urls, s.node_timeout)),
                _ => Locker::Limit(Arc::new(
                    Limit::connect(urls, s.node_timeout, Extras::default()).await,
                )),
            }
        });
        let prefix = format!("{}:stall", who.prefix());
        out.push((who, common::stall::measure(rt, &l, &prefix, masters, &plan)));
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The HTTP layer

async fn pay() -> &'static str {
    "paid"
}

static REQUEST_SEQ: AtomicU64 = AtomicU64::new(0);

fn next_key() -> String {
    format!("k-{}", REQUEST_SEQ.fetch_add(1, Ordering::Relaxed))
}

async fn layer(s: &Settings, masters: &Masters) -> Vec<(&'static str, LayerRow)> {
    let bare = Router::new().route("/pay", post(pay));
    let mem = Router::new().route("/pay", post(pay)).layer(
        RedlockLayer::new(Redlock::in_memory(), IdempotencyKey::required()).expect("the layer"),
    );
    let redis = Router::new().route("/pay", post(pay)).layer(
        RedlockLayer::new(
            common::ours(&masters.urls()[..3], s.node_timeout),
            IdempotencyKey::required(),
        )
        .expect("the layer"),
    );
    let apps = [
        ("bare handler", bare),
        ("+ RedlockLayer, memory node", mem),
        ("+ RedlockLayer, 3 Redis masters", redis),
    ];
    let mut served = Vec::new();
    for (name, router) in &apps {
        served.push((*name, router.clone(), HttpApp::serve(router.clone()).await));
    }
    let mut rows: Vec<(&'static str, LayerRow)> = apps
        .iter()
        .map(|(n, _)| (*n, LayerRow::default()))
        .collect();
    // Warm-up: connections to the masters, script caches.
    for (_, router, app) in &served {
        oneshot_latency(router, 100).await;
        http_conns(app.addr(), 4, Duration::from_millis(200)).await;
    }
    let k = served.len();
    for round in 0..s.rounds {
        for j in 0..k {
            let i = (j + round) % k;
            rows[i]
                .1
                .oneshot
                .extend(oneshot_latency(&served[i].1, s.count(1500)).await);
        }
        for j in 0..k {
            let i = (j + round) % k;
            let (lat, _) = http_sequential(served[i].2.addr(), s.count(500)).await;
            rows[i].1.http1.extend(lat);
        }
        for j in 0..k {
            let i = (j + round) % k;
            let (lat, rate) = http_conns(served[i].2.addr(), 64, s.dur(1.0)).await;
            rows[i].1.http64.extend(lat);
            rows[i].1.http64_rates.push(rate);
        }
    }
    rows
}

fn request(path: &str) -> http::Request<Empty<Bytes>> {
    http::Request::post(path)
        .header("host", "bench")
        .header("idempotency-key", next_key())
        .body(Empty::new())
        .expect("request")
}

/// In-process: `oneshot` on a clone of the router, the response body read to its end.
async fn oneshot_latency(router: &Router, count: usize) -> Vec<Duration> {
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let t0 = Instant::now();
        let res = router
            .clone()
            .oneshot(request("/pay"))
            .await
            .expect("infallible");
        assert!(res.status().is_success(), "status {}", res.status());
        res.into_body().collect().await.expect("body");
        out.push(t0.elapsed());
    }
    out
}

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

async fn connect<B>(addr: SocketAddr) -> hyper::client::conn::http1::SendRequest<B>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let (sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    tokio::spawn(conn);
    sender
}

async fn send(sender: &mut Sender) -> Duration {
    sender.ready().await.expect("ready");
    let t0 = Instant::now();
    let res = sender
        .send_request(request("/pay"))
        .await
        .expect("response");
    assert!(res.status().is_success(), "status {}", res.status());
    res.into_body().collect().await.expect("body");
    t0.elapsed()
}

/// One keep-alive connection, one request at a time.
async fn http_sequential(addr: SocketAddr, count: usize) -> (Vec<Duration>, f64) {
    let mut sender = connect(addr).await;
    let t0 = Instant::now();
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        out.push(send(&mut sender).await);
    }
    let rate = count as f64 / t0.elapsed().as_secs_f64();
    (out, rate)
}

/// `conns` keep-alive connections, each sending one request after the other for `dur`.
async fn http_conns(addr: SocketAddr, conns: usize, dur: Duration) -> (Vec<Duration>, f64) {
    let mut senders = Vec::with_capacity(conns);
    for _ in 0..conns {
        senders.push(connect(addr).await);
    }
    let deadline = Instant::now() + dur;
    let tasks: Vec<_> = senders
        .into_iter()
        .map(|mut sender| {
            tokio::spawn(async move {
                let mut lat = Vec::new();
                while Instant::now() < deadline {
                    let d = send(&mut sender).await;
                    if Instant::now() <= deadline {
                        lat.push(d);
                    }
                }
                lat
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("client task"));
    }
    let rate = all.len() as f64 / dur.as_secs_f64();
    (all, rate)
}

// ---------------------------------------------------------------------------------------------
// The report

fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_else(|| "unknown CPU".into());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| std::env::consts::OS.into());
    let redis = support::redis_server_version().unwrap_or_default();
    format!("{cpus} CPUs ({model}), Linux {kernel}, redis-server {redis}")
}

fn p(v: &[Duration], q: f64) -> Option<Duration> {
    percentile(v, q)
}

/// `value (ratio×)` against `base`; lower is better for latencies.
fn lat_cell(v: Option<Duration>, base: Option<Duration>, show_ratio: bool) -> String {
    match (v, base) {
        (Some(v), Some(b)) if show_ratio && !b.is_zero() => {
            format!("{} ({:.2}×)", fmt_dur(v), v.as_secs_f64() / b.as_secs_f64())
        }
        (Some(v), _) => fmt_dur(v),
        (None, _) => "—".into(),
    }
}

fn rate_cell(v: f64, base: f64, show_ratio: bool) -> String {
    if show_ratio && base > 0.0 {
        format!("{} ({:.2}×)", fmt_rate(v), v / base)
    } else {
        fmt_rate(v)
    }
}

fn fault_cell(l: &Latency, base: Option<Duration>, show_ratio: bool, acquire: bool) -> String {
    let v = if acquire { &l.acquire } else { &l.cycle };
    if l.hung && v.is_empty() {
        return "hangs (no timeout)".into();
    }
    let mut c = lat_cell(p(v, 50.0), base, show_ratio);
    if l.hung {
        c.push_str(", then hangs");
    }
    c
}

fn report(
    s: &Settings,
    table: &BTreeMap<(usize, Who), Row>,
    replays: &[(usize, ReplayRow)],
    http_replays: &[(usize, HttpReplayRow)],
    stall: &[(Who, Stall)],
    layer: Option<&Vec<(&'static str, LayerRow)>>,
    took: Duration,
) -> String {
    let mut o = String::new();
    let _ = writeln!(
        o,
        "### Lock clients: lock + release cycles, ttl {:?}, node timeout {:?}\n",
        common::TTL,
        s.node_timeout
    );
    let _ = writeln!(
        o,
        "| N | client | acquire p50 | cycle p50 | cycle p99 | 64 tasks: cycles/s | contended, 32 tasks on 1 key: successes/s | overlaps | 1 master +2 ms: acquire p50 | cycle p50 | 1 master black-holed: acquire p50 | cycle p50 | keys left |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (&(n, who), row) in table {
        let base = table.get(&(n, Who::Limit));
        let r = who != Who::Limit;
        let bl = |f: &dyn Fn(&Row) -> Option<Duration>| base.and_then(f);
        let many = median(&row.many.iter().map(Rate::per_sec).collect::<Vec<_>>());
        let one = median(&row.one_key.iter().map(Rate::per_sec).collect::<Vec<_>>());
        let overlaps: u64 = row.one_key.iter().map(|r| r.overlaps).sum();
        let base_many = base.map_or(0.0, |b| {
            median(&b.many.iter().map(Rate::per_sec).collect::<Vec<_>>())
        });
        let base_one = base.map_or(0.0, |b| {
            median(&b.one_key.iter().map(Rate::per_sec).collect::<Vec<_>>())
        });
        let _ = writeln!(
            o,
            "| {n} | {} | {} | {} | {} | {} | {} | {overlaps} | {} | {} | {} | {} | {} |",
            who.name(),
            lat_cell(
                p(&row.healthy_acquire.acquire, 50.0),
                bl(&|b| p(&b.healthy_acquire.acquire, 50.0)),
                r
            ),
            lat_cell(
                p(&row.healthy.cycle, 50.0),
                bl(&|b| p(&b.healthy.cycle, 50.0)),
                r
            ),
            lat_cell(
                p(&row.healthy.cycle, 99.0),
                bl(&|b| p(&b.healthy.cycle, 99.0)),
                r
            ),
            rate_cell(many, base_many, r),
            rate_cell(one, base_one, r),
            fault_cell(
                &row.slowed.acquire,
                bl(&|b| p(&b.slowed.acquire.acquire, 50.0)),
                r,
                true
            ),
            fault_cell(
                &row.slowed.cycle,
                bl(&|b| p(&b.slowed.cycle.cycle, 50.0)),
                r,
                false
            ),
            fault_cell(
                &row.black.acquire,
                bl(&|b| p(&b.black.acquire.acquire, 50.0)),
                r,
                true
            ),
            fault_cell(
                &row.black.cycle,
                bl(&|b| p(&b.black.cycle.cycle, 50.0)),
                r,
                false
            ),
            row.keys_left,
        );
    }

    if !replays.is_empty() {
        replay_table(&mut o, s, replays);
    }

    if !http_replays.is_empty() {
        http_replay_table(&mut o, s, http_replays);
    }

    if !stall.is_empty() {
        let rows: Vec<_> = stall.iter().map(|(w, r)| (w.name(), r)).collect();
        common::stall::table(&mut o, &stall_plan(s), s.node_timeout, &rows);
    }

    if let Some(layer) = layer {
        let _ = writeln!(o, "\n### HTTP layer: axum handler without and with `RedlockLayer` (distinct Idempotency-Keys)\n");
        let _ = writeln!(
            o,
            "| app | in-process `oneshot` p50 | p99 | HTTP, 1 connection: p50 | HTTP, 64 connections: requests/s | p50 | p99 |"
        );
        let _ = writeln!(o, "|---|---|---|---|---|---|---|");
        let bare = &layer[0].1;
        for (i, (name, row)) in layer.iter().enumerate() {
            let r = i > 0;
            let _ = writeln!(
                o,
                "| {name} | {} | {} | {} | {} | {} | {} |",
                lat_cell(p(&row.oneshot, 50.0), p(&bare.oneshot, 50.0), r),
                lat_cell(p(&row.oneshot, 99.0), p(&bare.oneshot, 99.0), r),
                lat_cell(p(&row.http1, 50.0), p(&bare.http1, 50.0), r),
                rate_cell(median(&row.http64_rates), median(&bare.http64_rates), r),
                lat_cell(p(&row.http64, 50.0), p(&bare.http64, 50.0), r),
                lat_cell(p(&row.http64, 99.0), p(&bare.http64, 99.0), r),
            );
        }
    }

    let _ = writeln!(o, "\n### Targets\n");
    let mark = |ok: bool| if ok { "met" } else { "NOT met" };
    for &n in &s.ns {
        let (Some(lim), Some(us)) = (table.get(&(n, Who::Limit)), table.get(&(n, Who::Ours)))
        else {
            continue;
        };
        let ratio = |a: Option<Duration>, b: Option<Duration>| match (a, b) {
            (Some(a), Some(b)) if !b.is_zero() => a.as_secs_f64() / b.as_secs_f64(),
            _ => f64::NAN,
        };
        let c = ratio(p(&us.healthy.cycle, 50.0), p(&lim.healthy.cycle, 50.0));
        let _ = writeln!(
            o,
            "- N={n}: cycle p50 ≤ 1.10× the limit: {c:.2}× — {}",
            mark(c <= 1.10)
        );
        let t = median(&us.many.iter().map(Rate::per_sec).collect::<Vec<_>>())
            / median(&lim.many.iter().map(Rate::per_sec).collect::<Vec<_>>());
        let _ = writeln!(
            o,
            "- N={n}: 64-task throughput ≥ 0.90× the limit: {t:.2}× — {}",
            mark(t >= 0.90)
        );
        if n == 3 || n == 5 {
            let c = median(&us.one_key.iter().map(Rate::per_sec).collect::<Vec<_>>())
                / median(&lim.one_key.iter().map(Rate::per_sec).collect::<Vec<_>>());
            let _ = writeln!(
                o,
                "- N={n}: contended (32 tasks, one key) ≥ 0.95× the limit: {c:.2}× — {}",
                mark(c >= 0.95)
            );
        }
        let own = p(&us.healthy_acquire.acquire, 50.0);
        let lim_own = p(&lim.healthy_acquire.acquire, 50.0);
        for (what, l, ll) in [
            ("slowed", &us.slowed, &lim.slowed),
            ("black-holed", &us.black, &lim.black),
        ] {
            let f = ratio(p(&l.acquire.acquire, 50.0), own);
            let fl = ratio(p(&ll.acquire.acquire, 50.0), lim_own);
            let _ = writeln!(
                o,
                "- N={n}: one {what} master: acquire p50 ≤ 1.2× our all-healthy acquire p50: {f:.2}× — {} (the limit's own: {fl:.2}×)",
                mark(f <= 1.2)
            );
        }
    }
    let stalled = |w: Who| stall.iter().find(|(x, _)| *x == w).map(|(_, r)| r);
    if let Some(us) = stalled(Who::Ours) {
        let _ = writeln!(o, "{}", common::stall::target(us, stalled(Who::Limit)));
    }
    if let (Some(layer), Some(us3)) = (layer, table.get(&(3, Who::Ours))) {
        if let Some(cycle) = p(&us3.healthy.cycle, 50.0) {
            for (what, pick) in [
                (
                    "in-process oneshot",
                    (|r: &LayerRow| p(&r.oneshot, 50.0)) as fn(&LayerRow) -> Option<Duration>,
                ),
                ("HTTP, 1 connection", |r: &LayerRow| p(&r.http1, 50.0)),
            ] {
                if let (Some(bare), Some(on)) = (pick(&layer[0].1), pick(&layer[2].1)) {
                    let budget = bare + cycle.mul_f64(1.2);
                    let _ = writeln!(
                        o,
                        "- layer on (3 Redis masters), {what}: p50 {} ≤ bare {} + 1.2 × cycle p50 {} = {}: {}",
                        fmt_dur(on),
                        fmt_dur(bare),
                        fmt_dur(cycle),
                        fmt_dur(budget),
                        mark(on <= budget)
                    );
                }
            }
        }
    }
    for (n, row) in replays {
        replay_targets(&mut o, *n, row);
    }
    for (n, row) in http_replays {
        http_replay_targets(&mut o, *n, row);
    }
    let _ = writeln!(
        o,
        "\n{}; scale {}, {} rounds; took {:.0} s.",
        machine(),
        s.scale,
        s.rounds,
        took.as_secs_f64()
    );
    o
}

/// The replay table: each workload's p50 and p99, and their ratios to this crate's lock
/// cycle (`try_lock` + `release`) measured in the same rounds.
fn replay_table(o: &mut String, s: &Settings, replays: &[(usize, ReplayRow)]) {
    let _ = writeln!(
        o,
        "\n### Idempotent work (replay): one task, one operation at a time, record {RECORD_LEN} B, ttl {:?}, node timeout {:?}\n",
        common::TTL,
        s.node_timeout
    );
    let _ = writeln!(
        o,
        "| N | workload | p50 | p99 | p50 / lock cycle p50 | p99 / lock cycle p99 | failures |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|");
    for (n, row) in replays {
        let base50 = p(&row.cycle.cycle, 50.0);
        let base99 = p(&row.cycle.cycle, 99.0);
        let lines: [(&str, &Latency, &[Duration]); 7] = [
            ("limit: lock + release", &row.limit, &row.limit.cycle),
            (
                "(a) tower-redlock lock cycle: `try_lock` + `release`",
                &row.cycle,
                &row.cycle.cycle,
            ),
            (
                "… of which `try_lock` (one write round on the quorum)",
                &row.cycle,
                &row.cycle.acquire,
            ),
            (
                "(b) replay hit: `lock_unless_completed` → `Completed`",
                &row.hit,
                &row.hit.cycle,
            ),
            (
                "(c) first execution: `lock_unless_completed` → `Locked`, then `complete`",
                &row.first,
                &row.first.cycle,
            ),
            (
                "… of which `lock_unless_completed` → `Locked`",
                &row.first,
                &row.first.acquire,
            ),
            (
                "one master: `SET` of the record (one round trip)",
                &row.write,
                &row.write.cycle,
            ),
        ];
        for (what, l, v) in lines {
            let failures = if l.hung {
                format!("{}, then hangs", l.failures)
            } else {
                l.failures.to_string()
            };
            let ratio = |q: f64, base: Option<Duration>| match (p(v, q), base) {
                (Some(v), Some(b)) if !b.is_zero() => {
                    format!("{:.2}×", v.as_secs_f64() / b.as_secs_f64())
                }
                _ => "—".into(),
            };
            let _ = writeln!(
                o,
                "| {n} | {what} | {} | {} | {} | {} | {failures} |",
                lat_cell(p(v, 50.0), None, false),
                lat_cell(p(v, 99.0), None, false),
                ratio(50.0, base50),
                ratio(99.0, base99),
            );
        }
    }
    let left: Vec<String> = replays
        .iter()
        .map(|(n, r)| format!("N={n}: {}", r.locks_left))
        .collect();
    let _ = writeln!(
        o,
        "\nLock keys left under the replay prefix once settled (completion records aside): {}.",
        left.join(", ")
    );
}

/// The issue's targets for idempotent work, at one N: a replay hit p50 ≤ 1.2× the lock
/// cycle p50; a first execution p50 ≤ the lock cycle p50 + one write round trip, taken as
/// `try_lock`'s p50 (one write round on the quorum), and shown too against one master's
/// `SET` round trip (the stricter reading).
fn replay_targets(o: &mut String, n: usize, row: &ReplayRow) {
    let mark = |ok: bool| if ok { "met" } else { "NOT met" };
    let (Some(cycle), Some(hit), Some(first), Some(quorum_write), Some(one_write)) = (
        p(&row.cycle.cycle, 50.0),
        p(&row.hit.cycle, 50.0),
        p(&row.first.cycle, 50.0),
        p(&row.cycle.acquire, 50.0),
        p(&row.write.cycle, 50.0),
    ) else {
        let _ = writeln!(o, "- N={n}: replay: nothing measured");
        return;
    };
    let r = |a: Duration| a.as_secs_f64() / cycle.as_secs_f64();
    let _ = writeln!(
        o,
        "- N={n}: replay hit p50 ≤ 1.2× the lock cycle p50: {} / {} = {:.2}× — {}",
        fmt_dur(hit),
        fmt_dur(cycle),
        r(hit),
        mark(r(hit) <= 1.2)
    );
    let budget = cycle + quorum_write;
    let strict = cycle + one_write;
    let _ = writeln!(
        o,
        "- N={n}: first execution p50 ≤ lock cycle p50 + one write round trip (a quorum write, `try_lock` p50): {} ({:.2}× the cycle) ≤ {} + {} = {} ({:.2}×) — {} (against one master's `SET` round trip instead: {} + {} = {} ({:.2}×) — {})",
        fmt_dur(first),
        r(first),
        fmt_dur(cycle),
        fmt_dur(quorum_write),
        fmt_dur(budget),
        r(budget),
        mark(first <= budget),
        fmt_dur(cycle),
        fmt_dur(one_write),
        fmt_dur(strict),
        r(strict),
        mark(first <= strict)
    );
}

/// The HTTP replay table: each workload's p50 and p99, and their ratios to one plain locked
/// request over HTTP (`/locked`) measured in the same rounds.
fn http_replay_table(o: &mut String, s: &Settings, rows: &[(usize, HttpReplayRow)]) {
    let _ = writeln!(
        o,
        "\n### Idempotent endpoints (replay), HTTP level: one axum app, one keep-alive HTTP/1 connection, one request at a time; response body {} B, request body {} B; layer defaults (ttl 30 s), node timeout {:?}\n",
        ORDER_RESPONSE.len(),
        ORDER_REQUEST.len(),
        s.node_timeout
    );
    let _ = writeln!(
        o,
        "| N | workload | p50 | p99 | p50 / (c) p50 | p99 / (c) p99 | failures |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|");
    for (n, row) in rows {
        let base50 = p(&row.plain.cycle, 50.0);
        let base99 = p(&row.plain.cycle, 99.0);
        let write = format!(
            "one master: `SET` of {} B, the stored record's size (one round trip)",
            row.record_len
        );
        let lines: [(&str, &Latency, &[Duration]); 10] = [
            ("`/bare`: the handler, no lock", &row.bare, &row.bare.cycle),
            (
                "(c) `/locked`: plain `RedlockLayer`, fresh key (lock + handler + release)",
                &row.plain,
                &row.plain.cycle,
            ),
            (
                "(a) `/idempotent`, replay hit (key completed before)",
                &row.hit,
                &row.hit.cycle,
            ),
            (
                "(b) `/idempotent`, first execution, fresh key (claim + handler + store)",
                &row.first,
                &row.first.cycle,
            ),
            (
                "… (c) in process (`oneshot`, no sockets)",
                &row.plain_oneshot,
                &row.plain_oneshot.cycle,
            ),
            ("… (a) in process", &row.hit_oneshot, &row.hit_oneshot.cycle),
            (
                "… (b) in process",
                &row.first_oneshot,
                &row.first_oneshot.cycle,
            ),
            (
                "client, no HTTP: `try_lock` + `release`",
                &row.client,
                &row.client.cycle,
            ),
            (
                "client, no HTTP: `try_lock` (one write round on the quorum)",
                &row.client,
                &row.client.acquire,
            ),
            (&write, &row.write, &row.write.cycle),
        ];
        for (what, l, v) in lines {
            let failures = if l.hung {
                format!("{}, then hangs", l.failures)
            } else {
                l.failures.to_string()
            };
            let ratio = |q: f64, base: Option<Duration>| match (p(v, q), base) {
                (Some(v), Some(b)) if !b.is_zero() => {
                    format!("{:.2}×", v.as_secs_f64() / b.as_secs_f64())
                }
                _ => "—".into(),
            };
            let _ = writeln!(
                o,
                "| {n} | {what} | {} | {} | {} | {} | {failures} |",
                lat_cell(p(v, 50.0), None, false),
                lat_cell(p(v, 99.0), None, false),
                ratio(50.0, base50),
                ratio(99.0, base99),
            );
        }
    }
    let left: Vec<String> = rows
        .iter()
        .map(|(n, r)| format!("N={n}: {}", r.locks_left))
        .collect();
    let _ = writeln!(
        o,
        "\nLock keys left once settled (completion records aside): {}.",
        left.join(", ")
    );
}

/// The issue's targets for an idempotent endpoint over HTTP, at one N: (a) a replay hit p50
/// ≤ 1.2× (c) one plain locked request p50; (b) a first execution p50 ≤ (c) + one write
/// round trip, taken as `try_lock`'s p50 (one write round on the quorum), and shown too
/// against one master's `SET` round trip (the stricter reading).
fn http_replay_targets(o: &mut String, n: usize, row: &HttpReplayRow) {
    let mark = |ok: bool| if ok { "met" } else { "NOT met" };
    let (Some(plain), Some(hit), Some(first), Some(quorum_write), Some(one_write)) = (
        p(&row.plain.cycle, 50.0),
        p(&row.hit.cycle, 50.0),
        p(&row.first.cycle, 50.0),
        p(&row.client.acquire, 50.0),
        p(&row.write.cycle, 50.0),
    ) else {
        let _ = writeln!(o, "- N={n}: HTTP replay: nothing measured");
        return;
    };
    let r = |a: Duration| a.as_secs_f64() / plain.as_secs_f64();
    let _ = writeln!(
        o,
        "- N={n}, HTTP: replay hit p50 ≤ 1.2× one plain locked request p50: {} / {} = {:.2}× — {}",
        fmt_dur(hit),
        fmt_dur(plain),
        r(hit),
        mark(r(hit) <= 1.2)
    );
    let budget = plain + quorum_write;
    let strict = plain + one_write;
    let _ = writeln!(
        o,
        "- N={n}, HTTP: first execution p50 ≤ plain locked request p50 + one write round trip (a quorum write, `try_lock` p50): {} ({:.2}× (c)) ≤ {} + {} = {} ({:.2}×) — {} (against one master's `SET` round trip instead: {} + {} = {} ({:.2}×) — {})",
        fmt_dur(first),
        r(first),
        fmt_dur(plain),
        fmt_dur(quorum_write),
        fmt_dur(budget),
        r(budget),
        mark(first <= budget),
        fmt_dur(plain),
        fmt_dur(one_write),
        fmt_dur(strict),
        r(strict),
        mark(first <= strict)
    );
}
