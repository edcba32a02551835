//! The mutual-exclusion checker: several OS processes fight over a few resources through
//! Redlock while a minority of the masters is frozen, partitioned, slowed, reset and
//! restarted; then every critical section of every process is checked against every other.
//!
//! `tests/checker.rs` (in the root crate) runs it at CI size; the `soak` binary of this crate
//! runs it long:
//!
//! ```text
//! cargo run --release -p tower-redlock-testkit --bin soak                  # 100,000 acquisitions
//! cargo run --release -p tower-redlock-testkit --bin soak -- --acquisitions 1000000 --processes 4
//! ```
//!
//! Settings, as flags or `CHECKER_*` environment variables (flags win):
//!
//! | flag | variable | soak default | test default |
//! | --- | --- | --- | --- |
//! | `--acquisitions N` | `CHECKER_ACQUISITIONS` | 100,000 | 10,000 |
//! | `--processes N` | `CHECKER_PROCESSES` | 4 | 3 |
//! | `--tasks N` (per process) | `CHECKER_TASKS` | 8 | 8 |
//! | `--resources N` | `CHECKER_RESOURCES` | 3 | 3 |
//! | `--ttl-ms N` | `CHECKER_TTL_MS` | 400 | 400 |
//! | `--work-us N` (busy work per section) | `CHECKER_WORK_US` | 200 | 200 |
//! | `--time-limit-s N` | `CHECKER_TIME_LIMIT_S` | 1800 | 240 |
//!
//! It needs `redis-server` on `PATH` (`apt-get install -y redis-server`, `brew install
//! redis`, or `. scripts/ensure-redis.sh && ensure_redis`); it starts and stops its own five
//! masters on free loopback ports.
//!
//! # What is checked
//!
//! Every worker process records, for each critical section, the resource, the moment it
//! entered and left, and the lease's validity deadline, all on the system-wide monotonic
//! clock (`CLOCK_MONOTONIC`, shared by every process of the machine). After the run:
//!
//! - no two sections on one resource overlap (sorted by entry, each entry is at or after
//!   every earlier section's exit), and
//! - every section left before its lease deadline (and `Lease::is_valid` agreed).
//!
//! The order is causal, not just clock-close: a section's exit is read before its release
//! is sent, and the next holder's entry after its lock was granted, which needs that release
//! (or the expiry) on a quorum first.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Read as _, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use crate::proxy::{Fault, FaultProxy};
use crate::Masters;
use tower_redlock::node::RedisNodeOptions;
use tower_redlock::{Redlock, Retry};

/// Set (to anything) in a worker process's environment.
pub const WORKER_ENV: &str = "CHECKER_WORKER";

/// How many masters; faults never touch more than [`MAX_AFFECTED`] of them at once.
pub const MASTERS: usize = 5;
/// A minority of [`MASTERS`].
pub const MAX_AFFECTED: usize = 2;

// --- settings ----------------------------------------------------------------------------------

/// The size and tunables of one run.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Worker processes.
    pub processes: usize,
    /// Lock-taking tasks per process.
    pub tasks: usize,
    /// Successful acquisitions to reach, over all processes.
    pub acquisitions: u64,
    /// Shared resources everyone fights over.
    pub resources: usize,
    /// The lock ttl (also the masters' delayed-restart protection window).
    pub ttl: Duration,
    /// The client's per-node timeout.
    pub node_timeout: Duration,
    /// Busy work inside each critical section.
    pub work: Duration,
    /// Retries of each `lock_with` call.
    pub retries: u32,
    /// The base delay between those retries.
    pub retry_delay: Duration,
    /// The random jitter added to each delay.
    pub retry_jitter: Duration,
    /// Workers stop on their own after this; the parent kills them a little later.
    pub time_limit: Duration,
}

impl Settings {
    /// A CI-sized run: a few tens of seconds on a shared 2-core machine.
    pub fn ci() -> Self {
        Self {
            processes: 3,
            tasks: 8,
            acquisitions: 10_000,
            resources: 3,
            ttl: Duration::from_millis(400),
            node_timeout: Duration::from_millis(150),
            work: Duration::from_micros(200),
            retries: 5,
            retry_delay: Duration::from_millis(2),
            retry_jitter: Duration::from_millis(8),
            time_limit: Duration::from_secs(240),
        }
    }

    /// A long local run.
    pub fn soak() -> Self {
        Self {
            processes: 4,
            acquisitions: 100_000,
            time_limit: Duration::from_secs(1800),
            ..Self::ci()
        }
    }

    /// Overrides from `CHECKER_*` environment variables, then from `--flag value` pairs.
    pub fn with_overrides(mut self, args: &[String]) -> Self {
        let mut set = |name: &str, value: &str| {
            let n: u64 = value
                .parse()
                .unwrap_or_else(|_| panic!("{name} must be a whole number, not {value:?}"));
            let us = |n: u64| usize::try_from(n).expect("fits usize");
            match name {
                "acquisitions" => self.acquisitions = n,
                "processes" => self.processes = us(n).max(1),
                "tasks" => self.tasks = us(n).max(1),
                "resources" => self.resources = us(n).max(1),
                "ttl-ms" => self.ttl = Duration::from_millis(n),
                "time-limit-s" => self.time_limit = Duration::from_secs(n),
                "work-us" => self.work = Duration::from_micros(n),
                other => panic!("unknown setting {other}"),
            }
        };
        for name in [
            "acquisitions",
            "processes",
            "tasks",
            "resources",
            "ttl-ms",
            "time-limit-s",
            "work-us",
        ] {
            let var = format!("CHECKER_{}", name.replace('-', "_").to_uppercase());
            if let Ok(v) = std::env::var(&var) {
                set(name, v.trim());
            }
        }
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let Some(name) = a.strip_prefix("--") else {
                panic!("unexpected argument {a:?}");
            };
            let value = it
                .next()
                .unwrap_or_else(|| panic!("--{name} needs a value"));
            set(name, value);
        }
        self
    }

    /// How long a restarted master abstains under delayed-restart protection: until Redis
    /// reports an uptime (whole seconds, rounded down) of at least 1 s + the ttl.
    fn abstention(&self) -> Duration {
        Duration::from_secs(1 + self.ttl.as_secs_f64().ceil() as u64) + Duration::from_millis(500)
    }
}

// --- the shared clock --------------------------------------------------------------------------

/// `CLOCK_MONOTONIC` as raw nanoseconds: one clock for every process of the machine
/// (`std::time::Instant` reads it too, but keeps the value opaque), read through rustix's
/// safe `clock_gettime`.
#[cfg(all(
    any(target_os = "linux", target_os = "macos"),
    target_pointer_width = "64"
))]
mod clock {
    use rustix::time::{clock_gettime, ClockId};

    pub fn now_ns() -> i64 {
        let ts = clock_gettime(ClockId::Monotonic);
        ts.tv_sec * 1_000_000_000 + ts.tv_nsec
    }
}

#[cfg(not(all(
    any(target_os = "linux", target_os = "macos"),
    target_pointer_width = "64"
)))]
mod clock {
    pub fn now_ns() -> i64 {
        panic!("the checker reads CLOCK_MONOTONIC and runs on 64-bit Linux or macOS only")
    }
}

/// `instant` on the shared clock. The raw clock is read *before* `Instant::now()`, so the
/// result is never later than the true value: a deadline is, if anything, checked early.
fn shared_ns(instant: Instant) -> i64 {
    let raw = clock::now_ns();
    let now = Instant::now();
    if instant >= now {
        raw + nanos(instant - now)
    } else {
        raw - nanos(now - instant)
    }
}

fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

// --- what the workers record -------------------------------------------------------------------

/// One critical section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Section {
    pub resource: usize,
    /// Entered (the lock was granted), on the shared clock.
    pub enter_ns: i64,
    /// Left (before the release was sent), on the shared clock.
    pub leave_ns: i64,
    /// The lease's validity deadline, on the shared clock.
    pub deadline_ns: i64,
    /// `Lease::is_valid()` when leaving.
    pub valid: bool,
    pub worker: usize,
    pub task: usize,
}

/// What one worker counted.
#[derive(Debug, Clone, Default)]
pub struct Counts {
    pub acquisitions: u64,
    /// `lock_with` calls that gave up because the resource stayed held.
    pub contended: u64,
    /// `lock_with` calls that gave up because no quorum answered.
    pub unavailable: u64,
    /// Any other error (should be none).
    pub other: u64,
    /// Releases that did not reach a quorum (the lock then expires with its ttl).
    pub release_errors: u64,
    /// Time from start until a first lock was taken (connections up, masters voting).
    pub warm_up_ms: u64,
    pub elapsed_ms: u64,
}

/// One worker's log: its counts, its sections and a few error samples.
#[derive(Debug, Clone, Default)]
pub struct WorkerLog {
    pub counts: Counts,
    pub sections: Vec<Section>,
    pub errors: Vec<String>,
}

impl WorkerLog {
    fn write(&self, path: &Path) -> std::io::Result<()> {
        let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
        let c = &self.counts;
        writeln!(
            out,
            "counts {} {} {} {} {} {} {}",
            c.acquisitions,
            c.contended,
            c.unavailable,
            c.other,
            c.release_errors,
            c.warm_up_ms,
            c.elapsed_ms
        )?;
        for e in &self.errors {
            writeln!(out, "error {}", e.replace('\n', " "))?;
        }
        for s in &self.sections {
            writeln!(
                out,
                "s {} {} {} {} {} {}",
                s.resource,
                s.enter_ns,
                s.leave_ns,
                s.deadline_ns,
                u8::from(s.valid),
                s.task
            )?;
        }
        writeln!(out, "end")?;
        out.flush()
    }

    fn read(path: &Path, worker: usize) -> Result<Self, String> {
        let file = std::fs::File::open(path).map_err(|e| format!("open {path:?}: {e}"))?;
        let mut log = WorkerLog::default();
        let mut complete = false;
        for (n, line) in BufReader::new(file).lines().enumerate() {
            let line = line.map_err(|e| format!("read {path:?}: {e}"))?;
            let bad = || format!("{path:?} line {}: malformed: {line:?}", n + 1);
            let mut f = line.split(' ');
            match f.next() {
                Some("counts") => {
                    let v: Vec<u64> = f
                        .map(|x| x.parse().map_err(|_| bad()))
                        .collect::<Result<_, _>>()?;
                    let [a, c, u, o, r, w, e] = v[..] else {
                        return Err(bad());
                    };
                    log.counts = Counts {
                        acquisitions: a,
                        contended: c,
                        unavailable: u,
                        other: o,
                        release_errors: r,
                        warm_up_ms: w,
                        elapsed_ms: e,
                    };
                }
                Some("error") => log.errors.push(line["error ".len()..].to_owned()),
                Some("s") => {
                    let v: Vec<i64> = f
                        .map(|x| x.parse().map_err(|_| bad()))
                        .collect::<Result<_, _>>()?;
                    let [r, enter, leave, deadline, valid, task] = v[..] else {
                        return Err(bad());
                    };
                    log.sections.push(Section {
                        resource: usize::try_from(r).map_err(|_| bad())?,
                        enter_ns: enter,
                        leave_ns: leave,
                        deadline_ns: deadline,
                        valid: valid == 1,
                        worker,
                        task: usize::try_from(task).map_err(|_| bad())?,
                    });
                }
                Some("end") => complete = true,
                _ => return Err(bad()),
            }
        }
        if !complete {
            return Err(format!("{path:?} is incomplete (no `end` line)"));
        }
        Ok(log)
    }
}

// --- the verdict -------------------------------------------------------------------------------

/// What the merged logs show.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    pub sections: usize,
    /// Pairs of sections on one resource that overlap: (earlier, later).
    pub overlaps: Vec<(Section, Section)>,
    /// Sections that left at or after their lease deadline, or whose lease was not valid.
    pub late: Vec<Section>,
    /// The smallest `deadline − leave` seen: how close a section came to its deadline.
    pub min_margin_ns: Option<i64>,
    /// The smallest gap between one holder's exit and the next holder's entry.
    pub min_handover_ns: Option<i64>,
}

impl Verdict {
    pub fn violations(&self) -> usize {
        self.overlaps.len() + self.late.len()
    }
}

/// Checks the merged sections: no overlap on any resource, every exit before its deadline.
pub fn check(mut sections: Vec<Section>) -> Verdict {
    let mut v = Verdict {
        sections: sections.len(),
        ..Verdict::default()
    };
    for s in &sections {
        if !s.valid || s.leave_ns >= s.deadline_ns {
            v.late.push(*s);
        }
        let margin = s.deadline_ns - s.leave_ns;
        v.min_margin_ns = Some(v.min_margin_ns.map_or(margin, |m| m.min(margin)));
    }
    sections.sort_by_key(|s| (s.resource, s.enter_ns, s.leave_ns));
    // Per resource, the section that left last so far: a later entry before its exit is an
    // overlap (comparing with the latest exit, not just the previous one, also catches a
    // section nested inside a long one).
    let mut last: Option<Section> = None;
    for s in sections {
        match last {
            Some(l) if l.resource == s.resource => {
                let gap = s.enter_ns - l.leave_ns;
                if gap < 0 {
                    v.overlaps.push((l, s));
                } else {
                    v.min_handover_ns = Some(v.min_handover_ns.map_or(gap, |m| m.min(gap)));
                }
                if s.leave_ns > l.leave_ns {
                    last = Some(s);
                }
            }
            _ => last = Some(s),
        }
    }
    v
}

// --- the worker process ------------------------------------------------------------------------

/// Runs one worker process from its environment (see [`run`]), writes its log and returns.
/// Panics on a broken environment.
pub fn worker_main() {
    let env = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| panic!("the worker needs {name} in its environment"))
    };
    let num = |name: &str| -> u64 {
        env(name)
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a whole number"))
    };
    let config = WorkerConfig {
        id: num("CHECKER_WORKER_ID") as usize,
        urls: env("CHECKER_URLS").split(',').map(str::to_owned).collect(),
        resources: env("CHECKER_RESOURCE_NAMES")
            .split(',')
            .map(str::to_owned)
            .collect(),
        target: num("CHECKER_TARGET"),
        tasks: num("CHECKER_TASKS") as usize,
        ttl: Duration::from_millis(num("CHECKER_TTL_MS")),
        node_timeout: Duration::from_millis(num("CHECKER_NODE_TIMEOUT_MS")),
        work: Duration::from_micros(num("CHECKER_WORK_US")),
        retry: Retry::times(num("CHECKER_RETRIES") as u32)
            .delay(Duration::from_micros(num("CHECKER_RETRY_DELAY_US")))
            .jitter(Duration::from_micros(num("CHECKER_RETRY_JITTER_US"))),
        time_limit: Duration::from_millis(num("CHECKER_TIME_LIMIT_MS")),
    };
    let log_path = PathBuf::from(env("CHECKER_LOG"));
    // The parent holds our stdin open: when it ends (the parent exited, even killed), so
    // does this worker, instead of fighting on alone until its time limit.
    std::thread::spawn(|| {
        let mut buf = [0u8; 64];
        while let Ok(n) = std::io::stdin().read(&mut buf) {
            if n == 0 {
                break;
            }
        }
        std::process::exit(3);
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("worker runtime");
    let log = rt.block_on(worker(config));
    log.write(&log_path)
        .unwrap_or_else(|e| panic!("write {log_path:?}: {e}"));
}

#[derive(Debug, Clone)]
struct WorkerConfig {
    id: usize,
    urls: Vec<String>,
    resources: Vec<String>,
    target: u64,
    tasks: usize,
    ttl: Duration,
    node_timeout: Duration,
    work: Duration,
    retry: Retry,
    time_limit: Duration,
}

#[derive(Default)]
struct Shared {
    acquisitions: AtomicU64,
    contended: AtomicU64,
    unavailable: AtomicU64,
    other: AtomicU64,
    release_errors: AtomicU64,
    errors: std::sync::Mutex<Vec<String>>,
}

impl Shared {
    fn sample(&self, e: &tower_redlock::Error) {
        let mut errors = self.errors.lock().unwrap();
        if errors.len() < 5 {
            errors.push(e.to_string());
        }
    }
}

async fn worker(config: WorkerConfig) -> WorkerLog {
    let started = Instant::now();
    let stop_at = started + config.time_limit;
    // Delayed-restart protection keeps restarts safe: a master restarted empty abstains
    // until its uptime exceeds the longest ttl (ours), so a lock it forgot can no longer be
    // valid when it votes again. Without it, a restart inside a lock's bare quorum is the
    // known Redlock hole, which this checker can then (rightly) report as an overlap.
    let node = RedisNodeOptions::new()
        .restart_protection(config.ttl)
        .connect_timeout(config.node_timeout * 2)
        .response_timeout(config.node_timeout * 2);
    let redlock = config
        .urls
        .iter()
        .fold(Redlock::builder(), |b, url| b.redis_with(url, &node))
        .node_timeout(config.node_timeout)
        .retry(config.retry)
        .build()
        .expect("a valid worker client");

    // Warm up: connections made, and every fresh master past its protection window, so that
    // the count of errors below is about the faults, not the start.
    let warm_key = format!("{}:warm-up:{}", config.resources[0], config.id);
    loop {
        if let Ok(lease) = redlock.try_lock(&warm_key, config.ttl).await {
            let _ = lease.release().await;
            break;
        }
        assert!(
            Instant::now() < stop_at,
            "worker {} could not take a first lock within {:?}",
            config.id,
            config.time_limit
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let warm_up = started.elapsed();

    let shared = Arc::new(Shared::default());
    let config = Arc::new(config);
    let tasks: Vec<_> = (0..config.tasks)
        .map(|task| {
            let (redlock, shared, config) = (redlock.clone(), shared.clone(), config.clone());
            tokio::spawn(async move { lock_loop(task, &redlock, &shared, &config, stop_at).await })
        })
        .collect();
    let mut sections = Vec::new();
    for t in tasks {
        sections.extend(t.await.expect("a lock task panicked"));
    }
    let errors = std::mem::take(&mut *shared.errors.lock().unwrap());
    WorkerLog {
        counts: Counts {
            acquisitions: shared.acquisitions.load(Ordering::Relaxed),
            contended: shared.contended.load(Ordering::Relaxed),
            unavailable: shared.unavailable.load(Ordering::Relaxed),
            other: shared.other.load(Ordering::Relaxed),
            release_errors: shared.release_errors.load(Ordering::Relaxed),
            warm_up_ms: warm_up.as_millis() as u64,
            elapsed_ms: started.elapsed().as_millis() as u64,
        },
        sections,
        errors,
    }
}

/// One task: lock a random resource, record the section, release; until the process's share
/// of acquisitions is reached or the time is up.
async fn lock_loop(
    task: usize,
    redlock: &Redlock,
    shared: &Shared,
    config: &WorkerConfig,
    stop_at: Instant,
) -> Vec<Section> {
    let mut sections = Vec::new();
    let mut rng = fastrand::Rng::new();
    while shared.acquisitions.load(Ordering::Relaxed) < config.target && Instant::now() < stop_at {
        let resource = rng.usize(..config.resources.len());
        match redlock
            .lock_with(&config.resources[resource], config.ttl, config.retry)
            .await
        {
            Ok(lease) => {
                let enter_ns = clock::now_ns();
                let deadline_ns = shared_ns(lease.deadline());
                // The "work": give the other tasks a turn, spin a little, once more.
                tokio::task::yield_now().await;
                let until = Instant::now() + config.work;
                while Instant::now() < until {
                    std::hint::spin_loop();
                }
                tokio::task::yield_now().await;
                let leave_ns = clock::now_ns();
                let valid = lease.is_valid();
                sections.push(Section {
                    resource,
                    enter_ns,
                    leave_ns,
                    deadline_ns,
                    valid,
                    worker: config.id,
                    task,
                });
                shared.acquisitions.fetch_add(1, Ordering::Relaxed);
                if lease.release().await.is_err() {
                    shared.release_errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e) if e.is_contended() => {
                shared.contended.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) if e.is_unavailable() => {
                shared.unavailable.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                shared.other.fetch_add(1, Ordering::Relaxed);
                shared.sample(&e);
            }
        }
    }
    sections
}

// --- the parent: masters, proxies, workers, faults ---------------------------------------------

/// Faults injected, by kind.
#[derive(Debug, Clone, Default)]
pub struct FaultCounts {
    pub by_kind: BTreeMap<&'static str, u64>,
}

impl FaultCounts {
    fn add(&mut self, kind: &'static str) {
        *self.by_kind.entry(kind).or_default() += 1;
    }

    pub fn total(&self) -> u64 {
        self.by_kind.values().sum()
    }
}

/// The outcome of a run.
#[derive(Debug)]
pub struct Report {
    pub settings: Settings,
    pub logs: Vec<WorkerLog>,
    /// Workers that did not exit cleanly, with what they said.
    pub failed_workers: Vec<String>,
    pub faults: FaultCounts,
    pub verdict: Verdict,
    pub elapsed: Duration,
    /// Kept on failure, removed on success.
    pub dir: PathBuf,
}

impl Report {
    pub fn total(&self) -> Counts {
        let mut t = Counts::default();
        for l in &self.logs {
            let c = &l.counts;
            t.acquisitions += c.acquisitions;
            t.contended += c.contended;
            t.unavailable += c.unavailable;
            t.other += c.other;
            t.release_errors += c.release_errors;
            t.warm_up_ms = t.warm_up_ms.max(c.warm_up_ms);
            t.elapsed_ms = t.elapsed_ms.max(c.elapsed_ms);
        }
        t
    }

    /// Everything that makes the run fail; empty when it passed.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        for w in &self.failed_workers {
            p.push(format!("worker failed: {w}"));
        }
        let t = self.total();
        if t.acquisitions < self.settings.acquisitions {
            p.push(format!(
                "only {} of {} acquisitions within {:?}",
                t.acquisitions, self.settings.acquisitions, self.settings.time_limit
            ));
        }
        if t.other > 0 {
            let samples: Vec<_> = self.logs.iter().flat_map(|l| l.errors.iter()).collect();
            p.push(format!(
                "{} unexpected lock errors, e.g. {samples:?}",
                t.other
            ));
        }
        for (a, b) in self.verdict.overlaps.iter().take(10) {
            p.push(format!(
                "OVERLAP on resource {}: worker {} task {} held [{}, {}] ns, worker {} task {} \
                 entered at {} ns ({} µs before the first left)",
                a.resource,
                a.worker,
                a.task,
                a.enter_ns,
                a.leave_ns,
                b.worker,
                b.task,
                b.enter_ns,
                (a.leave_ns - b.enter_ns) / 1000
            ));
        }
        for s in self.verdict.late.iter().take(10) {
            p.push(format!(
                "LATE: worker {} task {} left resource {} {} µs after its lease deadline \
                 (is_valid: {})",
                s.worker,
                s.task,
                s.resource,
                (s.leave_ns - s.deadline_ns) / 1000,
                s.valid
            ));
        }
        if self.faults.total() == 0 {
            p.push("no fault was injected: the run was too short to test anything".into());
        }
        p
    }

    /// The summary table.
    pub fn summary(&self) -> String {
        let s = &self.settings;
        let t = self.total();
        let v = &self.verdict;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "checker: {} processes × {} tasks, {MASTERS} masters (≤ {MAX_AFFECTED} faulty at once), \
             {} resources, ttl {:?}, node timeout {:?}",
            s.processes, s.tasks, s.resources, s.ttl, s.node_timeout
        );
        let row = |out: &mut String, name: &str, value: String| {
            let _ = writeln!(out, "  {name:<18} {value}");
        };
        row(
            &mut out,
            "acquisitions",
            format!(
                "{} (target {}, {:.0}/s)",
                t.acquisitions,
                s.acquisitions,
                t.acquisitions as f64 / self.elapsed.as_secs_f64().max(1e-9)
            ),
        );
        row(&mut out, "contended", t.contended.to_string());
        row(&mut out, "unavailable", t.unavailable.to_string());
        row(&mut out, "other errors", t.other.to_string());
        row(&mut out, "release errors", t.release_errors.to_string());
        let kinds: Vec<_> = self
            .faults
            .by_kind
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        row(
            &mut out,
            "faults injected",
            format!("{} ({})", self.faults.total(), kinds.join(", ")),
        );
        row(&mut out, "overlaps", v.overlaps.len().to_string());
        row(&mut out, "late exits", v.late.len().to_string());
        row(&mut out, "violations", v.violations().to_string());
        let ms = |ns: Option<i64>| ns.map_or("-".into(), |n| format!("{:.3} ms", n as f64 / 1e6));
        row(&mut out, "min deadline margin", ms(v.min_margin_ns));
        row(&mut out, "min handover gap", ms(v.min_handover_ns));
        row(
            &mut out,
            "warm-up",
            format!("{} ms (slowest worker)", t.warm_up_ms),
        );
        row(
            &mut out,
            "elapsed",
            format!("{:.1} s", self.elapsed.as_secs_f64()),
        );
        for (i, l) in self.logs.iter().enumerate() {
            let c = &l.counts;
            row(
                &mut out,
                &format!("worker {i}"),
                format!(
                    "{} acquisitions, {} contended, {} unavailable, {} other, {:.1} s",
                    c.acquisitions,
                    c.contended,
                    c.unavailable,
                    c.other,
                    c.elapsed_ms as f64 / 1000.0
                ),
            );
        }
        out
    }
}

/// Runs the checker: starts [`MASTERS`] masters with a [`FaultProxy`] in front of each,
/// spawns `settings.processes` workers (each from `worker_command()`, with the worker
/// environment added), injects faults on a minority of masters until every worker is done,
/// then merges the logs and checks them. Panics only on a broken harness; the verdict is in
/// the report.
pub fn run(settings: &Settings, worker_command: impl Fn() -> Command) -> Report {
    let started = Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("parent runtime");
    let masters = Masters::start(MASTERS);
    // Workers reach the masters only through the proxies, so a partition cuts them all off.
    let proxies: Vec<FaultProxy> = rt.block_on(async {
        let mut out = Vec::new();
        for m in masters.iter() {
            let upstream: SocketAddr = m.addr().parse().expect("a socket address");
            out.push(FaultProxy::start(upstream).await);
        }
        out
    });

    let run_id = format!("{}-{}", std::process::id(), fastrand::u32(..));
    let dir = std::env::temp_dir().join(format!("tower-redlock-checker-{run_id}"));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {dir:?}: {e}"));
    let urls: Vec<String> = proxies.iter().map(FaultProxy::url).collect();
    let resources: Vec<String> = (0..settings.resources)
        .map(|r| format!("checker:{run_id}:r{r}"))
        .collect();
    let share = settings.acquisitions.div_ceil(settings.processes as u64);

    let mut workers = Workers::default();
    for id in 0..settings.processes {
        let log = dir.join(format!("worker-{id}.log"));
        let out = std::fs::File::create(dir.join(format!("worker-{id}.out"))).expect("out file");
        let err = out.try_clone().expect("clone out file");
        let mut cmd = worker_command();
        cmd.env(WORKER_ENV, "1")
            .env("CHECKER_WORKER_ID", id.to_string())
            .env("CHECKER_URLS", urls.join(","))
            .env("CHECKER_RESOURCE_NAMES", resources.join(","))
            .env("CHECKER_TARGET", share.to_string())
            .env("CHECKER_TASKS", settings.tasks.to_string())
            .env("CHECKER_TTL_MS", settings.ttl.as_millis().to_string())
            .env(
                "CHECKER_NODE_TIMEOUT_MS",
                settings.node_timeout.as_millis().to_string(),
            )
            .env("CHECKER_WORK_US", settings.work.as_micros().to_string())
            .env("CHECKER_RETRIES", settings.retries.to_string())
            .env(
                "CHECKER_RETRY_DELAY_US",
                settings.retry_delay.as_micros().to_string(),
            )
            .env(
                "CHECKER_RETRY_JITTER_US",
                settings.retry_jitter.as_micros().to_string(),
            )
            .env(
                "CHECKER_TIME_LIMIT_MS",
                settings.time_limit.as_millis().to_string(),
            )
            .env("CHECKER_LOG", &log)
            .stdin(Stdio::piped())
            .stdout(out)
            .stderr(err);
        let child = cmd.spawn().expect("spawn a worker process");
        workers.children.push((id, Some(child), log));
    }

    // The fault schedule runs on its own thread until the workers are done.
    let (stop, stopped) = mpsc::channel::<()>();
    let abstention = settings.abstention();
    let faults = std::thread::scope(|s| {
        let (masters, proxies) = (&masters, &proxies);
        let schedule = s.spawn(move || fault_schedule(masters, proxies, &stopped, abstention));
        // Workers stop themselves at the time limit; past it (and a grace period) they are
        // killed.
        let statuses = workers.wait(settings.time_limit + Duration::from_secs(20));
        drop(stop);
        let faults = schedule
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        (faults, statuses)
    });
    let (faults, statuses) = faults;

    let mut logs = Vec::new();
    let mut failed_workers = Vec::new();
    for (id, status, log) in statuses {
        let output =
            std::fs::read_to_string(dir.join(format!("worker-{id}.out"))).unwrap_or_default();
        match status {
            Some(s) if s.success() => match WorkerLog::read(&log, id) {
                Ok(l) => logs.push(l),
                Err(e) => failed_workers.push(format!("worker {id}: {e}")),
            },
            Some(s) => failed_workers.push(format!("worker {id} exited with {s}: {output}")),
            None => failed_workers.push(format!(
                "worker {id} overran its time limit and was killed: {output}"
            )),
        }
    }
    let verdict = check(
        logs.iter()
            .flat_map(|l| l.sections.iter().copied())
            .collect(),
    );
    drop(proxies);
    drop(masters);
    drop(rt);
    let report = Report {
        settings: settings.clone(),
        logs,
        failed_workers,
        faults,
        verdict,
        elapsed: started.elapsed(),
        dir,
    };
    if report.problems().is_empty() {
        let _ = std::fs::remove_dir_all(&report.dir);
    }
    report
}

/// The worker processes; any still running when this is dropped is killed (by its pid).
#[derive(Default)]
struct Workers {
    children: Vec<(usize, Option<Child>, PathBuf)>,
}

type Statuses = Vec<(usize, Option<ExitStatus>, PathBuf)>;

impl Workers {
    /// Waits for every worker until `within` has passed, then kills the rest. Returns each
    /// worker's exit status (`None`: killed).
    fn wait(&mut self, within: Duration) -> Statuses {
        let deadline = Instant::now() + within;
        let mut done: Vec<Option<ExitStatus>> = vec![None; self.children.len()];
        loop {
            for (i, (_, child, _)) in self.children.iter_mut().enumerate() {
                if let (None, Some(c)) = (done[i], child.as_mut()) {
                    done[i] = c.try_wait().expect("poll a worker");
                }
            }
            if done.iter().all(Option::is_some) || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill_all();
        self.children
            .drain(..)
            .zip(done)
            .map(|((id, _, log), status)| (id, status, log))
            .collect()
    }

    fn kill_all(&mut self) {
        for (_, child, _) in &mut self.children {
            if let Some(mut c) = child.take() {
                if matches!(c.try_wait(), Ok(None)) {
                    let _ = c.kill();
                    let _ = c.wait();
                }
            }
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// Sleeps for `d` unless told to stop; true when told to stop.
fn pause(stop: &mpsc::Receiver<()>, d: Duration) -> bool {
    !matches!(stop.recv_timeout(d), Err(mpsc::RecvTimeoutError::Timeout))
}

fn ms(rng: &mut fastrand::Rng, range: std::ops::RangeInclusive<u64>) -> Duration {
    Duration::from_millis(rng.u64(range))
}

/// Injects one fault at a time on at most [`MAX_AFFECTED`] masters — counting a restarted
/// master that still abstains (delayed-restart protection) as affected — and heals it, until
/// `stop` says so. Every fault is healed before this returns.
fn fault_schedule(
    masters: &Masters,
    proxies: &[FaultProxy],
    stop: &mpsc::Receiver<()>,
    abstention: Duration,
) -> FaultCounts {
    let mut rng = fastrand::Rng::new();
    let mut counts = FaultCounts::default();
    let mut abstaining_until: Vec<Option<Instant>> = vec![None; masters.len()];
    // Let the workers warm up and take their first locks undisturbed.
    let mut stopped = pause(stop, Duration::from_millis(300));
    while !stopped {
        let now = Instant::now();
        let busy = abstaining_until
            .iter()
            .filter(|u| u.is_some_and(|u| u > now))
            .count();
        let mut free: Vec<usize> = (0..masters.len())
            .filter(|&i| abstaining_until[i].is_none_or(|u| u <= now))
            .collect();
        rng.shuffle(&mut free);
        let room = MAX_AFFECTED.saturating_sub(busy);
        if room == 0 {
            stopped = pause(stop, Duration::from_millis(100));
            continue;
        }
        let a = free[0];
        let b = free[1];
        let hold = ms(&mut rng, 150..=450);
        match rng.u8(0..7) {
            0 => {
                masters[a].freeze();
                counts.add("freeze");
                stopped = pause(stop, hold);
                masters[a].thaw();
            }
            1 if room >= 2 => {
                masters[a].freeze();
                masters[b].freeze();
                counts.add("freeze-two");
                stopped = pause(stop, hold);
                masters[a].thaw();
                masters[b].thaw();
            }
            2 => {
                proxies[a].set(Fault::BlackHole);
                counts.add("partition");
                stopped = pause(stop, hold);
                proxies[a].set(Fault::Pass);
            }
            3 if room >= 2 => {
                // One master frozen, another partitioned: two different stalls at once.
                masters[a].freeze();
                proxies[b].set(Fault::BlackHole);
                counts.add("freeze+partition");
                stopped = pause(stop, hold);
                masters[a].thaw();
                proxies[b].set(Fault::Pass);
            }
            4 => {
                // Slow, sometimes slower than the node timeout (then: answers arrive late).
                proxies[a].set(Fault::Latency(ms(&mut rng, 5..=250)));
                counts.add("latency");
                stopped = pause(stop, hold);
                proxies[a].set(Fault::Pass);
            }
            5 => {
                proxies[a].set(Fault::Reset);
                counts.add("reset");
                stopped = pause(stop, ms(&mut rng, 20..=200));
                proxies[a].set(Fault::Pass);
            }
            6 => {
                // Killed, down a moment, back empty: it abstains for a while (delayed-restart
                // protection), during which it counts as affected.
                masters[a].stop();
                counts.add("restart");
                stopped = pause(stop, ms(&mut rng, 50..=300));
                masters[a].restart();
                abstaining_until[a] = Some(Instant::now() + abstention);
            }
            _ => continue,
        }
        if !stopped {
            stopped = pause(stop, ms(&mut rng, 100..=400));
        }
    }
    counts
}
