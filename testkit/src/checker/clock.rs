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

/// `instant` on the shared clock. The raw clock is read *before* `Instant::now()`, so the
/// result is never later than the true value: a deadline is, if anything, checked early.
pub(super) fn shared_ns(instant: Instant) -> i64 {
    let raw = now_ns();
    let now = Instant::now();
    if instant >= now {
        raw + nanos(instant - now)
    } else {
        raw - nanos(now - instant)
    }
}

pub(super) fn nanos(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}
