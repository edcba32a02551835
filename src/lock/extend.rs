//! Extending a lease: compare-and-`PEXPIRE` on every node, counted at quorum — on demand
//! ([`Lease::extend`]) or in the background ([`Lease::keep_alive`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use super::lease::Lease;
use super::release::Release;
use super::state::LeaseState;
use super::tally::{self, Skip, Vote};
use super::telemetry;
use super::Redlock;
use crate::error::Error;
use crate::node::ExtendRequest;

impl Lease {
    /// Extends the lease to `ttl` from now, on a quorum of nodes (compare-and-`PEXPIRE`).
    ///
    /// # Errors
    ///
    /// - [`Error::is_lost`]: the lease's validity is already over, or runs out before a quorum
    ///   extended it. (The nodes that did extend are then released, so nothing outlives what the
    ///   error reports.) Or the nodes no longer carry its token (an expired lock is never
    ///   re-created).
    /// - [`Error::is_extension_limit`]: the extension cap is reached.
    /// - [`Error::is_unavailable`]: too few nodes answered; the lease keeps its previous
    ///   validity.
    pub async fn extend(&self, ttl: Duration) -> crate::Result<()> {
        self.client.extend_state(&self.state, ttl).await
    }

    /// Keeps the lease alive in the background: it is extended to its ttl about every
    /// ttl/3, until it is released or dropped, the extension cap is reached, or an
    /// extension finds the lock lost
    /// ([`LeaseHandle::lost`](super::lease::LeaseHandle::lost) then resolves).
    ///
    /// Calling it again does nothing. Must be called inside a Tokio runtime.
    pub fn keep_alive(&mut self) {
        self.keep_alive_from(Instant::now() + self.state.ttl() / 3);
    }

    /// [`Lease::keep_alive`] with the first extension at `first` (at once if it is past).
    pub(crate) fn keep_alive_from(&mut self, first: Instant) {
        if self.keep_alive.is_none() && !self.released {
            let client = self.client.clone();
            let state = self.state.clone();
            let span = telemetry::keep_alive_span(state.key(), state.span());
            let task = keep_alive(client, state, first).instrument(span);
            self.keep_alive = Some(tokio::spawn(task));
        }
    }
}

impl Redlock {
    /// Extends `state` to `ttl` from now, in a `redlock.extend` span (see [`Lease::extend`]).
    pub(crate) async fn extend_state(
        &self,
        state: &LeaseState,
        ttl: Duration,
    ) -> crate::Result<()> {
        let span = telemetry::extend_span(state.key(), state.span(), ttl);
        let t0 = telemetry::clock(&span);
        let extension = self.extend_quorum(state, ttl, span.as_ref());
        let result = telemetry::within(&span, extension).await;
        telemetry::extended(&span, t0, &result, || state.validity());
        result
    }

    async fn extend_quorum(
        &self,
        state: &LeaseState,
        ttl: Duration,
        span: Option<&tracing::Span>,
    ) -> crate::Result<()> {
        let inner = &*self.inner;
        let ttl = inner.config.check_ttl(ttl)?;
        if !state.is_valid() {
            // Still held past its validity: lost (counted once); released: not a loss.
            state.lose("its validity ran out before an extension");
            return Err(Error::lost(
                "the lease expired or was released; it cannot be extended",
            ));
        }
        if state.extension_count() >= inner.config.max_extensions {
            return Err(Error::extension_limit(inner.config.max_extensions));
        }
        let start = Instant::now();
        let n = inner.nodes.len();
        let (key, token) = (state.key_arc(), state.token_copy());
        let mut sent = tally::send(
            &inner.nodes,
            tally::all(n),
            inner.config.node_timeout,
            Skip::Suspended,
            &|node| node.extend_now(&ExtendRequest::new(&key, token.as_str(), ttl)),
            |v| {
                let key = key.clone();
                async move {
                    let request = ExtendRequest::new(&key, token.as_str(), ttl);
                    v.node.extend(request).await
                }
            },
        );
        let tally = tally::count(&mut sent, n, inner.quorum, |ok| {
            if ok {
                Vote::For
            } else {
                Vote::Against(None)
            }
        })
        .await;
        telemetry::votes(span, || tally.votes());
        tally::finish_in_background(sent);
        let deadline = start + ttl - inner.config.drift(ttl);
        // A lease that ended while the extension was on its way (found lost past its
        // deadline, or released) stays ended: the nodes that extended it are released below.
        if tally.for_ >= inner.quorum && Instant::now() < deadline && state.extended(deadline) {
            return Ok(());
        }
        let gone = n - tally.against < inner.quorum;
        if gone || !state.is_valid() {
            // Lost: the token is gone from too many nodes, or the validity ran out while the
            // extension was on its way. The nodes that did extend would keep the token past
            // what the lease reports: release them (in the background).
            state.lose(if gone {
                "its token is gone from too many nodes"
            } else {
                "its validity ran out before a quorum extended it"
            });
            if tally.for_mask != 0 {
                let release = Release {
                    key: key.clone(),
                    token,
                    mask: tally.for_mask,
                    needed: 0,
                    patience: Instant::now(),
                    until: Instant::now() + ttl,
                    gone: Instant::now() + ttl,
                    fence: state.fence().cloned(),
                };
                let _ = self.release_token(release).await;
            }
            return Err(Error::lost(if gone {
                format!(
                    "{} of {n} nodes no longer hold the lease's token",
                    tally.against
                )
            } else {
                "the lease's validity ran out before a quorum extended it".to_owned()
            }));
        }
        Err(Error::unavailable(
            format!(
                "could not extend on a quorum of {} of {n} nodes",
                inner.quorum
            ),
            tally.errors,
        ))
    }
}

/// Extends the lease at `first`, then about every ttl/3, until it ends.
async fn keep_alive(client: Redlock, state: Arc<LeaseState>, first: Instant) {
    let period = state.ttl() / 3;
    let mut next = first;
    loop {
        tokio::time::sleep_until(next.into()).await;
        match client.extend_state(&state, state.ttl()).await {
            Ok(()) => next = Instant::now() + period,
            Err(e) if e.is_unavailable() => {
                // Transient: try again soon, while the lease is still valid.
                let left = state.deadline().saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                tracing::debug!(error = %e, "keep-alive extension failed; retrying");
                next = Instant::now() + (left / 4).min(period).max(Duration::from_millis(1));
            }
            Err(e) if e.is_extension_limit() => {
                // The lease now runs out at its deadline; `lost()` fires then.
                tracing::debug!(error = %e, "keep-alive stopped at the extension cap");
                return;
            }
            Err(e) => {
                // A loss was counted and logged at warn by the extension.
                tracing::debug!(error = %e, "keep-alive stopped");
                break;
            }
        }
    }
    state.lose("the keep-alive could not extend it before its validity ran out");
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::node::{
        Acquire, AcquireRequest, CompleteRequest, ExtendRequest, MemoryNode, Node, NodeFuture,
        ReleaseRequest,
    };
    use crate::Redlock;

    /// A memory node whose extensions answer after `delay` (applied first).
    #[derive(Debug, Clone)]
    struct SlowExtend {
        inner: MemoryNode,
        delay: Duration,
    }

    impl Node for SlowExtend {
        fn name(&self) -> &str {
            "slow-extend"
        }
        fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> NodeFuture<'a, Acquire> {
            self.inner.acquire(request)
        }
        fn extend<'a>(&'a self, request: ExtendRequest<'a>) -> NodeFuture<'a, bool> {
            Box::pin(async move {
                let extended = self.inner.extend(request).await;
                tokio::time::sleep(self.delay).await;
                extended
            })
        }
        fn release<'a>(&'a self, request: ReleaseRequest<'a>) -> NodeFuture<'a, bool> {
            self.inner.release(request)
        }
        fn complete<'a>(&'a self, request: CompleteRequest<'a>) -> NodeFuture<'a, bool> {
            self.inner.complete(request)
        }
    }

    /// An extension that lands after the lease was found lost does not bring it back. (Its validity
    /// ran out while the extension was on its way, and a holder looked.) It answers lost, the lease
    /// stays lost at the moment it was lost, and the node that extended it is released.
    #[tokio::test]
    async fn an_extension_landing_after_the_loss_never_revives_the_lease() {
        let inner = MemoryNode::new();
        let node = SlowExtend {
            inner: inner.clone(),
            delay: Duration::from_millis(300),
        };
        let redlock = Redlock::builder()
            .node(node)
            .node_timeout(Duration::from_secs(2))
            .build()
            .unwrap();
        let lease = redlock
            .lock("late", Duration::from_millis(100))
            .await
            .unwrap();
        let handle = lease.handle();
        let extension = lease.extend(Duration::from_secs(10));
        let watcher = async {
            handle.lost().await;
            handle.lost_at()
        };
        let (extended, lost_at) = tokio::join!(extension, watcher);
        let lost_at = lost_at.expect("lost at its deadline");
        let e = extended.expect_err("the lease was lost before the extension landed");
        assert!(e.is_lost(), "{e}");
        assert!(handle.is_lost());
        assert_eq!(handle.lost_at(), Some(lost_at), "the loss stands");
        assert_eq!(handle.extension_count(), 0);
        // Released in the background.
        for _ in 0..1000 {
            if inner.get("late").is_none() {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(inner.get("late"), None, "the extended node is released");
        drop(lease);
    }
}
