use std::future::{ready, Ready};

use actix_web::{dev::Payload, FromRequest, HttpMessage, HttpRequest, HttpResponse, ResponseError};

use crate::rejection::MissingLease;
use crate::LeaseHandle;

/// `LeaseHandle` is an actix-web extractor: the lock
/// [`RedlockMiddleware`](crate::RedlockMiddleware) holds for this request. Use
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

impl ResponseError for crate::fenced::StaleToken {
    fn status_code(&self) -> actix_web::http::StatusCode {
        actix_web::http::StatusCode::CONFLICT
    }

    fn error_response(&self) -> HttpResponse {
        super::glue::rejection_response(self.to_problem_json())
    }
}

impl ResponseError for MissingLease {
    fn status_code(&self) -> actix_web::http::StatusCode {
        actix_web::http::StatusCode::INTERNAL_SERVER_ERROR
    }

    fn error_response(&self) -> HttpResponse {
        super::glue::rejection_response(self.to_problem_json())
    }
}
