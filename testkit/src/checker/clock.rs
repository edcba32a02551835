//! The shared clock: `CLOCK_MONOTONIC`, read the same by every process of the machine.

use std::time::{Duration, Instant};

/// `CLOCK_MONOTONIC` as raw nanoseconds: one clock for every process of the machine
/// (`std::time::Instant` reads it too, but keeps the value opaque), read through rustix's
/// safe `clock_gettime`.
#[cfg(all(
    any(target_os = "linux", target_os = "macos"),
    target_pointer_width = "64"
))]
pub(super) fn now_ns() -> i64 {
    use rustix::time::{clock_gettime, ClockId};

    let ts = clock_gettime(ClockId::Monotonic);
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// See the 64-bit Linux and macOS version.
#[cfg(not(all(
    any(target_os = "linux", target_os = "macos"),
    target_pointer_width = "64"
)))]
pub(super) fn now_ns() -> i64 {
    panic!("the checker reads CLOCK_MONOTONIC and runs on 64-bit Linux or macOS only")
}

/// `instant` on the shared clock, never later than the true value (the raw clock is read
/// before `Instant::now()`) and at most [`MAX_SKEW_NS`] earlier: read again when this thread
/// was preempted between the two reads. A deadline is, if anything, checked a few
/// microseconds early — and a paused section clamped at it ends no later than it did.
pub(super) fn shared_ns(instant: Instant) -> i64 {
    let mut tries = 0;
    loop {
        let raw = now_ns();
        let now = Instant::now();
        tries += 1;
        if now_ns() - raw <= MAX_SKEW_NS || tries >= 100 {
            return if instant >= now {
                raw + nanos(instant - now)
            } else {
                raw - nanos(now - instant)
            };
        }
    }
}

/// The most [`shared_ns`] may be early by.
pub(super) const MAX_SKEW_NS: i64 = 20_000;

/// Evidence that a section's thread was starved — runnable but not run by the machine —
/// rather than blocked by its own code: Linux's run-queue wait of a thread
/// (`/proc/self/task/<tid>/schedstat`, its second field). A thread blocked in a call (a sleep,
/// blocking I/O) is not runnable and should wait for nothing — but the kernel's count
/// sometimes takes a sleep for a wait (seen: a 587 ms `thread::sleep` counted as 585 ms of
/// run-queue wait, beside a CPU hog; a plain thread's 500 ms sleep as 504 ms). So a section
/// whose own code blocked its thread — a voluntary context switch between the validity check
/// and the section's first `.await` ([`Starvation::own_code_done`]) — shows no evidence at
/// all. Taken just before a section is entered ([`Starvation::begin`]: its `/proc` reads
/// are not part of the section) and read at its exit ([`Starvation::end`]).
#[derive(Debug)]
pub struct Starvation {
    /// The thread that ran the check, and every thread's wait then.
    tid: u32,
    waits: Vec<(u32, i64)>,
    /// The checking thread's voluntary context switches then.
    voluntary: Option<u64>,
    /// Whether the section's own code blocked its thread (see `own_code_done`).
    blocked: bool,
}

impl Starvation {
    /// Every thread's wait so far, and the current thread; `None` where the system does not
    /// say.
    pub fn begin() -> Option<Self> {
        let mut waits = Vec::new();
        for task in std::fs::read_dir("/proc/self/task").ok()? {
            let tid: u32 = task.ok()?.file_name().to_str()?.parse().ok()?;
            // A thread that ended meanwhile is skipped.
            if let Some(w) = wait_of(tid) {
                waits.push((tid, w));
            }
        }
        let tid = current_tid()?;
        Some(Self {
            tid,
            waits,
            voluntary: voluntary_of(tid),
            blocked: false,
        })
    }

    /// Called where the section's own synchronous code ends (before its first `.await`):
    /// whether that code blocked its thread — a voluntary context switch of the thread since
    /// [`Starvation::begin`] (a sleep, a blocking call). If it did, [`Starvation::end`] gives
    /// no evidence of starvation: the section is judged on its exit time alone.
    pub fn own_code_done(this: &mut Option<Self>) {
        if let Some(s) = this {
            s.blocked = match (s.voluntary, voluntary_of(s.tid)) {
                (Some(then), Some(now)) => now > then,
                // Unknown: no evidence either way; the wait alone is taken.
                _ => false,
            };
        }
    }

    /// How long the thread that ran the section waited for a CPU since
    /// [`Starvation::begin`], in ns; -1 when unknown. When the task moved to another thread,
    /// the smaller of the two threads' waits: the thread it left may have been blocked (a
    /// blocking call, not runnable: no wait), and the one it came to may have waited for a
    /// CPU before the task came (seen: a blocking section counted 207 ms of the other
    /// thread's wait) — only a wait both show was the task's.
    pub fn end(this: Option<Self>) -> i64 {
        let Some(this) = this else { return -1 };
        if this.blocked {
            return 0;
        }
        let grown = |tid| {
            let then = this.waits.iter().find(|(t, _)| *t == tid)?.1;
            Some(wait_of(tid)? - then)
        };
        let Some(here) = current_tid() else { return -1 };
        let checked = grown(this.tid).unwrap_or(0);
        if here == this.tid {
            checked
        } else {
            checked.min(grown(here).unwrap_or(0))
        }
    }
}

/// The run-queue wait of thread `tid` of this process so far, in ns.
fn wait_of(tid: u32) -> Option<i64> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat")).ok()?;
    text.split_whitespace().nth(1)?.parse().ok()
}

/// The voluntary context switches of thread `tid` of this process so far.
fn voluntary_of(tid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/self/task/{tid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))?
        .trim()
        .parse()
        .ok()
}

/// The current thread's id (`/proc/thread-self` links to `<pid>/task/<tid>`).
fn current_tid() -> Option<u32> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    link.file_name()?.to_str()?.parse().ok()
}

pub(super) fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}
