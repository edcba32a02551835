//! Taking a lock: the lock loop and one try.
//!
//! The loop tries, and after a failed try waits the retry policy's delay and tries again
//! (one more quick try after a split vote; with the middleware's policy, up to two more
//! after a quorum missed for nodes that gave no answer in time), within the policy's
//! bounds (`pacing.rs`); a contended error it returns carries the holder's remaining ttl. A try sends the acquire to every node at
//! once ([`Acquisition`]), counts the votes as they come (see `tally.rs`), and is granted
//! with a quorum and validity left — with fencing, once its token is settled (`fence.rs`);
//! otherwise it releases what it took (`failed.rs`). The replay acquire (`replay.rs`) asks each node for
//! the completion record first.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use self::acquisition::Acquisition;
use self::pacing::Pacing;
pub(crate) use self::replay::record_key;
pub use self::replay::LockOrRecord;
use crate::error::Error;
use crate::lock::fencing::{self, Fence};
use crate::lock::lease::{Lease, Parked};
use crate::lock::options::{self, Retry};
use crate::lock::records::Verdict;
use crate::lock::release::CancelGuard;
use crate::lock::state::{Grant, LeaseState};
use crate::lock::tally::{self, Skip, Vote};
use crate::lock::telemetry::{Acquiring, LockOutcome};
use crate::lock::token::Token;
use crate::lock::Redlock;
use crate::node::Acquire;

mod acquisition;
mod failed;
mod fence;
mod pacing;
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

        let wakes = self.inner.wakes.as_ref();
        let mut pacing = Pacing::new(&retry, obs.started, self.inner.config.node_timeout, wakes);
        pacing.queue(&key).await;
        let mut attempt = 0u32;
        loop {
            attempt = attempt.saturating_add(1);
            pacing.before_try();
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
                Err(e) => match pacing.after(&e) {
                    Some(pause) => pacing.wait(&key, pause).await,
                    None => {
                        let e = self.ask_holder_ttl(&key, e).await.with_attempts(attempt);
                        obs.done(LockOutcome::Failed(&e));
                        return Err(e);
                    }
                },
            }
        }
    }

    /// One try: returns the grant, or an error after releasing what it took.
    ///
    /// At the decision, the requests still unanswered are no longer polled: nothing is left running
    /// once the outcome is known. A granted lease keeps them (unpolled) until it is released. So
    /// one already handed to its node's connection is written — the lock lands on every master that
    /// is up and connected — and is followed there, in order, by the release. One never handed over
    /// (to a connection still being made) is never sent. A failed try drops them at once. Either
    /// way no SET of ours can land after our release (the `Node` contract).
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
        let vote = |answer| vote(answer, replay);
        let mut tally = tally::count(&mut sent, n, inner.quorum, vote).await;
        // The answers that came meanwhile need no release if they hold nothing of ours.
        tally::drain_ready(&mut sent, |answer| tally.late_acquire(answer, replay));
        let mut verdict = None;
        if replay {
            let until = deadline.min(start + timeout);
            replay::await_every_answer(&mut sent, &mut tally, inner.quorum, until).await;
            verdict = tally
                .records
                .verdict(inner.quorum, n, tally.answers(), tally.against > 0);
            let answer = matches!(verdict, Some(Verdict::Record(_) | Verdict::Unknown));
            if answer && !sent.is_empty() {
                // A record is the answer: the requests still in flight are settled in the
                // background, releasing only where they locked — not on every node asked.
                let sent = sent.take();
                replay::settle_in_background(self.clone(), sent, key.clone(), token, deadline, ttl);
            }
        }
        obs.tried(|| (tally.votes(), tally.records.any()));
        let mut holders = (tally.answered & !tally.not_ours) | sent.started();
        let granted =
            !tally.records.any() && tally.for_ >= inner.quorum && Instant::now() < deadline;
        let fence = fence_key.zip(tally.fence).filter(|_| granted);
        let fence = fence.map(|(key, token)| Fence {
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
            let grant = Grant {
                start,
                deadline,
                holders,
                fence,
            };
            return Ok(Try::Granted(Granted { grant, parked }));
        }
        drop(sent);
        let copied = self
            .copy_answer(key, token, &mut verdict, &mut tally, &mut holders)
            .await;
        // Still guarded: if this future is dropped during the release round, the guard
        // releases everywhere in the background.
        self.release_failed(key, token, holders, tally.for_mask, copied, deadline, ttl)
            .await;
        guard.disarm();
        self.refusal(tally, verdict, settled, ttl)
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

/// A node's answer to the acquire, as a vote (`replay`: the replay acquire was asked).
fn vote(answer: Acquire, replay: bool) -> Vote {
    match answer {
        Acquire::Acquired => Vote::For,
        Acquire::Fenced { fence } => Vote::Fenced(fence),
        Acquire::Held { remaining } => Vote::Against(remaining),
        Acquire::Completed { record } if replay => Vote::Completed(record, false, None),
        Acquire::CompletedIfFree { record, remaining } if replay => {
            Vote::Completed(record, true, remaining)
        }
        // From a plain acquire (a node must not answer it): it locked nothing.
        Acquire::Completed { .. } | Acquire::CompletedIfFree { .. } => Vote::Against(None),
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
