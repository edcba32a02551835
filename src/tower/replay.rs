//! The tower glue of a [replay](crate::replay) policy: buffer and fingerprint the
//! request body, claim the key, replay or run, then store the response. The decisions are
//! shared with actix-web (`http::replay`); only the body reading and the `http` 1.x types
//! are here.

use std::future::poll_fn;
use std::time::Instant;

use bytes::{Buf, Bytes};
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use tower_service::Service;

use super::future::rejection_head;
use super::RequestBody;
use crate::http::replay::FingerprintBuilder;
use crate::http::{
    AfterResponse, Collector, Decision, KeptAlive, LockKey, LockPolicy, Plan, RejectionKind,
    Running, StoredResponse, Unlocked, Wire, REPLAYED_HEADER,
};
use crate::Lease;

/// What the replay flow answers with; the response future turns it into its response type.
pub(crate) enum Replayed<R> {
    /// The inner service's response, as it is.
    Inner(R),
    /// The inner service's response, holding the lease to its body's end.
    Held(R, Lease),
    /// A response whose body is these bytes: a stored or replayed response, or a rejection.
    Full(http::response::Parts, Bytes),
}

impl<R> Replayed<R> {
    fn rejection(policy: &LockPolicy, kind: RejectionKind, wire: Wire) -> Self {
        let (head, body) = rejection_head(policy.reject(kind, wire));
        Self::Full(head, body)
    }
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

/// The replayed response: status, stored headers, `Idempotency-Replayed: true`, body.
fn replay_head(stored: StoredResponse) -> (http::response::Parts, Bytes) {
    let mut res = Response::new(());
    *res.status_mut() = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    let headers = res.headers_mut();
    for (name, value) in stored.headers {
        // Stored from a valid response: a name or value that does not convert was damaged.
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_maybe_shared(value),
        ) {
            headers.append(n, v);
        }
    }
    headers.insert(
        HeaderName::from_static(REPLAYED_HEADER),
        HeaderValue::from_static("true"),
    );
    (res.into_parts().0, stored.body)
}

/// The exact length of a body, if it is known.
fn exact_len<B: Body>(body: &B) -> Option<u64> {
    let hint = body.size_hint();
    hint.exact()
}

/// The whole replay flow for one keyed request: `fingerprint` is the fingerprint of all but
/// the body and the body limit (`None`: the body is not fingerprinted).
pub(crate) async fn call<S, ReqBody, ResBody>(
    policy: LockPolicy,
    key: LockKey,
    (fingerprint, body_limit): (FingerprintBuilder, Option<usize>),
    fencing: Option<http::HeaderName>,
    wire: Wire,
    mut inner: S,
    req: Request<ReqBody>,
) -> Result<Replayed<Response<ResBody>>, S::Error>
where
    S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>>,
    ReqBody: Body,
    ResBody: Body,
{
    let (mut parts, body) = req.into_parts();
    let (fingerprint, body) = match body_limit {
        None => (fingerprint.finish(None), RequestBody::new(body)),
        Some(limit) => {
            let declared = parts
                .headers
                .get(http::header::CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
            if declared.is_some_and(|len| len > limit as u64) {
                return Ok(Replayed::rejection(
                    &policy,
                    RejectionKind::BodyTooLarge,
                    wire,
                ));
            }
            match collect(body, limit).await {
                Ok(bytes) => (
                    fingerprint.finish(Some(&bytes)),
                    RequestBody::buffered(bytes),
                ),
                Err(kind) => return Ok(Replayed::rejection(&policy, kind, wire)),
            }
        }
    };
    let (lease, recorder) = match policy.clone().acquire(key, Some(fingerprint), wire).await {
        Decision::Reject(r) => {
            let (head, body) = rejection_head(r);
            return Ok(Replayed::Full(head, body));
        }
        Decision::Replay(stored) => {
            let (head, body) = replay_head(stored);
            return Ok(Replayed::Full(head, body));
        }
        Decision::Unlocked => {
            parts.extensions.insert(Unlocked);
            let res = inner.call(Request::from_parts(parts, body)).await?;
            return Ok(Replayed::Inner(res));
        }
        Decision::Locked(lease, recorder) => {
            if let (Some(name), Some(token)) = (fencing, lease.fencing_token()) {
                parts.headers.insert(name, http::HeaderValue::from(token));
            }
            parts.extensions.insert(lease.handle());
            (lease, recorder)
        }
    };
    let due = Instant::now() + lease.ttl() / 3;
    let keep_alive = policy.keeps_alive();
    // From here a cancelled request marks the key completed (see `Running`).
    let mut running = Running::new(lease, recorder);
    let call = inner.call(Request::from_parts(parts, body));
    let res = match KeptAlive::new(call, running.lease_mut(), keep_alive).await {
        Ok(res) => res,
        Err(e) => {
            // The handler may have run: at most once, so the key is marked completed.
            running.finish_unstored().await;
            return Err(e);
        }
    };
    let status = res.status().as_u16();
    let plan = running.recorder().map_or(Plan::Release, |recorder| {
        let headers = res.headers().iter();
        let headers = headers.map(|(n, v)| (n.as_str(), v.as_bytes()));
        recorder.plan_response(status, headers, exact_len(res.body()))
    });
    match plan {
        Plan::Release => {
            let body_to_send = !res.body().is_end_stream();
            match AfterResponse::decide(running.into_lease(), policy.release_on(), body_to_send) {
                AfterResponse::HoldToBodyEnd(mut lease) => {
                    if keep_alive {
                        lease.keep_alive_from(due);
                    }
                    Ok(Replayed::Held(res, lease))
                }
                AfterResponse::ReleaseNow(lease) => {
                    crate::http::release(lease).await;
                    Ok(Replayed::Inner(res))
                }
            }
        }
        Plan::MarkCompleted => {
            running.finish_unstored().await;
            Ok(Replayed::Inner(res))
        }
        Plan::Store { body_len } => {
            let (mut head, body) = res.into_parts();
            // Bounded by the lease: a body that takes longer is not waited for.
            let until = running.lease_mut().deadline();
            match tokio::time::timeout_at(until.into(), collect(body, body_len)).await {
                Ok(Ok(bytes)) => {
                    let record = running.recorder().map(|recorder| {
                        let headers = head.headers.iter();
                        let headers = headers.map(|(n, v)| (n.as_str(), v.as_bytes()));
                        recorder.response(status, headers, &bytes)
                    });
                    running
                        .complete(record.expect("a plan to store has a recorder"))
                        .await;
                    Ok(Replayed::Full(head, bytes))
                }
                Ok(Err(_)) | Err(_) => {
                    // The handler ran but its response failed (or outlasted the lease):
                    // nothing to replay, and it must not run again.
                    tracing::warn!(
                        "the response body failed while it was read for replay: key marked completed, answered 500"
                    );
                    running.finish_unstored().await;
                    head.status = StatusCode::INTERNAL_SERVER_ERROR;
                    head.headers.clear();
                    Ok(Replayed::Full(head, Bytes::new()))
                }
            }
        }
    }
}
