//! Idempotent work on the quorum: [`Redlock::lock_unless_completed`] answers with the
//! completion record when the work is done, or with a lease to do it (the replay acquire:
//! `acquire/replay.rs`); [`Lease::complete`](crate::Lease::complete) stores the completion
//! record on every node where the lease still holds, ending the lock there, and keeps at it
//! until a quorum has it.
//!
//! A duplicate runs the work again only if a quorum of nodes answers it with neither the record nor
//! our lock. So while the record lacks its quorum, the nodes that did not store it must keep our
//! lock. The completion is retried there — past the caller's patience, for as long as the lock may
//! still hold there. A node that refuses the write with an error reply (a master out of memory) but
//! still holds the lock has it extended. What this leaves open is stated in the crate's Safety
//! docs: a node that does not answer until its lock has expired can no longer store the record.
//!
//! `lost.rs`: the completion of a lease that may have been lost while its work ran, stored
//! where its lock holds or has expired (never over another holder).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use tracing::Instrument;

use super::acquire::{record_key, LockOrRecord};
use super::call::Answer;
use super::fencing::Fence;
use super::lease::Lease;
use super::options::Retry;
use super::release::{self, FIRST_PAUSE, MAX_PAUSE};
use super::state::LeaseState;
use super::tally::{self, Skip, Tally, Vote};
use super::telemetry::{self, Background};
use super::token::Token;
use super::{Inner, Redlock};
use crate::error::{Error, NodeError};
use crate::node::{CallError, CompleteRequest};

mod keep;
mod lost;
#[cfg(test)]
mod tests;

use self::keep::{keep_completing, Keep, KeepOnDrop, KEEP_TTLS};

impl Redlock {
    /// Locks `resource` for work that must run **once**, unless it already ran: each node is
    /// asked, in one atomic step, for the resource's completion record, and locks only if it
    /// has none. Any record found is the answer ([`LockOrRecord::Completed`]: only a holder ever
    /// stores one); "not done yet" is concluded only from a quorum of locks
    /// ([`LockOrRecord::Locked`]). Contended and unavailable as [`Redlock::lock_with`]; a node
    /// that stores no records (a custom [`Node`](crate::node::Node) without them) counts as
    /// failed.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_redlock::Error> {
    /// use std::time::Duration;
    /// use tower_redlock::{LockOrRecord, Redlock, Retry};
    ///
    /// let redlock = Redlock::in_memory();
    /// let ttl = Duration::from_secs(10);
    /// let day = Duration::from_secs(86_400);
    /// match redlock.lock_unless_completed("payment:8e03", ttl, Retry::never()).await? {
    ///     LockOrRecord::Locked(lease) => lease.complete("charged: pay_1", day).await?,
    ///     _ => unreachable!("first time"),
    /// }
    /// // A retry of the same work gets the stored answer; nothing runs twice.
    /// match redlock.lock_unless_completed("payment:8e03", ttl, Retry::never()).await? {
    ///     LockOrRecord::Completed(record) => assert_eq!(&record[..], b"charged: pay_1"),
    ///     _ => unreachable!("already done"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Redlock::lock`], once `retry` gives up; a completion record found is not an
    /// error ([`LockOrRecord::Completed`]).
    pub async fn lock_unless_completed(
        &self,
        resource: &str,
        ttl: Duration,
        retry: Retry,
    ) -> crate::Result<LockOrRecord> {
        self.lock_inner(resource, ttl, retry, true).await
    }
}

impl Lease {
    /// Completes the work this lease guarded (see [`Redlock::lock_unless_completed`]):
    /// stores `record` as the resource's completion record for `retention`, on every node
    /// where the lease still holds, and ends the lock there — one atomic step per node.
    /// From then on [`Redlock::lock_unless_completed`] answers
    /// [`LockOrRecord::Completed`](crate::LockOrRecord::Completed) with `record`.
    ///
    /// `Ok` once a quorum stored it. See the crate's Safety docs for the one case left open.
    ///
    /// # Errors
    ///
    /// - [`Error::is_invalid_input`]: a record over
    ///   [`Lease::MAX_RECORD_LEN`](crate::Lease::MAX_RECORD_LEN), or a retention of zero or
    ///   over [`Lease::MAX_RECORD_RETENTION`](crate::Lease::MAX_RECORD_RETENTION). Nothing
    ///   was stored, and the lease is released.
    /// - [`Error::is_lost`]: the lease expired or was lost (nothing stale is stored where it
    ///   no longer holds).
    /// - [`Error::is_unavailable`]: too few nodes answered.
    ///
    /// After a lost or unavailable answer the lock is **not** released early. The record is
    /// asked again, in the background, where the lock still holds (the lock extended where
    /// the write is refused with an error reply). That goes on until a quorum has it or the
    /// lock has expired there, so duplicates are refused rather than run a second time. The
    /// same holds if this future is dropped midway.
    ///
    /// [`Error::is_lost`]: crate::Error::is_lost
    /// [`Error::is_invalid_input`]: crate::Error::is_invalid_input
    /// [`Error::is_unavailable`]: crate::Error::is_unavailable
    pub async fn complete(
        mut self,
        record: impl Into<bytes::Bytes>,
        retention: std::time::Duration,
    ) -> crate::Result<()> {
        let record = record.into();
        if let Some(why) = invalid_record(&record, retention) {
            // Refused before anything was stored: the work may run again, so release.
            let _ = self.release().await;
            return Err(crate::Error::invalid(why));
        }
        self.stop_keep_alive();
        // From here the lock is never released early, not even if this future is dropped.
        self.released = true;
        let state = &*self.state;
        let end = telemetry::Ending::start(state.key(), state.span(), || state.deadline(), true);
        let completion = self
            .client
            .complete_state(state, record, retention, end.span.as_ref());
        let result = telemetry::within(&end.span, completion).await;
        state.end();
        // A loss found by the completion itself (its token gone from a quorum) counts too,
        // once: an expired lease was found lost before anything was sent.
        if result.as_ref().is_err_and(crate::Error::is_lost) {
            state.lost_after_end("its completion found its token gone");
        }
        end.done(state.started(), &result);
        result
    }
}

impl Redlock {
    /// Stores `record` for `state`'s resource on every node where its token still holds.
    ///
    /// The nodes that gave no answer are asked again until a quorum stored the record, or
    /// until the caller's patience runs out (see `release.rs`); a node asked again that
    /// answers "not stored" had stored it the first time (its answer was lost: the script is
    /// idempotent and answers "stored" then) or no longer holds our token. Past the
    /// caller's patience the rest goes on in the background: the stragglers once a quorum
    /// stored it; otherwise [`keep_completing`], until a quorum has the record.
    pub(crate) async fn complete_state(
        &self,
        state: &LeaseState,
        record: Bytes,
        retention: Duration,
        span: Option<&tracing::Span>,
    ) -> crate::Result<()> {
        let inner = &*self.inner;
        if !state.is_valid() {
            return Err(Error::lost(
                "the lease expired or was lost before its work was completed: nothing stored",
            ));
        }
        // The work is over: from here the lease reports itself ended (a holder watching its
        // handle stops), even if this future is dropped midway. Nothing is released.
        state.end();
        let n = inner.nodes.len();
        // If this future is dropped before the record is on a quorum, the guard hands the
        // completion to the background, where it goes on as below.
        let mut guard = KeepOnDrop(Some(Keep {
            client: Arc::downgrade(&self.inner),
            completion: Completion::of(state, record, retention, false),
            ttl: state.ttl(),
            until: state.deadline() + state.ttl(),
            hard_until: state.deadline() + state.ttl().saturating_mul(KEEP_TTLS),
            gone: Instant::now().max(state.deadline()) + state.ttl(),
            quorum: inner.quorum,
            holders: state.holders() & tally::all(n),
        }));
        let completion = &guard.keep().completion;
        let vote = |stored| {
            if stored {
                Vote::For
            } else {
                Vote::Against(None)
            }
        };
        // Only where the lease's lock may be: a record is never stored anywhere else.
        let holders = state.holders() & tally::all(n);
        let mut sent = completion.send(inner, holders);
        let asked = holders.count_ones() as usize;
        // Each round stops at the caller's patience (one node timeout at least): a node that
        // answers late (`call.rs`) is waited for in the background.
        let patience = self.patience(state.deadline());
        let timeout = inner.config.node_timeout;
        let round = || patience.max(Instant::now() + timeout);
        let first = round();
        let tally = tally::count_until(&mut sent, asked, inner.quorum, vote, Some(first)).await;
        // The first round's votes, on the `redlock.complete` span.
        telemetry::votes(span, || tally.votes());
        let mut progress = Progress::from_tally(&tally);
        progress.refused |= tally::all(n) & !holders;
        // The first round decided early without a quorum (some node refused): its other
        // answers still count.
        progress.count(&mut sent, inner.quorum, first).await;
        let mut pause = FIRST_PAUSE;
        while progress.stored() < inner.quorum
            && !progress.lost(n, inner.quorum)
            && progress.retry != 0
            // A round cut at the patience leaves requests in flight: no new round drops them.
            && sent.is_empty()
            && Instant::now() + pause < patience
        {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_PAUSE);
            // A suspended node is being probed: it is asked again once it is back.
            let ask = progress.retry & !release::suspended(inner);
            sent = completion.send(inner, ask);
            progress.count(&mut sent, inner.quorum, round()).await;
        }
        let stored = progress.stored();
        let keep = guard.disarm();
        if stored >= inner.quorum {
            self.complete_rest(keep, progress, sent, state.deadline());
            return Ok(());
        }
        tracing::warn!(
            key = %telemetry::hashed(state.key()),
            stored_on = stored,
            "completion record not stored on a quorum yet: it is retried where the lock \
             holds, and the lock is kept there meanwhile, so duplicates are refused rather \
             than run again"
        );
        let lost = progress.lost(n, inner.quorum);
        tokio::spawn(
            keep_completing(keep, progress, sent)
                .instrument(telemetry::background(Background::Completing)),
        );
        if lost {
            return Err(Error::lost(
                "the lease no longer held on a quorum: the record was not stored there",
            ));
        }
        let why = format!(
            "the completion record reached {stored} of the {} nodes a quorum needs (retried \
             in the background while the lock holds)",
            inner.quorum
        );
        Err(Error::unavailable(why, tally.errors))
    }

    /// Stored on a quorum: the slower nodes store it too, and those that gave no answer are
    /// asked again, in the background while the lease is valid (`deadline`).
    fn complete_rest<F>(
        &self,
        keep: Keep,
        mut progress: Progress,
        mut sent: tally::Sent<bool, F>,
        deadline: Instant,
    ) where
        F: std::future::Future<Output = Result<bool, CallError>> + Send + 'static,
    {
        tally::drain_ready(&mut sent, |answer| progress.take(answer));
        if progress.retry == 0 && sent.is_empty() {
            return;
        }
        let client = Arc::downgrade(&self.inner);
        let until = self.patience(deadline);
        let failed = progress.retry;
        let rest = async move {
            let resend = |inner: &Inner, mask| keep.completion.send(inner, mask);
            // Where it is still missing, the completion is owed (see `keep.rs`).
            let owe = |inner: &Inner, mask| keep.owe(inner, mask);
            release::retry_rest(client, until, sent, failed, resend, owe).await;
        };
        tokio::spawn(rest.instrument(telemetry::background(Background::Stragglers)));
    }
}

/// Why `record`, kept for `retention`, is refused before anything is sent (over
/// [`Lease::MAX_RECORD_LEN`], or a retention of zero or over
/// [`Lease::MAX_RECORD_RETENTION`]), if it is.
fn invalid_record(record: &[u8], retention: Duration) -> Option<String> {
    if record.len() > Lease::MAX_RECORD_LEN {
        Some(format!(
            "the completion record is {} bytes; the maximum is {}",
            record.len(),
            Lease::MAX_RECORD_LEN
        ))
    } else if retention < Duration::from_millis(1) || retention > Lease::MAX_RECORD_RETENTION {
        Some(format!(
            "the retention of a completion record must be between 1 ms and {:?}",
            Lease::MAX_RECORD_RETENTION
        ))
    } else {
        None
    }
}

/// Where a completion stands on each node (bit sets, by node index).
#[derive(Debug, Clone, Copy, Default)]
struct Progress {
    /// The node stored the record.
    stored: u64,
    /// The node answered "not stored": it does not hold our lock (any more).
    refused: u64,
    /// No answer (timed out, unreachable, suspended): ask again.
    retry: u64,
    /// An error reply (a master out of memory, a node without records): it may still hold
    /// our lock, which is extended there while the record lacks its quorum.
    kept: u64,
}

impl Progress {
    /// The answers counted in `tally` (those still in flight are not in it).
    fn from_tally(tally: &Tally) -> Self {
        let mut p = Self {
            stored: tally.for_mask,
            refused: tally.not_ours & !tally.error_mask(),
            ..Self::default()
        };
        for e in &tally.errors {
            p.failed(e.node(), e.is_transient() || e.is_suspended());
        }
        p
    }

    fn failed(&mut self, i: usize, transient: bool) {
        if transient {
            self.retry |= 1 << i;
        } else {
            self.kept |= 1 << i;
        }
    }

    /// Takes node `i`'s answer to a completion.
    fn take(&mut self, answer: Answer<bool>) {
        let _ = self.take_error(answer);
    }

    /// Takes node `i`'s answer to a completion, and gives back its error, if it failed.
    fn take_error(&mut self, (i, answer): Answer<bool>) -> Option<NodeError> {
        let bit = 1u64 << i;
        self.retry &= !bit;
        self.kept &= !bit;
        match answer {
            Ok(true) => self.stored |= bit,
            Ok(false) => self.refused |= bit,
            Err(e) => {
                self.failed(i, e.is_transient() || e.is_suspended());
                return Some(e);
            }
        }
        None
    }

    /// Takes the answers of a round until the quorum is reached, every node asked answered,
    /// or `until`. A refusal decides nothing: any other node asked may still store it.
    async fn count<S>(&mut self, sent: &mut S, quorum: usize, until: Instant)
    where
        S: Stream<Item = Answer<bool>> + Unpin,
    {
        let go = |p: &Self| p.stored() < quorum;
        self.count_while(sent, until, go, drop).await;
    }

    /// Takes the answers of a round while `go` says so, until every node asked answered or
    /// `until`; each error goes to `failed`.
    async fn count_while<S>(
        &mut self,
        sent: &mut S,
        until: Instant,
        go: impl Fn(&Self) -> bool,
        mut failed: impl FnMut(NodeError),
    ) where
        S: Stream<Item = Answer<bool>> + Unpin,
    {
        while go(self) {
            let next = tokio::time::timeout_at(until.into(), sent.next()).await;
            let Ok(Some(answer)) = next else {
                break;
            };
            if let Some(e) = self.take_error(answer) {
                failed(e);
            }
        }
    }

    fn stored(&self) -> usize {
        self.stored.count_ones() as usize
    }

    /// Whether too many of `n` nodes refused for the record to reach a quorum.
    fn lost(&self, n: usize, quorum: usize) -> bool {
        n - (self.refused.count_ones() as usize) < quorum
    }
}

/// What a completion stores, owned, so that its retries can go on in the background.
struct Completion {
    key: Arc<str>,
    record_key: Arc<str>,
    token: Token,
    record: Bytes,
    retention: Duration,
    fence: Option<Fence>,
    /// Stored also where the lock is absent ([`CompleteRequest::or_if_free`]): the
    /// completion of a lease that may have been lost (`lost.rs`).
    if_free: bool,
}

impl Completion {
    /// The completion of `state`'s work with `record`; `if_free`, its "if free" form.
    fn of(state: &LeaseState, record: Bytes, retention: Duration, if_free: bool) -> Self {
        Self {
            key: state.key_arc(),
            record_key: record_key(state.key()),
            token: state.token_copy(),
            record,
            retention,
            fence: state.fence().cloned(),
            if_free,
        }
    }

    /// Sends the completion to the nodes in `mask` (suspended ones fail at once).
    fn send(
        &self,
        inner: &Inner,
        mask: u64,
    ) -> tally::Sent<
        bool,
        impl std::future::Future<Output = Result<bool, CallError>> + Send + 'static,
    > {
        let (key, record_key, token) = (&self.key, &self.record_key, self.token);
        let (record, retention, fence) = (&self.record, self.retention, &self.fence);
        let if_free = self.if_free;
        tally::send(
            &inner.nodes,
            mask,
            inner.config.node_timeout,
            Skip::Suspended,
            &|node| {
                let request =
                    CompleteRequest::new(key, record_key, token.as_str(), record, retention);
                let request = free_if(request, if_free);
                node.complete_now(&match fence {
                    None => request,
                    Some(f) => request.fenced(f.floor()),
                })
            },
            |v| {
                let (key, record_key, record) = (key.clone(), record_key.clone(), record.clone());
                let fence = fence.clone();
                async move {
                    let plain =
                        CompleteRequest::new(&key, &record_key, token.as_str(), &record, retention);
                    let plain = free_if(plain, if_free);
                    let Some(f) = &fence else {
                        return v.node.complete(plain).await;
                    };
                    // The counters raised to the lease's token first, as a release does; a
                    // node without counters (no vote: see `acquire/acquisition.rs`) may still hold our
                    // key, and gets the plain completion, as it gets the plain release.
                    match v.node.complete(plain.fenced(f.floor())).await {
                        Err(e) if e.is_unsupported() => v.node.complete(plain).await,
                        answer => answer,
                    }
                }
            },
        )
    }
}

/// `request`, in its "if free" form when `if_free`.
fn free_if(request: CompleteRequest<'_>, if_free: bool) -> CompleteRequest<'_> {
    if if_free {
        request.or_if_free()
    } else {
        request
    }
}
