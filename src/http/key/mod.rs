//! Deriving lock keys from requests: the extractors, their combinators, the key material
//! and its hash, and the rejections. Documented in the [`http`](super) module, which
//! re-exports every public item.

mod combinators;
mod extractor;
mod grpc;
mod header;
mod keyed;
mod material;
mod parse;
mod rejection;
mod route;
#[cfg(test)]
mod tests;

pub use self::combinators::{
    KeyExtractorExt, Prefixed, ScopedBy, ScopedByExtension, ScopedByHeader, ScopedByMethod,
    ScopedByRoute,
};
pub use self::extractor::{key_fn, KeyExtractor};
pub use self::grpc::{GrpcMethodKey, OnlyGrpcService, ScopedByGrpcMethod};
pub use self::header::{HeaderKey, IdempotencyKey};
pub(crate) use self::keyed::HmacKey;
pub use self::material::{KeyMaterial, LockKey};
pub use self::rejection::{KeyRejection, KeyRejectionKind, KeySource};
pub use self::route::{MethodPathKey, PathKey, RouteParamKey};
pub use super::view::{ExtensionType, RequestView, SimpleRequest};

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
