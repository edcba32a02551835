//! Suspension of unresponsive nodes: a node that keeps timing out is not asked to lock until
//! a probe gets an answer from it.
//!
//! A dead or partitioned master otherwise costs every lock whose decision needs it a full
//! node timeout. Skipping it changes no outcome — a suspended node counts as a failed vote at
//! once, exactly what its timeout would have given — but takes that wait off every lock.
//!
//! A node is judged by Redis's behaviour, not by this process's scheduling:
//! - a request whose timer fired late (this process was stalled) is given the time back
//!   before it may time out at all (see `quorum::Request`);
//! - a node is suspended only after `trip_after` timeouts in a row **spanning at least one
//!   node timeout** without a single answer in between: a burst of requests that queued
//!   behind this process's own work and timed out together does not suspend a master that
//!   answers, since its next answer ends the streak.
//!
//! A suspended node gets one probe per backoff (100 ms, then 200 ms): a compare-and-delete of
//! a key nobody holds, sent on its own, whose answer — any answer — restores the node. So a
//! master that is back is used again within about 200 ms, whether or not locks are taken
//! meanwhile. Only acquisitions and extensions skip a suspended node; releases are always
//! sent to every node that may hold the token.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// The first delay before a suspended node gets a probe; doubled after each failed probe.
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest delay between two probes of a suspended node: a master that is back is used
/// again within about this long.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_millis(200);

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
    /// ... spanning at least this long (the node timeout), in ms.
    span_ms: u64,
    epoch: Instant,
    /// Timeouts since the node last answered.
    timeouts: AtomicU32,
    /// Answers so far (wrapping): whether the node answered anything since a moment.
    answers: AtomicU64,
    /// When the first timeout of the current streak came, in ms after `epoch` (+1).
    streak_since: AtomicU64,
    /// 0: not suspended. Otherwise, in ms after `epoch` (+1), when the next probe may go.
    probe_at: AtomicU64,
    /// The delay before the next probe, in ms.
    backoff_ms: AtomicU64,
}

impl Health {
    pub(crate) fn new(trip_after: u32, span: Duration) -> Self {
        Self {
            trip_after,
            span_ms: ms(span),
            epoch: Instant::now(),
            timeouts: AtomicU32::new(0),
            answers: AtomicU64::new(0),
            streak_since: AtomicU64::new(0),
            probe_at: AtomicU64::new(0),
            backoff_ms: AtomicU64::new(ms(FIRST_BACKOFF)),
        }
    }

    /// Milliseconds since `epoch`, plus one (0 means "not suspended").
    fn now(&self) -> u64 {
        ms(self.epoch.elapsed()).saturating_add(1)
    }

    /// Whether to send a request that may be skipped (an acquire or an extend). A suspended
    /// node is not asked; once per backoff delay, the caller also sends it a probe.
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
        self.answers.fetch_add(1, Relaxed);
        // Two loads; stores only when there is something to reset.
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
        let now = self.now();
        if n == 1 {
            self.streak_since.store(now, Relaxed);
        }
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
        } else if n >= self.trip_after && self.silent_for_a_span(now) {
            // Suspend, unless already suspended (requests sent before it time out too).
            let at = now.saturating_add(self.backoff_ms.load(Relaxed));
            let _ = self.probe_at.compare_exchange(0, at, Relaxed, Relaxed);
        }
    }

    /// Whether the current streak of timeouts spans at least one node timeout: the node has
    /// answered nothing for that long, not merely a burst of requests timed out together.
    fn silent_for_a_span(&self, now: u64) -> bool {
        let since = self.streak_since.load(Relaxed);
        since != 0 && now.saturating_sub(since) >= self.span_ms
    }

    /// How many answers the node gave so far (wrapping): compare two readings to learn
    /// whether it answered in between.
    pub(crate) fn answers(&self) -> u64 {
        self.answers.load(Relaxed)
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

    /// Whether the node is suspended: it timed out repeatedly for at least one node timeout
    /// without answering, so locks do not ask it (it counts as a failed vote) until a probe,
    /// sent every 100–200 ms, gets an answer.
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
        let h = Health::new(3, Duration::ZERO);
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

    /// A burst of timeouts that came together (requests that queued behind this process's
    /// own work) does not suspend a node: the streak must span a node timeout.
    #[test]
    fn a_burst_of_timeouts_within_one_span_does_not_suspend() {
        let mut h = Health::new(3, Duration::from_millis(50));
        for _ in 0..100 {
            h.timed_out(false);
        }
        assert!(!h.is_suspended());
        assert_eq!(h.timeouts(), 100);
        // A node timeout later (the clock moved on), still no answer: the next one suspends.
        h.epoch = h.epoch.checked_sub(Duration::from_millis(100)).unwrap();
        h.timed_out(false);
        assert!(h.is_suspended());
        // An answer ends the streak; a new one starts its own span.
        h.answered();
        h.timed_out(false);
        h.timed_out(false);
        h.timed_out(false);
        assert!(!h.is_suspended());
    }

    #[test]
    fn an_answer_between_timeouts_resets_the_count() {
        let h = Health::new(3, Duration::ZERO);
        for _ in 0..10 {
            h.timed_out(false);
            h.timed_out(false);
            h.answered();
        }
        assert!(!h.is_suspended());
    }

    #[test]
    fn one_probe_per_backoff_and_a_failed_probe_doubles_it() {
        let h = Health::new(1, Duration::ZERO);
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
        let h = Health::new(1, Duration::ZERO);
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
        let h = Health::new(0, Duration::ZERO);
        h.timeouts.store(u32::MAX - 1, Relaxed);
        h.timed_out(false);
        h.timed_out(false);
        assert_eq!(h.timeouts(), u32::MAX);
    }

    #[test]
    fn zero_never_suspends() {
        let h = Health::new(0, Duration::ZERO);
        for _ in 0..100 {
            h.timed_out(false);
        }
        assert!(!h.is_suspended());
        assert_eq!(h.admit(), Admit::Ask);
        assert_eq!(h.timeouts(), 100);
    }
}
