//! Durable replay's actix-web face (feature `actix`): [`KeyRow`] as an extractor, [`RowError`]
//! as a response — the same answers as the axum face's.

use std::future::{ready, Ready};

use actix_web::{dev::Payload, FromRequest, HttpMessage, HttpRequest, HttpResponse, ResponseError};

use super::{KeyRow, RowError};
use crate::rejection::MissingLease;

/// `KeyRow` is an actix-web extractor under [durable replay](crate::durable): the key's row
/// the handler records in its transaction. A route without it (no durable replay on its
/// policy) is answered `500`: a wiring mistake, never a run without the row.
impl FromRequest for KeyRow {
    type Error = MissingLease;
    type Future = Ready<Result<Self, Self::Error>>;

    fn from_request(req: &HttpRequest, _payload: &mut Payload) -> Self::Future {
        ready(
            req.extensions()
                .get::<KeyRow>()
                .cloned()
                .ok_or(MissingLease),
        )
    }
}

/// A handler may return a [`RowError`] as its error: a key whose row committed before, or a
/// busy row, is answered by the middleware in its place (from the row, or `409` +
/// `Retry-After`); any other is a `500` with no body, as on axum (nothing committed, so a
/// retry runs).
impl ResponseError for RowError {
    fn status_code(&self) -> actix_web::http::StatusCode {
        actix_web::http::StatusCode::INTERNAL_SERVER_ERROR
    }

    fn error_response(&self) -> HttpResponse {
        tracing::warn!(error = %self, "the key's row failed");
        HttpResponse::InternalServerError().finish()
    }
}
