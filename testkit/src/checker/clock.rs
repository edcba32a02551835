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
///
/// For a section that reached its entry with no validity left and left at once, the
/// stretch before the entry counts too: from the moment the lock call returned (its future
/// ready: the library had checked the grant's validity) to the entry, one thread runs with
/// no `.await` between ([`noting_return`]). A thread descheduled there reaches its section
/// late, its validity spent by the machine: that wait is evidence of starvation as well
/// (seen: a section entered 45 ms after its deadline, beside a CPU hog, that waited for
/// nothing inside the section). The library's own check lies before the note, outside the
/// evidence: a lease returned already expired is still late.
#[derive(Debug)]
pub struct Starvation {
    /// The thread that ran the check, and every thread's wait then.
    tid: u32,
    waits: Vec<(u32, i64)>,
    /// The checking thread's wait from the lock call's return to the entry (0 without
    /// evidence, and 0 once the section checked its validity itself: `own_code_done`).
    before: i64,
    /// The checking thread's voluntary context switches then.
    voluntary: Option<u64>,
    /// Whether the section's own code blocked its thread (see `own_code_done`).
    blocked: bool,
}

impl Starvation {
    /// Every thread's wait so far, and the current thread; `None` where the system does not
    /// say.
    pub fn begin(returned: Option<Returned>) -> Option<Self> {
        let mut waits = Vec::new();
        let tid = current_tid()?;
        for task in std::fs::read_dir("/proc/self/task").ok()? {
            let t: u32 = task.ok()?.file_name().to_str()?.parse().ok()?;
            // A thread that ended meanwhile is skipped; this one is read last, below.
            if let (false, Some(w)) = (t == tid, wait_of(t)) {
                waits.push((t, w));
            }
        }
        // The checking thread last, its wait before its switches: nothing of the reads
        // above is left between its baseline and the entry, and a sleep after the return's
        // note shows in the switches.
        let wait = wait_of(tid);
        let voluntary = voluntary_of(tid);
        if let Some(w) = wait {
            waits.push((tid, w));
        }
        // Only on the thread the call returned on, and only if it did not block meanwhile
        // (a sleep may be counted as a wait: see above).
        let before = returned
            .filter(|r| r.tid == tid && r.voluntary.is_some() && r.voluntary == voluntary)
            .zip(wait)
            .map_or(0, |(r, w)| (w - r.wait).max(0));
        Some(Self {
            tid,
            waits,
            before,
            voluntary,
            blocked: false,
        })
    }

    /// Called where the section's own synchronous code ends (before its first `.await`):
    /// whether that code blocked its thread — a voluntary context switch of the thread since
    /// [`Starvation::begin`] (a sleep, a blocking call). If it did, [`Starvation::end`] gives
    /// no evidence of starvation: the section is judged on its exit time alone.
    ///
    /// Only a section that checked its validity calls it: that check came after the entry,
    /// so the wait before the entry no longer counts.
    pub fn own_code_done(this: &mut Option<Self>) {
        if let Some(s) = this {
            s.before = 0;
            s.blocked = match (s.voluntary, voluntary_of(s.tid)) {
                (Some(then), Some(now)) => now > then,
                // Unknown: no evidence either way; the wait alone is taken.
                _ => false,
            };
        }
    }

    /// How long the thread that ran the section waited for a CPU since
    /// [`Starvation::begin`] — plus, for a section that left at once, its wait between the
    /// lock call's return and the entry — in ns; -1 when unknown. When the task moved to another thread,
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
        let inside = if here == this.tid {
            checked
        } else {
            checked.min(grown(here).unwrap_or(0))
        };
        this.before + inside
    }
}

/// The thread a lock call returned on, and its voluntary context switches and run-queue
/// wait then (see [`Starvation`]).
#[derive(Debug, Clone, Copy)]
pub struct Returned {
    tid: u32,
    wait: i64,
    voluntary: Option<u64>,
}

/// Runs `f`, noting the thread, its switches and its wait (in that order) as `f` returns
/// (`None` where the system does not say). A few `/proc` reads a call: for the checker's
/// lock calls, not for the library's.
pub async fn noting_return<F: std::future::Future>(f: F) -> (F::Output, Option<Returned>) {
    let mut f = std::pin::pin!(f);
    std::future::poll_fn(|cx| {
        f.as_mut().poll(cx).map(|out| {
            let note = current_tid().and_then(|tid| {
                let voluntary = voluntary_of(tid);
                Some(Returned {
                    tid,
                    wait: wait_of(tid)?,
                    voluntary,
                })
            });
            (out, note)
        })
    })
    .await
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
