//! Taking a lock: the lock loop and one try.
//!
//! The loop tries, and after a failed try waits the retry policy's delay and tries again
//! (one more quick try after a split vote; with the middleware's policy, up to two more
//! after a quorum missed for nodes that gave no answer in time), within the policy's
//! bounds; a contended error it returns carries the holder's remaining ttl. A try sends the acquire to every node at
//! once ([`Acquisition`]), counts the votes as they come (see `tally.rs`), and is granted
//! with a quorum and validity left — with fencing, once its token is settled (`fence.rs`);
//! otherwise it releases what it took. The replay acquire (`replay.rs`) asks each node for
//! the completion record first.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use self::acquisition::Acquisition;
pub(crate) use self::replay::record_key;
pub use self::replay::LockOrRecord;
use crate::error::{Ballots, Error};
use crate::lock::fencing::{self, Fence};
use crate::lock::lease::{Lease, Parked};
use crate::lock::options::{self, Retry};
use crate::lock::records::Verdict;
use crate::lock::release::{CancelGuard, Release};
use crate::lock::state::{Grant, LeaseState};
use crate::lock::tally::{self, Skip, Vote};
use crate::lock::telemetry::{Acquiring, LockOutcome};
use crate::lock::token::Token;
use crate::lock::wake::{self, Woken};
use crate::lock::Redlock;
use crate::node::Acquire;

mod acquisition;
mod fence;
mod replay;

impl Redlock {
    /// The lock loop, in a `redlock.acquire` span; with `replay`, a node's completion record
    /// ends it (see [`Redlock::lock_unless_completed`]).
    pub(in crate::lock) async fn lock_inner(
        &self,
        resource: &str,
        ttl: Duration,
        retry: Retry,
        replay: bool,
    ) -> crate::Result<LockOrRecord> {
        let obs = Acquiring::start(ttl, replay);
        let checked = options::check_resource(resource).and_then(|()| self.check_ttl(ttl));
        let ttl = match checked {
            Ok(ttl) => ttl,
            Err(e) => {
                obs.done(LockOutcome::Failed(&e));
                return Err(e);
            }
        };
        let prefix = &self.inner.config.key_prefix;
        let key: Arc<str> = if prefix.is_empty() {
            resource.into()
        } else {
            format!("{prefix}{resource}").into()
        };
        obs.key(&key);
        let record_key = replay.then(|| replay::record_key(&key));
        let fence_key = self.inner.config.fencing.then(|| fencing::fence_key(&key));

        let deadline = retry.max_wait_of().and_then(|w| obs.started.checked_add(w));
        // A try takes at most two node timeouts: the requests, then the release round of a
        // failed try (a contended one rarely has any: it won no vote), or the holder's ttl,
        // asked once for the last error.
        let try_time = self.inner.config.node_timeout.saturating_mul(2);
        // With the wake-up (see `wake.rs`), a caller that may wait queues behind the
        // client's waiters of the key (one that may not, `Retry::never()`, tries at once), a
        // failed try registers to be woken by the key's release, and the polls keep their
        // schedule: `poll_at` is the next one, and only the polls count as retries.
        let wakes = self.inner.wakes.as_ref();
        let mut interest = None;
        let mut poll_at: Option<Instant> = None;
        let mut polls = 0u32;
        if let Some(w) = wakes.filter(|w| retry.retry_count() > 0 && w.has_waiters(&key)) {
            // The queue's wait is the first pause: it counts as a retry. Like every pause, it
            // ends in time for a try to finish by the deadline.
            let now = Instant::now();
            let mut first_poll = now + retry.next_delay();
            if let Some(last) = deadline.map(|d| d.checked_sub(try_time).unwrap_or(now)) {
                first_poll = first_poll.min(last.max(now));
            }
            polls = 1;
            let queued = interest.insert(w.interest(&key));
            if queued.queue(first_poll.into()).await == Woken::Early {
                poll_at = Some(first_poll);
            }
        }
        // Failed tries in a row that won votes (or failed without a holder): a split.
        let mut splits = 0u32;
        let mut attempt = 0u32;
        let mut split_vote_retried = false;
        let mut transient_left = retry.transient_retries();
        loop {
            attempt = attempt.saturating_add(1);
            if let Some(i) = &interest {
                i.before_try();
            }
            // A try decided without I/O (every node suspended, in-process nodes) must still
            // let other tasks run: a loop of tries would otherwise starve its runtime.
            tokio::task::consume_budget().await;
            let token = Token::new();
            obs.attempt(attempt);
            let (record_key, fence_key) = (record_key.as_ref(), fence_key.as_ref());
            let try_once = || self.try_once(&key, record_key, fence_key, token, ttl, &obs);
            // The try runs in the span only when it is enabled, and awaited in place
            // otherwise: a wrapper (`telemetry::within`, or one around the whole loop) would
            // cost every lock call a move of its future (measured: ~270 instructions).
            let tried = match &obs.span {
                None => try_once().await,
                Some(span) => try_once().instrument(span.clone()).await,
            };
            match tried {
                Ok(Try::Granted(Granted { grant, parked })) => {
                    let valid_until = grant.deadline;
                    let span = obs.lease_span(&key);
                    let state = LeaseState::new(key, prefix.len(), token, ttl, grant, span);
                    let lease = Lease::new(self.clone(), state, parked);
                    obs.done(LockOutcome::Locked(valid_until));
                    return Ok(LockOrRecord::Locked(lease));
                }
                Ok(Try::Completed(record)) => {
                    obs.done(LockOutcome::Completed);
                    return Ok(LockOrRecord::Completed(record));
                }
                Ok(Try::Unknown) => {
                    obs.done(LockOutcome::Completed);
                    return Ok(LockOrRecord::OutcomeUnknown);
                }
                Err(e) => {
                    let split = !e.is_contended() || e.votes_won() > 0;
                    splits = if split { splits.saturating_add(1) } else { 0 };
                    // The pause until the next poll: the one under way (the wake-up ended the
                    // last wait early), or a new one, which counts as a retry.
                    let now = Instant::now();
                    let (mut pause, new_poll) = match poll_at.filter(|&at| at > now) {
                        Some(at) => (at - now, false),
                        None => (retry.next_delay(), true),
                    };
                    let mut more = (!new_poll || polls < retry.retry_count())
                        && Retry::fits(deadline, pause, try_time);
                    if !more && !split_vote_retried {
                        // A split vote between concurrent callers, not a holder: everyone
                        // backed off, so one quick try after a random pause usually settles it.
                        if let Some(p) = retry.split_vote_pause(&e) {
                            split_vote_retried = true;
                            (pause, more) = (p, Retry::fits(deadline, p, try_time));
                        }
                    }
                    if !more && transient_left > 0 && Retry::is_transient_failure(&e) {
                        // Masters that did not answer in time (or dropped a connection) and
                        // are not suspended: healthy ones stalled — a busy machine, a GC in
                        // the network — answer a try made a moment later.
                        transient_left -= 1;
                        let p = Retry::transient_pause(self.inner.config.node_timeout);
                        (pause, more) = (p, Retry::fits(deadline, p, try_time));
                    }
                    if !more {
                        let e = self.ask_holder_ttl(&key, e).await.with_attempts(attempt);
                        obs.done(LockOutcome::Failed(&e));
                        return Err(e);
                    }
                    polls = polls.saturating_add(u32::from(new_poll));
                    let Some(w) = wakes else {
                        tokio::time::sleep(pause).await;
                        continue;
                    };
                    let at = now + pause;
                    let i = interest.get_or_insert_with(|| w.interest(&key));
                    poll_at = match i.wait(at.into()).await {
                        Woken::Early => Some(at),
                        Woken::Poll => None,
                    };
                    if poll_at.is_some() && splits >= 2 {
                        // Woken again after splits in a row: the losers' own releases can add
                        // up to a quorum while nobody holds the key, and woken together they
                        // would split again; a random pause sets them apart.
                        let until_poll = at.saturating_duration_since(Instant::now());
                        tokio::time::sleep(wake::split_pause(splits, until_poll)).await;
                    }
                }
            }
        }
    }

    /// One try: returns the grant, or an error after releasing what it took.
    ///
    /// At the decision, the requests still unanswered are no longer polled: nothing is left
    /// running once the outcome is known. A granted lease keeps them (unpolled) until it is
    /// released, so that one already handed to its node's connection is written — the lock
    /// lands on every master that is up and connected — and is followed there, in order, by
    /// the release; one never handed over (to a connection still being made) is never sent.
    /// A failed try drops them at once. Either way no SET of
    /// ours can land after our release (the `Node` contract).
    ///
    /// With `record_key` (replay), each node is asked the replay acquire: any completion
    /// record ends the try with it, and what the try locked meanwhile is released.
    ///
    /// With `fence_key` (fencing), each node is asked the fenced acquire, and the grant
    /// carries the largest counter among the votes for (see `fencing`).
    async fn try_once(
        &self,
        key: &Arc<str>,
        record_key: Option<&Arc<str>>,
        fence_key: Option<&Arc<str>>,
        token: Token,
        ttl: Duration,
        obs: &Acquiring,
    ) -> crate::Result<Try> {
        let inner = &*self.inner;
        let n = inner.nodes.len();
        let timeout = inner.config.node_timeout;
        let start = Instant::now();
        // If this future is dropped from here on (a cancelled caller), the guard releases
        // the token everywhere in the background — after the requests, dropped first.
        let deadline = start + ttl - inner.config.drift(ttl);
        let guard = CancelGuard {
            client: Some(self.clone()),
            key: key.clone(),
            token,
            deadline,
            ttl,
        };
        let request = Acquisition::new(&inner.nodes, key, record_key, fence_key, token, ttl);
        let mut sent = tally::send(
            &inner.nodes,
            tally::all(n),
            timeout,
            Skip::Suspended,
            &|node| request.now(node),
            |v| {
                let request = request.clone();
                async move { request.send(&v.node).await }
            },
        );
        let replay = record_key.is_some();
        let mut tally = tally::count(&mut sent, n, inner.quorum, |a| match a {
            Acquire::Acquired => Vote::For,
            Acquire::Fenced { fence } => Vote::Fenced(fence),
            Acquire::Held { remaining } => Vote::Against(remaining),
            Acquire::Completed { record } if replay => Vote::Completed(record, false, None),
            Acquire::CompletedIfFree { record, remaining } if replay => {
                Vote::Completed(record, true, remaining)
            }
            // From a plain acquire (a node must not answer it): it locked nothing.
            Acquire::Completed { .. } | Acquire::CompletedIfFree { .. } => Vote::Against(None),
        })
        .await;
        // The answers that came meanwhile need no release if they hold nothing of ours.
        tally::drain_ready(&mut sent, |answer| tally.late_acquire(answer, replay));
        let mut verdict = None;
        if replay {
            let until = deadline.min(start + timeout);
            replay::await_every_answer(&mut sent, &mut tally, inner.quorum, until).await;
            let held = tally.against > 0;
            verdict = tally
                .records
                .verdict(inner.quorum, n, tally.answers(), held);
            let answer = matches!(verdict, Some(Verdict::Record(_) | Verdict::Unknown));
            if answer && !sent.is_empty() {
                // A record is the answer: the requests still in flight are settled in the
                // background, releasing only where they locked — not on every node asked.
                replay::settle_in_background(
                    self.clone(),
                    sent.take(),
                    key.clone(),
                    token,
                    deadline,
                    ttl,
                );
            }
        }
        obs.tried(|| (tally.votes(), tally.records.any()));
        let mut holders = (tally.answered & !tally.not_ours) | sent.started();
        let granted =
            !tally.records.any() && tally.for_ >= inner.quorum && Instant::now() < deadline;
        let fence = fence_key
            .zip(tally.fence)
            .filter(|_| granted)
            .map(|(key, token)| Fence {
                token,
                key: key.clone(),
                retention: request.retention,
            });
        // A fenced grant is handed out only once its token is settled (see `fencing`). Boxed:
        // the plain try's future (allocated per lock call) does not carry its state.
        let settled = match &fence {
            Some(f) => {
                let holding = tally.for_mask;
                let settle =
                    self.settle_fence(key, token, ttl, f, &tally.fences, holding, deadline);
                Box::pin(settle).await
            }
            None => Ok(()),
        };
        if granted && settled.is_ok() {
            guard.disarm();
            // The stragglers are kept, unpolled, with the lease (see `Lease`): what was handed
            // to a connection is written, what was not is never sent.
            let parked = (!sent.is_empty()).then(|| Parked::new(sent));
            return Ok(Try::Granted(Granted {
                grant: Grant {
                    start,
                    deadline,
                    holders,
                    fence,
                },
                parked,
            }));
        }
        drop(sent);

        // An answer from records stored "if free" alone (rule 5) is made to last: the record
        // is copied where this try locked (`records.rs`), which ends our lock there. A copy
        // that did not reach every such node makes the answer unavailable (try again), never
        // one that a later lost lease's record could change; the release of the rest then
        // goes on in the background, so that the try still takes two rounds at most.
        let mut copied = true;
        if let Some(Verdict::Record(record)) = &verdict {
            let copy = tally
                .records
                .copy_for(record)
                .filter(|_| tally.for_mask != 0);
            if let Some(retention) = copy {
                let record = record.clone();
                let mask = tally.for_mask;
                let copy = self.copy_free(key, token, record, retention, mask);
                let (stored, errors) = Box::pin(copy).await;
                holders &= !stored;
                copied = stored == mask;
                if !copied {
                    tally.errors.extend(errors);
                    verdict = Some(Verdict::Unavailable(
                        "a lost lease's completion record answered, but its copy did not reach \
                         every node this try locked within the node timeout: try again",
                    ));
                }
            }
        }

        // Failed: release on every node that may hold our token. Wait one round for the
        // nodes that voted for (they answered quickly), so that nothing of ours outlives this
        // try; the others, and any retry, go on in the background while the lock could be
        // valid — a try never waits longer than its node timeouts. (After a copy that missed
        // a node, the release is all in the background: the copy took the round.)
        if holders != 0 {
            let needed = match copied {
                true => (tally.for_mask & holders).count_ones() as usize,
                false => 0,
            };
            let release = Release {
                key: key.clone(),
                token,
                mask: holders,
                needed,
                patience: Instant::now(),
                until: deadline,
                gone: deadline + ttl,
                fence: None,
            };
            // Still guarded: if this future is dropped during the release round, the guard
            // releases everywhere in the background.
            let _ = self.release_token(release).await;
        }
        guard.disarm();
        let unsettled = match verdict {
            Some(Verdict::Record(record)) => return Ok(Try::Completed(record)),
            Some(Verdict::Unknown) => return Ok(Try::Unknown),
            Some(Verdict::Unavailable(why)) => {
                Err(Error::unavailable(why, std::mem::take(&mut tally.errors)).with_records())
            }
            // A live holder beside records: contended, as any "held" answer makes it.
            Some(Verdict::Contended) | None => settled,
        };
        let ballots = Ballots {
            names: inner.names.clone(),
            granted: tally.for_mask,
            held: tally.not_ours & !tally.error_mask(),
            ttls: std::mem::take(&mut tally.held_ttls),
        };
        let err = if let Err(unsettled) = unsettled {
            unsettled
        } else if tally.for_ >= inner.quorum && !tally.records.any() {
            Error::unavailable(
                format!(
                    "a quorum answered, but too slowly to leave any validity of the {ttl:?} ttl"
                ),
                tally.errors,
            )
        } else if tally.against > 0 {
            // Any "held" answer makes it contended: the rule is stated on `Error`.
            let holder = tally.not_ours & !tally.error_mask();
            Error::contended(
                tally.against,
                tally.for_,
                n,
                tally.min_remaining,
                tally.errors,
            )
            .with_holder(holder.trailing_zeros() as usize)
        } else {
            Error::unavailable(
                format!(
                    "could not reach a quorum of {} of {n} nodes, and none said held",
                    inner.quorum
                ),
                tally.errors,
            )
        };
        Err(err.with_ballots(ballots))
    }

    /// Completes a contended error that is about to be returned with the holder's remaining
    /// ttl, asked from one node that said "held" (bounded by the node timeout), when no node
    /// reported it with its answer. Asked once per returned error, not on every try.
    async fn ask_holder_ttl(&self, key: &str, mut e: Error) -> Error {
        let Some(i) = e.holder_to_ask() else {
            return e;
        };
        let Some(voter) = self.inner.nodes.get(i) else {
            return e;
        };
        let Some(ask) = voter.node.remaining_ttl(key) else {
            return e;
        };
        let timeout = self.inner.config.node_timeout;
        if let Ok(Ok(Some(remaining))) = tokio::time::timeout(timeout, ask).await {
            e.set_retry_after(i, remaining);
        }
        e
    }
}

/// The outcome of a try that did not fail.
enum Try {
    Granted(Granted),
    /// A node had the completion record (replay acquire).
    Completed(bytes::Bytes),
    /// Nodes had records of lost leases that differ (replay acquire).
    Unknown,
}

struct Granted {
    /// The validity, the nodes that may hold our token, the fencing token.
    grant: Grant,
    /// The requests still unanswered, kept with the lease.
    parked: Option<Parked>,
}
