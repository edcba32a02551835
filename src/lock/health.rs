//! Suspension of unresponsive nodes: a node that times out repeatedly is not asked to lock
//! until a probe request gets an answer from it.
//!
//! A dead or partitioned master otherwise costs every lock a request that can only time out:
//! a timer, a pending entry in the connection's pipeline, and a task finishing it in the
//! background. Skipping it changes no outcome — a suspended node counts as a failed vote at
//! once, exactly what its timeout would have given — but takes that cost off every lock.
//!
//! Only acquisitions and extensions skip a suspended node. Releases are always sent to every
//! node that may hold the token, so a node that comes back never keeps a stale lock of ours
//! longer than its ttl.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// The first delay before a suspended node gets a probe; doubled after each failed probe.
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
/// The longest delay between two probes of a suspended node.
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Whether to ask a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Ask it.
    Ask,
    /// Ask it: it is suspended, and this request is its probe.
    Probe,
    /// Do not ask it: it is suspended.
    Skip,
}

/// One node's recent timeouts, shared by every request to it (lock-free).
#[derive(Debug)]
pub(crate) struct Health {
    /// Suspend after this many timeouts in a row (0: never).
    trip_after: u32,
    epoch: Instant,
    /// Timeouts since the node last answered.
    timeouts: AtomicU32,
    /// 0: not suspended. Otherwise, in ms after `epoch` (+1), when the next probe may go.
    probe_at: AtomicU64,
    /// The delay before the next probe, in ms.
    backoff_ms: AtomicU64,
}

impl Health {
    pub(crate) fn new(trip_after: u32) -> Self {
        Self {
            trip_after,
            epoch: Instant::now(),
            timeouts: AtomicU32::new(0),
            probe_at: AtomicU64::new(0),
            backoff_ms: AtomicU64::new(ms(FIRST_BACKOFF)),
        }
    }

    /// Milliseconds since `epoch`, plus one (0 means "not suspended").
    fn now(&self) -> u64 {
        ms(self.epoch.elapsed()).saturating_add(1)
    }

    /// Whether to send a request that may be skipped (an acquire or an extend). Of the
    /// requests to a suspended node, one per backoff delay goes through as its probe.
    pub(crate) fn admit(&self) -> Admit {
        let at = self.probe_at.load(Relaxed);
        if at == 0 {
            return Admit::Ask;
        }
        let now = self.now();
        if now < at {
            return Admit::Skip;
        }
        let next = now.saturating_add(self.backoff_ms.load(Relaxed));
        match self.probe_at.compare_exchange(at, next, Relaxed, Relaxed) {
            Ok(_) => Admit::Probe,
            // Restored meanwhile.
            Err(0) => Admit::Ask,
            // Another request is the probe.
            Err(_) => Admit::Skip,
        }
    }

    /// The node answered (anything but a timeout): it is reachable.
    pub(crate) fn answered(&self) {
        // Two loads on the hot path; stores only when there is something to reset.
        if self.timeouts.load(Relaxed) != 0 || self.probe_at.load(Relaxed) != 0 {
            self.timeouts.store(0, Relaxed);
            self.backoff_ms.store(ms(FIRST_BACKOFF), Relaxed);
            self.probe_at.store(0, Relaxed);
        }
    }

    /// A request timed out; `probe` says whether it was the suspended node's probe.
    pub(crate) fn timed_out(&self, probe: bool) {
        let n = self
            .timeouts
            .fetch_update(Relaxed, Relaxed, |n| Some(n.saturating_add(1)))
            .unwrap_or(u32::MAX)
            .saturating_add(1);
        if self.trip_after == 0 {
            return;
        }
        if probe {
            // Still unresponsive: wait longer before the next probe — unless another request
            // got an answer meanwhile and restored the node (a stale probe must not suspend
            // it again).
            let at = self.probe_at.load(Relaxed);
            if at == 0 {
                return;
            }
            let backoff = self.backoff_ms.load(Relaxed);
            let longer = backoff.saturating_mul(2).min(ms(MAX_BACKOFF));
            self.backoff_ms.store(longer, Relaxed);
            let next = self.now().saturating_add(longer);
            let _ = self.probe_at.compare_exchange(at, next, Relaxed, Relaxed);
        } else if n >= self.trip_after {
            // Suspend, unless already suspended (requests sent before it time out too).
            let at = self.now().saturating_add(self.backoff_ms.load(Relaxed));
            let _ = self.probe_at.compare_exchange(0, at, Relaxed, Relaxed);
        }
    }

    /// Whether the node is suspended now.
    pub(crate) fn is_suspended(&self) -> bool {
        self.probe_at.load(Relaxed) != 0
    }

    /// Timeouts since the node last answered.
    pub(crate) fn timeouts(&self) -> u32 {
        self.timeouts.load(Relaxed)
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// One node's state as [`Redlock::node_status`](crate::Redlock::node_status) reports it: for
/// health checks and dashboards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeStatus {
    pub(crate) name: String,
    pub(crate) suspended: bool,
    pub(crate) timeouts: u32,
}

impl NodeStatus {
    /// The node's name (`host:port` for Redis, never a password).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the node is suspended: it timed out repeatedly, so locks do not ask it (it
    /// counts as a failed vote) until a probe request, sent after a backoff of 200 ms
    /// doubling up to 2 s, gets an answer.
    pub fn is_suspended(&self) -> bool {
        self.suspended
    }

    /// How many requests in a row timed out since the node last answered.
    pub fn consecutive_timeouts(&self) -> u32 {
        self.timeouts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suspends_after_the_threshold_and_restores_on_an_answer() {
        let h = Health::new(3);
        h.timed_out(false);
        h.timed_out(false);
        assert_eq!(h.admit(), Admit::Ask);
        h.timed_out(false);
        assert!(h.is_suspended());
        assert_eq!(h.admit(), Admit::Skip);
        h.answered();
        assert!(!h.is_suspended());
        assert_eq!(h.timeouts(), 0);
        assert_eq!(h.admit(), Admit::Ask);
    }

    #[test]
    fn an_answer_between_timeouts_resets_the_count() {
        let h = Health::new(3);
        for _ in 0..10 {
            h.timed_out(false);
            h.timed_out(false);
            h.answered();
        }
        assert!(!h.is_suspended());
    }

    #[test]
    fn one_probe_per_backoff_and_a_failed_probe_doubles_it() {
        let h = Health::new(1);
        h.timed_out(false);
        assert_eq!(h.admit(), Admit::Skip);
        // Due now: pretend the backoff passed.
        h.probe_at.store(1, Relaxed);
        assert_eq!(h.admit(), Admit::Probe);
        assert_eq!(h.admit(), Admit::Skip, "one probe at a time");
        h.timed_out(true);
        assert_eq!(h.backoff_ms.load(Relaxed), 2 * ms(FIRST_BACKOFF));
        for _ in 0..10 {
            h.timed_out(true);
        }
        assert_eq!(h.backoff_ms.load(Relaxed), ms(MAX_BACKOFF));
        assert_eq!(h.admit(), Admit::Skip);
    }

    #[test]
    fn a_stale_probe_does_not_suspend_a_restored_node() {
        let h = Health::new(1);
        h.timed_out(false);
        h.probe_at.store(1, Relaxed);
        assert_eq!(h.admit(), Admit::Probe);
        // Another request (a release, never skipped) gets an answer first.
        h.answered();
        h.timed_out(true);
        assert!(!h.is_suspended());
        assert_eq!(h.admit(), Admit::Ask);
    }

    #[test]
    fn the_timeout_count_saturates() {
        let h = Health::new(0);
        h.timeouts.store(u32::MAX - 1, Relaxed);
        h.timed_out(false);
        h.timed_out(false);
        assert_eq!(h.timeouts(), u32::MAX);
    }

    #[test]
    fn zero_never_suspends() {
        let h = Health::new(0);
        for _ in 0..100 {
            h.timed_out(false);
        }
        assert!(!h.is_suspended());
        assert_eq!(h.admit(), Admit::Ask);
        assert_eq!(h.timeouts(), 100);
    }
}
