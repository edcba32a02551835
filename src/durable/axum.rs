//! Durable replay's axum face (feature `axum`): [`KeyRow`] as an extractor, [`RowError`] as a
//! response.

use axum::extract::FromRequestParts;
use axum::response::{IntoResponse, Response};
use http::request::Parts;

use super::{KeyRow, RowError};
use crate::rejection::MissingLease;

/// `KeyRow` is an axum extractor under [durable replay](crate::durable): the key's row the
/// handler records in its transaction. A route without it (no durable replay on its
/// policy) is answered `500`: a wiring mistake, never a run without the row.
impl<S: Send + Sync> FromRequestParts<S> for KeyRow {
    type Rejection = MissingLease;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        parts
            .extensions
            .get::<KeyRow>()
            .cloned()
            .ok_or(MissingLease)
    }
}

/// A handler may return a [`RowError`] as its answer: a key
/// whose row committed before, or a busy row, is answered by the middleware in its place
/// (from the row, or `409` + `Retry-After`); any other is a `500` (nothing committed, so a
/// retry runs).
impl IntoResponse for RowError {
    fn into_response(self) -> Response {
        tracing::warn!(error = %self, "the key's row failed");
        http::StatusCode::INTERNAL_SERVER_ERROR.into_response()
    }
}
