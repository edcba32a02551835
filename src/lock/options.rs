//! Retry policy and the client's tunables.

use std::time::{Duration, Instant};

/// How [`Redlock::lock_with`](crate::Redlock::lock_with) retries a lock that is contended or
/// whose quorum is unreachable.
///
/// After a failed try the client releases what it took, then waits `delay` plus a random
/// jitter in `0..=jitter` before the next try. It stops after `retries` more tries, or — if a
/// `max_wait` is set — before a try that could not finish by then. Every wait is bounded.
///
/// The default is the Ruby `redlock` gem's: 3 retries, 200 ms delay, up to 50 ms jitter.
///
/// ```
/// use std::time::Duration;
/// use tower_redlock::Retry;
///
/// // Wait up to 2 s for a busy resource, trying every 50–75 ms.
/// let wait = Retry::until(Duration::from_secs(2))
///     .delay(Duration::from_millis(50))
///     .jitter(Duration::from_millis(25));
/// // At most 5 retries, and none that could not finish within 1 s:
/// let short = Retry::times(5).max_wait(Duration::from_secs(1));
/// # let _ = (wait, short);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a retry policy does nothing until it is used"]
pub struct Retry {
    retries: u32,
    delay: Duration,
    jitter: Duration,
    max_wait: Option<Duration>,
    /// One more try, after a random pause of at most 20 ms, when the last one lost a split
    /// vote (contended, yet some node voted for us): the middleware's, inside one lock call.
    split_vote_retry: bool,
    /// Extra tries, each after a pause of one to two node timeouts, when the tries run out on an
    /// unreachable quorum that a node's transient failure caused. Such a failure is no answer in
    /// time or a dropped connection, not a suspended node. These tries are the middleware's, so
    /// that a stall of healthy masters is not answered `503`.
    transient_retries: u32,
}

impl Default for Retry {
    fn default() -> Self {
        Self {
            retries: 3,
            delay: Duration::from_millis(200),
            jitter: Duration::from_millis(50),
            max_wait: None,
            split_vote_retry: false,
            transient_retries: 0,
        }
    }
}

impl Retry {
    /// One try, no retry.
    pub const fn never() -> Self {
        Self {
            retries: 0,
            delay: Duration::ZERO,
            jitter: Duration::ZERO,
            max_wait: None,
            split_vote_retry: false,
            transient_retries: 0,
        }
    }

    /// `retries` retries after the first try, with the default delay and jitter.
    pub fn times(retries: u32) -> Self {
        Self {
            retries,
            ..Self::default()
        }
    }

    /// Retry until `max_wait` has passed since the first try (with the default delay and
    /// jitter; no retry count limit). No try starts after that, but the last one runs to
    /// its end: one node timeout, plus the time given back for stalls of this process (see
    /// [`RedlockBuilder::node_timeout`](crate::RedlockBuilder::node_timeout); at most 5 s).
    pub fn until(max_wait: Duration) -> Self {
        Self {
            retries: u32::MAX,
            max_wait: Some(max_wait),
            ..Self::default()
        }
    }

    /// The number of retries after the first try.
    pub fn retries(mut self, retries: u32) -> Self {
        self.retries = retries;
        self
    }

    /// The base delay between tries.
    pub fn delay(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }

    /// The upper bound of the random delay added to each wait.
    pub fn jitter(mut self, jitter: Duration) -> Self {
        self.jitter = jitter;
        self
    }

    /// Stop retrying once `max_wait` has passed since the first try (no try starts after;
    /// see [`Retry::until`]).
    pub fn max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = Some(max_wait);
        self
    }

    /// The bound on the whole wait, if any.
    pub(crate) fn max_wait_of(&self) -> Option<Duration> {
        self.max_wait
    }

    /// The base delay between tries.
    pub(crate) fn delay_of(&self) -> Duration {
        self.delay
    }

    /// The number of retries after the first try.
    pub(crate) fn retry_count(&self) -> u32 {
        self.retries
    }

    /// With one extra try when the tries run out on a split vote (see `split_vote_retry`).
    pub(crate) const fn settling_split_votes(mut self) -> Self {
        self.split_vote_retry = true;
        self
    }

    /// With `retries` extra tries when the tries run out on an unreachable quorum that a
    /// transient node failure caused (see `transient_retries`).
    pub(crate) const fn riding_out_transient_failures(mut self, retries: u32) -> Self {
        self.transient_retries = retries;
        self
    }

    /// The extra tries after an unreachable quorum that a transient failure caused.
    pub(crate) const fn transient_retries(&self) -> u32 {
        self.transient_retries
    }

    /// Whether `e` is worth one of the extra tries of `transient_retries`: the quorum was
    /// unreachable, and some node gave no answer (a timeout, a dropped connection) rather
    /// than a refusal or a suspension — asked again, it may answer.
    pub(crate) fn is_transient_failure(e: &crate::Error) -> bool {
        e.is_unavailable() && e.node_errors().iter().any(crate::NodeError::is_transient)
    }

    /// The pause before such an extra try: one to two node timeouts, at random — time for
    /// a stalled master to answer its backlog, and the callers that failed together apart.
    pub(crate) fn transient_pause(node_timeout: Duration) -> Duration {
        let ns = u64::try_from(node_timeout.as_nanos()).unwrap_or(u64::MAX);
        node_timeout.saturating_add(Duration::from_nanos(fastrand::u64(0..=ns)))
    }

    /// The pause before one extra try after a split vote, if this policy takes one.
    pub(crate) fn split_vote_pause(&self, e: &crate::Error) -> Option<Duration> {
        (self.split_vote_retry && e.is_contended() && e.votes_won() > 0)
            .then(|| Duration::from_micros(fastrand::u64(0..=20_000)))
    }

    /// The pause before the next try: `delay` + a uniform random jitter.
    pub(crate) fn next_delay(&self) -> Duration {
        let jitter_ns = u64::try_from(self.jitter.as_nanos()).unwrap_or(u64::MAX);
        let extra = if jitter_ns == 0 {
            0
        } else {
            fastrand::u64(0..=jitter_ns)
        };
        self.delay.saturating_add(Duration::from_nanos(extra))
    }

    /// Whether a try that starts after `pause` and may take `try_time` still ends by the
    /// deadline.
    pub(crate) fn fits(deadline: Option<Instant>, pause: Duration, try_time: Duration) -> bool {
        match deadline {
            None => true,
            Some(d) => Instant::now()
                .checked_add(pause.saturating_add(try_time))
                .is_some_and(|end| end <= d),
        }
    }
}

/// The client's tunables, fixed when it is built.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) retry: Retry,
    pub(crate) node_timeout: Duration,
    pub(crate) drift_factor: f64,
    pub(crate) key_prefix: String,
    pub(crate) max_extensions: u32,
    /// The smallest ttl limit of the nodes (delayed-restart protection), if any.
    pub(crate) max_ttl: Option<Duration>,
    /// Suspend a node after this many timeouts in a row (0: never).
    pub(crate) suspend_after: u32,
    /// Fencing tokens (fenced acquires and releases).
    pub(crate) fencing: bool,
    /// Waiters woken on release (the scripts publish, the voters subscribe).
    pub(crate) wake_waiters: bool,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            retry: Retry::default(),
            node_timeout: Duration::from_millis(50),
            drift_factor: 0.01,
            key_prefix: String::new(),
            max_extensions: 100,
            max_ttl: None,
            suspend_after: 3,
            fencing: false,
            wake_waiters: false,
        }
    }
}

/// The fixed part of the clock drift allowance (Redis' distributed-lock page adds 2 ms for
/// the expiry precision of Redis itself).
pub(crate) const DRIFT_FLOOR: Duration = Duration::from_millis(2);

/// The longest ttl a lock may ask for.
pub(crate) const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

impl Config {
    /// The drift allowance for `ttl`: `ttl · drift_factor + 2 ms`.
    pub(crate) fn drift(&self, ttl: Duration) -> Duration {
        ttl.mul_f64(self.drift_factor) + DRIFT_FLOOR
    }

    /// Checks a ttl and rounds it down to whole milliseconds (what `PX` takes).
    pub(crate) fn check_ttl(&self, ttl: Duration) -> crate::Result<Duration> {
        let whole = Duration::from_millis(u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX));
        if whole > MAX_TTL {
            return Err(crate::Error::invalid(format!(
                "ttl {ttl:?} is longer than the maximum of {MAX_TTL:?}"
            )));
        }
        if let Some(max) = self.max_ttl.filter(|max| whole > *max) {
            return Err(crate::Error::invalid(format!(
                "ttl {ttl:?} is longer than the {max:?} the nodes' delayed-restart protection \
                 allows; raise their `restart_protection` or shorten the ttl"
            )));
        }
        let drift = self.drift(whole);
        if whole <= drift {
            return Err(crate::Error::invalid(format!(
                "ttl {ttl:?} leaves no validity after the clock drift allowance of {drift:?}; \
                 use a ttl of at least 10 ms (well above the per-node timeout of {:?})",
                self.node_timeout
            )));
        }
        Ok(whole)
    }
}

/// Checks a resource name.
pub(crate) fn check_resource(resource: &str) -> crate::Result<()> {
    if resource.is_empty() {
        return Err(crate::Error::invalid("the resource name is empty"));
    }
    let max = crate::Redlock::MAX_RESOURCE_LEN;
    if resource.len() > max {
        return Err(crate::Error::invalid(format!(
            "the resource name is {} bytes long; the maximum is {max} \
             (hash long names before locking them)",
            resource.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jitter_stays_in_bounds() {
        let r = Retry::default();
        for _ in 0..1000 {
            let d = r.next_delay();
            assert!(d >= Duration::from_millis(200) && d <= Duration::from_millis(250));
        }
        assert_eq!(Retry::never().next_delay(), Duration::ZERO);
    }

    #[test]
    fn ttl_checks() {
        let c = Config::default();
        assert!(c.check_ttl(Duration::from_millis(2)).is_err());
        assert!(c.check_ttl(Duration::ZERO).is_err());
        assert!(c.check_ttl(MAX_TTL + Duration::from_secs(1)).is_err());
        assert!(c.check_ttl(Duration::MAX).is_err());
        assert_eq!(
            c.check_ttl(Duration::from_micros(10_900)).unwrap(),
            Duration::from_millis(10)
        );
        // drift = 1000 ms · 0.01 + 2 ms
        assert_eq!(c.drift(Duration::from_secs(1)), Duration::from_millis(12));
    }

    #[test]
    fn resource_checks() {
        assert!(check_resource("").unwrap_err().is_invalid_input());
        assert!(check_resource(&"x".repeat(crate::Redlock::MAX_RESOURCE_LEN + 1)).is_err());
        assert!(check_resource("a").is_ok());
    }

    /// The middleware's split-vote retry is one more try inside the same lock call: the
    /// caller sees one call (one outcome, counted once) of two attempts; without it, one.
    #[tokio::test]
    async fn a_split_vote_gets_one_more_try_in_the_same_call() {
        use crate::{node::MemoryNode, Redlock};
        let (a, b, c) = (MemoryNode::new(), MemoryNode::new(), MemoryNode::new());
        let holder = Redlock::builder()
            .node(a.clone())
            .node(b.clone())
            .build()
            .unwrap();
        let _held = holder.try_lock("k", Duration::from_secs(30)).await.unwrap();
        let client = Redlock::builder().node(a).node(b).node(c).build().unwrap();
        let ttl = Duration::from_secs(30);

        let plain = client
            .lock_with("k", ttl, Retry::never())
            .await
            .unwrap_err();
        assert!(plain.is_contended() && plain.votes_won() == 1, "{plain:?}");
        assert_eq!(plain.attempts(), 1);

        let settling = Retry::never().settling_split_votes();
        let split = client.lock_with("k", ttl, settling).await.unwrap_err();
        assert!(split.is_contended(), "{split:?}");
        assert_eq!(split.attempts(), 2, "one extra try after the split vote");

        // No vote won: a plain holder, no extra try.
        let all = Redlock::builder().node(MemoryNode::new()).build().unwrap();
        let _all_held = all.try_lock("k", ttl).await.unwrap();
        let lost = all.lock_with("k", ttl, settling).await.unwrap_err();
        assert_eq!((lost.votes_won(), lost.attempts()), (0, 1));
    }
}
