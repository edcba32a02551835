//! The quorum tally: parallel fan-out to every node, and vote counting with an early
//! decision. Every request to a node is a [`Call`] (see `call.rs`): the node's call, bounded
//! by the node timeout as this process experiences it, reported to the node's health. Each
//! answer is logged at debug.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_util::future::{self, Either};
use futures_util::stream::{FuturesUnordered, Stream, StreamExt};
use futures_util::FutureExt;
use tokio::task::JoinHandle;
use tracing::Instrument;

use super::call::{Answer, Call, Voter};
use super::records::Records;
use super::telemetry::{self, Background, NodeVote, Votes};
use crate::error::NodeError;
use crate::node::{Acquire, AnyNode, CallError};

/// Whether a request may skip a suspended node.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Skip {
    /// Acquisitions and extensions: a suspended node counts as failed at once.
    Suspended,
    /// Releases: always sent.
    Never,
}

/// One node's answer, as the caller classifies it.
pub(crate) enum Vote {
    /// The node did what was asked (set, extended, released).
    For,
    /// The node set the key and bumped the resource's fencing counter to this value.
    Fenced(u64),
    /// The node refused: the key is held by another value (with the holder's remaining ttl
    /// when the node reported a live one), or no longer holds ours.
    Against(Option<Duration>),
    /// The node has the completion record of the work (replay acquire), stored "if free"
    /// when `true` (with what it has left, when known): nothing was locked there (see
    /// `records.rs` for the answer they make).
    Completed(bytes::Bytes, bool, Option<Duration>),
}

impl Vote {
    /// How the node's debug event names it.
    fn telemetry(&self) -> NodeVote {
        match self {
            Vote::For => NodeVote::For,
            Vote::Fenced(_) => NodeVote::Fenced,
            Vote::Against(_) => NodeVote::Against,
            Vote::Completed(..) => NodeVote::Completed,
        }
    }
}

/// The votes counted so far.
#[derive(Default)]
pub(crate) struct Tally {
    pub(crate) for_: usize,
    pub(crate) against: usize,
    /// Bit `i` set: node `i` voted for.
    pub(crate) for_mask: u64,
    /// Bit `i` set: node `i` answered (with a vote or an error).
    pub(crate) answered: u64,
    /// Bit `i` set: node `i` certainly holds no token of ours — it voted against (held by
    /// another value) or was not asked (suspended) — so it needs no release.
    pub(crate) not_ours: u64,
    /// The shortest remaining ttl among the `Against` votes that reported a live holder.
    pub(crate) min_remaining: Option<Duration>,
    /// Each `Against` vote's reported ttl, by node (for the error's votes).
    pub(crate) held_ttls: Vec<(usize, Duration)>,
    pub(crate) errors: Vec<NodeError>,
    /// The completion records nodes answered with (replay acquire).
    pub(crate) records: Records,
    /// The largest fencing counter among the votes for (fenced acquire).
    pub(crate) fence: Option<u64>,
    /// Each vote's fencing counter, by node (fenced acquire).
    pub(crate) fences: Vec<(usize, u64)>,
}

impl Tally {
    /// Counts node `i`'s vote against (held by another value, with the holder's remaining
    /// ttl when the node reported a live one).
    pub(crate) fn held(&mut self, i: usize, remaining: Option<Duration>) {
        self.against += 1;
        self.not_ours |= 1 << i;
        if let Some(r) = remaining {
            self.min_remaining = Some(self.min_remaining.map_or(r, |m| m.min(r)));
            self.held_ttls.push((i, r));
        }
    }

    /// Whether the quorum is reached, or can no longer be.
    fn decided(&self, nodes: usize, quorum: usize) -> bool {
        self.for_ >= quorum || nodes - self.against - self.errors.len() < quorum
    }

    /// Whether counting may stop: the quorum is reached, or it can no longer be **and** a
    /// node said "held" — or no answer is left to wait for. A failure is never decided on
    /// errors alone while an asked node may still say "held": a live holder is not reported
    /// as an outage because the failures came faster.
    fn done(&self, nodes: usize, quorum: usize) -> bool {
        self.records.settled(quorum).is_some()
            || self.for_ >= quorum
            || (self.decided(nodes, quorum) && self.against > 0)
    }

    /// Counts an acquire's answer that came after the decision (or, in replay, while every
    /// answer is awaited): it says whether the node holds our token (a release is owed).
    /// Only replay keeps counting votes for, and takes a completion record for one.
    pub(crate) fn late_acquire(&mut self, (i, answer): Answer<Acquire>, replay: bool) {
        self.answered |= 1 << i;
        match answer {
            Ok(Acquire::Acquired) => {
                self.for_mask |= 1 << i;
                self.for_ += usize::from(replay);
            }
            Ok(Acquire::Fenced { fence }) => {
                self.for_mask |= 1 << i;
                if replay {
                    // A vote counted for the lease: its counter counts for the token.
                    self.for_ += 1;
                    self.fenced(i, fence);
                }
            }
            Ok(Acquire::Held { remaining }) => self.held(i, remaining),
            Ok(Acquire::Completed { record }) if replay => self.completed(i, record, false, None),
            Ok(Acquire::CompletedIfFree { record, remaining }) if replay => {
                self.completed(i, record, true, remaining)
            }
            Ok(Acquire::Completed { .. } | Acquire::CompletedIfFree { .. }) => self.held(i, None),
            Err(e) => {
                if e.is_suspended() {
                    self.not_ours |= 1 << i;
                }
                self.errors.push(e)
            }
        }
    }

    /// Takes node `i`'s fencing counter (its vote is counted by the caller).
    fn fenced(&mut self, i: usize, fence: u64) {
        self.fence = Some(self.fence.map_or(fence, |f| f.max(fence)));
        self.fences.push((i, fence));
    }

    /// Counts node `i`'s completion record (stored "if free" when `if_free`, with what it
    /// has left when known): it locked nothing.
    pub(crate) fn completed(
        &mut self,
        i: usize,
        record: bytes::Bytes,
        if_free: bool,
        remaining: Option<Duration>,
    ) {
        self.not_ours |= 1 << i;
        self.records.add(record, if_free, remaining);
    }

    /// How many nodes answered without an error: a vote for, "held", or a record.
    pub(crate) fn answers(&self) -> usize {
        self.for_ + self.against + self.records.nodes()
    }
}

/// The most nodes a client may have (votes are kept in a `u64` bit set).
pub(crate) const MAX_NODES: usize = 64;

/// The bit set of all `n` nodes.
pub(crate) const fn all(n: usize) -> u64 {
    if n >= 64 {
        u64::MAX
    } else {
        (1u64 << n) - 1
    }
}

/// The requests of one fan-out: the answers known at once (in-process nodes, suspended
/// nodes) and the requests in flight. As a stream, it yields the known answers first.
///
/// Known answers take no task: a task's allocation is sized for the largest request future
/// (a Redis request's, about 1.7 KB), which an in-process node's answer need not pay.
pub(crate) struct Sent<T, F> {
    now: Vec<Answer<T>>,
    later: Option<FuturesUnordered<Call<F>>>,
}

// Never pinned structurally: the answers are moved out, and `FuturesUnordered` is `Unpin`.
impl<T, F> Unpin for Sent<T, F> {}

impl<T, F> Sent<T, F> {
    /// No request at all.
    pub(crate) fn empty() -> Self {
        Self {
            now: Vec::new(),
            later: None,
        }
    }

    /// Whether every answer has been taken.
    pub(crate) fn is_empty(&self) -> bool {
        self.now.is_empty() && self.later.as_ref().is_none_or(FuturesUnordered::is_empty)
    }

    /// Takes the requests out, leaving none.
    pub(crate) fn take(&mut self) -> Self {
        std::mem::replace(self, Self::empty())
    }

    /// The nodes whose request is still in flight and was sent (polled at least once): it
    /// may have reached the node. The requests never polled were never sent.
    pub(crate) fn started(&self) -> u64 {
        let Some(later) = &self.later else {
            return 0;
        };
        Pin::new(later)
            .iter_pin_ref()
            .map(|r| r.get_ref())
            .filter(|r| r.started)
            .fold(0, |m, r| m | 1 << r.index)
    }
}

impl<T, F: Future<Output = Result<T, CallError>>> Stream for Sent<T, F> {
    type Item = Answer<T>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Answer<T>>> {
        // `Vec` and `FuturesUnordered` are `Unpin`, and so is `Sent`.
        let this = self.get_mut();
        if let Some(answer) = this.now.pop() {
            return Poll::Ready(Some(answer));
        }
        match &mut this.later {
            Some(later) => later.poll_next_unpin(cx),
            None => Poll::Ready(None),
        }
    }
}

/// Sends a request to every node in `mask` at once, each bounded by `timeout`: `now` answers
/// for an in-process node at once (`None` for a remote one), `later` makes the request of a
/// remote one. With [`Skip::Suspended`], a suspended node is not asked (it fails at once;
/// a task of its own probes it meanwhile).
///
/// The requests own their arguments (`'static`), so the ones still in flight when the
/// outcome is decided can be driven to completion by a spawned task.
pub(crate) fn send<T, C, F>(
    nodes: &[Arc<Voter>],
    mask: u64,
    timeout: Duration,
    skip: Skip,
    // `dyn`: the returned futures' type must not depend on this closure, which borrows.
    now: &dyn Fn(&AnyNode) -> Option<Result<T, CallError>>,
    later: C,
) -> Sent<T, F>
where
    C: Fn(Arc<Voter>) -> F,
    F: Future<Output = Result<T, CallError>> + Send + 'static,
    T: Send + 'static,
{
    let mut sent = Sent {
        now: Vec::new(),
        later: None,
    };
    for (i, voter) in nodes.iter().enumerate() {
        if mask & (1 << i) == 0 {
            continue;
        }
        if let Some(answer) = now(&voter.node) {
            let answer = answer.map_err(|e| NodeError::from_source(i, voter.name.clone(), e));
            sent.now.push((i, answer));
            continue;
        }
        if skip == Skip::Suspended && !voter.health.admit() {
            let err = NodeError::suspended(i, voter.name.clone());
            sent.now.push((i, Err(err)));
            continue;
        }
        let call = Call::new(later(voter.clone()), voter.clone(), i, timeout, false);
        sent.later
            .get_or_insert_with(FuturesUnordered::new)
            .push(call);
    }
    sent
}

/// Counts the answers of `sent` (requests to `asked` nodes) until the outcome is certain (see
/// `Tally::done`). It is certain at `quorum` votes for, or with too few nodes left to reach it with
/// a vote against among the answers. Else it counts until every node answered or timed out. The
/// requests still in flight stay in `sent`; the caller drops them or lets them finish in the
/// background.
pub(crate) async fn count<T, S, V>(sent: &mut S, asked: usize, quorum: usize, vote: V) -> Tally
where
    S: Stream<Item = Answer<T>> + Unpin,
    V: Fn(T) -> Vote,
{
    count_until(sent, asked, quorum, vote, None).await
}

/// [`count`], stopping at `until` too (when given): a caller's patience, which a request
/// waiting for a node that answers late (see `call.rs`) must not stretch.
pub(crate) async fn count_until<T, S, V>(
    sent: &mut S,
    asked: usize,
    quorum: usize,
    vote: V,
    until: Option<Instant>,
) -> Tally
where
    S: Stream<Item = Answer<T>> + Unpin,
    V: Fn(T) -> Vote,
{
    let mut tally = Tally::default();
    // Pinned in place: no allocation per round.
    let mut cutoff = std::pin::pin!(until.map(|u| tokio::time::sleep_until(u.into())));
    loop {
        let next = match cutoff.as_mut().as_pin_mut() {
            None => sent.next().await,
            Some(cutoff) => match future::select(sent.next(), cutoff).await {
                Either::Left((next, _)) => next,
                Either::Right(_) => break,
            },
        };
        let Some((i, answer)) = next else { break };
        tally.answered |= 1 << i;
        match answer {
            Ok(v) => {
                let v = vote(v);
                telemetry::answered(i, v.telemetry());
                match v {
                    Vote::For => {
                        tally.for_ += 1;
                        tally.for_mask |= 1 << i;
                    }
                    Vote::Fenced(fence) => {
                        tally.for_ += 1;
                        tally.for_mask |= 1 << i;
                        tally.fenced(i, fence);
                    }
                    Vote::Against(remaining) => tally.held(i, remaining),
                    Vote::Completed(record, if_free, remaining) => {
                        tally.completed(i, record, if_free, remaining)
                    }
                }
            }
            Err(e) => {
                if e.is_suspended() {
                    tally.not_ours |= 1 << i;
                }
                tally.errors.push(e)
            }
        }
        if tally.done(asked, quorum) {
            break;
        }
    }
    tally
}

/// Lets the requests still in flight finish in the background, so that every node gets
/// every request even when the outcome was decided without it. The handle says when they
/// are done (each is bounded by the node timeout).
///
/// The answers already there are taken first: usually the last nodes have answered by the
/// time the caller decided, and then no task is spawned at all.
pub(crate) fn finish_in_background<T, F>(mut sent: Sent<T, F>) -> Option<JoinHandle<()>>
where
    T: Send + 'static,
    F: Future<Output = Result<T, CallError>> + Send + 'static,
{
    drain_ready(&mut sent, |_| ());
    let rest = |sent: Sent<T, F>| {
        let span = telemetry::background(Background::Stragglers);
        tokio::spawn(sent.for_each(|_| async {}).instrument(span))
    };
    (!sent.is_empty()).then(|| rest(sent))
}

/// Takes the answers of `sent` that are ready now, without waiting, handing each to `each`.
pub(crate) fn drain_ready<T, F: Future<Output = Result<T, CallError>>>(
    sent: &mut Sent<T, F>,
    mut each: impl FnMut(Answer<T>),
) {
    while let Some(Some(answer)) = sent.next().now_or_never() {
        each(answer);
    }
}

impl Tally {
    /// The votes as a span records them: for, held (against), failed.
    pub(crate) fn votes(&self) -> Votes {
        Votes {
            for_: self.for_,
            held: self.against,
            failed: self.errors.len(),
        }
    }

    /// The nodes whose request failed or timed out.
    pub(crate) fn error_mask(&self) -> u64 {
        self.errors.iter().fold(0, |m, e| m | 1 << e.node())
    }
}

/// The quorum of `n` nodes: a strict majority.
pub(crate) const fn quorum(n: usize) -> usize {
    n / 2 + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quorum_is_a_strict_majority() {
        for n in 1..=9usize {
            let q = quorum(n);
            assert!(2 * q > n, "n={n}");
            assert!(2 * (q - 1) <= n, "n={n}");
        }
    }

    use proptest::prelude::*;

    proptest! {
        /// For any node count and any order of votes, the early decision is never wrong:
        /// it stops only when the outcome can no longer change, and never panics.
        #[test]
        fn early_decision_is_sound(
            n in 1usize..=MAX_NODES,
            votes in proptest::collection::vec(0u8..3, 0..=MAX_NODES),
        ) {
            let q = quorum(n);
            let name: Arc<str> = "node".into();
            let mut t = Tally::default();
            for (i, v) in votes.iter().take(n).enumerate() {
                match v {
                    0 => t.for_ += 1,
                    1 => t.against += 1,
                    _ => t.errors.push(NodeError::timeout(i, name.clone(), Duration::ZERO)),
                }
                let answered = i + 1;
                if t.decided(n, q) {
                    // Once decided, no remaining answer can change the outcome.
                    prop_assert!(t.for_ >= q || t.for_ + (n - answered) < q);
                } else {
                    // Undecided: both outcomes are still possible.
                    prop_assert!(t.for_ < q && t.for_ + (n - answered) >= q);
                }
                if answered == n {
                    prop_assert!(t.decided(n, q), "all {} answered but undecided", n);
                }
            }
            prop_assert_eq!(all(n).count_ones() as usize, n);
        }
    }

    #[test]
    fn decides_as_soon_as_certain() {
        let t = Tally {
            for_: 2,
            ..Tally::default()
        };
        assert!(t.decided(3, 2));
        let t = Tally {
            against: 2,
            ..Tally::default()
        };
        assert!(t.decided(3, 2));
        let t = Tally {
            for_: 1,
            against: 1,
            ..Tally::default()
        };
        assert!(!t.decided(3, 2));
        assert!(!Tally::default().decided(1, 1));
    }
}
