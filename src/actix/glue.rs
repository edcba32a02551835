//! The actix-web glue of the request flow (`http::flow`): `ServiceRequest`,
//! `ServiceResponse` and `MessageBody`.

use std::future::poll_fn;
use std::pin::pin;
use std::rc::Rc;

use actix_web::body::{BodySize, BoxBody, EitherBody, MessageBody};
use actix_web::dev::{Payload, Service, ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue, CONTENT_LENGTH};
use actix_web::http::StatusCode;
use actix_web::{HttpMessage, HttpRequest, HttpResponse};
use bytes::Bytes;
use futures_util::StreamExt;

use super::LeaseBody;
use crate::middleware::flow::{FullResponse, Glue};
use crate::middleware::watch::LossWatch;
use crate::policy::Unlocked;
use crate::rejection::{RejectionKind, RejectionResponse};
use crate::replay::Collector;
use crate::{Lease, LeaseHandle};

/// The inner service, as the flow calls it.
pub(crate) struct Actix<S>(pub(crate) Rc<S>);

/// The middleware's own answer as an actix-web response.
fn full_response(res: FullResponse) -> HttpResponse<BoxBody> {
    let status = StatusCode::from_u16(res.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut builder = HttpResponse::build(status);
    for (name, value) in res.headers {
        // Checked when made or stored: a name or value that does not convert was damaged.
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_maybe_shared(value),
        ) {
            builder.append_header((n, v));
        }
    }
    builder.body(res.body)
}

/// A neutral rejection as an actix-web response.
pub(crate) fn rejection_response(r: RejectionResponse) -> HttpResponse<BoxBody> {
    full_response(FullResponse::rejection(r))
}

/// The size of a response body, when it is known.
fn known_len(res: &HttpResponse<impl MessageBody>) -> Option<u64> {
    match res.body().size() {
        BodySize::None => Some(0),
        BodySize::Sized(n) => Some(n),
        BodySize::Stream => None,
    }
}

impl<S, B> Glue for Actix<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: MessageBody + 'static,
{
    type Request = ServiceRequest;
    type Response = ServiceResponse<B>;
    type Head = (HttpRequest, HttpResponse<()>);
    type Body = B;
    type Output = ServiceResponse<EitherBody<LeaseBody<B>>>;
    type Error = actix_web::Error;

    fn content_length(req: &Self::Request) -> Option<u64> {
        req.headers()
            .get(CONTENT_LENGTH)?
            .to_str()
            .ok()?
            .parse()
            .ok()
    }

    async fn buffer_body(req: &mut Self::Request, limit: usize) -> Result<Bytes, RejectionKind> {
        let mut payload = req.take_payload();
        let mut collector = Collector::new(limit);
        while let Some(chunk) = payload.next().await {
            let chunk = chunk.map_err(|_| RejectionKind::BodyUnreadable)?;
            collector
                .push(chunk)
                .map_err(|_| RejectionKind::BodyTooLarge)?;
        }
        let bytes = collector.finish();
        req.set_payload(Payload::from(bytes.clone()));
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

    fn head_headers((_, head): &Self::Head) -> impl Iterator<Item = (&str, &[u8])> {
        head.headers()
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_bytes()))
    }

    fn body_len(res: &Self::Response) -> Option<u64> {
        known_len(res.response())
    }

    fn body_to_send(res: &Self::Response) -> bool {
        known_len(res.response()) != Some(0)
    }

    fn add_header(res: &mut Self::Response, name: &'static str, value: &'static str) {
        res.headers_mut().insert(
            HeaderName::from_static(name),
            HeaderValue::from_static(value),
        );
    }

    fn pass(res: Self::Response, lease: Option<Lease>, watch: Option<LossWatch>) -> Self::Output {
        res.map_body(|_, b| LeaseBody::new(b, lease, watch))
            .map_into_left_body()
    }

    fn split(res: Self::Response) -> (Self::Head, Self::Body) {
        let (req, res) = res.into_parts();
        let (head, body) = res.into_parts();
        ((req, head), body)
    }

    async fn collect(body: Self::Body, limit: usize) -> Option<Bytes> {
        let mut body = pin!(body);
        let mut collector = Collector::new(limit);
        while let Some(chunk) = poll_fn(|cx| body.as_mut().poll_next(cx)).await {
            collector.push(chunk.ok()?).ok()?;
        }
        Some(collector.finish())
    }

    fn rebuild((req, head): Self::Head, body: Bytes) -> Self::Output {
        let res = head.set_body(BoxBody::new(body));
        ServiceResponse::new(req, res).map_into_right_body()
    }

    fn server_error((req, _): Self::Head) -> Self::Output {
        let res = HttpResponse::InternalServerError().finish();
        ServiceResponse::new(req, res).map_into_right_body()
    }

    fn full(req: Self::Request, res: FullResponse) -> Self::Output {
        req.into_response(full_response(res)).map_into_right_body()
    }

    fn replace(res: Self::Response, answer: FullResponse) -> Self::Output {
        let (req, _) = res.into_parts();
        ServiceResponse::new(req, full_response(answer)).map_into_right_body()
    }

    fn answer_dropped(res: FullResponse) -> Result<Self::Output, Self::Error> {
        let response = full_response(res);
        let cause = "the request's lock was lost and its handler stopped";
        Err(actix_web::error::InternalError::from_response(cause, response).into())
    }
}
