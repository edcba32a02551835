use std::pin::Pin;
use std::task::{ready, Context, Poll};

use actix_web::body::{BodySize, MessageBody};
use bytes::Bytes;
use pin_project::pin_project;

use crate::http::BodyLease;
use crate::Lease;

/// The response body of [`RedlockMiddleware`](super::RedlockMiddleware): the inner body,
/// holding the lease until its end when the policy releases at body end.
///
/// The end of the stream is reported only once the release has completed. Dropping the body
/// early spawns the release in the background.
#[pin_project]
pub struct LeaseBody<B> {
    #[pin]
    body: B,
    lease: BodyLease,
    /// Bytes still to come of a body of known length: the server stops polling after the
    /// last one, so the release happens before that chunk is handed over.
    remaining: Option<u64>,
    /// The last chunk, held back until the release is done.
    last: Option<Bytes>,
}

impl<B: MessageBody> LeaseBody<B> {
    pub(crate) fn new(body: B, lease: Option<Lease>) -> Self {
        let remaining = match body.size() {
            BodySize::Sized(n) => Some(n),
            _ => None,
        };
        Self {
            body,
            lease: BodyLease::new(lease),
            remaining,
            last: None,
        }
    }
}

impl<B> LeaseBody<B> {
    /// Whether this body still holds a lock (released at the body's end).
    pub fn holds_lock(&self) -> bool {
        self.lease.holds()
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
    type Error = B::Error;

    fn size(&self) -> BodySize {
        self.body.size()
    }

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        let this = self.project();
        if !this.lease.is_releasing() && this.last.is_none() {
            match ready!(this.body.poll_next(cx)) {
                Some(Ok(chunk)) => {
                    let is_last = this.remaining.as_mut().is_some_and(|r| {
                        *r = r.saturating_sub(chunk.len() as u64);
                        *r == 0
                    });
                    if !(is_last && this.lease.holds()) {
                        return Poll::Ready(Some(Ok(chunk)));
                    }
                    *this.last = Some(chunk);
                }
                Some(Err(e)) => {
                    this.lease.abandon();
                    return Poll::Ready(Some(Err(e)));
                }
                None => {}
            }
        }
        ready!(this.lease.poll_end(cx));
        Poll::Ready(this.last.take().map(Ok))
    }

    fn try_into_bytes(self) -> Result<Bytes, Self> {
        if self.lease.holds() {
            // The lease must see the end of the body.
            return Err(self);
        }
        let Self {
            body,
            lease,
            remaining,
            last,
        } = self;
        body.try_into_bytes().map_err(|body| Self {
            body,
            lease,
            remaining,
            last,
        })
    }
}
