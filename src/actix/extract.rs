use std::future::{ready, Ready};

use actix_web::{dev::Payload, FromRequest, HttpMessage, HttpRequest, HttpResponse, ResponseError};

use crate::LeaseHandle;

/// `LeaseHandle` is an actix-web extractor: the lock
/// [`RedlockMiddleware`](super::RedlockMiddleware) holds for this request. Use
/// `Option<LeaseHandle>` where the request may run without a lock.
impl FromRequest for LeaseHandle {
    type Error = MissingLease;
    type Future = Ready<Result<Self, Self::Error>>;

    fn from_request(req: &HttpRequest, _payload: &mut Payload) -> Self::Future {
        ready(
            req.extensions()
                .get::<LeaseHandle>()
                .cloned()
                .ok_or(MissingLease),
        )
    }
}

/// The rejection of the [`LeaseHandle`] extractor when no lock is held for the request: the
/// route is not behind a `RedlockMiddleware`, the request had no key, or the middleware
/// failed open. Answers `500` (a server misconfiguration, not the client's fault).
#[derive(Debug, Clone, Copy)]
pub struct MissingLease;

impl std::fmt::Display for MissingLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(
            "no lock is held for this request: the route is not behind a RedlockMiddleware, \
             the request had no key, or the middleware failed open",
        )
    }
}

impl ResponseError for MissingLease {
    fn error_response(&self) -> HttpResponse {
        HttpResponse::InternalServerError()
            .content_type("application/problem+json")
            .body(format!(
                "{{\"type\":\"/problems/lock-missing\",\"title\":\"No lock held\",\"status\":500,\"detail\":\"{self}\"}}"
            ))
    }
}
