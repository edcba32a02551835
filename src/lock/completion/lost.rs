//! The completion of a lease that may have been lost while its work ran. Lost means its validity
//! ran out: the lock expired on the masters, or the keep-alive could not extend it. The work's
//! outcome — its answer, or a marker that it is unknown — must still be recorded, or a duplicate
//! runs the work again. [`Lease::complete_lost`] stores the record with the "if free" completion
//! ([`CompleteRequest::or_if_free`](crate::node::CompleteRequest::or_if_free)). It stores it on
//! every node where the lock still holds the lease's token or is absent. It never stores it where
//! another client holds it (that client is doing the work now, and completes it), nor over another
//! record.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tracing::Instrument;

use super::{invalid_record, record_key, Completion, Progress};
use crate::error::{Error, NodeError};
use crate::lock::lease::Lease;
use crate::lock::release::{self, FIRST_PAUSE, MAX_PAUSE};
use crate::lock::state::LeaseState;
use crate::lock::tally;
use crate::lock::telemetry::{self, Background};
use crate::lock::token::Token;
use crate::lock::{Inner, Redlock};

impl Lease {
    /// Stores `record` as the resource's completion record for `retention`, for a lease that
    /// may have been lost (its validity is not required): on every node where the lock holds
    /// this lease's token (and ends it there) or is absent; fenced when the lease has a fence
    /// (the plain form where a node keeps no counters).
    ///
    /// `Ok` once a quorum stored it. A node that refused (another holder, another record) is
    /// final; the others (no answer, an error reply, suspended) are asked again, with a
    /// growing pause, until a quorum stored it or `patience` has passed since the call (a
    /// round in flight then gets one node timeout at least). [`Error::is_lost`] when too many
    /// nodes refused for a quorum ever to store it; [`Error::is_unavailable`] when the
    /// patience ran out first; [`Error::is_invalid_input`] (nothing sent, the lease released)
    /// for a record or retention [`Lease::complete`] refuses. Past a quorum, the other nodes
    /// are asked on in the background until the patience ends.
    ///
    /// A valid record ends the lease, which is never released afterwards (not on drop
    /// either, nor when this future is dropped midway: nothing goes on then): where the lock
    /// still holds, it keeps refusing duplicates until its ttl. A loss is counted once: here
    /// only for a lease still held past its deadline that nothing had looked at.
    ///
    /// Tests: `complete_lost_stores_where_the_lock_expired` (plain and fenced),
    /// `complete_lost_never_takes_another_holders_lock`,
    /// `complete_lost_asks_again_until_a_quorum_stored_it`,
    /// `complete_lost_is_unavailable_once_its_patience_ran_out`,
    /// `complete_lost_refuses_an_invalid_record` (`completion/tests.rs`); the node's side, on
    /// every backend: the conformance suite's `completion_if_free_*`.
    ///
    /// [`Error::is_lost`]: crate::Error::is_lost
    /// [`Error::is_unavailable`]: crate::Error::is_unavailable
    /// [`Error::is_invalid_input`]: crate::Error::is_invalid_input
    pub(crate) async fn complete_lost(
        mut self,
        record: Bytes,
        retention: Duration,
        patience: Duration,
    ) -> crate::Result<()> {
        let now = Instant::now();
        // A patience beyond the clock's range: a year.
        let year = Duration::from_secs(365 * 86_400);
        let until = now.checked_add(patience).unwrap_or(now + year);
        self.stop_keep_alive();
        // A lease still held past its deadline is lost now (counted once, if nothing
        // looked before).
        self.state.finish();
        if let Some(why) = invalid_record(&record, retention) {
            // Nothing stored, as `Lease::complete`: the lock goes (no loss counted: the
            // lease is ended already, and a drop midway releases the same way).
            let _ = self.client.release_state(&self.state).await;
            self.released = true;
            return Err(Error::invalid(why));
        }
        self.released = true;
        let state = &*self.state;
        let end = telemetry::Ending::start(state.key(), state.span(), || state.deadline(), true);
        let completion = self.client.complete_free(state, record, retention, until);
        let result = telemetry::within(&end.span, completion).await;
        end.done(state.started(), &result);
        result
    }
}

impl Lease {
    /// The middleware's completion of work that ran under this lease. It is [`Lease::complete`]
    /// while the lease holds. It is the "if free" completion ([`Lease::complete_lost`]) when the
    /// lease was lost already or `complete` finds it lost (its validity ran out meanwhile, its
    /// token gone from a quorum). So a lost lease never leaves its work unrecorded. The "if free"
    /// part runs in a task of its own, kept at for `patience` and waited for here at most `wait`. A
    /// quorum of unreachable masters does not hold the response back, and a caller that goes away
    /// does not stop it. Past `wait`, this answers an unavailable error while the task goes on.
    /// Tests: `replay_a_record_is_stored_even_when_the_lease_ran_out_during_the_write`
    /// (`completion/tests.rs`), the middleware's `on_lost_*_with_replay_*`.
    pub(crate) async fn complete_or_free(
        self,
        record: Bytes,
        retention: Duration,
        patience: Duration,
        wait: Duration,
    ) -> crate::Result<()> {
        let task = if self.is_valid() {
            let (client, state) = (self.client.clone(), Arc::clone(&self.state));
            match self.complete(record.clone(), retention).await {
                // Lost, or the validity ran out while the write was under way: the plain
                // completion (which goes on where the lock holds) cannot store it where the
                // lock has expired.
                Err(e) if e.is_lost() || Instant::now() >= state.deadline() => {}
                done => return done,
            }
            let free = async move {
                let until = Instant::now() + patience;
                client.complete_free(&state, record, retention, until).await
            };
            tokio::spawn(free.instrument(telemetry::background(Background::Completing)))
        } else {
            tokio::spawn(self.complete_lost(record, retention, patience))
        };
        match tokio::time::timeout(wait, task).await {
            Ok(Ok(done)) => done,
            Ok(Err(_)) => Err(Error::unavailable(
                "the completion task ended before it answered",
                Vec::new(),
            )),
            Err(_) => Err(Error::unavailable(
                "the completion record is still being stored, in the background",
                Vec::new(),
            )),
        }
    }
}

impl Redlock {
    /// Stores `record` for `state`'s resource on every node where the lock holds its token
    /// or is absent, asking again until a quorum has it, a quorum is out of reach, or
    /// `until` (see [`Lease::complete_lost`]).
    async fn complete_free(
        &self,
        state: &LeaseState,
        record: Bytes,
        retention: Duration,
        until: Instant,
    ) -> crate::Result<()> {
        let inner = &*self.inner;
        let (n, quorum) = (inner.nodes.len(), inner.quorum);
        let completion = Completion::of(state, record, retention, true);
        // Every node: the lock may have expired anywhere, and a record is stored where it did.
        let mut sent = completion.send(inner, tally::all(n));
        let mut progress = Progress::default();
        // The last error of each node that has not stored it (nor refused).
        let mut errors: Vec<NodeError> = Vec::new();
        let open = |p: &Progress| p.stored() < quorum && !p.lost(n, quorum);
        let timeout = inner.config.node_timeout;
        let mut pause = FIRST_PAUSE;
        loop {
            let round = until.max(Instant::now() + timeout);
            let failed = |e: NodeError| {
                errors.retain(|x| x.node() != e.node());
                errors.push(e);
            };
            progress.count_while(&mut sent, round, open, failed).await;
            // A round cut at the patience leaves requests in flight: no new round drops them.
            if !open(&progress) || !sent.is_empty() || Instant::now() + pause >= until {
                break;
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_PAUSE);
            // A suspended node is being probed: it is asked again once it is back.
            let ask = (progress.retry | progress.kept) & !release::suspended(inner);
            sent = completion.send(inner, ask);
        }
        let failed = progress.retry | progress.kept;
        if progress.stored() >= quorum {
            if failed != 0 || !sent.is_empty() {
                // More copies of the record: the others are asked on, until the patience.
                let client = Arc::downgrade(&self.inner);
                let rest = async move {
                    let resend = |inner: &Inner, mask| completion.send(inner, mask);
                    let owe_nothing = |_: &Inner, _| {};
                    release::retry_rest(client, until, sent, failed, resend, owe_nothing).await;
                };
                tokio::spawn(rest.instrument(telemetry::background(Background::Stragglers)));
            }
            return Ok(());
        }
        // The requests still in flight may store it yet: they finish.
        tally::finish_in_background(sent);
        if progress.lost(n, quorum) {
            return Err(Error::lost(format!(
                "{} of the {n} nodes refused the completion record (another client holds \
                 the lock there, or another record is stored): a quorum cannot store it",
                progress.refused.count_ones()
            )));
        }
        errors.retain(|e| failed & (1 << e.node()) != 0);
        Err(Error::unavailable(
            format!(
                "the completion record reached {} of the {quorum} nodes a quorum needs \
                 before the patience ran out",
                progress.stored()
            ),
            errors,
        ))
    }
}

impl Redlock {
    /// Copies `record`, "if free", for `retention`, to the nodes in `mask`. Those are the nodes
    /// where a replay acquire's try (`key`, `token`) locked. That try answers with a record that
    /// only "if free" records made (rule 5 of `records.rs`). The copy is stored where the try's
    /// lock holds or the key is free, never over another holder's lock or another record. One
    /// round, each node within the node timeout; what is still in flight then finishes in the
    /// background. Returns the nodes that stored it (or had it already). It also returns an error
    /// for each node of `mask` that failed or gave no answer within the round. A refusal is not one
    /// of them: asked again, it would refuse again. The try answers with the record only when the
    /// copy reached every node of `mask`. The copies keep a later lost lease's "if free" record
    /// from landing beside it. Otherwise the try is unavailable with these errors (a timeout among
    /// them makes it transient: worth another try). `retention` is bounded by
    /// [`Lease::MAX_RECORD_RETENTION`] (a custom node may report more).
    pub(crate) async fn copy_free(
        &self,
        key: &Arc<str>,
        token: Token,
        record: Bytes,
        retention: Duration,
        mask: u64,
    ) -> (u64, Vec<NodeError>) {
        let inner = &*self.inner;
        let completion = Completion {
            key: key.clone(),
            record_key: record_key(key),
            token,
            record,
            retention: retention.min(Lease::MAX_RECORD_RETENTION),
            fence: None,
            if_free: true,
        };
        let mut sent = completion.send(inner, mask);
        let timeout = inner.config.node_timeout;
        let round = Instant::now() + timeout;
        let mut progress = Progress::default();
        let mut errors = Vec::new();
        let failed = |e: NodeError| errors.push(e);
        progress
            .count_while(&mut sent, round, |_| true, failed)
            .await;
        // An answer ready just as the round ended still counts (a stored copy is no miss).
        tally::drain_ready(&mut sent, |answer| {
            errors.extend(progress.take_error(answer))
        });
        tally::finish_in_background(sent);
        let answered = progress.stored | progress.refused | progress.retry | progress.kept;
        let silent = mask & !answered;
        for i in (0..inner.nodes.len()).filter(|i| silent & (1u64 << i) != 0) {
            errors.push(NodeError::timeout(i, inner.names[i].clone(), timeout));
        }
        if progress.stored != mask {
            tracing::warn!(
                stored = progress.stored.count_ones(),
                locked = mask.count_ones(),
                "a lost lease's completion record was not copied to every node the replay \
                 acquire locked: answered unavailable, to be tried again"
            );
        }
        (progress.stored, errors)
    }
}
