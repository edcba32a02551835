//! One keyed request through actix-web: (with [replay](crate::replay) on, buffer and
//! fingerprint the body,) claim the key, run the handler or answer for it, then release —
//! or store the response. The decisions are shared with tower (`http::policy`,
//! `http::release`, `http::replay`); only the body reading and actix-web's types are here.

use std::future::poll_fn;
use std::pin::pin;
use std::time::Instant;

use actix_web::body::{BodySize, BoxBody, EitherBody, MessageBody};
use actix_web::dev::{Payload, Service, ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue, CONTENT_LENGTH};
use actix_web::http::StatusCode;
use actix_web::{HttpMessage, HttpResponse};
use bytes::Bytes;
use futures_util::StreamExt;

use super::middleware::rejection_response;
use super::LeaseBody;
use crate::http::replay::FingerprintBuilder;
use crate::http::{
    AfterResponse, Collector, Decision, KeptAlive, LockKey, LockPolicy, Plan, RejectionKind,
    Running, StoredResponse, Unlocked, Wire, REPLAYED_HEADER,
};

type Answer<B> = ServiceResponse<EitherBody<LeaseBody<B>>>;

/// Reads the request body whole, up to `limit` bytes.
async fn collect_request(req: &mut ServiceRequest, limit: usize) -> Result<Bytes, RejectionKind> {
    let mut payload = req.take_payload();
    let mut collector = Collector::new(limit);
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|_| RejectionKind::BodyUnreadable)?;
        collector
            .push(chunk)
            .map_err(|_| RejectionKind::BodyTooLarge)?;
    }
    Ok(collector.finish())
}

/// Reads a response body whole, up to `limit` bytes.
async fn collect_response<B: MessageBody>(body: B, limit: usize) -> Option<Bytes> {
    let mut body = pin!(body);
    let mut collector = Collector::new(limit);
    while let Some(chunk) = poll_fn(|cx| body.as_mut().poll_next(cx)).await {
        collector.push(chunk.ok()?).ok()?;
    }
    Some(collector.finish())
}

/// The replayed response: status, stored headers, `Idempotency-Replayed: true`, body.
fn replay_response(stored: StoredResponse) -> HttpResponse<BoxBody> {
    let status = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    let mut res = HttpResponse::build(status);
    for (name, value) in stored.headers {
        // Stored from a valid response: a name or value that does not convert was damaged.
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_maybe_shared(value),
        ) {
            res.append_header((n, v));
        }
    }
    res.insert_header((
        HeaderName::from_static(REPLAYED_HEADER),
        HeaderValue::from_static("true"),
    ));
    res.body(stored.body)
}

/// The whole flow for one keyed request; `fingerprint`: replay is on (with the body limit,
/// `None`: the body is not fingerprinted).
pub(crate) async fn call<S, B>(
    service: &S,
    policy: LockPolicy,
    key: LockKey,
    fingerprint: Option<(FingerprintBuilder, Option<usize>)>,
    wire: Wire,
    mut req: ServiceRequest,
) -> Result<Answer<B>, actix_web::Error>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error>,
    B: MessageBody + 'static,
{
    let reject = |req: ServiceRequest, kind| {
        Ok(req
            .into_response(rejection_response(policy.reject(kind, wire)))
            .map_into_right_body())
    };
    let fingerprint = match fingerprint {
        None => None,
        Some((fingerprint, None)) => Some(fingerprint.finish(None)),
        Some((fingerprint, Some(limit))) => {
            let declared = req
                .headers()
                .get(CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
            if declared.is_some_and(|len| len > limit as u64) {
                return reject(req, RejectionKind::BodyTooLarge);
            }
            match collect_request(&mut req, limit).await {
                Ok(bytes) => {
                    let fingerprint = fingerprint.finish(Some(&bytes));
                    req.set_payload(Payload::from(bytes));
                    Some(fingerprint)
                }
                Err(kind) => return reject(req, kind),
            }
        }
    };
    let (lease, recorder) = match policy.clone().acquire(key, fingerprint, wire).await {
        Decision::Reject(r) => {
            return Ok(req
                .into_response(rejection_response(r))
                .map_into_right_body())
        }
        Decision::Replay(stored) => {
            return Ok(req
                .into_response(replay_response(stored))
                .map_into_right_body())
        }
        Decision::Unlocked => {
            req.extensions_mut().insert(Unlocked);
            let res = service.call(req).await?;
            return Ok(res
                .map_body(|_, b| LeaseBody::new(b, None))
                .map_into_left_body());
        }
        Decision::Locked(lease, recorder) => {
            if let (Some(name), Some(token)) = (policy.fencing_header(), lease.fencing_token()) {
                let name = HeaderName::from_bytes(name.as_bytes())
                    .expect("checked when the policy was built");
                req.headers_mut().insert(name, HeaderValue::from(token));
            }
            req.extensions_mut().insert(lease.handle());
            (lease, recorder)
        }
    };
    // A cancelled request (with `h1_allow_half_closed(false)`, see the module docs) drops
    // `running` here: without replay that releases the lease in the background, with replay
    // it marks the key completed (see `Running`). The keep-alive starts only if the handler
    // outlives ttl/3.
    let due = Instant::now() + lease.ttl() / 3;
    let keep_alive = policy.keeps_alive();
    let mut running = Running::new(lease, recorder);
    let res = match KeptAlive::new(service.call(req), running.lease_mut(), keep_alive).await {
        Ok(res) => res,
        Err(e) => {
            // With replay the handler may have run: at most once, so the key is marked
            // completed; without, the lease is released.
            running.finish_unstored().await;
            return Err(e);
        }
    };
    let status = res.status().as_u16();
    let size = res.response().body().size();
    let plan = running.recorder().map_or(Plan::Release, |recorder| {
        let len = match size {
            BodySize::None => Some(0),
            BodySize::Sized(n) => Some(n),
            BodySize::Stream => None,
        };
        let headers = res.headers().iter();
        let headers = headers.map(|(n, v)| (n.as_str(), v.as_bytes()));
        recorder.plan_response(status, headers, len)
    });
    match plan {
        Plan::Release => {
            let body_to_send = !matches!(size, BodySize::None | BodySize::Sized(0));
            match AfterResponse::decide(running.into_lease(), policy.release_on(), body_to_send) {
                AfterResponse::HoldToBodyEnd(mut lease) => {
                    if keep_alive {
                        // On the handler's schedule (nothing if it already started).
                        lease.keep_alive_from(due);
                    }
                    Ok(res
                        .map_body(|_, b| LeaseBody::new(b, Some(lease)))
                        .map_into_left_body())
                }
                AfterResponse::ReleaseNow(lease) => {
                    crate::http::release(lease).await;
                    Ok(res
                        .map_body(|_, b| LeaseBody::new(b, None))
                        .map_into_left_body())
                }
            }
        }
        Plan::MarkCompleted => {
            running.finish_unstored().await;
            Ok(res
                .map_body(|_, b| LeaseBody::new(b, None))
                .map_into_left_body())
        }
        Plan::Store { body_len } => {
            let (req, res) = res.into_parts();
            let (head, body) = res.into_parts();
            // Bounded by the lease: a body that takes longer is not waited for.
            let until = running.lease_mut().deadline();
            let read = tokio::time::timeout_at(until.into(), collect_response(body, body_len));
            match read.await.ok().flatten() {
                Some(bytes) => {
                    let record = running.recorder().map(|recorder| {
                        let headers = head.headers().iter();
                        let headers = headers.map(|(n, v)| (n.as_str(), v.as_bytes()));
                        recorder.response(status, headers, &bytes)
                    });
                    running
                        .complete(record.expect("a plan to store has a recorder"))
                        .await;
                    let res = head.set_body(BoxBody::new(bytes));
                    Ok(ServiceResponse::new(req, res).map_into_right_body())
                }
                None => {
                    // The handler ran but its response failed (or outlasted the lease):
                    // nothing to replay, and it must not run again.
                    tracing::warn!(
                        "the response body failed while it was read for replay: key marked completed, answered 500"
                    );
                    running.finish_unstored().await;
                    let res = HttpResponse::InternalServerError().finish();
                    Ok(ServiceResponse::new(req, res).map_into_right_body())
                }
            }
        }
    }
}
