use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project::pin_project;

use crate::middleware::watch::LossWatch;
use crate::middleware::{BodyTail, Next};
use crate::policy::LockLostError;
use crate::rejection::Wire;
use crate::Lease;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The error a [`LeaseBody`] ends with: its inner body's error, or [`LockLostError`] when
/// its lease was lost while it streamed and the policy says
/// [`OnLost::Abort`](crate::policy::OnLost::Abort). Shows as the error it holds.
#[derive(Debug)]
pub struct BodyError(BoxError);

impl BodyError {
    /// Whether the body was broken off because its lease was lost.
    pub fn is_lock_lost(&self) -> bool {
        self.0.is::<LockLostError>()
    }

    /// The error it holds.
    pub fn into_inner(self) -> BoxError {
        self.0
    }
}

impl std::fmt::Display for BodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for BodyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// The response body of [`RedlockService`](super::RedlockService): the inner body (holding
/// the lease until its end when the policy releases at body end), or a body the middleware
/// made (a rejection, a replayed or a stored response).
///
/// With release at body end, the end of the stream is reported only once the release has
/// completed, so a client that has read the whole response finds the key free. Dropping the
/// body early spawns the release in the background. If the lease is lost while the body
/// streams and the policy says [`OnLost::Abort`](crate::policy::OnLost::Abort), the body
/// ends with [`LockLostError`] (a gRPC body with `UNAVAILABLE` trailers): see [`BodyError`].
#[pin_project]
pub struct LeaseBody<B: Body> {
    #[pin]
    kind: Kind<B>,
}

#[pin_project(project = KindProj)]
enum Kind<B: Body> {
    Inner {
        #[pin]
        body: B,
        tail: BodyTail<Frame<B::Data>>,
    },
    /// A body the middleware made: a rejection, a replayed or a stored response.
    Full { body: Option<Bytes> },
}

impl<B: Body> LeaseBody<B> {
    pub(crate) fn new(body: B, lease: Option<Lease>, watch: Option<LossWatch>) -> Self {
        Self {
            kind: Kind::Inner {
                body,
                tail: BodyTail::new(lease, watch),
            },
        }
    }

    pub(crate) fn full(body: Bytes) -> Self {
        Self {
            kind: Kind::Full {
                body: Some(body).filter(|b| !b.is_empty()),
            },
        }
    }

    /// Whether this body still holds a lock (released at the body's end).
    pub fn holds_lock(&self) -> bool {
        matches!(&self.kind, Kind::Inner { tail, .. } if tail.holds())
    }
}

impl<B: Body> std::fmt::Debug for LeaseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseBody")
            .field("holds_lock", &self.holds_lock())
            .finish_non_exhaustive()
    }
}

/// The `grpc-message` of a gRPC response broken off on a lost lease.
const GRPC_LOST_MESSAGE: &str = "the lock of this call was lost while its response streamed";

/// The last frame of a body broken off on a lost lease: gRPC's status in trailers, or the
/// error that makes the server break the response off.
fn lost_frame<D>(wire: Wire) -> Result<Frame<D>, BodyError> {
    if wire == Wire::Http {
        return Err(BodyError(Box::new(LockLostError)));
    }
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", http::HeaderValue::from_static("14"));
    trailers.insert(
        "grpc-message",
        http::HeaderValue::from_static(GRPC_LOST_MESSAGE),
    );
    Ok(Frame::trailers(trailers))
}

impl<B> Body for LeaseBody<B>
where
    B: Body,
    B::Data: From<Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = B::Data;
    type Error = BodyError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Full { body } => {
                Poll::Ready(body.take().map(|b| Ok(Frame::data(B::Data::from(b)))))
            }
            KindProj::Inner { mut body, tail } => {
                let next = ready!(tail.poll_next(cx, |cx| {
                    let polled = ready!(body.as_mut().poll_frame(cx));
                    Poll::Ready(polled.map(|frame| frame.map(|f| (f, body.is_end_stream()))))
                }));
                Poll::Ready(match next {
                    Next::Chunk(frame) => Some(Ok(frame)),
                    Next::Lost(wire) => Some(lost_frame(wire)),
                    Next::Failed(e) => Some(Err(BodyError(e.into()))),
                    Next::End => None,
                })
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full { body } => body.is_none(),
            // While a lease is held, the end must be polled so that it is released.
            Kind::Inner { body, tail } => {
                tail.is_aborted() || (tail.is_done() && body.is_end_stream())
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full { body } => {
                SizeHint::with_exact(body.as_ref().map_or(0, |b| b.len() as u64))
            }
            Kind::Inner { tail, .. } if tail.is_aborted() => SizeHint::with_exact(0),
            Kind::Inner { body, .. } => body.size_hint(),
        }
    }
}
