//! Completing idempotent work: [`Lease::complete`](crate::Lease::complete) stores the
//! completion record on every node where the lease still holds, ending the lock there, and
//! keeps at it until a quorum has it.
//!
//! A duplicate runs the work again only if a quorum of nodes answers it with neither the
//! record nor our lock. So while the record lacks its quorum, the nodes that did not store
//! it must keep our lock: the completion is retried there — past the caller's patience, for
//! as long as the lock may still hold there — and a node that refuses the write with an error
//! reply (a master out of memory) but still holds the lock has it extended. What this
//! leaves open is stated in the crate's Safety docs: a node that does not answer until its
//! lock has expired can no longer store the record.

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use tracing::Instrument;

use super::fencing::Fence;
use super::lease::{LeaseState, Token};
use super::observe::{self, Background};
use super::owed::{Debt, Owed};
use super::quorum::{self, Answer, Skip, Tally, Vote};
use super::records::record_key;
use super::release::{self, FIRST_PAUSE, MAX_PAUSE};
use super::{Inner, Redlock};
use crate::error::Error;
use crate::node::NodeFailure;

/// How long a completion that lacks its quorum is kept going, in ttls past the lease's
/// validity, at most (extensions of the lock where the write is refused included).
const KEEP_TTLS: u32 = 10;

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
            completion: Completion {
                key: state.key_arc(),
                record_key: record_key(state.key()),
                token: state.token_copy(),
                record,
                retention,
                fence: state.fence().cloned(),
            },
            ttl: state.ttl(),
            until: state.deadline() + state.ttl(),
            hard_until: state.deadline() + state.ttl().saturating_mul(KEEP_TTLS),
            gone: Instant::now().max(state.deadline()) + state.ttl(),
            quorum: inner.quorum,
            nodes: n,
        }));
        let completion = &guard.keep().completion;
        let vote = |stored| {
            if stored {
                Vote::For
            } else {
                Vote::Against(None)
            }
        };
        let mut sent = completion.send(inner, quorum::all(n));
        let tally = quorum::count(&mut sent, n, inner.quorum, vote).await;
        // The first round's votes, on the `redlock.complete` span.
        observe::votes(span, &tally);
        let mut progress = Progress::from_tally(&tally);
        // The first round decided early without a quorum (some node refused): its other
        // answers still count.
        progress.count(&mut sent, inner.quorum).await;
        let patience = self.patience(state.deadline());
        let mut pause = FIRST_PAUSE;
        while progress.stored() < inner.quorum
            && !progress.lost(n, inner.quorum)
            && progress.retry != 0
            && Instant::now() + pause < patience
        {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_PAUSE);
            // A suspended node is being probed: it is asked again once it is back.
            let ask = progress.retry & !release::suspended(inner);
            sent = completion.send(inner, ask);
            progress.count(&mut sent, inner.quorum).await;
        }
        let stored = progress.stored();
        let keep = guard.disarm();
        if stored >= inner.quorum {
            // The slower nodes store it too, and those that gave no answer are asked again,
            // in the background while the lease is valid.
            quorum::drain_ready(&mut sent, |answer| progress.take(answer));
            if progress.retry != 0 || !sent.is_empty() {
                let client = Arc::downgrade(&self.inner);
                let until = self.patience(state.deadline());
                let failed = progress.retry;
                let rest = async move {
                    let resend = |inner: &Inner, mask| keep.completion.send(inner, mask);
                    let owe = |inner: &Inner, mask| keep.owe(inner, mask);
                    release::retry_rest(client, until, sent, failed, resend, owe).await;
                };
                tokio::spawn(rest.instrument(observe::background(Background::Stragglers)));
            }
            return Ok(());
        }
        tracing::warn!(
            key = %observe::hashed(state.key()),
            stored_on = stored,
            "completion record not stored on a quorum yet: it is retried where the lock \
             holds, and the lock is kept there meanwhile, so duplicates are refused rather \
             than run again"
        );
        tokio::spawn(
            keep_completing(keep, progress, sent)
                .instrument(observe::background(Background::Completing)),
        );
        if progress.lost(n, inner.quorum) {
            Err(Error::lost(
                "the lease no longer held on a quorum: the record was not stored there",
            ))
        } else {
            Err(Error::unavailable(
                format!(
                    "the completion record reached {stored} of the {} nodes a quorum needs \
                     (retried in the background while the lock holds)",
                    inner.quorum
                ),
                tally.errors,
            ))
        }
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
    fn take(&mut self, (i, answer): Answer<bool>) {
        let bit = 1u64 << i;
        self.retry &= !bit;
        self.kept &= !bit;
        match answer {
            Ok(true) => self.stored |= bit,
            Ok(false) => self.refused |= bit,
            Err(e) => self.failed(i, e.is_transient() || e.is_suspended()),
        }
    }

    /// Takes the answers of a round until the quorum is reached, or every node asked
    /// answered. A refusal decides nothing: any other node asked may still store it.
    async fn count<S>(&mut self, sent: &mut S, quorum: usize)
    where
        S: Stream<Item = Answer<bool>> + Unpin,
    {
        while self.stored() < quorum {
            let Some(answer) = sent.next().await else {
                break;
            };
            self.take(answer);
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

/// What the background part of a completion that lacks its quorum needs.
struct Keep {
    client: Weak<Inner>,
    completion: Completion,
    ttl: Duration,
    /// The completion is asked again until then: a ttl past the lease's validity, when its
    /// lock has expired on every node that did not answer (later, once it is extended).
    until: Instant,
    /// Extensions never keep it going past this.
    hard_until: Instant,
    /// After this no node can hold the lock any more: what a node was not given is owed to
    /// it until then.
    gone: Instant,
    quorum: usize,
    /// How many nodes vote.
    nodes: usize,
}

impl Keep {
    /// Owes the completion to the nodes in `mask` until the lock is gone from them (see
    /// `owed.rs`).
    fn owe(&self, inner: &Inner, mask: u64) {
        let c = &self.completion;
        release::each_voter(inner, mask, |voter| {
            let debt = Owed {
                key: c.key.clone(),
                token: c.token,
                fence: c.fence.clone(),
                debt: Debt::Complete {
                    record_key: c.record_key.clone(),
                    record: c.record.clone(),
                    retention: c.retention,
                },
                until: self.gone,
            };
            voter.owed.owe(debt, &voter.name);
        });
    }
}

/// Hands a completion whose future was dropped before the record was on a quorum to the
/// background ([`keep_completing`], every node asked again: the write is idempotent).
struct KeepOnDrop(Option<Keep>);

impl KeepOnDrop {
    fn keep(&self) -> &Keep {
        self.0.as_ref().expect("armed until disarmed")
    }

    fn disarm(&mut self) -> Keep {
        self.0.take().expect("disarmed once")
    }
}

impl Drop for KeepOnDrop {
    fn drop(&mut self) {
        let Some(keep) = self.0.take() else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                key = %observe::hashed(&keep.completion.key),
                "completion dropped outside a Tokio runtime: not asked again; the lock \
                 expires with its ttl where the record is missing"
            );
            return;
        };
        let progress = Progress {
            retry: quorum::all(keep.nodes),
            ..Progress::default()
        };
        let sent = quorum::Sent::<bool, std::future::Ready<Result<bool, NodeFailure>>>::empty();
        let span = observe::background(Background::Completing);
        rt.spawn(keep_completing(keep, progress, sent).instrument(span));
    }
}

/// Asks the nodes that may still hold the lease's lock to store the record, again and again,
/// until a quorum has it or no node can still take it — every node left refused, or the lock
/// has expired everywhere it was not extended (`keep.until`). A node that answers the write
/// with an error reply but holds the lock has it extended, so that it keeps refusing
/// duplicates. Ends early when the client is dropped. A completion that never reaches its
/// quorum is reported (warn, and `redlock_record_minority_total`).
async fn keep_completing<F>(mut keep: Keep, mut progress: Progress, mut sent: quorum::Sent<bool, F>)
where
    F: std::future::Future<Output = Result<bool, NodeFailure>>,
{
    while let Some(answer) = sent.next().await {
        progress.take(answer);
    }
    let mut pause = FIRST_PAUSE;
    // The nodes owed the completion already (while suspended).
    let mut owed = 0u64;
    while progress.stored() < keep.quorum
        && (progress.retry | progress.kept) != 0
        && Instant::now() < keep.until
    {
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
        let Some(inner) = keep.client.upgrade() else {
            // The application dropped its client (shutting down): nothing to report for it.
            tracing::debug!(
                key = %observe::hashed(&keep.completion.key),
                "the client was dropped: its completions in the background end"
            );
            return;
        };
        let pending = progress.retry | progress.kept;
        // A suspended node is owed the completion: paid the moment it answers again (its
        // probe), not a round later.
        let waiting = pending & release::suspended(&inner) & !owed;
        if waiting != 0 {
            keep.owe(&inner, waiting);
            owed |= waiting;
        }
        let ask = pending & !release::suspended(&inner);
        if ask == 0 {
            continue;
        }
        let mut sent = keep.completion.send(&inner, ask);
        let mut errored = 0u64;
        while let Some((i, answer)) = sent.next().await {
            if answer
                .as_ref()
                .is_err_and(|e| !e.is_transient() && !e.is_suspended())
            {
                errored |= 1 << i;
            }
            progress.take((i, answer));
        }
        if errored != 0 {
            keep_locked(&inner, &mut keep, &mut progress, errored).await;
        }
    }
    let key = &keep.completion.key;
    if progress.stored() >= keep.quorum {
        tracing::info!(
            key = %observe::hashed(key),
            "the completion record reached its quorum after all"
        );
        // The nodes still without it may hold the lock: it is owed to them.
        if let Some(inner) = keep.client.upgrade() {
            keep.owe(&inner, progress.retry | progress.kept);
        }
        return;
    }
    crate::metrics::record_minority();
    tracing::warn!(
        key = %observe::hashed(key),
        stored_on = progress.stored(),
        quorum = keep.quorum,
        "the completion record never reached a quorum: once the lock expires where it is \
         missing, a duplicate can run the work again if every node with the record fails \
         to answer it"
    );
}

/// Extends the lease's lock on the nodes in `mask` (their write was refused with an error),
/// so that they keep refusing duplicates; pushes `keep.until` to a ttl past each success.
async fn keep_locked(inner: &Inner, keep: &mut Keep, progress: &mut Progress, mask: u64) {
    let (key, token, ttl) = (keep.completion.key.clone(), keep.completion.token, keep.ttl);
    let start = Instant::now();
    let mut sent = quorum::send(
        &inner.nodes,
        mask,
        inner.config.node_timeout,
        Skip::Never,
        &|node| node.extend_now(&key, token.as_str(), ttl),
        |v| {
            let key = key.clone();
            async move { v.node.extend(&key, token.as_str(), ttl).await }
        },
    );
    while let Some((i, answer)) = sent.next().await {
        match answer {
            Ok(true) => {
                keep.until = keep.until.max(start + ttl).min(keep.hard_until);
                keep.gone = keep.gone.max(start + ttl);
            }
            // Gone there: it will neither store the record nor refuse a duplicate.
            Ok(false) => {
                progress.kept &= !(1 << i);
                progress.refused |= 1 << i;
            }
            Err(_) => {}
        }
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
}

impl Completion {
    /// Sends the completion to the nodes in `mask` (suspended ones fail at once).
    fn send(
        &self,
        inner: &Inner,
        mask: u64,
    ) -> quorum::Sent<
        bool,
        impl std::future::Future<Output = Result<bool, NodeFailure>> + Send + 'static,
    > {
        let (key, record_key, token) = (&self.key, &self.record_key, self.token);
        let (record, retention, fence) = (&self.record, self.retention, &self.fence);
        quorum::send(
            &inner.nodes,
            mask,
            inner.config.node_timeout,
            Skip::Suspended,
            &|node| match fence {
                None => node.complete_now(key, record_key, token.as_str(), record, retention),
                Some(f) => node.complete_fenced_now(
                    key,
                    record_key,
                    token.as_str(),
                    record,
                    retention,
                    f.floor(),
                ),
            },
            |v| {
                let (key, record_key, record) = (key.clone(), record_key.clone(), record.clone());
                let fence = fence.clone();
                async move {
                    let Some(f) = &fence else {
                        return v
                            .node
                            .complete(&key, &record_key, token.as_str(), &record, retention)
                            .await;
                    };
                    // The counters raised to the lease's token first, as a release does; a
                    // node without counters (no vote: see `acquire.rs`) may still hold our
                    // key, and gets the plain completion, as it gets the plain release.
                    let fenced = v.node.complete_fenced(
                        &key,
                        &record_key,
                        token.as_str(),
                        &record,
                        retention,
                        f.floor(),
                    );
                    match fenced.await {
                        Err(e) if e.is_unsupported() => {
                            v.node
                                .complete(&key, &record_key, token.as_str(), &record, retention)
                                .await
                        }
                        answer => answer,
                    }
                }
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use crate::node::{Acquire, MemoryNode, Node, NodeFailure, NodeFuture};
    use crate::{Claim, Redlock, Retry};

    /// What a [`Scripted`] node does with one completion request.
    #[derive(Debug, Clone, Copy)]
    enum Step {
        /// Store it (the memory node's completion).
        Store,
        /// No reply: the request is lost on the way (nothing stored).
        Unreachable,
        /// Answer "not stored" at once.
        Refuse,
        /// Store it, answering after this delay.
        StoreAfter(Duration),
    }

    /// A node whose completions follow a script, one step per request (then `Store`).
    #[derive(Debug, Clone)]
    struct Scripted {
        inner: MemoryNode,
        steps: Arc<Mutex<VecDeque<Step>>>,
    }

    impl Scripted {
        fn new(steps: &[Step]) -> Self {
            Self {
                inner: MemoryNode::new(),
                steps: Arc::new(Mutex::new(steps.iter().copied().collect())),
            }
        }
    }

    impl Node for Scripted {
        fn name(&self) -> String {
            "scripted".to_owned()
        }
        fn acquire<'a>(
            &'a self,
            key: &'a str,
            token: &'a str,
            ttl: Duration,
        ) -> NodeFuture<'a, Acquire> {
            self.inner.acquire(key, token, ttl)
        }
        fn release<'a>(&'a self, key: &'a str, token: &'a str) -> NodeFuture<'a, bool> {
            self.inner.release(key, token)
        }
        fn extend<'a>(
            &'a self,
            key: &'a str,
            token: &'a str,
            ttl: Duration,
        ) -> NodeFuture<'a, bool> {
            self.inner.extend(key, token, ttl)
        }
        fn acquire_unless_completed<'a>(
            &'a self,
            key: &'a str,
            record_key: &'a str,
            token: &'a str,
            ttl: Duration,
        ) -> NodeFuture<'a, Acquire> {
            self.inner
                .acquire_unless_completed(key, record_key, token, ttl)
        }
        fn complete<'a>(
            &'a self,
            key: &'a str,
            record_key: &'a str,
            token: &'a str,
            record: &'a [u8],
            retention: Duration,
        ) -> NodeFuture<'a, bool> {
            let step = self
                .steps
                .lock()
                .unwrap()
                .pop_front()
                .unwrap_or(Step::Store);
            Box::pin(async move {
                match step {
                    Step::Store => {}
                    Step::Unreachable => {
                        return Err(NodeFailure::new("connection reset").with_unreachable())
                    }
                    Step::Refuse => return Ok(false),
                    Step::StoreAfter(d) => tokio::time::sleep(d).await,
                }
                self.inner
                    .complete(key, record_key, token, record, retention)
                    .await
            })
        }
    }

    /// A completion's retry round counts every answer it gets: a node that refuses first
    /// does not hide the store a slower node answers after it. Here the record reaches node 0
    /// in the first round and node 2 in the retry (node 1 refusing at once): a quorum of
    /// three stored it, and the completion says so.
    #[tokio::test]
    async fn completion_tally_counts_a_retry_rounds_stores_after_a_refusal() {
        let nodes = [
            Scripted::new(&[Step::Store]),
            Scripted::new(&[Step::Unreachable, Step::Refuse]),
            Scripted::new(&[
                Step::Unreachable,
                Step::StoreAfter(Duration::from_millis(30)),
            ]),
        ];
        let redlock = nodes
            .iter()
            .fold(Redlock::builder(), |b, n| b.node(n.clone()))
            .node_timeout(Duration::from_millis(500))
            .retry(Retry::never())
            .build()
            .unwrap();
        let ttl = Duration::from_secs(30);
        let Claim::Locked(lease) = redlock
            .lock_unless_completed("tally", ttl, Retry::never())
            .await
            .unwrap()
        else {
            panic!("nothing was completed yet");
        };
        let stored = lease.complete("done", Duration::from_secs(60)).await;
        stored.expect("the record is on a quorum (nodes 0 and 2): the completion succeeded");
        let completed = |n: &Scripted| n.inner.get("tally").is_none();
        assert!(
            completed(&nodes[0]) && completed(&nodes[2]),
            "stored on 0 and 2"
        );
    }
}
