//! Releasing a token: compare-and-delete on every node that may hold it, retried.
//!
//! A release that does not reach enough nodes leaves the lock held for the rest of its ttl —
//! and the next request for the key is refused all that time. So a release is not one try
//! per node: the nodes that failed (an error, or no answer within the node timeout) are asked
//! again, with a short backoff, until enough of them have answered or the lock's validity is
//! over (after it, the lock expires by itself). The caller waits until enough nodes released,
//! or until its own patience (at most [`PATIENCE`] node timeouts) runs out; the rest is
//! released, and retried, in the background.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;

use super::lease::Token;
use super::quorum::{self, Vote};
use super::Redlock;
use crate::error::{Error, NodeError};

/// How long a caller waits for a release at most, in node timeouts (when the lock's
/// validity does not end sooner).
pub(crate) const PATIENCE: u32 = 10;

/// The first pause before a failed node is asked again; doubled up to [`MAX_PAUSE`].
const FIRST_PAUSE: Duration = Duration::from_millis(10);
const MAX_PAUSE: Duration = Duration::from_millis(200);

/// What to release, and how much of it the caller waits for.
pub(crate) struct Release {
    pub(crate) key: Arc<str>,
    pub(crate) token: Token,
    /// The nodes that may hold the token.
    pub(crate) mask: u64,
    /// How many of them must have answered before the caller goes on.
    pub(crate) needed: usize,
    /// The caller asks again until this instant at most (then the background goes on).
    pub(crate) patience: Instant,
    /// No retry after this instant (the lock expires by itself then).
    pub(crate) until: Instant,
}

impl Redlock {
    /// Releases `r.token` on the nodes in `r.mask`: waits until `r.needed` of them answered,
    /// asking the failed ones again until `r.patience`; the rest — and the retries after the
    /// caller's patience, until `r.until` — go on in the background. Fails (logged at warn)
    /// when too few nodes answered within the patience.
    pub(crate) async fn release_token(&self, r: Release) -> crate::Result<()> {
        let inner = &*self.inner;
        let timeout = inner.config.node_timeout;
        if r.needed == 0 {
            // Nothing to wait for: all of it in the background.
            let sent = quorum::send_release(&inner.nodes, r.mask, timeout, &r.key, r.token);
            let client = self.clone();
            tokio::spawn(async move { client.release_rest(r, sent, 0).await });
            return Ok(());
        }
        let (mut todo, mut released, mut pause) = (r.mask, 0, FIRST_PAUSE);
        loop {
            let mut sent = quorum::send_release(&inner.nodes, todo, timeout, &r.key, r.token);
            let asked = todo.count_ones() as usize;
            let tally = quorum::count(&mut sent, asked, r.needed - released, |_| Vote::For).await;
            released += tally.for_;
            let mut failed = tally.error_mask();
            if released >= r.needed {
                quorum::drain_ready(&mut sent, |(i, answer)| {
                    if answer.is_err() {
                        failed |= 1 << i;
                    }
                });
                if failed != 0 || !sent.is_empty() {
                    let client = self.clone();
                    tokio::spawn(async move { client.release_rest(r, sent, failed).await });
                }
                return Ok(());
            }
            // Too few: every node asked has answered (or timed out) by now.
            todo = failed;
            if todo == 0 || Instant::now() + pause >= r.patience.min(r.until) {
                let err = release_failed(&r.key, released, r.needed, tally.errors);
                if todo != 0 && Instant::now() + pause < r.until {
                    let client = self.clone();
                    let sent = quorum::send_release(&inner.nodes, 0, timeout, &r.key, r.token);
                    tokio::spawn(async move { client.release_rest(r, sent, todo).await });
                }
                return Err(err);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }

    /// The background part of a release: lets the requests in flight finish, and asks the
    /// nodes that failed again until `r.until`.
    async fn release_rest<F>(&self, r: Release, mut sent: quorum::Sent<bool, F>, mut failed: u64)
    where
        F: std::future::Future<Output = Result<bool, crate::node::NodeFailure>>,
    {
        let inner = &*self.inner;
        while let Some((i, answer)) = sent.next().await {
            if answer.is_err() {
                failed |= 1 << i;
            }
        }
        let mut pause = FIRST_PAUSE;
        while failed != 0 && Instant::now() + pause < r.until {
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_PAUSE);
            let timeout = inner.config.node_timeout;
            let mut sent = quorum::send_release(&inner.nodes, failed, timeout, &r.key, r.token);
            failed = 0;
            while let Some((i, answer)) = sent.next().await {
                if answer.is_err() {
                    failed |= 1 << i;
                }
            }
        }
        if failed != 0 {
            tracing::debug!(
                resource = %r.key,
                nodes = failed.count_ones(),
                "a minority of nodes did not answer the release; their keys expire with the ttl"
            );
        }
    }

    /// The latest instant a caller waits for a release of a lock valid until `deadline`.
    pub(crate) fn patience(&self, deadline: Instant) -> Instant {
        let patience = self.inner.config.node_timeout.saturating_mul(PATIENCE);
        deadline.min(Instant::now() + patience)
    }
}

/// The error of a release that too few nodes answered, logged at warn: the lock stays held
/// on the others until its ttl, and the next request for it is refused meanwhile.
fn release_failed(key: &str, released: usize, needed: usize, errors: Vec<NodeError>) -> Error {
    let err = Error::unavailable(
        format!(
            "the release reached {released} of the {needed} nodes it needed in time; it is \
             retried in the background while the lock is valid, and the lock expires with \
             its ttl"
        ),
        errors,
    );
    tracing::warn!(resource = %key, error = %err, "release failed");
    err
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::node::tests::Wrapped;
    use crate::{MemoryNode, Redlock, Retry};

    /// A node that said "held" holds nothing of ours and is not asked to release — and it
    /// counts as released: the lease's own quorum does not need every one of its nodes then.
    #[tokio::test]
    async fn a_node_that_said_held_counts_as_released() {
        let (held, free) = (MemoryNode::new(), MemoryNode::new());
        let slow = Wrapped {
            inner: MemoryNode::new(),
            hang_on_release: true,
        };
        let other = Redlock::builder().node(held.clone()).build().unwrap();
        let _theirs = other.try_lock("r", Duration::from_secs(60)).await.unwrap();
        let redlock = Redlock::builder()
            .node(held.clone())
            .node(free.clone())
            .node(slow.clone())
            .node_timeout(Duration::from_millis(50))
            .retry(Retry::never())
            .build()
            .unwrap();
        let lease = redlock
            .try_lock("r", Duration::from_secs(60))
            .await
            .unwrap();
        let token = lease.value().to_owned();
        assert_eq!(free.get("r").as_deref(), Some(token.as_str()));
        assert_ne!(held.get("r").as_deref(), Some(token.as_str()));
        // Released on the free node; the slow one would have made it wait and fail.
        lease
            .release()
            .await
            .expect("a quorum: the free node and the one that said held");
        assert_eq!(free.get("r"), None);
        assert!(
            held.get("r").is_some(),
            "the other holder's lock is untouched"
        );
    }
}
