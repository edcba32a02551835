use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use pin_project::pin_project;

/// The request body the inner service of [`RedlockService`](super::RedlockService) gets: the
/// client's body as it arrives, or — when a [replay](crate::replay) policy
/// fingerprinted it — the same bytes, buffered (trailers are not kept).
///
/// axum's routers and tonic's services accept any body, so this changes nothing for them; a
/// hand-written inner service takes `Request<RequestBody<B>>`.
#[pin_project]
pub struct RequestBody<B> {
    #[pin]
    kind: Kind<B>,
}

#[pin_project(project = KindProj)]
enum Kind<B> {
    Streamed(#[pin] B),
    Buffered(Option<Bytes>),
}

impl<B> RequestBody<B> {
    /// The client's body, streamed.
    pub fn new(body: B) -> Self {
        Self {
            kind: Kind::Streamed(body),
        }
    }

    /// A body that was read whole.
    pub fn buffered(bytes: Bytes) -> Self {
        Self {
            kind: Kind::Buffered(Some(bytes)),
        }
    }

    /// The client's body if it is still streamed, else the buffered bytes.
    pub(crate) fn into_streamed(self) -> Result<B, Bytes> {
        match self.kind {
            Kind::Streamed(body) => Ok(body),
            Kind::Buffered(bytes) => Err(bytes.unwrap_or_default()),
        }
    }

    /// Whether the body was buffered (for a replay fingerprint).
    pub fn is_buffered(&self) -> bool {
        matches!(self.kind, Kind::Buffered(_))
    }
}

impl<B> std::fmt::Debug for RequestBody<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RequestBody")
            .field("buffered", &self.is_buffered())
            .finish_non_exhaustive()
    }
}

impl<B> Body for RequestBody<B>
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
            KindProj::Streamed(body) => body.poll_frame(cx),
            KindProj::Buffered(bytes) => Poll::Ready(
                bytes
                    .take()
                    .filter(|b| !b.is_empty())
                    .map(|b| Ok(Frame::data(B::Data::from(b)))),
            ),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.kind {
            Kind::Streamed(body) => body.is_end_stream(),
            Kind::Buffered(bytes) => bytes.as_ref().is_none_or(Bytes::is_empty),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.kind {
            Kind::Streamed(body) => body.size_hint(),
            Kind::Buffered(bytes) => {
                SizeHint::with_exact(bytes.as_ref().map_or(0, |b| b.len() as u64))
            }
        }
    }
}
