use std::pin::Pin;
use std::task::{ready, Context, Poll};

use actix_web::body::{BodySize, MessageBody};
use bytes::Bytes;
use pin_project::pin_project;

use crate::middleware::watch::LossWatch;
use crate::middleware::{BodyTail, Next};
use crate::policy::LockLostError;
use crate::Lease;

/// The response body of [`RedlockMiddleware`](crate::RedlockMiddleware): the inner body,
/// holding the lease until its end when the policy releases at body end.
///
/// The end of the stream is reported only once the release has completed. Dropping the body
/// early spawns the release in the background. If the lease is lost while the body streams
/// and the policy says [`OnLost::Abort`](crate::policy::OnLost::Abort), the body ends with
/// [`LockLostError`]: actix-web then breaks the response off.
#[pin_project]
pub struct LeaseBody<B> {
    #[pin]
    body: B,
    tail: BodyTail<Bytes>,
    /// Bytes still to come of a body of known length: the last chunk is the one that
    /// brings this to zero.
    remaining: Option<u64>,
}

impl<B: MessageBody> LeaseBody<B> {
    pub(crate) fn new(body: B, lease: Option<Lease>, watch: Option<LossWatch>) -> Self {
        let remaining = match body.size() {
            BodySize::Sized(n) => Some(n),
            _ => None,
        };
        Self {
            body,
            tail: BodyTail::new(lease, watch),
            remaining,
        }
    }
}

impl<B> LeaseBody<B> {
    /// Whether this body still holds a lock (released at the body's end).
    pub fn holds_lock(&self) -> bool {
        self.tail.holds()
    }
}

impl<B> std::fmt::Debug for LeaseBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseBody")
            .field("holds_lock", &self.holds_lock())
            .finish_non_exhaustive()
    }
}

impl<B: MessageBody> MessageBody for LeaseBody<B> {
    type Error = Box<dyn std::error::Error>;

    fn size(&self) -> BodySize {
        self.body.size()
    }

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        let this = self.project();
        let (body, remaining) = (this.body, this.remaining);
        let next = ready!(this.tail.poll_next(cx, |cx| {
            let polled = ready!(body.poll_next(cx));
            Poll::Ready(polled.map(|chunk| {
                chunk.map(|chunk| {
                    let is_last = remaining.as_mut().is_some_and(|r| {
                        *r = r.saturating_sub(chunk.len() as u64);
                        *r == 0
                    });
                    (chunk, is_last)
                })
            }))
        }));
        Poll::Ready(match next {
            Next::Chunk(chunk) => Some(Ok(chunk)),
            Next::Lost(_) => Some(Err(Box::new(LockLostError))),
            Next::Failed(e) => Some(Err(e.into())),
            Next::End => None,
        })
    }

    fn try_into_bytes(self) -> Result<Bytes, Self> {
        if self.tail.holds() {
            // The lease must see the end of the body.
            return Err(self);
        }
        let Self {
            body,
            tail,
            remaining,
        } = self;
        body.try_into_bytes().map_err(|body| Self {
            body,
            tail,
            remaining,
        })
    }
}
