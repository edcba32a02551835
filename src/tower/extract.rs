//! The lease as an axum extractor (feature `axum`).

use std::convert::Infallible;

use axum::extract::{FromRequestParts, OptionalFromRequestParts};
use axum::response::{IntoResponse, Response};
use http::request::Parts;

use crate::rejection::MissingLease;
use crate::LeaseHandle;

/// `LeaseHandle` is an axum extractor: the lock [`RedlockLayer`](crate::RedlockLayer) holds
/// for this request. Use `Option<LeaseHandle>` where the request may run without a lock
/// (an optional key, or fail-open).
///
/// ```
/// use tower_redlock::LeaseHandle;
///
/// async fn handler(lease: LeaseHandle) -> String {
///     format!("{} valid for {:?}", lease.resource(), lease.validity())
/// }
/// async fn maybe_locked(lease: Option<LeaseHandle>) -> &'static str {
///     if lease.is_some() { "locked" } else { "unlocked" }
/// }
/// # let _ = axum::Router::<()>::new()
/// #     .route("/a", axum::routing::post(handler))
/// #     .route("/b", axum::routing::post(maybe_locked));
/// ```
impl<S: Send + Sync> FromRequestParts<S> for LeaseHandle {
    type Rejection = MissingLease;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<LeaseHandle>()
            .cloned()
            .ok_or(MissingLease)
    }
}

impl<S: Send + Sync> OptionalFromRequestParts<S> for LeaseHandle {
    type Rejection = Infallible;

    async fn from_request_parts(
        parts: &mut Parts,
        _state: &S,
    ) -> Result<Option<Self>, Self::Rejection> {
        Ok(parts.extensions.get::<LeaseHandle>().cloned())
    }
}

impl IntoResponse for crate::fenced::StaleToken {
    fn into_response(self) -> Response {
        super::glue::rejection_response::<axum::body::Body>(self.to_problem_json())
            .map(axum::body::Body::new)
    }
}

impl IntoResponse for MissingLease {
    fn into_response(self) -> Response {
        super::glue::rejection_response::<axum::body::Body>(self.to_problem_json())
            .map(axum::body::Body::new)
    }
}
