//! After the inner service answered: release at once, or hand the lease to the response
//! body and release at its end, holding the body's last chunk back until the release is
//! done. Shared by the tower and actix-web glue, which keep only their framework's types.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use super::watch::LossWatch;
use crate::lock::hashed;
use crate::policy::OnLost;
use crate::policy::ReleaseOn;
use crate::rejection::Wire;
use crate::Lease;

/// Releases a lease and logs the outcome (used by both glues). A release that reaches no
/// quorum is logged at warn, with the (hashed) key, by the lock itself.
pub(crate) async fn release(lease: Lease) {
    let started = Instant::now();
    let key = tracing::enabled!(tracing::Level::DEBUG).then(|| hashed(lease.key()).to_string());
    let released = lease.release().await.is_ok();
    if let Some(key) = key.filter(|_| released) {
        tracing::debug!(key, elapsed = ?started.elapsed(), "lock released");
    }
}

/// What the glue does with the lease once the inner service has answered.
pub(crate) enum AfterResponse {
    /// Give the lease to the response body, which releases it at its end.
    HoldToBodyEnd(Lease),
    /// Release now, *before* answering, so a client that retries the moment it has the
    /// answer finds the key free.
    ReleaseNow(Lease),
}

impl AfterResponse {
    /// The decision for `lease`. `body_to_send`: the service answered with a response whose
    /// body may still have data. An empty body is never polled by the server, so it could
    /// never report its end: with one (or an error) the lease is released now.
    pub(crate) fn decide(lease: Lease, release_on: ReleaseOn, body_to_send: bool) -> Self {
        if release_on == ReleaseOn::BodyEnd && body_to_send {
            Self::HoldToBodyEnd(lease)
        } else {
            Self::ReleaseNow(lease)
        }
    }
}

/// The end of a response body that holds a lease (release at body end). The last chunk is held back
/// until the release is done, because a server may stop polling once it has the last chunk of a
/// body of known length. And a client that has read the whole response must find the key free.
/// Without a lease it passes everything through.
///
/// Each framework's body polls through [`poll_next`](Self::poll_next), which polls the inner
/// body and says what to hand over ([`Next`]). Dropping it early (a cancelled response) drops
/// the lease, whose release is then spawned in the background.
pub(crate) struct BodyTail<T> {
    /// Broken off on a lost lease: nothing more follows.
    aborted: bool,
    lease: Option<Lease>,
    releasing: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    /// The last chunk, held back until the release is done.
    last: Option<T>,
    /// With a policy that may stop a request on a lost lease: the lease's watch.
    watch: Option<LossWatch>,
}

impl<T> BodyTail<T> {
    pub(crate) fn new(lease: Option<Lease>, watch: Option<LossWatch>) -> Self {
        let watch = watch.filter(|_| lease.is_some());
        Self {
            aborted: false,
            lease,
            releasing: None,
            last: None,
            watch,
        }
    }

    /// One poll of the body. It polls the inner body (`poll_inner`: a chunk, and whether the inner
    /// body says nothing follows it) while no chunk is held back. It breaks the body off on a known
    /// loss (the policy says abort), and holds the last chunk back until the release is done.
    pub(crate) fn poll_next<E>(
        &mut self,
        cx: &mut Context<'_>,
        poll_inner: impl FnOnce(&mut Context<'_>) -> Poll<Option<Result<(T, bool), E>>>,
    ) -> Poll<Next<T, E>> {
        if self.aborted {
            return Poll::Ready(Next::End);
        }
        if self.wants_more() {
            let polled = poll_inner(cx);
            if polled.is_pending() {
                return self.poll_abort(cx).map(|wire| self.broken_off(wire));
            }
            match ready!(polled) {
                Some(Ok((chunk, is_last))) => {
                    if let Some(wire) = self.lost_abort() {
                        return Poll::Ready(self.broken_off(wire));
                    }
                    if let Some(chunk) = self.chunk(chunk, is_last) {
                        return Poll::Ready(Next::Chunk(chunk));
                    }
                }
                Some(Err(e)) => {
                    self.abandon();
                    return Poll::Ready(Next::Failed(e));
                }
                None => {}
            }
        }
        if let Some(wire) = self.lost_abort() {
            return Poll::Ready(self.broken_off(wire));
        }
        self.poll_end(cx)
            .map(|last| last.map_or(Next::End, Next::Chunk))
    }

    fn broken_off<E>(&mut self, wire: Wire) -> Next<T, E> {
        self.aborted = true;
        Next::Lost(wire)
    }

    /// Whether the body was broken off on a lost lease.
    #[cfg(feature = "tower")]
    pub(crate) fn is_aborted(&self) -> bool {
        self.aborted
    }

    /// Whether the lease is known lost and the policy says abort. It is checked before a chunk is
    /// handed over and before the release, so that no chunk and no clean end follow a known loss.
    /// Then the client's wire, the lease dropped (its release spawned), and the body must end with
    /// an error.
    fn lost_abort(&mut self) -> Option<Wire> {
        let watch = self.watch.as_mut().filter(|_| self.lease.is_some())?;
        if watch.decide(true) != Some(OnLost::Abort) {
            return None;
        }
        let wire = watch.wire();
        self.watch = None;
        self.lease = None;
        Some(wire)
    }

    /// Call while the inner body is pending: `Ready` with the client's wire when the lease
    /// was lost and the policy says abort — the body must then end with an error (gRPC:
    /// its status in trailers). The lease is dropped (its release spawned).
    fn poll_abort(&mut self, cx: &mut Context<'_>) -> Poll<Wire> {
        let Some(watch) = self.watch.as_mut().filter(|_| self.lease.is_some()) else {
            return Poll::Pending;
        };
        ready!(watch.poll_abort(cx, true));
        let wire = watch.wire();
        self.watch = None;
        self.lease = None;
        Poll::Ready(wire)
    }

    /// Whether a lease is still held or being released.
    pub(crate) fn holds(&self) -> bool {
        self.lease.is_some() || self.releasing.is_some()
    }

    /// Whether the inner body is still to be polled (no chunk held back, no release under
    /// way).
    fn wants_more(&self) -> bool {
        self.releasing.is_none() && self.last.is_none()
    }

    /// Whether the whole body, the release included, is done once the inner body is.
    #[cfg(feature = "tower")]
    pub(crate) fn is_done(&self) -> bool {
        !self.holds() && self.last.is_none()
    }

    /// A chunk from the inner body; `is_last`: the inner body says nothing follows. Returns
    /// the chunk to hand over now, or `None` when it was held back: then poll
    /// [`poll_end`](Self::poll_end).
    fn chunk(&mut self, chunk: T, is_last: bool) -> Option<T> {
        if is_last && self.holds() {
            self.last = Some(chunk);
            None
        } else {
            Some(chunk)
        }
    }

    /// The inner body failed: drop the lease, which spawns its release.
    fn abandon(&mut self) {
        self.lease.take();
    }

    /// The inner body ended or its last chunk was held back: release and wait for it, then
    /// hand over the held-back chunk (`None`: the end of the stream).
    fn poll_end(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        if let Some(lease) = self.lease.take() {
            self.releasing = Some(Box::pin(release(lease)));
        }
        if let Some(r) = self.releasing.as_mut() {
            ready!(r.as_mut().poll(cx));
            self.releasing = None;
        }
        Poll::Ready(self.last.take())
    }
}

/// What a body holding a [`BodyTail`] hands over next.
pub(crate) enum Next<T, E> {
    /// A chunk of the inner body.
    Chunk(T),
    /// The lease was lost and the policy says abort: the body ends with an error on this wire
    /// (gRPC: its status in trailers; actix-web only breaks the response off).
    Lost(#[cfg_attr(not(feature = "tower"), allow(dead_code))] Wire),
    /// The inner body failed (its lease dropped, the release spawned).
    Failed(E),
    /// The end of the stream, the release done.
    End,
}
