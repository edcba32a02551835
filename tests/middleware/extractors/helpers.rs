//! Requests and extraction shorthands shared by the test modules.

use tower_redlock::key::{KeyExtractor, KeyRejection, LockKey, SimpleRequest};

/// A raw key value that must never be shown by a key or a rejection.
pub const SECRET: &str = "SECRET-zebra-4242";

pub fn post(path: &str) -> SimpleRequest {
    SimpleRequest::new("POST", path)
}

pub fn idem(value: impl AsRef<[u8]>) -> SimpleRequest {
    post("/payments").header("idempotency-key", value)
}

pub fn extract(
    e: &impl KeyExtractor,
    req: &SimpleRequest,
) -> Result<Option<LockKey>, KeyRejection> {
    e.extract(req)
}

pub fn key(e: &impl KeyExtractor, req: &SimpleRequest) -> LockKey {
    match e.extract(req) {
        Ok(Some(key)) => key,
        other => panic!("expected a key, got {other:?}"),
    }
}

pub fn reject(e: &impl KeyExtractor, req: &SimpleRequest) -> KeyRejection {
    match e.extract(req) {
        Err(rejection) => rejection,
        other => panic!("expected a rejection, got {other:?}"),
    }
}
