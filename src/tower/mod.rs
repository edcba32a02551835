//! The tower middleware [`RedlockLayer`](crate::RedlockLayer) (axum, hyper, tonic —
//! anything on `http` 1.x) and the types it is made of.
//!
//! For each request the layer derives a lock key with the policy's
//! [`KeyExtractor`](crate::key::KeyExtractor), takes the quorum lock before the inner
//! service runs, and releases it after — when the response is produced, or when its body has
//! been fully sent. When it cannot lock it answers for itself:
//!
//! | situation | answer |
//! | --- | --- |
//! | key held by another request | `409 Conflict`, `Retry-After` = holder's remaining ttl (s, rounded up, ≥ 1) |
//! | waiting enabled, deadline passed | `409` with `Retry-After` |
//! | quorum unreachable | `503`, `Retry-After`; or run unlocked (fail-open) |
//! | required key missing, malformed, too long | `400` |
//! | extractor returns "no key" | pass through without a lock |
//! | key already completed ([replay](crate::replay) on) | the stored response + `Idempotency-Replayed: true` |
//! | key reused with another request (replay on) | `422` |
//! | request body over the fingerprint limit (replay on) | `413` |
//!
//! Rejections are `application/problem+json` bodies (a gRPC call, e.g. from tonic, gets a
//! gRPC status instead: `ABORTED`, `UNAVAILABLE`, `INVALID_ARGUMENT`, …; see
//! [`grpc`](crate::grpc)), replaceable with
//! [`LockPolicyBuilder::responder`](crate::policy::LockPolicyBuilder::responder). The inner
//! error type is unchanged (axum's `Infallible` holds). The handler sees the lease as a
//! [`LeaseHandle`](crate::LeaseHandle) in the request extensions (and, with the `axum`
//! feature, as an extractor). If the request is cancelled, the lock is released in the
//! background — with [replay](crate::replay) on, once the handler has started, the key
//! is marked completed instead, so that it never runs twice.
//!
//! The inner service receives `Request<`[`RequestBody<B>`](RequestBody)`>`: the client's
//! body, or the same bytes buffered when a replay policy fingerprinted them. axum's routers
//! and tonic's services accept any body, so nothing changes for them.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_redlock::Error> {
//! use axum::{routing::post, Json, Router};
//! use tower_redlock::key::IdempotencyKey;
//! use tower_redlock::{LeaseHandle, Redlock, RedlockLayer};
//!
//! async fn pay(lease: LeaseHandle) -> Json<String> {
//!     Json(format!("charged under lock {}", lease.resource()))
//! }
//!
//! let redlock = Redlock::in_memory(); // Redlock::new([url1, url2, url3])? in production
//! // `route_layer`: only matched routes take the lock, so an unknown path answers 404
//! // and a wrong method 405, never 400 or 409.
//! let app: Router = Router::new()
//!     .route("/payments", post(pay))
//!     .route_layer(RedlockLayer::new(redlock, IdempotencyKey::required())?);
//! # let _ = app;
//! # Ok(()) }
//! ```

mod body;
#[cfg(feature = "axum")]
mod extract;
mod future;
mod glue;
pub(crate) mod layer;
mod request;
mod service;
mod view;

pub use self::body::LeaseBody;
pub use self::future::ResponseFuture;
pub use self::request::RequestBody;
pub use self::service::RedlockService;
pub(crate) use self::view::HttpRequestView;

#[cfg(test)]
mod assertions {
    use super::*;
    use crate::RedlockLayer;

    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}

    #[test]
    fn middleware_types_are_send_and_sync() {
        type Inner = tower::util::BoxCloneSyncService<
            http::Request<RequestBody<String>>,
            http::Response<String>,
            std::convert::Infallible,
        >;
        send_sync::<RedlockLayer>();
        send_sync::<RedlockService<Inner>>();
        send::<ResponseFuture<Inner, String>>();
        send::<LeaseBody<String>>();
    }
}
