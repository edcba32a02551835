//! The tower glue of the request flow (`http::flow`): `http` 1.x requests and responses,
//! `http_body` bodies.

use std::future::poll_fn;
use std::marker::PhantomData;

use bytes::{Buf, Bytes};
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use tower_service::Service;

use super::{LeaseBody, RequestBody};
use crate::middleware::flow::{FullResponse, Glue};
use crate::middleware::watch::LossWatch;
use crate::policy::Unlocked;
use crate::rejection::{RejectionKind, RejectionResponse};
use crate::replay::Collector;
use crate::{Lease, LeaseHandle};

/// The inner service, as the flow calls it.
pub(crate) struct Tower<S, ReqBody>(pub(crate) S, PhantomData<fn(ReqBody)>);

impl<S, ReqBody> Tower<S, ReqBody> {
    pub(crate) fn new(inner: S) -> Self {
        Self(inner, PhantomData)
    }
}

/// The flow's answer; the response future makes it a `Response<LeaseBody<_>>`.
pub(crate) enum Answer<R> {
    /// The inner service's response, holding the lease to its body's end if there is one
    /// (watched for its loss when the policy may abort).
    Pass(R, Option<Lease>, Option<LossWatch>),
    /// A response whose body is these bytes: a stored or replayed response, or a rejection.
    Full(http::response::Parts, Bytes),
}

impl<B: Body> Answer<Response<B>> {
    pub(crate) fn into_response(self) -> Response<LeaseBody<B>> {
        match self {
            Self::Pass(res, lease, watch) => res.map(|b| LeaseBody::new(b, lease, watch)),
            Self::Full(head, body) => Response::from_parts(head, LeaseBody::full(body)),
        }
    }
}

/// The middleware's own answer as an `http` 1.x response head and body.
fn full_head(res: FullResponse) -> (http::response::Parts, Bytes) {
    let mut head = Response::new(()).into_parts().0;
    head.status = StatusCode::from_u16(res.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    for (name, value) in res.headers {
        // Checked when made or stored: a name or value that does not convert was damaged.
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_maybe_shared(value),
        ) {
            head.headers.append(n, v);
        }
    }
    (head, res.body)
}

/// A neutral rejection as an `http` 1.x response.
pub(crate) fn rejection_response<B: Body>(r: RejectionResponse) -> Response<LeaseBody<B>> {
    let (head, body) = full_head(FullResponse::rejection(r));
    Response::from_parts(head, LeaseBody::full(body))
}

/// Reads a body whole, up to `limit` bytes (trailers are dropped).
async fn collect<B: Body>(body: B, limit: usize) -> Result<Bytes, RejectionKind> {
    let mut body = std::pin::pin!(body);
    let mut collector = Collector::new(limit);
    while let Some(frame) = poll_fn(|cx| body.as_mut().poll_frame(cx)).await {
        let frame = frame.map_err(|_| RejectionKind::BodyUnreadable)?;
        if let Ok(mut data) = frame.into_data() {
            let chunk = data.copy_to_bytes(data.remaining());
            collector
                .push(chunk)
                .map_err(|_| RejectionKind::BodyTooLarge)?;
        }
    }
    Ok(collector.finish())
}

impl<S, ReqBody, ResBody> Glue for Tower<S, ReqBody>
where
    S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>>,
    ReqBody: Body,
    ResBody: Body,
{
    type Request = Request<RequestBody<ReqBody>>;
    type Response = Response<ResBody>;
    type Head = http::response::Parts;
    type Body = ResBody;
    type Output = Answer<Response<ResBody>>;
    type Error = S::Error;

    fn content_length(req: &Self::Request) -> Option<u64> {
        let value = req.headers().get(http::header::CONTENT_LENGTH)?;
        value.to_str().ok()?.parse().ok()
    }

    async fn buffer_body(req: &mut Self::Request, limit: usize) -> Result<Bytes, RejectionKind> {
        let body = std::mem::replace(req.body_mut(), RequestBody::buffered(Bytes::new()));
        let bytes = match body.into_streamed() {
            Ok(streamed) => collect(streamed, limit).await?,
            Err(buffered) => buffered,
        };
        *req.body_mut() = RequestBody::buffered(bytes.clone());
        Ok(bytes)
    }

    fn lend(req: &mut Self::Request, handle: LeaseHandle, fencing: Option<(&str, u64)>) {
        if let Some((name, token)) = fencing {
            let name = HeaderName::from_bytes(name.as_bytes());
            let name = name.expect("checked when the policy was built");
            req.headers_mut().insert(name, HeaderValue::from(token));
        }
        req.extensions_mut().insert(handle);
    }

    fn lend_row(req: &mut Self::Request, row: crate::durable::KeyRow) {
        req.extensions_mut().insert(row);
    }

    fn unlocked(req: &mut Self::Request) {
        req.extensions_mut().insert(Unlocked);
    }

    fn call(
        &mut self,
        req: Self::Request,
    ) -> impl std::future::Future<Output = Result<Self::Response, Self::Error>> {
        self.0.call(req)
    }

    fn status(res: &Self::Response) -> u16 {
        res.status().as_u16()
    }

    fn headers(res: &Self::Response) -> impl Iterator<Item = (&str, &[u8])> {
        res.headers()
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_bytes()))
    }

    fn head_headers(head: &Self::Head) -> impl Iterator<Item = (&str, &[u8])> {
        head.headers.iter().map(|(n, v)| (n.as_str(), v.as_bytes()))
    }

    fn body_len(res: &Self::Response) -> Option<u64> {
        res.body().size_hint().exact()
    }

    fn body_to_send(res: &Self::Response) -> bool {
        !res.body().is_end_stream()
    }

    fn add_header(res: &mut Self::Response, name: &'static str, value: &'static str) {
        res.headers_mut()
            .insert(name, HeaderValue::from_static(value));
    }

    fn pass(res: Self::Response, lease: Option<Lease>, watch: Option<LossWatch>) -> Self::Output {
        Answer::Pass(res, lease, watch)
    }

    fn split(res: Self::Response) -> (Self::Head, Self::Body) {
        res.into_parts()
    }

    async fn collect(body: Self::Body, limit: usize) -> Option<Bytes> {
        collect(body, limit).await.ok()
    }

    fn rebuild(head: Self::Head, body: Bytes) -> Self::Output {
        Answer::Full(head, body)
    }

    fn server_error(mut head: Self::Head) -> Self::Output {
        head.status = StatusCode::INTERNAL_SERVER_ERROR;
        head.headers.clear();
        Answer::Full(head, Bytes::new())
    }

    fn full(_: Self::Request, res: FullResponse) -> Self::Output {
        let (head, body) = full_head(res);
        Answer::Full(head, body)
    }

    fn replace(_: Self::Response, answer: FullResponse) -> Self::Output {
        let (head, body) = full_head(answer);
        Answer::Full(head, body)
    }

    fn answer_dropped(res: FullResponse) -> Result<Self::Output, Self::Error> {
        let (head, body) = full_head(res);
        Ok(Answer::Full(head, body))
    }
}
