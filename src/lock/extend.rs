//! Extending a lease: compare-and-`PEXPIRE` on every node, counted at quorum.

use std::time::{Duration, Instant};

use super::release::Release;
use super::state::LeaseState;
use super::tally::{self, Skip, Vote};
use super::telemetry;
use super::Redlock;
use crate::error::Error;
use crate::node::ExtendRequest;

impl Redlock {
    /// Extends `state` to `ttl` from now, in a `redlock.extend` span (see [`Redlock::extend`]).
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
        if state.extensions() >= inner.config.max_extensions {
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
        telemetry::votes(span, tally.votes());
        tally::finish_in_background(sent);
        let deadline = start + ttl - inner.config.drift(ttl);
        if tally.for_ >= inner.quorum && Instant::now() < deadline {
            state.extended(deadline);
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
