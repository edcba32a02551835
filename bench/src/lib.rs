//! Shared by the benchmarks: the raw limit (Redlock written directly on redis-rs, [`limit`]),
//! adapters for this crate and the peer crates, the workloads, and the statistics; and the
//! sections of the comparison runner (`bench/benches/compare.rs`): the lock clients
//! ([`lock_clients`]), the replay workloads ([`replay`], [`http_replay`]), the HTTP layer
//! ([`http_layer`]), the stall workload ([`stall`]) and the report's cells ([`report`]).
//!
//! Everything here is measurement code: none of it is part of the crate. The benches of this
//! workspace member (`bench/benches/`) use it as `use tower_redlock_bench as common;`.

pub mod counting;
pub mod http_layer;
pub mod http_replay;
pub mod limit;
pub mod lock_clients;
pub mod replay;
pub mod report;
pub mod stall;
pub mod wake;
pub mod wake_subscribe;

pub use limit::{Extras, Limit, LimitLock};

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tower_redlock::{Lease, Redlock, Retry};

/// The lock ttl of every benchmark: long enough that no lock expires while it is measured.
pub const TTL: Duration = Duration::from_secs(10);

/// What every section of the comparison runner takes from its settings.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// Multiplies every duration and cycle count.
    pub scale: f64,
    /// Rounds: in each, every client runs every workload once, in a rotated order.
    pub rounds: usize,
    /// The per-node timeout of the limit and this crate.
    pub node_timeout: Duration,
}

impl Params {
    /// `secs` seconds, scaled.
    pub fn dur(&self, secs: f64) -> Duration {
        Duration::from_secs_f64(secs * self.scale)
    }

    /// `n` cycles, scaled (at least 1).
    pub fn count(&self, n: usize) -> usize {
        ((n as f64) * self.scale).ceil().max(1.0) as usize
    }
}

// ---------------------------------------------------------------------------------------------
// The clients under test

/// This crate's client as the benchmarks use it: one `.redis(url)` per master, no retries.
pub fn ours(urls: &[String], node_timeout: Duration) -> Redlock {
    ours_with(urls, node_timeout, false)
}

/// As [`ours`], with fencing tokens on or off.
pub fn ours_with(urls: &[String], node_timeout: Duration, fencing: bool) -> Redlock {
    urls.iter()
        .fold(Redlock::builder(), |b, u| b.redis(u))
        .node_timeout(node_timeout)
        .retry(Retry::never())
        .fencing(fencing)
        .build()
        .expect("valid client")
}

/// rslock 0.10 over `urls`, one try per call (no retry, no pause).
pub fn rslock(urls: &[String]) -> rslock::LockManager {
    let mut m = rslock::LockManager::new(urls.to_vec());
    m.set_retry(1, Duration::from_millis(1));
    m
}

/// redlock-rs 2 over `urls`, one try per call. It is synchronous: every command opens a new
/// connection, the masters are asked one after the other, and there is no timeout.
pub fn redlock_rs(urls: &[String]) -> redlock::RedLock {
    let mut m = redlock::RedLock::new(urls.to_vec());
    // One try; after a failed try it sleeps `0..delay` ms, so 1 means no pause.
    m.set_retry(1, 1);
    m
}

/// An async client under test.
#[derive(Clone)]
pub enum Locker {
    Limit(Arc<Limit>),
    Ours(Redlock),
    Rslock(rslock::LockManager),
}

/// A lock one of them holds.
pub enum Held {
    Limit(LimitLock),
    Ours(Lease),
    Rslock(rslock::Lock),
}

impl Locker {
    /// One try to lock `key` for [`TTL`].
    pub async fn acquire(&self, key: &str) -> Option<Held> {
        match self {
            Locker::Limit(l) => l.acquire(key, TTL).await.map(Held::Limit),
            Locker::Ours(r) => r.try_lock(key, TTL).await.ok().map(Held::Ours),
            Locker::Rslock(m) => m.lock(key, TTL).await.ok().map(Held::Rslock),
        }
    }

    /// Releases `held`, waiting as long as the client makes its caller wait.
    pub async fn release(&self, key: &str, held: Held) {
        match (self, held) {
            (Locker::Limit(l), Held::Limit(h)) => {
                l.release(key, h).await;
            }
            (Locker::Ours(_), Held::Ours(lease)) => {
                let _ = lease.release().await;
            }
            (Locker::Rslock(m), Held::Rslock(lock)) => m.unlock(&lock).await,
            _ => unreachable!("a lock is released by the client that took it"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Workloads

/// Single-task lock + release cycles.
#[derive(Debug, Default)]
pub struct Latency {
    /// Time to a held lock, per successful cycle.
    pub acquire: Vec<Duration>,
    /// Time of the whole lock + release cycle, per successful cycle.
    pub cycle: Vec<Duration>,
    pub failures: usize,
    /// Set when one cycle took longer than the cap (the client hangs).
    pub hung: bool,
}

impl Latency {
    pub fn merge(&mut self, other: Latency) {
        self.acquire.extend(other.acquire);
        self.cycle.extend(other.cycle);
        self.failures += other.failures;
        self.hung |= other.hung;
    }
}

/// Up to `count` runs of `one(i)`, one at a time, stopping early after `budget`, or when one
/// run takes longer than `cap`. A run gives its two times (`acquire`, `cycle` of
/// [`Latency`]), or `None` for a wrong answer or an error (a failure).
pub async fn sequential(
    count: usize,
    budget: Duration,
    cap: Duration,
    mut one: impl AsyncFnMut(usize) -> Option<(Duration, Duration)>,
) -> Latency {
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

/// `cycles` lock + release cycles on `key`, one at a time, stopping early after `budget`, or
/// when one cycle takes longer than `cap`.
pub async fn latency(
    l: &Locker,
    key: &str,
    cycles: usize,
    budget: Duration,
    cap: Duration,
) -> Latency {
    sequential(cycles, budget, cap, async |_| {
        let t0 = Instant::now();
        let held = l.acquire(key).await;
        let t1 = Instant::now();
        match held {
            Some(h) => {
                l.release(key, h).await;
                Some((t1 - t0, t0.elapsed()))
            }
            None => None,
        }
    })
    .await
}

/// `count` acquisitions, each of a fresh key (`{prefix}:{i}`) and timed alone; each lock is
/// released by a spawned task, so the loop never idles (an idle runtime parks its workers,
/// and waking them costs more than a lock). Stops early after `budget`, or when one
/// acquisition takes longer than `cap`.
pub async fn acquire_hot(
    l: &Locker,
    prefix: &str,
    count: usize,
    budget: Duration,
    cap: Duration,
) -> Latency {
    let mut out = Latency::default();
    let started = Instant::now();
    for i in 0..count {
        if started.elapsed() > budget {
            break;
        }
        let key = format!("{prefix}:{i}");
        let t0 = Instant::now();
        match tokio::time::timeout(cap, l.acquire(&key)).await {
            Ok(Some(h)) => {
                out.acquire.push(t0.elapsed());
                let l = l.clone();
                tokio::spawn(async move { l.release(&key, h).await });
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

/// Cycles (or successes) counted over a fixed duration.
#[derive(Debug, Default, Clone, Copy)]
pub struct Rate {
    pub ok: u64,
    pub failed: u64,
    pub overlaps: u64,
    pub secs: f64,
}

impl Rate {
    pub fn per_sec(&self) -> f64 {
        self.ok as f64 / self.secs
    }
}

/// `tasks` tasks, each cycling on its own key (`{prefix}:{i}`) for `dur`; counts the cycles
/// that finished within `dur`.
pub async fn throughput(l: &Locker, prefix: &str, tasks: usize, dur: Duration) -> Rate {
    cycles(l, |i| format!("{prefix}:{i}"), tasks, dur, false).await
}

/// `tasks` tasks competing for ONE key for `dur`, each trying again at once after a failed
/// try. A holder marks itself in a counter while it holds the lock: finding the counter
/// non-zero is an overlap (two holders at once), which must never happen.
pub async fn one_key(l: &Locker, key: &str, tasks: usize, dur: Duration) -> Rate {
    cycles(l, |_| key.to_owned(), tasks, dur, true).await
}

/// Counts the overlaps of holders: one shared by the tasks of a contended workload.
#[derive(Default)]
struct Holders {
    inside: AtomicUsize,
    overlaps: AtomicU64,
}

impl Holders {
    /// Marks a holder in: finding another one inside is an overlap.
    fn enter(&self) {
        if self.inside.fetch_add(1, Ordering::SeqCst) != 0 {
            self.overlaps.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Marks a holder out.
    fn leave(&self) {
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `tasks` tasks cycling on `key_of(task)` for `dur`; with `mark_holders`, each holder is
/// marked in [`Holders`] (and yields once while it holds the lock).
async fn cycles(
    l: &Locker,
    key_of: impl Fn(usize) -> String,
    tasks: usize,
    dur: Duration,
    mark_holders: bool,
) -> Rate {
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let holders = Arc::new(Holders::default());
    let deadline = Instant::now() + dur;
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let (l, ok, failed, holders) = (l.clone(), ok.clone(), failed.clone(), holders.clone());
            let key = key_of(i);
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    match l.acquire(&key).await {
                        Some(h) => {
                            if mark_holders {
                                // Hold for a moment, so that another holder could show up.
                                holders.enter();
                                tokio::task::yield_now().await;
                                holders.leave();
                            }
                            l.release(&key, h).await;
                            if Instant::now() <= deadline {
                                ok.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        None => {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.await.expect("task");
    }
    Rate {
        ok: ok.load(Ordering::Relaxed),
        failed: failed.load(Ordering::Relaxed),
        overlaps: holders.overlaps.load(Ordering::Relaxed),
        secs: dur.as_secs_f64(),
    }
}

// The same workloads for redlock-rs, which blocks: one OS thread per task.

/// Single-thread lock + release cycles of redlock-rs (call from a blocking thread).
pub fn latency_sync(m: &redlock::RedLock, key: &str, cycles: usize, budget: Duration) -> Latency {
    let mut out = Latency::default();
    let started = Instant::now();
    let ttl_ms = TTL.as_millis() as usize;
    for _ in 0..cycles {
        if started.elapsed() > budget {
            break;
        }
        let t0 = Instant::now();
        match m.lock(key.as_bytes(), ttl_ms) {
            Ok(Some(lock)) => {
                let t1 = Instant::now();
                m.unlock(&lock);
                out.acquire.push(t1 - t0);
                out.cycle.push(t0.elapsed());
            }
            _ => out.failures += 1,
        }
    }
    out
}

/// [`throughput`] for redlock-rs, on `tasks` threads.
pub fn throughput_sync(m: &redlock::RedLock, prefix: &str, tasks: usize, dur: Duration) -> Rate {
    cycles_sync(m, |i| format!("{prefix}:{i}"), tasks, dur, false)
}

/// [`one_key`] for redlock-rs, on `tasks` threads.
pub fn one_key_sync(m: &redlock::RedLock, key: &str, tasks: usize, dur: Duration) -> Rate {
    cycles_sync(m, |_| key.to_owned(), tasks, dur, true)
}

/// [`cycles`] for redlock-rs, on `tasks` threads.
fn cycles_sync(
    m: &redlock::RedLock,
    key_of: impl Fn(usize) -> String,
    tasks: usize,
    dur: Duration,
    mark_holders: bool,
) -> Rate {
    let ok = AtomicU64::new(0);
    let failed = AtomicU64::new(0);
    let holders = Holders::default();
    let deadline = Instant::now() + dur;
    let ttl_ms = TTL.as_millis() as usize;
    std::thread::scope(|s| {
        for i in 0..tasks {
            let (ok, failed, holders) = (&ok, &failed, &holders);
            let key = key_of(i);
            s.spawn(move || {
                while Instant::now() < deadline {
                    match m.lock(key.as_bytes(), ttl_ms) {
                        Ok(Some(lock)) => {
                            if mark_holders {
                                holders.enter();
                                std::thread::yield_now();
                                holders.leave();
                            }
                            m.unlock(&lock);
                            if Instant::now() <= deadline {
                                ok.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        _ => {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    Rate {
        ok: ok.into_inner(),
        failed: failed.into_inner(),
        overlaps: holders.overlaps.into_inner(),
        secs: dur.as_secs_f64(),
    }
}

// ---------------------------------------------------------------------------------------------
// Statistics and formatting

/// The `p`-th percentile (0..=100) of `v`, nearest rank; `None` when empty.
pub fn percentile(v: &[Duration], p: f64) -> Option<Duration> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_unstable();
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    Some(s[rank.clamp(1, s.len()) - 1])
}

/// The median of `v` (0 when empty).
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    }
}

/// `87 µs`, `4.31 ms`, `1.02 s`.
pub fn fmt_dur(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1000.0 {
        format!("{us:.0} µs")
    } else if us < 1e6 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{:.2} s", us / 1e6)
    }
}

/// `12.3k`, `950`.
pub fn fmt_rate(r: f64) -> String {
    if r >= 10_000.0 {
        format!("{:.1}k", r / 1000.0)
    } else {
        format!("{r:.0}")
    }
}
