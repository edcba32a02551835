//! Suspension of unresponsive nodes: a node that keeps timing out is not asked to lock until
//! a probe gets an answer from it.
//!
//! A dead or partitioned master otherwise costs every lock whose decision needs it a full
//! node timeout. Skipping it changes no outcome — a suspended node counts as a failed vote at
//! once, exactly what its timeout would have given — but takes that wait off every lock.
//!
//! A node is judged by Redis's behaviour, not by this process's scheduling:
//! - a request whose timer fired late (this process was stalled) is given the time back
//!   before it may time out at all (see `call::Call`);
//! - a node is suspended only after `trip_after` timeouts in a row **spanning at least one node
//!   timeout** without a single answer in between. A burst of requests that queued behind this
//!   process's own work and timed out together does not suspend a master that answers, since its
//!   next answer ends the streak.
//!
//! A suspended node is probed by a task of its own, after 100 ms and then every 200 ms: a
//! compare-and-delete of a key nobody holds, whose reply — any reply — restores the node. So
//! a master that is back is used again within about 200 ms, whether or not locks are taken
//! meanwhile. (Connection errors — refused, dropped — are no reply: they count as timeouts.) Only acquisitions and extensions skip a suspended node; releases are always
//! sent to every node that may hold the token.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// The first delay before a suspended node gets a probe; doubled after each failed probe.
pub(crate) const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// The longest delay between two probes of a suspended node: a master that is back is used
/// again within about this long.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_millis(200);

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
    /// When the first timeout of the current streak came, in ms after `epoch` (+1); 0 when
    /// no streak is known.
    streak_since: AtomicU64,
    suspended: AtomicBool,
    /// The delay before the next probe, in ms.
    backoff_ms: AtomicU64,
    /// Whether a probe loop runs for this node (at most one does).
    probing: AtomicBool,
    /// When a probe loop last showed it is alive, in ms after `epoch` (+1).
    probed_at: AtomicU64,
    /// What was last reported of `suspended` (the metrics gauge), and the lock every report
    /// takes: taken only when it changes.
    report: std::sync::Mutex<bool>,
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
            suspended: AtomicBool::new(false),
            backoff_ms: AtomicU64::new(ms(FIRST_BACKOFF)),
            probing: AtomicBool::new(false),
            probed_at: AtomicU64::new(0),
            report: std::sync::Mutex::new(false),
        }
    }

    /// Milliseconds since `epoch`, plus one (0 means "none").
    fn now(&self) -> u64 {
        ms(self.epoch.elapsed()).saturating_add(1)
    }

    /// Whether to send a request that may be skipped (an acquire or an extend): not to a suspended
    /// node. The exception is when its probe loop has shown no sign of life for a while (it ran on
    /// a runtime that is gone, or none could be started). Then one request goes through as an
    /// in-band probe, so a node is never left suspended for good.
    pub(crate) fn admit(&self) -> bool {
        if !self.suspended.load(Relaxed) {
            return true;
        }
        let (now, last) = (self.now(), self.probed_at.load(Relaxed));
        now.saturating_sub(last) > 2 * ms(MAX_BACKOFF)
            && self
                .probed_at
                .compare_exchange(last, now, Relaxed, Relaxed)
                .is_ok()
    }

    /// Claims the node's probe loop: false when one already runs.
    pub(crate) fn start_probing(&self) -> bool {
        self.probed_at.store(self.now(), Relaxed);
        self.probing
            .compare_exchange(false, true, Relaxed, Relaxed)
            .is_ok()
    }

    /// The probe loop is alive (called once per round).
    pub(crate) fn probing_alive(&self) {
        self.probed_at.store(self.now(), Relaxed);
    }

    /// The probe loop ends; returns whether it must go on after all (the node was suspended
    /// again meanwhile, and the loop re-claimed it).
    pub(crate) fn stop_probing(&self) -> bool {
        self.probing.store(false, Relaxed);
        self.suspended.load(Relaxed) && self.start_probing()
    }

    /// The node answered (a reply, even an error reply): it is reachable. Returns whether
    /// this answer restored a suspended node.
    pub(crate) fn answered(&self) -> bool {
        self.answers.fetch_add(1, Relaxed);
        // Stores only when there is something to reset.
        if self.timeouts.load(Relaxed) != 0 || self.suspended.load(Relaxed) {
            self.timeouts.store(0, Relaxed);
            self.streak_since.store(0, Relaxed);
            self.backoff_ms.store(ms(FIRST_BACKOFF), Relaxed);
            return self.suspended.swap(false, Relaxed);
        }
        false
    }

    /// A request got no answer in time (or could not reach the node); `probe` says whether
    /// it was a suspended node's probe. Returns whether this call suspended the node: the
    /// caller then starts probing it.
    pub(crate) fn timed_out(&self, probe: bool) -> bool {
        let n = self
            .timeouts
            .fetch_update(Relaxed, Relaxed, |n| Some(n.saturating_add(1)))
            .unwrap_or(u32::MAX)
            .saturating_add(1);
        let now = self.now();
        if n == 1 {
            self.streak_since.store(now, Relaxed);
        } else {
            // The streak's first timeout may not have stored its start yet (or an answer
            // cleared it meanwhile): never judge by an older streak's start.
            let _ = self.streak_since.compare_exchange(0, now, Relaxed, Relaxed);
        }
        if self.trip_after == 0 {
            return false;
        }
        if probe {
            // Still unresponsive: wait longer before the next probe.
            let longer = self
                .backoff_ms
                .load(Relaxed)
                .saturating_mul(2)
                .min(ms(MAX_BACKOFF));
            self.backoff_ms.store(longer, Relaxed);
            false
        } else if n >= self.trip_after && self.silent_for_a_span(now) {
            // Suspend, unless already suspended (requests sent before it time out too).
            self.suspended
                .compare_exchange(false, true, Relaxed, Relaxed)
                .is_ok()
        } else {
            false
        }
    }

    /// Whether the current streak of timeouts spans at least one node timeout: the node has
    /// answered nothing for that long, not merely a burst of requests timed out together.
    fn silent_for_a_span(&self, now: u64) -> bool {
        let since = self.streak_since.load(Relaxed);
        since != 0 && now.saturating_sub(since) >= self.span_ms
    }

    /// The delay before the next probe of a suspended node.
    pub(crate) fn backoff(&self) -> Duration {
        Duration::from_millis(self.backoff_ms.load(Relaxed))
    }

    /// How many answers the node gave so far (wrapping): compare two readings to learn
    /// whether it answered in between.
    pub(crate) fn answers(&self) -> u64 {
        self.answers.load(Relaxed)
    }

    /// Whether the node is suspended now.
    pub(crate) fn is_suspended(&self) -> bool {
        self.suspended.load(Relaxed)
    }

    /// Reports whether the node is suspended when it differs from the last report, read
    /// under a lock that every report takes: of two changes racing, the last report reads the
    /// state after both, and every report is a change (a gauge added to and taken from stays
    /// exact).
    pub(crate) fn report_suspended(&self, report: impl FnOnce(bool)) {
        let mut reported = self
            .report
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = self.is_suspended();
        if now != *reported {
            *reported = now;
            report(now);
        }
    }

    /// Whether the last report said suspended (a dropped client takes it back).
    pub(crate) fn reported_suspended(&mut self) -> bool {
        *self
            .report
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
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
    pub(crate) eviction: crate::node::EvictionStatus,
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

    /// A Redis voter's `maxmemory-policy` as its master last reported it (`INFO memory`; on
    /// a Cluster, that of a master that evicts, if one does): `noeviction` is what a lock
    /// voter must run. `None` before the first check (made on first use), when `INFO` is
    /// denied (the voter then votes unchecked, with a warning), and for other nodes.
    pub fn eviction_policy(&self) -> Option<&str> {
        self.eviction.policy.as_deref()
    }

    /// Whether the master may evict keys before their ttl: a `maxmemory` with a policy
    /// other than `noeviction` (`allkeys-*`, or `volatile-*`: locks and completion records
    /// have a ttl). A lock or a record on it can vanish under memory pressure.
    pub fn evicts(&self) -> bool {
        self.eviction.evicts
    }

    /// Whether the voter abstains: its acquires and extensions fail at once, counting as failed
    /// votes. One reason is that its master [`evicts`](Self::evicts) and its options do not [allow
    /// eviction](crate::node::RedisNodeOptions::allow_eviction) (it votes again once a check finds
    /// `noeviction`). The other, for a Sentinel voter, is that no majority of its sentinels named
    /// its master within its window (see
    /// [`Sentinel::refresh_interval`](crate::node::Sentinel::refresh_interval)). Like a suspended
    /// node, it does not help a quorum.
    pub fn is_abstaining(&self) -> bool {
        self.eviction.abstains
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn suspends_after_the_threshold_and_restores_on_an_answer() {
        let h = Health::new(3, Duration::ZERO);
        assert!(!h.timed_out(false));
        assert!(!h.timed_out(false));
        assert!(h.admit());
        assert!(h.timed_out(false), "the third timeout suspends");
        assert!(h.is_suspended());
        assert!(!h.admit());
        assert!(!h.timed_out(false), "already suspended");
        h.answered();
        assert!(!h.is_suspended());
        assert_eq!(h.timeouts(), 0);
        assert!(h.admit());
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
        assert!(h.timed_out(false));
        // An answer ends the streak; a new one starts its own span.
        h.answered();
        for _ in 0..3 {
            h.timed_out(false);
        }
        assert!(!h.is_suspended());
    }

    /// A timeout that finds no streak start (its first timeout's store not done yet, or an
    /// answer cleared it) starts the span itself, never judging by an older streak.
    #[test]
    fn a_missing_streak_start_is_taken_as_now() {
        let mut h = Health::new(2, Duration::from_millis(50));
        h.timed_out(false);
        h.epoch = h.epoch.checked_sub(Duration::from_millis(100)).unwrap();
        h.streak_since.store(0, Relaxed);
        assert!(!h.timed_out(false), "the span starts now");
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
    fn a_failed_probe_doubles_the_backoff_up_to_the_maximum() {
        let h = Health::new(1, Duration::ZERO);
        assert!(h.timed_out(false));
        assert_eq!(h.backoff(), FIRST_BACKOFF);
        assert!(!h.timed_out(true));
        assert_eq!(h.backoff(), FIRST_BACKOFF * 2);
        for _ in 0..10 {
            h.timed_out(true);
        }
        assert_eq!(h.backoff(), MAX_BACKOFF);
        assert!(h.is_suspended());
        h.answered();
        assert_eq!(h.backoff(), FIRST_BACKOFF);
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
            assert!(!h.timed_out(false));
        }
        assert!(!h.is_suspended());
        assert!(h.admit());
        assert_eq!(h.timeouts(), 100);
    }

    #[test]
    fn one_probe_loop_at_a_time_and_a_stale_one_lets_a_request_through() {
        let mut h = Health::new(1, Duration::ZERO);
        assert!(h.timed_out(false));
        assert!(h.start_probing(), "the first loop claims it");
        assert!(!h.start_probing(), "a second loop does not start");
        assert!(!h.admit(), "suspended, with a live prober");
        // The prober showed no sign of life for longer than two backoffs (its runtime is
        // gone): one request goes through as an in-band probe, the next does not.
        h.epoch = h.epoch.checked_sub(MAX_BACKOFF * 3).unwrap();
        assert!(h.admit());
        assert!(!h.admit());
        // A loop that ends while the node is suspended again keeps the claim.
        assert!(h.stop_probing(), "suspended: the loop goes on");
        h.answered();
        assert!(!h.stop_probing(), "restored: the loop ends");
        assert!(h.start_probing(), "free to claim again");
    }
}
