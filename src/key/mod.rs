//! Lock keys from requests: what the middleware locks, read from a framework-neutral view
//! of the request, hashed before it reaches Redis, logs or `Debug` output.
//!
//! Nothing here depends on an HTTP framework or on either major version of the `http` crate: axum
//! 0.8 speaks `http` 1.x while actix-web 4 speaks `http` 0.2. So the glue for each framework adapts
//! its own request type to the small [`RequestView`] trait. Everything else is shared.
//!
//! # The flow
//!
//! ```text
//! framework request ──▶ RequestView ──▶ KeyExtractor ──▶ LockKey ──▶ Redlock
//!   (axum / actix)       (glue impl)     (built-ins,      (hashed,     (quorum
//!                                         combinators,     prefixed)    lock)
//!                                         closures)
//! ```
//!
//! 1. The glue wraps the framework's request in a [`RequestView`]: method,
//!    path, query, matched route, headers (raw bytes), route parameters, the
//!    peer address and, typed, the request's extensions (what an
//!    authentication layer put there).
//! 2. A [`KeyExtractor`] reads what it needs and answers with one of:
//!    * `Ok(Some(key))`: lock this [`LockKey`] around the handler;
//!    * `Ok(None)`: this request has no key, pass it through without a lock;
//!    * `Err(rejection)`: the key is missing, empty, too long, malformed or
//!      sent twice; the middleware answers `400 Bad Request` with a
//!      problem+json body built from [`KeyRejection::title`] and
//!      [`KeyRejection::detail`] (a gRPC call gets `INVALID_ARGUMENT`, see
//!      [`grpc`](crate::grpc)).
//! 3. With [`replay`](crate::replay) on, the request is fingerprinted (method, path, query, chosen
//!    headers, the body's digest) and a key that already completed answers with its stored
//!    response (or `422` when the fingerprint differs) instead of locking.
//! 4. Extractors never hash on their own. They push *parts* (raw key material and scope such as the
//!    route, the method or a tenant header) into a [`KeyMaterial`]. The material is hashed once, at
//!    the end, into the [`LockKey`] whose [`as_str`](LockKey::as_str) is the Redis resource name.
//!    Raw keys never reach Redis, logs or `Debug` output.
//!
//! # Built-in extractors
//!
//! | extractor | key material | rejects |
//! | --- | --- | --- |
//! | [`IdempotencyKey`] | the `Idempotency-Key` header (structured-field string or bare token) | missing (if required), empty, too long, malformed, duplicate |
//! | [`HeaderKey`] | any header's raw value (printable ASCII) | missing (if required), empty, too long, malformed, duplicate |
//! | [`PathKey`] | the request path | never |
//! | [`MethodPathKey`] | method and path | never |
//! | [`RouteParamKey`] | one route parameter | missing, empty, too long |
//! | [`GrpcMethodKey`] | the gRPC method path (`/package.Service/Method`) | not a method path, too long |
//!
//! Closures `Fn(&dyn RequestView) -> Result<Option<LockKey>, KeyRejection>`
//! are extractors too (see [`key_fn`]).
//!
//! # Combinators
//!
//! [`KeyExtractorExt`] scopes any extractor by the route
//! ([`scoped_by_route`](KeyExtractorExt::scoped_by_route)), the method, a
//! tenant header, a request extension (the authenticated principal), the gRPC method
//! ([`scoped_by_grpc_method`](KeyExtractorExt::scoped_by_grpc_method)) or a closure, and
//! replaces the Redis prefix
//! ([`prefix`](KeyExtractorExt::prefix)). Scope is added to the raw material
//! *before* hashing, so a scoped key costs one hash and one `String`.
//!
//! # The hash
//!
//! A [`LockKey`] is `prefix + hex`, where `hex` is the lowercase hex form of
//! the first 16 bytes (128 bits) of SHA-256 over the parts, each encoded as
//! its length (big-endian `u64`) followed by its bytes. The encoding is part
//! of the crate's contract: the same request gives the same key in every
//! process, on every machine and with every build, so that all instances of
//! a service contend for the same lock.
//!
//! # Example
//!
//! ```
//! use tower_redlock::key::{
//!     IdempotencyKey, KeyExtractor, KeyExtractorExt, SimpleRequest,
//! };
//!
//! // The same Idempotency-Key on two routes takes two different locks,
//! // and each tenant has its own key space.
//! let extractor = IdempotencyKey::required()
//!     .scoped_by_route()
//!     .scoped_by_header("x-tenant-id")
//!     .prefix("payments:");
//!
//! let req = SimpleRequest::new("POST", "/payments")
//!     .route("/payments")
//!     .header("x-tenant-id", "acme")
//!     .header("idempotency-key", "\"8e03978e-40d5-43e8-bc93-6894a57f9324\"");
//!
//! let key = extractor.extract(&req).unwrap().unwrap();
//! assert!(key.as_str().starts_with("payments:"));
//! assert!(!key.as_str().contains("8e03978e")); // hashed, never raw
//!
//! // A request without the header is a 400.
//! let bad = SimpleRequest::new("POST", "/payments").header("x-tenant-id", "acme");
//! let rejection = extractor.extract(&bad).unwrap_err();
//! assert_eq!(rejection.status(), 400);
//! assert!(rejection.is_missing());
//! ```

// Without tower or actix-web, the middleware's part of this module has no caller.
#![cfg_attr(
    not(any(feature = "tower", feature = "actix")),
    allow(dead_code, unused_imports)
)]

mod combinators;
mod extractor;
mod grpc_method;
mod header;
mod keyed;
mod material;
mod parse;
mod rejection;
mod route;
#[cfg(test)]
mod tests;
mod view;

pub use self::combinators::KeyExtractorExt;
pub use self::extractor::{key_fn, KeyExtractor};
pub use self::grpc_method::GrpcMethodKey;
use self::grpc_method::{OnlyGrpcService, ScopedByGrpcMethod};
pub use self::header::{HeaderKey, IdempotencyKey};
pub(crate) use self::keyed::HmacKey;
pub use self::material::{KeyMaterial, LockKey};
pub use self::rejection::{KeyRejection, KeyRejectionKind, KeySource};
pub use self::route::{MethodPathKey, PathKey, RouteParamKey};
#[cfg(feature = "actix")]
pub(crate) use self::view::percent_decodes_to_utf8;
pub use self::view::{ExtensionType, RequestView, SimpleRequest};

/// The extractors the [`KeyExtractorExt`] combinators return (as `std::iter` keeps `Map`):
/// named in types, rarely written by hand.
pub mod adapters {
    pub use crate::key::combinators::{
        Prefixed, ScopedBy, ScopedByExtension, ScopedByHeader, ScopedByMethod, ScopedByRoute,
    };
    pub use crate::key::grpc_method::{OnlyGrpcService, ScopedByGrpcMethod};
}

#[allow(unused_imports)]
use self::parse::*;

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use sha2::{Digest, Sha256};

/// See [`LockKey::DEFAULT_PREFIX`].
pub(crate) const DEFAULT_KEY_PREFIX: &str = "tower-redlock:";

/// See [`IdempotencyKey::DEFAULT_MAX_LEN`].
pub(crate) const DEFAULT_MAX_KEY_LEN: usize = 255;

/// Bytes of the SHA-256 digest kept in a [`LockKey`].
const DIGEST_BYTES: usize = 16;
/// Lowercase hex digits.
const HEX: &[u8; 16] = b"0123456789abcdef";
/// Hex characters of the digest in a [`LockKey`].
const DIGEST_HEX_LEN: usize = DIGEST_BYTES * 2;

// Domain tags: the first part each extractor or combinator pushes. Every tag
// is followed by a fixed number of parts, so the sequence of parts can be
// read back unambiguously: configurations that read different request data
// never collide. `IdempotencyKey` and `HeaderKey` share `TAG_HEADER` on
// purpose: on the same header with the same value they mean the same thing,
// and give the same key.
const TAG_HEADER: &[u8] = b"header";
const TAG_PATH: &[u8] = b"path";
const TAG_METHOD_PATH: &[u8] = b"method-path";
const TAG_ROUTE_PARAM: &[u8] = b"route-param";
const TAG_FN: &[u8] = b"fn";
const TAG_GRPC_METHOD: &[u8] = b"grpc-method";
const TAG_SCOPE_ROUTE: &[u8] = b"scope:route";
const TAG_SCOPE_METHOD: &[u8] = b"scope:method";
const TAG_SCOPE_HEADER: &[u8] = b"scope:header";
const TAG_SCOPE_FN_SOME: &[u8] = b"scope:fn";
const TAG_SCOPE_FN_NONE: &[u8] = b"scope:fn-none";
const TAG_SCOPE_EXTENSION: &[u8] = b"scope:extension";
const TAG_SCOPE_GRPC_METHOD: &[u8] = b"scope:grpc-method";

// Public types cross tasks: keep them `Send + Sync`.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<LockKey>();
    assert_send_sync::<KeyMaterial>();
    assert_send_sync::<KeyRejection>();
    assert_send_sync::<SimpleRequest>();
    assert_send_sync::<IdempotencyKey>();
    assert_send_sync::<HeaderKey>();
    assert_send_sync::<RouteParamKey>();
    assert_send_sync::<GrpcMethodKey>();
    assert_send_sync::<Box<dyn KeyExtractor>>();
    assert_send_sync::<Arc<dyn KeyExtractor>>();
};
