//! Lock keys from requests: what the middleware locks, read from a framework-neutral view
//! of the request, hashed before it reaches Redis, logs or `Debug` output.
//!
//! Nothing here depends on an HTTP framework or on either major version of the `http`
//! crate: axum 0.8 speaks `http` 1.x while actix-web 4 speaks `http` 0.2, so the glue for
//! each framework adapts its own request type to the small [`RequestView`] trait and
//! everything else is shared.
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
//! 4. Extractors never hash on their own: they push *parts* (raw key material
//!    and scope such as the route, the method or a tenant header) into a
//!    [`KeyMaterial`], and the material is hashed once, at the end, into the
//!    [`LockKey`] whose [`as_str`](LockKey::as_str) is the Redis resource
//!    name. Raw keys never reach Redis, logs or `Debug` output.
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

pub use crate::http::key::ExtensionType;
pub use crate::http::key::{
    key_fn, GrpcMethodKey, HeaderKey, IdempotencyKey, KeyExtractor, KeyExtractorExt, KeyMaterial,
    KeyRejection, KeyRejectionKind, KeySource, LockKey, MethodPathKey, PathKey, RequestView,
    RouteParamKey, SimpleRequest,
};

/// The extractors the [`KeyExtractorExt`] combinators return (as `std::iter` keeps `Map`):
/// named in types, rarely written by hand.
pub mod adapters {
    pub use crate::http::key::{
        OnlyGrpcService, Prefixed, ScopedBy, ScopedByExtension, ScopedByGrpcMethod, ScopedByHeader,
        ScopedByMethod, ScopedByRoute,
    };
}
