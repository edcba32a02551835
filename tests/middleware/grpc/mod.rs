//! gRPC answers with a real tonic server and client over real masters: `RedlockLayer` on
//! `tonic::transport::Server::builder().layer(..)`, keyed by the `idempotency-key` metadata and
//! scoped by the gRPC method. Every test name contains `grpc`.
//!
//! - [`answers`]: a held key is `ABORTED` with a retry hint, an unreachable quorum
//!   `UNAVAILABLE`, a bad key `INVALID_ARGUMENT`; a plain HTTP request to the same layer still
//!   gets problem+json; another service of the server (a health check) passes through
//!   unlocked with a key extractor that gives it no key; replay on gRPC;
//! - [`parity`] (feature `actix`): actix-web answers a gRPC request as tower does.
//!
//! The tonic services are in [`service`] (`shop.Payments` and `grpc.health.v1.Health`,
//! written by hand as tonic's codegen would), the server they run in in [`server`].

use tower_redlock_testkit as support;

mod answers;
#[cfg(feature = "actix")]
mod parity;
mod server;
mod service;

use std::time::Duration;

use tonic::Status;
use tower_redlock::key::{IdempotencyKey, KeyExtractor, KeyExtractorExt, SimpleRequest};
use tower_redlock::policy::{LockPolicy, LockPolicyBuilder};
use tower_redlock::Redlock;

use service::PayReply;

const TTL: Duration = Duration::from_secs(10);
const PAY: &str = "/shop.Payments/Pay";
const REFUND: &str = "/shop.Payments/Refund";
const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";

/// The policy of these tests: `idempotency-key` metadata, scoped by method.
fn policy_of(redlock: &Redlock) -> LockPolicyBuilder {
    LockPolicy::builder(
        redlock.clone(),
        IdempotencyKey::required().scoped_by_grpc_method(),
    )
    .ttl(TTL)
}

/// The Redis key of a call of `method` with `key`: the `idempotency-key` header, as the
/// metadata arrives.
fn redis_key(method: &str, key: &str) -> String {
    let req = SimpleRequest::new("POST", method)
        .header("content-type", "application/grpc")
        .header("idempotency-key", key);
    IdempotencyKey::required()
        .scoped_by_grpc_method()
        .extract(&req)
        .expect("a valid key")
        .expect("a key")
        .as_str()
        .to_owned()
}

/// The status of a call that must fail.
fn refused(result: Result<tonic::Response<PayReply>, Status>) -> Status {
    match result {
        Err(status) => status,
        Ok(reply) => panic!("expected a refusal, got {:?}", reply.get_ref()),
    }
}

fn meta<'a>(status: &'a Status, name: &str) -> Option<&'a str> {
    status.metadata().get(name).and_then(|v| v.to_str().ok())
}

/// `retry-after` (s) and `grpc-retry-pushback-ms`: present, the same delay (seconds rounded
/// up, milliseconds rounded up), at most `max`.
fn assert_retry_hint(status: &Status, max: Duration) {
    let secs: u64 = meta(status, "retry-after")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no retry-after: {status:?}"));
    let ms: u64 = meta(status, "grpc-retry-pushback-ms")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no grpc-retry-pushback-ms: {status:?}"));
    assert!((1..=max.as_secs()).contains(&secs), "retry-after {secs}");
    assert!(
        ms > 0 && ms <= secs * 1000 && ms > (secs - 1) * 1000,
        "pushback {ms} ms, retry-after {secs} s: {status:?}"
    );
}
