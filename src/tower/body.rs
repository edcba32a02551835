use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project::pin_project;

use crate::http::BodyTail;
use crate::Lease;

/// The response body of [`RedlockService`](super::RedlockService): the inner body (holding
/// the lease until its end when the policy releases at body end), or a body the middleware
/// made (a rejection, a replayed or a stored response).
///
/// With release at body end, the end of the stream is reported only once the release has
/// completed, so a client that has read the whole response finds the key free. Dropping the
/// body early spawns the release in the background.
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
    pub(crate) fn new(body: B, lease: Option<Lease>) -> Self {
        Self {
            kind: Kind::Inner {
                body,
                tail: BodyTail::new(lease),
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

impl<B> Body for LeaseBody<B>
where
    B: Body,
    B::Data: From<Bytes>,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().kind.project() {
            KindProj::Full { body } => {
                Poll::Ready(body.take().map(|b| Ok(Frame::data(B::Data::from(b)))))
            }
            KindProj::Inner { mut body, tail } => {
                if tail.wants_more() {
                    match ready!(body.as_mut().poll_frame(cx)) {
                        Some(Ok(frame)) => {
                            if let Some(frame) = tail.chunk(frame, body.is_end_stream()) {
                                return Poll::Ready(Some(Ok(frame)));
                            }
                        }
                        Some(Err(e)) => {
                            tail.abandon();
                            return Poll::Ready(Some(Err(e)));
                        }
                        None => {}
                    }
                }
                tail.poll_end(cx).map(|last| last.map(Ok))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Full { body } => body.is_none(),
            // While a lease is held, the end must be polled so that it is released.
            Kind::Inner { body, tail } => tail.is_done() && body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Full { body } => {
                SizeHint::with_exact(body.as_ref().map_or(0, |b| b.len() as u64))
            }
            Kind::Inner { body, .. } => body.size_hint(),
        }
    }
}
