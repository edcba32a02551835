//! The pauses of the lock loop. They are the retry policy's schedule and the extra tries it allows
//! (one after a split vote, a few after transient failures). With the wake-up (see `wake.rs`), they
//! are also the queue behind the client's waiters and the wait for the key's release.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::lock::options::Retry;
use crate::lock::wake::{self, Interest, Wakes, Woken};
use crate::metrics;

/// One lock call's pacing between its tries.
///
/// With the wake-up, a caller that may wait queues behind the client's waiters of the key. (One
/// that may not, `Retry::never()`, tries at once.) A failed try registers to be woken by the key's
/// release, and the polls keep their schedule. `poll_at` is the next one, and only the polls count
/// as retries.
pub(super) struct Pacing<'a> {
    retry: &'a Retry,
    /// The retry policy's time bound, from the call's start.
    deadline: Option<Instant>,
    /// The longest a try takes (see [`Pacing::new`]).
    try_time: Duration,
    node_timeout: Duration,
    wakes: Option<&'a Wakes>,
    interest: Option<Interest>,
    poll_at: Option<Instant>,
    polls: u32,
    /// Failed tries in a row that won votes (or failed without a holder): a split.
    splits: u32,
    split_vote_retried: bool,
    transient_left: u32,
}

/// The pause after a failed try.
pub(super) struct Pause {
    at: Instant,
    pause: Duration,
    /// A new poll (a retry), not the rest of one under way.
    new_poll: bool,
}

impl<'a> Pacing<'a> {
    /// A try takes at most two node timeouts: the requests, then the release round of a
    /// failed try (a contended one rarely has any: it won no vote), or the holder's ttl,
    /// asked once for the last error.
    pub(super) fn new(
        retry: &'a Retry,
        started: Instant,
        node_timeout: Duration,
        wakes: Option<&'a Wakes>,
    ) -> Self {
        Self {
            retry,
            deadline: retry.max_wait_of().and_then(|w| started.checked_add(w)),
            try_time: node_timeout.saturating_mul(2),
            node_timeout,
            wakes,
            interest: None,
            poll_at: None,
            polls: 0,
            splits: 0,
            split_vote_retried: false,
            transient_left: retry.transient_retries(),
        }
    }

    /// Before the first try: queue behind the client's waiters of `key`, if it has any and
    /// the caller may wait. The queue's wait is the first pause: it counts as a retry. Like
    /// every pause, it ends in time for a try to finish by the deadline.
    pub(super) async fn queue(&mut self, key: &Arc<str>) {
        let Some(w) = self.wakes else { return };
        if self.retry.retry_count() == 0 || !w.has_waiters(key) {
            return;
        }
        let now = Instant::now();
        let mut first_poll = now + self.retry.next_delay();
        let last = self
            .deadline
            .map(|d| d.checked_sub(self.try_time).unwrap_or(now));
        if let Some(last) = last {
            first_poll = first_poll.min(last.max(now));
        }
        self.polls = 1;
        let queued = self.interest.insert(w.interest(key));
        let woken = queued.queue(first_poll.into()).await == Woken::Early;
        metrics::retry_wait(woken);
        if woken {
            self.poll_at = Some(first_poll);
        }
    }

    /// Before each try.
    pub(super) fn before_try(&self) {
        if let Some(i) = &self.interest {
            i.before_try();
        }
    }

    /// After the failed try `e`: the pause before the next one, or `None` when the call
    /// gives up with `e`.
    pub(super) fn after(&mut self, e: &Error) -> Option<Pause> {
        let split = !e.is_contended() || e.votes_won() > 0;
        self.splits = if split {
            self.splits.saturating_add(1)
        } else {
            0
        };
        // The pause until the next poll: the one under way (the wake-up ended the last wait
        // early), or a new one, which counts as a retry.
        let now = Instant::now();
        let (mut pause, new_poll) = match self.poll_at.filter(|&at| at > now) {
            Some(at) => (at - now, false),
            None => (self.retry.next_delay(), true),
        };
        let fits = |pause| Retry::fits(self.deadline, pause, self.try_time);
        let mut more = (!new_poll || self.polls < self.retry.retry_count()) && fits(pause);
        if !more && !self.split_vote_retried {
            // A split vote between concurrent callers, not a holder: everyone backed off, so
            // one quick try after a random pause usually settles it.
            if let Some(p) = self.retry.split_vote_pause(e) {
                self.split_vote_retried = true;
                (pause, more) = (p, fits(p));
            }
        }
        if !more && self.transient_left > 0 && Retry::is_transient_failure(e) {
            // Masters that did not answer in time (or dropped a connection) and are not
            // suspended: healthy ones stalled — a busy machine, a GC in the network — answer
            // a try made a moment later.
            self.transient_left -= 1;
            let p = Retry::transient_pause(self.node_timeout);
            (pause, more) = (p, fits(p));
        }
        more.then_some(Pause {
            at: now + pause,
            pause,
            new_poll,
        })
    }

    /// Waits out `p`: a sleep, or with the wake-up until the key's release or the poll.
    pub(super) async fn wait(&mut self, key: &Arc<str>, p: Pause) {
        self.polls = self.polls.saturating_add(u32::from(p.new_poll));
        let Some(w) = self.wakes else {
            tokio::time::sleep(p.pause).await;
            metrics::retry_wait(false);
            return;
        };
        let i = self.interest.get_or_insert_with(|| w.interest(key));
        let woken = i.wait(p.at.into()).await;
        metrics::retry_wait(woken == Woken::Early);
        self.poll_at = match woken {
            Woken::Early => Some(p.at),
            Woken::Poll => None,
        };
        if self.poll_at.is_some() && self.splits >= 2 {
            // Woken again after splits in a row: the losers' own releases can add up to a
            // quorum while nobody holds the key, and woken together they would split again;
            // a random pause sets them apart.
            let until_poll = p.at.saturating_duration_since(Instant::now());
            tokio::time::sleep(wake::split_pause(self.splits, until_poll)).await;
        }
    }
}
