//! The stall workload: a quorum of masters hangs for a moment under contention.
//!
//! `tasks` tasks contend for one key, each trying once to lock it and releasing it in a loop
//! (a failed try is retried at once), as [`super::one_key`] does, counting overlaps. After
//! [`Plan::before`], the first [`Plan::paused`] masters are paused with `SIGSTOP` (their
//! ports still accept connections, nothing is answered) for [`Plan::pause`], then resumed.
//! With 3 of 5 paused no quorum is possible, so every try fails meanwhile.
//!
//! Measured: the successes over the window, the failed tries, how long the run really took
//! (the tasks stop trying at the end of the window; a client whose failing tries never yield
//! keeps the runtime's threads busy past it), the time from the resume to the first success,
//! the worst lateness of a ticker task that sleeps 10 ms at a time on the same runtime (a
//! starved runtime shows up there), and the keys left on the masters once background
//! releases have settled.
//!
//! The pause and the resume are sent from the calling thread, outside the runtime, so that
//! a starved runtime cannot delay them; a guard resumes the paused masters on every exit,
//! a panic included.

use std::fmt::Write as _;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tower_redlock_testkit::{Masters, RedisServer};

use crate::{fmt_dur, fmt_rate, Holders, Locker};

/// The masters of the comparison runner's stall workload.
pub const MASTERS: usize = 5;
/// How often the ticker wakes.
pub const TICK: Duration = Duration::from_millis(10);
/// The process may grow by this much (resident memory) during a run; beyond it the run is
/// stopped early (a client that piles up work faster than its runtime can run it).
const MEMORY_GUARD_KB: u64 = 3 * 1024 * 1024;
/// How long to wait for the tasks after the window before giving up on them.
const JOIN_CAP: Duration = Duration::from_secs(30);

/// The timeline of one run.
#[derive(Debug, Clone, Copy)]
pub struct Plan {
    /// How many masters (the first ones of the runner's).
    pub masters: usize,
    /// How many of them (the first ones) are paused.
    pub paused: usize,
    pub tasks: usize,
    /// From the start to the pause.
    pub before: Duration,
    /// How long the masters stay paused.
    pub pause: Duration,
    /// The whole window, from the start: the tasks stop trying at its end.
    pub total: Duration,
    /// Waited after the run before the keys are counted (background releases settle).
    pub settle: Duration,
}

impl Plan {
    /// The comparison runner's: 32 tasks, 5 masters, the first 3 paused for 300 ms after
    /// `before`, a window of `total` — but never less than 1.5 s after the resume (the target
    /// looks at the first second after it) — and a settle of 4 node timeouts + 300 ms.
    pub fn standard(before: Duration, total: Duration, node_timeout: Duration) -> Self {
        let pause = Duration::from_millis(300);
        Self {
            masters: MASTERS,
            paused: 3,
            tasks: 32,
            before,
            pause,
            total: total.max(before + pause + Duration::from_millis(1500)),
            settle: node_timeout * 4 + Duration::from_millis(300),
        }
    }
}

/// What one client did.
#[derive(Debug, Default, Clone)]
pub struct Stall {
    pub ok: u64,
    /// Of them, the ones acquired after the resume.
    pub ok_after: u64,
    pub failed: u64,
    /// Of them, the ones that ended while the masters were paused.
    pub failed_paused: u64,
    pub overlaps: u64,
    /// The window the successes are counted over.
    pub window: Duration,
    /// From the start to the resume.
    pub resumed: Duration,
    /// From the start until the last task finished.
    pub wall: Duration,
    /// From the resume to the first success after it; `None`: none before the end.
    pub restart: Option<Duration>,
    /// The worst lateness of the ticker's 10 ms sleeps, and how many it completed.
    pub worst_tick_late: Duration,
    pub ticks: u64,
    /// This client's keys on the masters after the settle.
    pub keys_left: u64,
    /// The tasks were not all done `JOIN_CAP` after the window (given up on).
    pub hung: bool,
    /// Why the run was stopped early, if it was.
    pub aborted: Option<String>,
}

impl Stall {
    pub fn per_sec(&self) -> f64 {
        self.ok as f64 / self.window.as_secs_f64()
    }

    /// Successes per second from the resume to the end of the window.
    pub fn per_sec_after(&self) -> f64 {
        let after = self.window.saturating_sub(self.resumed).as_secs_f64();
        if after > 0.0 {
            self.ok_after as f64 / after
        } else {
            0.0
        }
    }
}

/// Resumes the masters it paused when dropped (also while unwinding).
struct Paused<'a>(Vec<&'a RedisServer>);

impl<'a> Paused<'a> {
    fn freeze(servers: impl IntoIterator<Item = &'a RedisServer>) -> Self {
        let mut paused = Paused(Vec::new());
        for s in servers {
            // Recorded first: a resume of a master that is not paused does nothing.
            paused.0.push(s);
            s.freeze();
        }
        paused
    }
}

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        for s in &self.0 {
            // A failure to resume one master must not keep the others paused.
            let _ = std::panic::catch_unwind(AssertUnwindSafe(|| s.thaw()));
        }
    }
}

/// Resident memory of this process, in kB.
fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .unwrap_or(0)
}

/// Sleeps until `t` in short steps; sets `stop` (and says why) if the process's memory grows
/// past the guard.
fn wait_until(t: Instant, base_kb: u64, stop: &AtomicBool, why: &mut Option<String>) {
    loop {
        let now = Instant::now();
        if now >= t {
            return;
        }
        std::thread::sleep((t - now).min(Duration::from_millis(10)));
        let kb = rss_kb();
        if why.is_none() && kb > base_kb + MEMORY_GUARD_KB {
            *why = Some(format!(
                "stopped at {:.0} MB resident (+{:.0} MB)",
                kb as f64 / 1024.0,
                (kb - base_kb) as f64 / 1024.0
            ));
            stop.store(true, Ordering::SeqCst);
        }
    }
}

fn since(origin: Instant) -> u64 {
    origin.elapsed().as_nanos() as u64
}

/// Warms `l` up (50 cycles on `{prefix}:warmup`, with every master up), [`run`]s it, then
/// empties the masters.
pub fn measure(
    rt: &tokio::runtime::Runtime,
    l: &Locker,
    prefix: &str,
    masters: &Masters,
    plan: &Plan,
) -> Stall {
    let key = format!("{prefix}:warmup");
    let w = rt.block_on(super::latency(
        l,
        &key,
        50,
        Duration::from_secs(5),
        Duration::from_secs(5),
    ));
    assert!(
        w.failures == 0 && !w.hung,
        "{prefix}: warm-up failed: {w:?}"
    );
    let r = run(rt, l, prefix, masters, plan);
    rt.block_on(async {
        for m in masters.iter() {
            let _: () = m.query(&redis::cmd("FLUSHALL")).await;
        }
    });
    r
}

/// One run of `l` on the key `{prefix}:one`; its keys (`{prefix}:*`) are counted after it.
/// Call it from outside the runtime `rt` (it blocks the calling thread for the run).
pub fn run(
    rt: &tokio::runtime::Runtime,
    l: &Locker,
    prefix: &str,
    masters: &Masters,
    plan: &Plan,
) -> Stall {
    let key = format!("{prefix}:one");
    let base_kb = rss_kb();
    let origin = Instant::now();
    let deadline = origin + plan.total;
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let ok_after = Arc::new(AtomicU64::new(0));
    let failed_paused = Arc::new(AtomicU64::new(0));
    let holders = Arc::new(Holders::default());
    // Nanoseconds after `origin`: the pause and the resume (MAX until then), the first
    // success at or after the resume, and the end of the last task.
    let paused = Arc::new(AtomicU64::new(u64::MAX));
    let resumed = Arc::new(AtomicU64::new(u64::MAX));
    let first_ok = Arc::new(AtomicU64::new(u64::MAX));
    let ended = Arc::new(AtomicU64::new(0));

    let tasks: Vec<_> = (0..plan.tasks)
        .map(|_| {
            let (l, key, stop, ok, failed, holders) = (
                l.clone(),
                key.clone(),
                stop.clone(),
                ok.clone(),
                failed.clone(),
                holders.clone(),
            );
            let (paused, resumed, first_ok, ended) = (
                paused.clone(),
                resumed.clone(),
                first_ok.clone(),
                ended.clone(),
            );
            let (ok_after, failed_paused) = (ok_after.clone(), failed_paused.clone());
            rt.spawn(async move {
                while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
                    match l.acquire(&key).await {
                        Some(h) => {
                            let at = since(origin);
                            let after = at >= resumed.load(Ordering::SeqCst);
                            if after {
                                first_ok.fetch_min(at, Ordering::SeqCst);
                            }
                            holders.enter();
                            tokio::task::yield_now().await;
                            holders.leave();
                            l.release(&key, h).await;
                            if Instant::now() <= deadline {
                                ok.fetch_add(1, Ordering::Relaxed);
                                if after {
                                    ok_after.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                        }
                        None => {
                            failed.fetch_add(1, Ordering::Relaxed);
                            let at = since(origin);
                            if at >= paused.load(Ordering::SeqCst)
                                && at < resumed.load(Ordering::SeqCst)
                            {
                                failed_paused.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                    }
                }
                ended.fetch_max(since(origin), Ordering::SeqCst);
            })
        })
        .collect();
    let ticker = {
        let stop = stop.clone();
        rt.spawn(async move {
            let (mut worst, mut ticks) = (Duration::ZERO, 0u64);
            while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                tokio::time::sleep(TICK).await;
                worst = worst.max(t.elapsed().saturating_sub(TICK));
                ticks += 1;
            }
            (worst, ticks)
        })
    };

    let mut aborted = None;
    wait_until(origin + plan.before, base_kb, &stop, &mut aborted);
    paused.store(since(origin), Ordering::SeqCst);
    {
        let _paused = Paused::freeze((0..plan.paused).map(|i| &masters[i]));
        let paused_at = Instant::now();
        wait_until(paused_at + plan.pause, base_kb, &stop, &mut aborted);
        // `_paused` resumes them here.
    }
    let resume_ns = since(origin);
    resumed.store(resume_ns, Ordering::SeqCst);
    wait_until(deadline, base_kb, &stop, &mut aborted);

    let joined = rt.block_on(async {
        let all = async {
            for t in tasks {
                t.await.expect("a stall task panicked");
            }
            ticker.await.unwrap_or_default()
        };
        tokio::time::timeout(JOIN_CAP, all).await
    });
    let hung = joined.is_err();
    if hung {
        stop.store(true, Ordering::SeqCst);
    }
    let (worst_tick_late, ticks) = joined.unwrap_or_default();
    let wall = if hung {
        origin.elapsed()
    } else {
        Duration::from_nanos(ended.load(Ordering::SeqCst))
    };
    let first = first_ok.load(Ordering::SeqCst);
    let restart = (first != u64::MAX).then(|| Duration::from_nanos(first - resume_ns));

    std::thread::sleep(plan.settle);
    let keys_left = rt.block_on(async {
        let mut total = 0;
        for i in 0..plan.masters {
            let keys: Vec<String> = masters[i]
                .query(redis::cmd("KEYS").arg(format!("{prefix}:*")))
                .await;
            total += keys.len() as u64;
        }
        total
    });
    Stall {
        ok: ok.load(Ordering::Relaxed),
        ok_after: ok_after.load(Ordering::Relaxed),
        failed: failed.load(Ordering::Relaxed),
        failed_paused: failed_paused.load(Ordering::Relaxed),
        resumed: Duration::from_nanos(resume_ns),
        overlaps: holders.overlaps.load(Ordering::Relaxed),
        window: plan.total,
        wall,
        restart,
        worst_tick_late,
        ticks,
        keys_left,
        hung,
        aborted,
    }
}

// ---------------------------------------------------------------------------------------------
// Report

/// The section of the report: one row per client, `rows[0]` the baseline of the ratios.
pub fn table(o: &mut String, plan: &Plan, node_timeout: Duration, rows: &[(&str, &Stall)]) {
    let _ = writeln!(
        o,
        "\n### Stall: {} of {} masters paused {} ms, {} tasks on one key\n",
        plan.paused,
        plan.masters,
        plan.pause.as_millis(),
        plan.tasks
    );
    let _ = writeln!(
        o,
        "{} tasks contend for one key on {} masters (try once, release, again at once; node \
         timeout {node_timeout:?}). {:?} after the start, the first {} masters are paused \
         (`SIGSTOP`) for {:?} — no quorum is possible, every try fails — then resumed; the \
         window is {}. *After the resume*: successes/s from the resume to the window's end. \
         *Run took*: from the start until the last task ended (a task stops \
         trying at the window's end; failing tries that never yield keep the runtime busy past \
         it). *Resume → success*: to the first success after the resume. *Ticker*: the worst \
         lateness of a task on the same runtime sleeping {TICK:?} at a time (a starved \
         runtime shows here). *Keys left*: the client's keys on the masters {:?} after the \
         run.\n",
        plan.tasks,
        plan.masters,
        plan.before,
        plan.paused,
        plan.pause,
        fmt_dur(plan.total),
        plan.settle,
    );
    let _ = writeln!(
        o,
        "| client | successes/s | after the resume | overlaps | failed tries (while paused) | run took | resume → success | ticker worst lateness | keys left |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|");
    let cell = |i: usize, v: f64, base: f64| {
        if i > 0 && base > 0.0 {
            format!("{} ({:.2}×)", fmt_rate(v), v / base)
        } else {
            fmt_rate(v)
        }
    };
    let base = rows.first().map(|(_, r)| (r.per_sec(), r.per_sec_after()));
    let (base, base_after) = base.unwrap_or_default();
    for (i, (name, r)) in rows.iter().enumerate() {
        let rate = cell(i, r.per_sec(), base);
        let after = cell(i, r.per_sec_after(), base_after);
        let mut took = fmt_dur(r.wall);
        if r.hung {
            took.push_str(" (tasks still running: given up)");
        }
        if let Some(why) = &r.aborted {
            let _ = write!(took, " ({why})");
        }
        let _ = writeln!(
            o,
            "| {name} | {rate} | {after} | {} | {} ({}) | {took} | {} | {} ({} ticks) | {} |",
            r.overlaps,
            r.failed,
            r.failed_paused,
            r.restart.map_or("none".into(), fmt_dur),
            fmt_dur(r.worst_tick_late),
            r.ticks,
            r.keys_left,
        );
    }
}

/// The target line for `us`, with the limit's values beside it.
pub fn target(us: &Stall, limit: Option<&Stall>) -> String {
    let summary = |r: &Stall| {
        format!(
            "first success {} after the resume, {} keys left",
            r.restart.map_or("never".into(), fmt_dur),
            r.keys_left
        )
    };
    let met = us.restart.is_some_and(|d| d <= Duration::from_secs(1)) && us.keys_left == 0;
    format!(
        "- stall (3 of 5 masters paused 300 ms): after resume, successes restart within 1 s; \
         no keys left: {} — {}{}",
        summary(us),
        if met { "met" } else { "NOT met" },
        limit.map_or(String::new(), |l| format!(" (the limit: {})", summary(l)))
    )
}
