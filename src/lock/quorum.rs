//! Parallel fan-out to every node and vote counting.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, Stream, StreamExt};
use futures_util::FutureExt;
use tokio::task::JoinHandle;

use super::health::{Admit, Health};
use super::lease::Token;
use crate::error::NodeError;
use crate::node::{AnyNode, NodeFailure};

/// One node as the client holds it: the node, its name, and its recent timeouts.
#[derive(Debug)]
pub(crate) struct Voter {
    pub(crate) node: AnyNode,
    pub(crate) name: Arc<str>,
    pub(crate) health: Health,
}

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
    /// The node refused: the key is held by another value (with its remaining ttl), or no
    /// longer holds ours.
    Against(Option<Duration>),
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
    /// The shortest remaining ttl among the `Against` votes that reported one.
    pub(crate) min_remaining: Option<Duration>,
    pub(crate) errors: Vec<NodeError>,
}

impl Tally {
    fn decided(&self, nodes: usize, quorum: usize) -> bool {
        self.for_ >= quorum || nodes - self.against - self.errors.len() < quorum
    }
}

/// How long to wait for the answers.
#[derive(Clone, Copy)]
pub(crate) enum Until {
    /// Stop counting as soon as the outcome is certain: `quorum` votes for, or too few nodes
    /// left to reach it. The requests still in flight stay in the stream; the caller lets
    /// them finish in the background (the spec sends every request to every node).
    Decided { quorum: usize },
    /// Wait for every node (or its timeout).
    All,
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

/// One node's answer: its index, and its result or why it has none.
pub(crate) type Answer<T> = (usize, Result<T, NodeError>);

/// The requests of one fan-out: the answers known at once (in-process nodes, suspended
/// nodes) and the requests in flight. As a stream, it yields the known answers first.
///
/// Known answers take no task: a task's allocation is sized for the largest request future
/// (a Redis request's, about 1.7 KB), which an in-process node's answer need not pay.
pub(crate) struct Sent<T, F> {
    now: Vec<Answer<T>>,
    later: Option<FuturesUnordered<F>>,
}

// Never pinned structurally: the answers are moved out, and `FuturesUnordered` is `Unpin`.
impl<T, F> Unpin for Sent<T, F> {}

impl<T, F> Sent<T, F> {
    /// Whether every answer has been taken.
    pub(crate) fn is_empty(&self) -> bool {
        self.now.is_empty() && self.later.as_ref().is_none_or(FuturesUnordered::is_empty)
    }
}

impl<T, F: Future<Output = Answer<T>>> Stream for Sent<T, F> {
    type Item = Answer<T>;

    fn poll_next(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Answer<T>>> {
        // `Vec` and `FuturesUnordered` are `Unpin`, and so is `Sent`.
        let this = self.get_mut();
        if let Some(answer) = this.now.pop() {
            return std::task::Poll::Ready(Some(answer));
        }
        match &mut this.later {
            Some(later) => later.poll_next_unpin(cx),
            None => std::task::Poll::Ready(None),
        }
    }
}

/// Sends a request to every node in `mask` at once, each bounded by `timeout`: `now` answers
/// for an in-process node at once (`None` for a remote one), `later` makes the request of a
/// remote one. With [`Skip::Suspended`], a suspended node is not asked (it fails at once;
/// one request per backoff goes through as its probe).
///
/// The requests own their arguments (`'static`), so the ones still in flight when the
/// outcome is decided can be driven to completion by a spawned task.
pub(crate) fn send<T, C, F>(
    nodes: &[Arc<Voter>],
    mask: u64,
    timeout: Duration,
    skip: Skip,
    // `dyn`: the returned futures' type must not depend on this closure, which borrows.
    now: &dyn Fn(&AnyNode) -> Option<Result<T, NodeFailure>>,
    later: C,
) -> Sent<T, impl Future<Output = Answer<T>> + Send + 'static>
where
    C: Fn(Arc<Voter>) -> F,
    F: Future<Output = Result<T, NodeFailure>> + Send + 'static,
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
        let admit = match skip {
            Skip::Suspended => voter.health.admit(),
            Skip::Never => Admit::Ask,
        };
        if admit == Admit::Skip {
            let err = NodeError::suspended(i, voter.name.clone());
            sent.now.push((i, Err(err)));
            continue;
        }
        let v = voter.clone();
        // A combinator, not an `async` block: a block awaiting the request future it
        // captured would hold it twice (the capture and the awaited copy), doubling the
        // allocation made for every request (3.5 KB instead of 1.7 KB, measured).
        let request = tokio::time::timeout(timeout, later(voter.clone())).map(move |r| match r {
            Ok(Ok(x)) => {
                v.health.answered();
                (i, Ok(x))
            }
            Ok(Err(e)) => {
                if e.is_timeout() {
                    v.health.timed_out(admit == Admit::Probe);
                } else {
                    v.health.answered();
                }
                (i, Err(NodeError::from_source(i, v.name.clone(), e)))
            }
            Err(_) => {
                v.health.timed_out(admit == Admit::Probe);
                (i, Err(NodeError::timeout(i, v.name.clone(), timeout)))
            }
        });
        sent.later
            .get_or_insert_with(FuturesUnordered::new)
            .push(request);
    }
    sent
}

/// Sends the compare-and-delete of `token` at `key` to every node in `mask`.
pub(crate) fn send_release(
    nodes: &[Arc<Voter>],
    mask: u64,
    timeout: Duration,
    key: &Arc<str>,
    token: Token,
) -> Sent<bool, impl Future<Output = Answer<bool>> + Send + 'static> {
    let owned = key.clone();
    send(
        nodes,
        mask,
        timeout,
        Skip::Never,
        &|node| node.release_now(key, token.as_str()),
        move |v| {
            let key = owned.clone();
            async move { v.node.release(&key, token.as_str()).await }
        },
    )
}

/// Counts the answers of `sent` (requests to `asked` nodes) until `until`.
pub(crate) async fn count<T, S, V>(sent: &mut S, asked: usize, until: Until, vote: V) -> Tally
where
    S: Stream<Item = Answer<T>> + Unpin,
    V: Fn(T) -> Vote,
{
    let mut tally = Tally::default();
    while let Some((i, answer)) = sent.next().await {
        tally.answered |= 1 << i;
        match answer {
            Ok(v) => match vote(v) {
                Vote::For => {
                    tally.for_ += 1;
                    tally.for_mask |= 1 << i;
                }
                Vote::Against(remaining) => {
                    tally.against += 1;
                    tally.not_ours |= 1 << i;
                    if let Some(r) = remaining {
                        tally.min_remaining = Some(tally.min_remaining.map_or(r, |m| m.min(r)));
                    }
                }
            },
            Err(e) => {
                if e.is_suspended() {
                    tally.not_ours |= 1 << i;
                }
                tally.errors.push(e)
            }
        }
        if let Until::Decided { quorum } = until {
            if tally.decided(asked, quorum) {
                break;
            }
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
    F: Future<Output = Answer<T>> + Send + 'static,
{
    drain_ready(&mut sent, |_| ());
    (!sent.is_empty()).then(|| tokio::spawn(sent.for_each(|_| async {})))
}

/// Takes the answers of `sent` that are ready now, without waiting, handing each to `each`.
pub(crate) fn drain_ready<T, F: Future<Output = Answer<T>>>(
    sent: &mut Sent<T, F>,
    mut each: impl FnMut(Answer<T>),
) {
    while let Some(Some(answer)) = sent.next().now_or_never() {
        each(answer);
    }
}

impl Tally {
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
