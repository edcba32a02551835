//! Parallel fan-out to every node and vote counting.

use std::sync::Arc;
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};

use crate::error::NodeError;
use crate::node::{Node, NodeFuture};

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
    /// Bit `i` set: node `i` voted against (so it certainly does not hold our token).
    pub(crate) against_mask: u64,
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
    /// Stop as soon as the outcome is certain: `quorum` votes for, or too few nodes left to
    /// reach it. Requests still in flight are dropped; they were already written to their
    /// connection, so anything sent to that node later is ordered after them.
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

/// Calls every node in `mask` in parallel, each bounded by `timeout`, and counts the votes.
pub(crate) async fn fan_out<'a, T, C, V>(
    nodes: &'a [(Arc<dyn Node>, Arc<str>)],
    mask: u64,
    timeout: Duration,
    until: Until,
    call: C,
    vote: V,
) -> Tally
where
    T: 'a,
    C: Fn(usize, &'a dyn Node) -> NodeFuture<'a, T>,
    V: Fn(T) -> Vote,
{
    let mut pending: FuturesUnordered<_> = nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| mask & (1 << i) != 0)
        .map(|(i, (node, _))| {
            let fut = call(i, node.as_ref());
            async move { (i, tokio::time::timeout(timeout, fut).await) }
        })
        .collect();
    let mut tally = Tally::default();
    while let Some((i, answer)) = pending.next().await {
        match answer {
            Ok(Ok(v)) => match vote(v) {
                Vote::For => {
                    tally.for_ += 1;
                    tally.for_mask |= 1 << i;
                }
                Vote::Against(remaining) => {
                    tally.against += 1;
                    tally.against_mask |= 1 << i;
                    if let Some(r) = remaining {
                        tally.min_remaining = Some(tally.min_remaining.map_or(r, |m| m.min(r)));
                    }
                }
            },
            Ok(Err(e)) => tally
                .errors
                .push(NodeError::from_source(i, nodes[i].1.clone(), e)),
            Err(_) => tally
                .errors
                .push(NodeError::timeout(i, nodes[i].1.clone(), timeout)),
        }
        if let Until::Decided { quorum } = until {
            if tally.decided(mask.count_ones() as usize, quorum) {
                break;
            }
        }
    }
    tally
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
