//! Idempotent work on the quorum: [`Redlock::lock_unless_completed`] answers with the
//! completion record when the work is done, or with a lease to do it; [`Lease::complete`]
//! stores the record where the lease still holds, ending the lock there.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use tracing::Instrument;

use super::fencing::Fence;
use super::lease::LeaseState;
use super::observe::{self, Background};
use super::quorum::{self, Answer, Skip, Tally, Vote};
use super::release::{self, Release};
use super::{Redlock, Retry, Token};
use crate::error::Error;
use crate::node::{Acquire, NodeFailure};
use crate::Lease;

/// The largest completion record [`Lease::complete`] stores (1 MiB): records live in the
/// masters' memory, beside the locks.
pub const MAX_RECORD_LEN: usize = 1 << 20;

/// The longest a completion record is kept (one year).
pub const MAX_RECORD_RETENTION: Duration = Duration::from_secs(365 * 86_400);

/// The Redis key of `key`'s completion record: beside the lock, with a distinct suffix.
pub(crate) fn record_key(key: &str) -> Arc<str> {
    format!("{key}:record").into()
}

/// The replay acquire draws no conclusion before every asked node has answered (each
/// request is bounded by the node timeout; suspended nodes were not asked), unless with a
/// record: a record that survives on a single master is the answer, over locks and "held"
/// alike.
///
/// Bounded by `until` too (the try's first node timeout, and the lock's validity): a node
/// whose request is given time back for this process' stalls is not waited for beyond it.
pub(super) async fn await_every_answer<S>(sent: &mut S, tally: &mut Tally, until: Instant)
where
    S: Stream<Item = Answer<Acquire>> + Unpin,
{
    while tally.record.is_none() {
        let Ok(Some(answer)) = tokio::time::timeout_at(until.into(), sent.next()).await else {
            break;
        };
        tally.late_acquire(answer, true);
    }
}

/// A replay acquire found a record while requests were still in flight: they are awaited in
/// the background (each bounded by the node timeout), and only the nodes whose request
/// locked — or gave no answer — are released. A node that answered with a record or "held"
/// locked nothing, so a replay hit usually costs no release at all.
pub(super) fn settle_in_background<F>(
    client: Redlock,
    mut sent: quorum::Sent<Acquire, F>,
    key: Arc<str>,
    token: Token,
    until: Instant,
) where
    F: std::future::Future<Output = Result<Acquire, crate::node::NodeFailure>> + Send + 'static,
{
    let settle = async move {
        let mut late = Tally::default();
        while let Some(answer) = sent.next().await {
            late.late_acquire(answer, true);
        }
        let mask = late.answered & !late.not_ours;
        if mask != 0 {
            let release = Release {
                key,
                token,
                mask,
                needed: 0,
                patience: Instant::now(),
                until,
                fence: None,
            };
            let _ = client.release_token(release).await;
        }
    };
    tokio::spawn(settle.instrument(observe::background(Background::Settle)));
}

/// The answer of [`Redlock::lock_unless_completed`].
#[derive(Debug)]
#[must_use = "a Claim may hold the lock: dropping it releases the lock at once"]
pub enum Claim {
    /// No node has a completion record, and the lock is ours: do the work, then
    /// [`Lease::complete`] it.
    Locked(Lease),
    /// The work is done: the record its holder stored with [`Lease::complete`]. Nothing was
    /// locked.
    Completed(Bytes),
}

impl Redlock {
    /// Locks `resource` for work that must run **once**, unless it already ran: each node is
    /// asked, in one atomic step, for the resource's completion record, and locks only if it
    /// has none. Any record found is the answer ([`Claim::Completed`]: only a holder ever
    /// stores one); "not done yet" is concluded only from a quorum of locks
    /// ([`Claim::Locked`]). Contended and unavailable as [`Redlock::lock_with`]; a node
    /// that stores no records (a custom [`Node`](crate::node::Node) without them) counts as
    /// failed.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_redlock::Error> {
    /// use std::time::Duration;
    /// use tower_redlock::{Claim, Redlock, Retry};
    ///
    /// let redlock = Redlock::in_memory();
    /// let ttl = Duration::from_secs(10);
    /// let day = Duration::from_secs(86_400);
    /// match redlock.lock_unless_completed("payment:8e03", ttl, Retry::never()).await? {
    ///     Claim::Locked(lease) => lease.complete("charged: pay_1", day).await?,
    ///     Claim::Completed(_) => unreachable!("first time"),
    /// }
    /// // A retry of the same work gets the stored answer; nothing runs twice.
    /// match redlock.lock_unless_completed("payment:8e03", ttl, Retry::never()).await? {
    ///     Claim::Completed(record) => assert_eq!(&record[..], b"charged: pay_1"),
    ///     Claim::Locked(_) => unreachable!("already done"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn lock_unless_completed(
        &self,
        resource: &str,
        ttl: Duration,
        retry: Retry,
    ) -> crate::Result<Claim> {
        self.lock_inner(resource, ttl, retry, true).await
    }

    /// Stores `record` for `state`'s resource on every node where its token still holds.
    ///
    /// Asked again, as a release is (see `release.rs`): a node that gave no answer still holds
    /// the lock, and duplicates are refused until its ttl ends. So the nodes that gave no
    /// answer are asked again until a quorum stored the record, or until the caller's
    /// patience runs out; the others go on in the background while the lease is valid. A
    /// node asked again that answers "not stored" had stored it the first time (its answer
    /// was lost) or no longer holds our token: neither counts for or against.
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
        let completion = Completion {
            key: state.key_arc(),
            record_key: record_key(state.key()),
            token: state.token_copy(),
            record,
            retention,
            fence: state.fence().cloned(),
        };
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
        let (mut stored, mut failed) = (tally.for_, release::transient(&tally.errors));
        let lost = n - tally.against < inner.quorum;
        let patience = self.patience(state.deadline());
        let mut pause = release::FIRST_PAUSE;
        while stored < inner.quorum && !lost && failed != 0 && Instant::now() + pause < patience {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(release::MAX_PAUSE);
            failed &= !release::suspended(inner);
            sent = completion.send(inner, failed);
            let (more, again) = count_stores(&mut sent, inner.quorum - stored).await;
            stored += more;
            failed = again;
        }
        // The slower nodes store it too, and those that gave no answer are asked again, in
        // the background while the lease is valid.
        quorum::drain_ready(&mut sent, |(i, answer)| {
            if answer.is_err_and(|e| e.is_transient()) {
                failed |= 1 << i;
            }
        });
        if failed != 0 || !sent.is_empty() {
            let client = Arc::downgrade(&self.inner);
            let until = self.patience(state.deadline());
            let rest = async move {
                let resend = |inner: &super::Inner, mask| completion.send(inner, mask);
                release::retry_rest(client, until, sent, failed, resend).await;
            };
            tokio::spawn(rest.instrument(observe::background(Background::Stragglers)));
        }
        if stored >= inner.quorum {
            return Ok(());
        }
        tracing::warn!(
            key = %observe::hashed(state.key()),
            stored_on = stored,
            "completion record not stored on a quorum: the lock stays until its ttl, so \
             duplicates are refused until then rather than run again"
        );
        if lost {
            Err(Error::lost(
                "the lease no longer held on a quorum: the record was not stored there",
            ))
        } else {
            Err(Error::unavailable(
                format!(
                    "the completion record reached {stored} of the {} nodes a quorum needs",
                    inner.quorum
                ),
                tally.errors,
            ))
        }
    }
}

/// Counts a completion retry round's answers until `needed` more nodes stored the record,
/// or every node asked has answered: how many stored it, and the nodes that gave no answer
/// (to ask again). Unlike the first round's tally, a refusal decides nothing here: the nodes
/// asked again are the first round's failures, any of which may still store it.
async fn count_stores<S>(sent: &mut S, needed: usize) -> (usize, u64)
where
    S: Stream<Item = Answer<bool>> + Unpin,
{
    let (mut stored, mut failed) = (0, 0u64);
    while stored < needed {
        let Some((i, answer)) = sent.next().await else {
            break;
        };
        match answer {
            Ok(true) => stored += 1,
            Ok(false) => {}
            Err(e) if e.is_transient() => failed |= 1 << i,
            Err(_) => {}
        }
    }
    (stored, failed)
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
        inner: &super::Inner,
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
