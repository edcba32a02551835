//! Deriving lock keys from requests.
//!
//! A [`KeyExtractor`] looks at a [`RequestView`] and pushes *parts* into a
//! [`KeyMaterial`]; the material is hashed once into a [`LockKey`]. See the
//! [module docs of `http`](super) for the whole flow.
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
//!
//! Closures `Fn(&dyn RequestView) -> Result<Option<LockKey>, KeyRejection>`
//! are extractors too (see [`key_fn`]).
//!
//! # Combinators
//!
//! [`KeyExtractorExt`] scopes any extractor by the route
//! ([`scoped_by_route`](KeyExtractorExt::scoped_by_route)), the method, a
//! tenant header or a closure, and replaces the Redis prefix
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

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use sha2::{Digest, Sha256};

/// The Redis prefix of a [`LockKey`] when none is set with
/// [`KeyExtractorExt::prefix`].
pub const DEFAULT_KEY_PREFIX: &str = "tower-redlock:";

/// The default bound, in bytes, on a key taken from a header or a route
/// parameter (after unquoting).
pub const DEFAULT_MAX_KEY_LEN: usize = 255;

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
const TAG_SCOPE_ROUTE: &[u8] = b"scope:route";
const TAG_SCOPE_METHOD: &[u8] = b"scope:method";
const TAG_SCOPE_HEADER: &[u8] = b"scope:header";
const TAG_SCOPE_FN_SOME: &[u8] = b"scope:fn";
const TAG_SCOPE_FN_NONE: &[u8] = b"scope:fn-none";

// ===== RequestView =====

/// The framework-neutral view of an HTTP request that key extractors read.
///
/// The tower/axum and actix-web glue implement it for their request types;
/// [`SimpleRequest`] implements it for tests.
pub trait RequestView {
    /// The request method, e.g. `"POST"`.
    fn method(&self) -> &str;

    /// The request path without the query string, e.g. `"/payments/42"`.
    fn path(&self) -> &str;

    /// The route pattern the router matched, e.g. `"/payments/{id}"`, when
    /// the router exposes it.
    fn matched_route(&self) -> Option<&str>;

    /// The first value of the header `name` (matched case-insensitively), as
    /// raw bytes: header values may be any bytes, not only UTF-8.
    fn header(&self, name: &str) -> Option<&[u8]>;

    /// How many values the header `name` has (matched case-insensitively);
    /// extractors use it to reject a key header sent twice.
    fn header_count(&self, name: &str) -> usize;

    /// The route parameter `name` (e.g. `"id"` for `/payments/{id}`) when the
    /// router exposes it.
    fn path_param(&self, name: &str) -> Option<&str>;

    /// Whether the router matched path parameters it could not decode (not
    /// UTF-8 once percent-decoded): a route parameter key then rejects the
    /// request as malformed, not as missing. Default: `false`.
    fn path_params_malformed(&self) -> bool {
        false
    }
}

impl<T: RequestView + ?Sized> RequestView for &T {
    fn method(&self) -> &str {
        (**self).method()
    }
    fn path(&self) -> &str {
        (**self).path()
    }
    fn matched_route(&self) -> Option<&str> {
        (**self).matched_route()
    }
    fn header(&self, name: &str) -> Option<&[u8]> {
        (**self).header(name)
    }
    fn header_count(&self, name: &str) -> usize {
        (**self).header_count(name)
    }
    fn path_param(&self, name: &str) -> Option<&str> {
        (**self).path_param(name)
    }
    fn path_params_malformed(&self) -> bool {
        (**self).path_params_malformed()
    }
}

// ===== SimpleRequest =====

/// An owned, framework-free request for tests, built step by step.
///
/// Note that the builder method [`header`](SimpleRequest::header) shadows
/// [`RequestView::header`] on a `SimpleRequest` value; to read a header back,
/// call it through the trait: `RequestView::header(&req, "name")`.
///
/// `Debug` shows header and parameter *names* only, never their values,
/// since they may carry keys.
///
/// ```
/// use tower_redlock::http::{RequestView, SimpleRequest};
///
/// let req = SimpleRequest::new("POST", "/payments/42?expand=all")
///     .route("/payments/{id}")
///     .param("id", "42")
///     .header("Idempotency-Key", "\"abc\"");
///
/// assert_eq!(req.path(), "/payments/42"); // the query is dropped
/// assert_eq!(req.matched_route(), Some("/payments/{id}"));
/// assert_eq!(req.path_param("id"), Some("42"));
/// assert_eq!(RequestView::header(&req, "idempotency-key"), Some(&b"\"abc\""[..]));
/// assert_eq!(req.header_count("IDEMPOTENCY-KEY"), 1);
/// ```
#[derive(Clone, Default)]
pub struct SimpleRequest {
    method: String,
    path: String,
    route: Option<String>,
    headers: Vec<(String, Vec<u8>)>,
    params: Vec<(String, String)>,
}

impl SimpleRequest {
    /// A request with this method and path; anything from `?` on in `path`
    /// is dropped, as [`RequestView::path`] has no query.
    pub fn new(method: impl Into<String>, path: impl Into<String>) -> Self {
        let mut path = path.into();
        if let Some(query) = path.find('?') {
            path.truncate(query);
        }
        Self {
            method: method.into(),
            path,
            ..Self::default()
        }
    }

    /// Adds a header value (the name is stored lowercase). Calling it twice
    /// with the same name adds a second value.
    #[must_use]
    pub fn header(mut self, name: impl AsRef<str>, value: impl AsRef<[u8]>) -> Self {
        self.headers
            .push((name.as_ref().to_ascii_lowercase(), value.as_ref().to_vec()));
        self
    }

    /// Sets the matched route pattern, e.g. `"/payments/{id}"`.
    #[must_use]
    pub fn route(mut self, route: impl Into<String>) -> Self {
        self.route = Some(route.into());
        self
    }

    /// Adds a route parameter.
    #[must_use]
    pub fn param(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.params.push((name.into(), value.into()));
        self
    }
}

impl RequestView for SimpleRequest {
    fn method(&self) -> &str {
        &self.method
    }
    fn path(&self) -> &str {
        &self.path
    }
    fn matched_route(&self) -> Option<&str> {
        self.route.as_deref()
    }
    fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }
    fn header_count(&self, name: &str) -> usize {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .count()
    }
    fn path_param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

impl fmt::Debug for SimpleRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        struct Names<'a, T>(&'a [(String, T)]);
        impl<T> fmt::Debug for Names<'_, T> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_list()
                    .entries(self.0.iter().map(|(n, _)| n))
                    .finish()
            }
        }
        f.debug_struct("SimpleRequest")
            .field("method", &self.method)
            .field("path", &self.path)
            .field("route", &self.route)
            .field("headers", &Names(&self.headers))
            .field("params", &Names(&self.params))
            .finish()
    }
}

// ===== KeyMaterial =====

/// The parts of a lock key, hashed as they are pushed; [`finish`] turns them
/// into a [`LockKey`].
///
/// Each part is fed to SHA-256 as its length (big-endian `u64`) followed by
/// its bytes, so `["ab", "c"]` and `["a", "bc"]` give different keys. Pushing
/// costs no allocation; [`finish`] allocates the key's one `String`.
///
/// Extractors receive a `&mut KeyMaterial` in
/// [`KeyExtractor::extract_into`]. Start what you push with a constant tag of
/// your own (e.g. `b"my-extractor"`) so that your parts cannot be mistaken for
/// another extractor's.
///
/// ```
/// use tower_redlock::http::{KeyMaterial, LockKey};
///
/// let mut material = KeyMaterial::new();
/// material.push("order").push("42");
/// let key = material.finish();
/// assert_eq!(key, LockKey::from_parts(["order", "42"]));
/// assert!(key.as_str().starts_with("tower-redlock:"));
/// ```
///
/// [`finish`]: KeyMaterial::finish
#[derive(Clone, Default)]
pub struct KeyMaterial {
    hasher: Sha256,
    prefix: Option<Arc<str>>,
}

impl KeyMaterial {
    /// Empty material with the default prefix ([`DEFAULT_KEY_PREFIX`]).
    pub fn new() -> Self {
        Self::default()
    }

    /// Pushes one part.
    pub fn push(&mut self, part: impl AsRef<[u8]>) -> &mut Self {
        let part = part.as_ref();
        self.begin_part(part.len());
        self.hasher.update(part);
        self
    }

    /// Sets the Redis prefix of the key, replacing any set before.
    pub fn set_prefix(&mut self, prefix: impl Into<Arc<str>>) -> &mut Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// The prefix the key will get.
    pub fn prefix(&self) -> &str {
        self.prefix.as_deref().unwrap_or(DEFAULT_KEY_PREFIX)
    }

    /// Hashes the parts into a [`LockKey`] (the one allocation).
    pub fn finish(self) -> LockKey {
        let prefix = self.prefix.as_deref().unwrap_or(DEFAULT_KEY_PREFIX);
        let digest = self.hasher.finalize();
        let mut key = String::with_capacity(prefix.len() + DIGEST_HEX_LEN);
        key.push_str(prefix);
        for byte in digest.iter().take(DIGEST_BYTES) {
            key.push(char::from(HEX[usize::from(byte >> 4)]));
            key.push(char::from(HEX[usize::from(byte & 0x0f)]));
        }
        LockKey { key }
    }

    /// Starts a part of `len` bytes; [`write`](Self::write) must then feed
    /// exactly `len` bytes.
    fn begin_part(&mut self, len: usize) {
        let len = u64::try_from(len).unwrap_or(u64::MAX);
        self.hasher.update(len.to_be_bytes());
    }

    /// Feeds bytes of the part started by [`begin_part`](Self::begin_part).
    fn write(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
    }
}

impl fmt::Debug for KeyMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyMaterial")
            .field("prefix", &self.prefix())
            .finish_non_exhaustive()
    }
}

// ===== LockKey =====

/// A lock key ready for Redis: `prefix + 32 lowercase hex digits` (128 bits of
/// SHA-256 over the key's parts).
///
/// The raw key material is gone once the key is built: `Display`, `Debug`
/// and [`as_str`](LockKey::as_str) all show the hashed form only.
///
/// ```
/// use tower_redlock::http::LockKey;
///
/// let key = LockKey::from_parts(["payments", "order-123"]);
/// assert_eq!(key.prefix(), "tower-redlock:");
/// assert_eq!(key.digest_hex().len(), 32);
/// assert!(!format!("{key} {key:?}").contains("order-123"));
///
/// let custom = LockKey::from_parts_with_prefix("myapp:", ["payments", "order-123"]);
/// assert_eq!(custom.digest_hex(), key.digest_hex());
/// assert_eq!(custom.as_str(), format!("myapp:{}", key.digest_hex()));
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockKey {
    key: String,
}

impl LockKey {
    /// Hashes `parts` (in order) into a key with the default prefix.
    pub fn from_parts<I>(parts: I) -> Self
    where
        I: IntoIterator,
        I::Item: AsRef<[u8]>,
    {
        let mut material = KeyMaterial::new();
        for part in parts {
            material.push(part);
        }
        material.finish()
    }

    /// Hashes `parts` (in order) into a key with `prefix`.
    pub fn from_parts_with_prefix<I>(prefix: &str, parts: I) -> Self
    where
        I: IntoIterator,
        I::Item: AsRef<[u8]>,
    {
        let mut material = KeyMaterial::new();
        material.set_prefix(prefix);
        for part in parts {
            material.push(part);
        }
        material.finish()
    }

    /// The Redis resource name: prefix and hex digest.
    pub fn as_str(&self) -> &str {
        &self.key
    }

    /// The prefix part of the key.
    pub fn prefix(&self) -> &str {
        let end = self.key.len().saturating_sub(DIGEST_HEX_LEN);
        self.key.get(..end).unwrap_or_default()
    }

    /// The 32 lowercase hex digits after the prefix.
    pub fn digest_hex(&self) -> &str {
        let start = self.key.len().saturating_sub(DIGEST_HEX_LEN);
        self.key.get(start..).unwrap_or_default()
    }

    /// The Redis resource name as an owned `String`.
    pub fn into_string(self) -> String {
        self.key
    }
}

impl fmt::Display for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key)
    }
}

impl fmt::Debug for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LockKey").field(&self.key).finish()
    }
}

impl AsRef<str> for LockKey {
    fn as_ref(&self) -> &str {
        &self.key
    }
}

impl From<LockKey> for String {
    fn from(key: LockKey) -> Self {
        key.key
    }
}

// ===== KeyRejection =====

/// Where a rejected key was looked for; used in [`KeyRejection::detail`].
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeySource {
    /// A header, by (lowercase) name.
    Header(Cow<'static, str>),
    /// A route parameter, by name.
    RouteParam(Cow<'static, str>),
    /// Anything else, as a noun phrase for the detail message, e.g.
    /// ``"`session` cookie"``.
    Other(Cow<'static, str>),
}

impl KeySource {
    /// A header source.
    pub fn header(name: impl Into<Cow<'static, str>>) -> Self {
        Self::Header(name.into())
    }

    /// A route parameter source.
    pub fn route_param(name: impl Into<Cow<'static, str>>) -> Self {
        Self::RouteParam(name.into())
    }

    /// Any other source, described by a noun phrase such as
    /// ``"`session` cookie"``.
    pub fn other(description: impl Into<Cow<'static, str>>) -> Self {
        Self::Other(description.into())
    }
}

impl fmt::Display for KeySource {
    /// A noun phrase: ``"`idempotency-key` header"``.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Header(name) => write!(f, "`{name}` header"),
            Self::RouteParam(name) => write!(f, "route parameter `{name}`"),
            Self::Other(description) => f.write_str(description),
        }
    }
}

/// What is wrong with a request's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyRejectionKind {
    /// A required key is absent.
    Missing,
    /// The key is present but empty.
    Empty,
    /// The key is longer than `max` bytes.
    TooLong {
        /// The configured bound, in bytes.
        max: usize,
    },
    /// The key does not follow its syntax.
    Malformed {
        /// What is wrong, in words that never quote the value.
        reason: &'static str,
    },
    /// The key header was sent more than once.
    Duplicate,
}

/// Why a [`KeyExtractor`] refused a request: always a `400 Bad Request`.
///
/// [`title`](Self::title) and [`detail`](Self::detail) are fit for an
/// `application/problem+json` body (RFC 9457); neither they, `Display` nor
/// `Debug` ever contain the raw key value.
///
/// ```
/// use tower_redlock::http::{IdempotencyKey, KeyExtractor, SimpleRequest};
///
/// let req = SimpleRequest::new("POST", "/payments")
///     .header("idempotency-key", "\"unterminated-secret");
/// let rejection = IdempotencyKey::required().extract(&req).unwrap_err();
/// assert_eq!(rejection.status(), 400);
/// assert!(rejection.is_malformed());
/// assert_eq!(rejection.title(), "Malformed request key");
/// assert!(!rejection.detail().contains("secret"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRejection {
    kind: KeyRejectionKind,
    source: KeySource,
}

impl KeyRejection {
    /// A rejection of this kind for a key looked for in `source`.
    pub fn new(kind: KeyRejectionKind, source: KeySource) -> Self {
        Self { kind, source }
    }

    /// A required key is absent.
    pub fn missing(source: KeySource) -> Self {
        Self::new(KeyRejectionKind::Missing, source)
    }

    /// The key is empty.
    pub fn empty(source: KeySource) -> Self {
        Self::new(KeyRejectionKind::Empty, source)
    }

    /// The key is longer than `max` bytes.
    pub fn too_long(source: KeySource, max: usize) -> Self {
        Self::new(KeyRejectionKind::TooLong { max }, source)
    }

    /// The key is malformed; `reason` must not quote the value.
    pub fn malformed(source: KeySource, reason: &'static str) -> Self {
        Self::new(KeyRejectionKind::Malformed { reason }, source)
    }

    /// The key header was sent more than once.
    pub fn duplicate(source: KeySource) -> Self {
        Self::new(KeyRejectionKind::Duplicate, source)
    }

    /// What is wrong.
    pub fn kind(&self) -> KeyRejectionKind {
        self.kind
    }

    /// Where the key was looked for.
    pub fn source_of_key(&self) -> &KeySource {
        &self.source
    }

    /// Whether a required key is absent.
    pub fn is_missing(&self) -> bool {
        matches!(self.kind, KeyRejectionKind::Missing)
    }

    /// Whether the key is empty.
    pub fn is_empty(&self) -> bool {
        matches!(self.kind, KeyRejectionKind::Empty)
    }

    /// Whether the key is too long.
    pub fn is_too_long(&self) -> bool {
        matches!(self.kind, KeyRejectionKind::TooLong { .. })
    }

    /// Whether the key is malformed.
    pub fn is_malformed(&self) -> bool {
        matches!(self.kind, KeyRejectionKind::Malformed { .. })
    }

    /// Whether the key header was sent more than once.
    pub fn is_duplicate(&self) -> bool {
        matches!(self.kind, KeyRejectionKind::Duplicate)
    }

    /// The HTTP status to answer with: always `400`.
    pub fn status(&self) -> u16 {
        400
    }

    /// A short, stable, human-readable summary for a problem+json `title`.
    pub fn title(&self) -> &'static str {
        match self.kind {
            KeyRejectionKind::Missing => "Missing request key",
            KeyRejectionKind::Empty => "Empty request key",
            KeyRejectionKind::TooLong { .. } => "Request key too long",
            KeyRejectionKind::Malformed { .. } => "Malformed request key",
            KeyRejectionKind::Duplicate => "Duplicate request key",
        }
    }

    /// A stable machine-readable code, e.g. for a problem+json `type` URI
    /// suffix: `key-missing`, `key-empty`, `key-too-long`, `key-malformed`,
    /// `key-duplicate`.
    pub fn code(&self) -> &'static str {
        match self.kind {
            KeyRejectionKind::Missing => "key-missing",
            KeyRejectionKind::Empty => "key-empty",
            KeyRejectionKind::TooLong { .. } => "key-too-long",
            KeyRejectionKind::Malformed { .. } => "key-malformed",
            KeyRejectionKind::Duplicate => "key-duplicate",
        }
    }

    /// One sentence for a problem+json `detail`; it names where the key was
    /// looked for and never quotes the key's value.
    pub fn detail(&self) -> String {
        self.to_string()
    }
}

impl fmt::Display for KeyRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let source = &self.source;
        match (self.kind, source) {
            (KeyRejectionKind::Missing, KeySource::RouteParam(name)) => write!(
                f,
                "The route parameter `{name}` is not available for this request; \
                 the lock key extractor is mounted on a route without it."
            ),
            (KeyRejectionKind::Missing, _) => {
                write!(
                    f,
                    "The request has no {source}, which this endpoint requires."
                )
            }
            (KeyRejectionKind::Empty, _) => write!(f, "The {source} is empty."),
            (KeyRejectionKind::TooLong { max }, _) => {
                write!(f, "The {source} is longer than {max} bytes.")
            }
            (KeyRejectionKind::Malformed { reason }, _) => {
                write!(f, "The {source} is malformed: {reason}.")
            }
            (KeyRejectionKind::Duplicate, _) => {
                write!(
                    f,
                    "The {source} was sent more than once; send it exactly once."
                )
            }
        }
    }
}

impl std::error::Error for KeyRejection {}

// ===== KeyExtractor =====

/// Derives a request's lock key.
///
/// * `Ok(Some(key))`: lock `key` around the handler;
/// * `Ok(None)`: the request has no key; it passes through without a lock;
/// * `Err(rejection)`: answer `400` (see [`KeyRejection`]).
///
/// Implement [`extract_into`](Self::extract_into), which pushes raw parts into
/// a [`KeyMaterial`], so that combinators can add scope before the single
/// hash; [`extract`](Self::extract) is provided. Closures
/// `Fn(&dyn RequestView) -> Result<Option<LockKey>, KeyRejection>` are
/// extractors too (see [`key_fn`]).
///
/// ```
/// use tower_redlock::http::{
///     KeyExtractor, KeyMaterial, KeyRejection, KeySource, RequestView, SimpleRequest,
/// };
///
/// /// Locks per user, from a header set by an authenticating proxy.
/// struct PerUser;
///
/// impl KeyExtractor for PerUser {
///     fn extract_into(
///         &self,
///         req: &dyn RequestView,
///         material: &mut KeyMaterial,
///     ) -> Result<bool, KeyRejection> {
///         match req.header("x-user-id") {
///             Some(user) => {
///                 material.push("per-user").push(user);
///                 Ok(true)
///             }
///             None => Err(KeyRejection::missing(KeySource::header("x-user-id"))),
///         }
///     }
/// }
///
/// let req = SimpleRequest::new("POST", "/cart").header("x-user-id", "u-1");
/// assert!(PerUser.extract(&req).unwrap().is_some());
/// ```
pub trait KeyExtractor: Send + Sync + 'static {
    /// Pushes this request's key parts into `material`.
    ///
    /// Returns `Ok(true)` when the request has a key (parts were pushed),
    /// `Ok(false)` when it has none (pass through unlocked).
    ///
    /// # Errors
    ///
    /// A [`KeyRejection`] (answered with `400`) when the key is missing,
    /// empty, too long, malformed or sent twice.
    fn extract_into(
        &self,
        req: &dyn RequestView,
        material: &mut KeyMaterial,
    ) -> Result<bool, KeyRejection>;

    /// The request's lock key, if any: `Ok(None)` means pass through
    /// unlocked.
    ///
    /// # Errors
    ///
    /// As [`extract_into`](Self::extract_into).
    fn extract(&self, req: &dyn RequestView) -> Result<Option<LockKey>, KeyRejection> {
        let mut material = KeyMaterial::new();
        if self.extract_into(req, &mut material)? {
            Ok(Some(material.finish()))
        } else {
            Ok(None)
        }
    }
}

/// Closures are extractors. Used alone, the closure's [`LockKey`] is the key
/// as is; under a combinator, the closure's key becomes one part of the
/// scoped key (its prefix is kept unless [`KeyExtractorExt::prefix`] replaces
/// it).
impl<F> KeyExtractor for F
where
    F: Fn(&dyn RequestView) -> Result<Option<LockKey>, KeyRejection> + Send + Sync + 'static,
{
    fn extract_into(
        &self,
        req: &dyn RequestView,
        material: &mut KeyMaterial,
    ) -> Result<bool, KeyRejection> {
        match self(req)? {
            Some(key) => {
                material.push(TAG_FN).push(key.as_str());
                if key.prefix() != material.prefix() {
                    material.set_prefix(key.prefix());
                }
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn extract(&self, req: &dyn RequestView) -> Result<Option<LockKey>, KeyRejection> {
        self(req)
    }
}

impl<E: KeyExtractor + ?Sized> KeyExtractor for Arc<E> {
    fn extract_into(
        &self,
        req: &dyn RequestView,
        material: &mut KeyMaterial,
    ) -> Result<bool, KeyRejection> {
        (**self).extract_into(req, material)
    }

    fn extract(&self, req: &dyn RequestView) -> Result<Option<LockKey>, KeyRejection> {
        (**self).extract(req)
    }
}

impl KeyExtractor for Box<dyn KeyExtractor> {
    fn extract_into(
        &self,
        req: &dyn RequestView,
        material: &mut KeyMaterial,
    ) -> Result<bool, KeyRejection> {
        (**self).extract_into(req, material)
    }

    fn extract(&self, req: &dyn RequestView) -> Result<Option<LockKey>, KeyRejection> {
        (**self).extract(req)
    }
}

/// Returns the closure unchanged; it only helps type inference, so that
/// `|req| ...` needs no type annotation.
///
/// ```
/// use tower_redlock::http::{key_fn, KeyExtractor, LockKey, SimpleRequest};
///
/// // Lock per user when the proxy says who the user is, else no lock.
/// let per_user = key_fn(|req| {
///     Ok(req
///         .header("x-user-id")
///         .map(|user| LockKey::from_parts([&b"user"[..], user])))
/// });
///
/// let req = SimpleRequest::new("POST", "/cart").header("x-user-id", "u-1");
/// assert!(per_user.extract(&req).unwrap().is_some());
/// assert!(per_user.extract(&SimpleRequest::new("GET", "/")).unwrap().is_none());
/// ```
pub fn key_fn<F>(f: F) -> F
where
    F: Fn(&dyn RequestView) -> Result<Option<LockKey>, KeyRejection> + Send + Sync + 'static,
{
    f
}

// ===== Parsing helpers =====

/// Removes optional whitespace (SP / HTAB) around a header value.
fn trim_ows(mut value: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = value {
        value = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = value {
        value = rest;
    }
    value
}

/// Lowercases a configured header name, allocating only when needed.
fn header_name(name: Cow<'static, str>) -> Cow<'static, str> {
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(name.to_ascii_lowercase())
    } else {
        name
    }
}

/// The single value of header `name`: `Ok(None)` when absent, `Duplicate`
/// when sent more than once.
fn single_header<'r>(
    req: &'r dyn RequestView,
    name: &str,
) -> Result<Option<&'r [u8]>, KeyRejectionKind> {
    let Some(value) = req.header(name) else {
        return Ok(None);
    };
    if req.header_count(name) > 1 {
        return Err(KeyRejectionKind::Duplicate);
    }
    Ok(Some(value))
}

/// A bare key character: RFC 9110 `tchar`, plus `:` and `/` (as in an RFC
/// 8941 token) and `=` (base64 padding).
fn is_bare_key_char(b: u8) -> bool {
    matches!(b,
        b'0'..=b'9' | b'a'..=b'z' | b'A'..=b'Z'
        | b'!' | b'#' | b'$' | b'%' | b'&' | b'\'' | b'*' | b'+' | b'-' | b'.'
        | b'^' | b'_' | b'`' | b'|' | b'~' | b':' | b'/' | b'=')
}

/// A validated `Idempotency-Key` value. (No `Debug`: it holds the raw key.)
#[derive(Clone, Copy)]
enum KeyText<'a> {
    /// A bare token, used as is.
    Bare(&'a [u8]),
    /// The inside of a structured-field string (escapes still in place) and
    /// its unescaped length.
    Quoted { inner: &'a [u8], len: usize },
}

impl KeyText<'_> {
    /// Pushes the (unescaped) key as one part, without allocating.
    fn push_into(self, material: &mut KeyMaterial) {
        match self {
            KeyText::Bare(bytes) => {
                material.push(bytes);
            }
            KeyText::Quoted { inner, len } => {
                material.begin_part(len);
                let mut rest = inner;
                while let Some(i) = rest.iter().position(|&b| b == b'\\') {
                    material.write(rest.get(..i).unwrap_or_default());
                    // Validation guarantees a `"` or `\` after each backslash;
                    // it is content.
                    match rest.get(i + 1..).unwrap_or_default().split_first() {
                        Some((escaped, tail)) => {
                            material.write(std::slice::from_ref(escaped));
                            rest = tail;
                        }
                        None => {
                            rest = &[];
                        }
                    }
                }
                material.write(rest);
            }
        }
    }
}

/// Parses an `Idempotency-Key` value: an RFC 8941 string (`"..."`, printable
/// ASCII, only `\"` and `\\` escapes) or a bare token.
fn parse_key_text(raw: &[u8], max: usize) -> Result<KeyText<'_>, KeyRejectionKind> {
    let value = trim_ows(raw);
    let Some((&first, body)) = value.split_first() else {
        return Err(KeyRejectionKind::Empty);
    };
    if first != b'"' {
        if value.len() > max {
            return Err(KeyRejectionKind::TooLong { max });
        }
        if !value.iter().all(|&b| is_bare_key_char(b)) {
            return Err(KeyRejectionKind::Malformed {
                reason: "a key that is not a quoted string may only contain letters, digits \
                         and !#$%&'*+-.^_`|~:/= (quote it to use other printable characters)",
            });
        }
        return Ok(KeyText::Bare(value));
    }

    let mut len = 0usize;
    let mut escaped = false;
    for (i, &b) in body.iter().enumerate() {
        if escaped {
            if b != b'"' && b != b'\\' {
                return Err(KeyRejectionKind::Malformed {
                    reason: r#"only \" and \\ escapes are allowed in a quoted key"#,
                });
            }
            escaped = false;
        } else {
            match b {
                b'\\' => {
                    escaped = true;
                    continue;
                }
                b'"' => {
                    if body.get(i + 1..).is_some_and(|tail| !tail.is_empty()) {
                        return Err(KeyRejectionKind::Malformed {
                            reason: "unexpected characters after the closing quote",
                        });
                    }
                    if len == 0 {
                        return Err(KeyRejectionKind::Empty);
                    }
                    let inner = body.get(..i).unwrap_or_default();
                    return Ok(KeyText::Quoted { inner, len });
                }
                0x20..=0x7e => {}
                _ => {
                    return Err(KeyRejectionKind::Malformed {
                        reason: "a quoted key may only contain printable ASCII characters",
                    });
                }
            }
        }
        len += 1;
        if len > max {
            return Err(KeyRejectionKind::TooLong { max });
        }
    }
    Err(KeyRejectionKind::Malformed {
        reason: "the quoted key has no closing quote",
    })
}

/// Validates a raw header value used as key (printable ASCII, bounded).
fn parse_raw_text(raw: &[u8], max: usize) -> Result<&[u8], KeyRejectionKind> {
    let value = trim_ows(raw);
    if value.is_empty() {
        return Err(KeyRejectionKind::Empty);
    }
    if value.len() > max {
        return Err(KeyRejectionKind::TooLong { max });
    }
    if !value.iter().all(|&b| matches!(b, 0x20..=0x7e)) {
        return Err(KeyRejectionKind::Malformed {
            reason: "the value may only contain printable ASCII characters",
        });
    }
    Ok(value)
}

// ===== IdempotencyKey =====

/// The `Idempotency-Key` header (IETF httpapi draft "The Idempotency-Key HTTP
/// Header Field") as lock key.
///
/// The value is an RFC 8941 structured-field string: `"..."` holding
/// printable ASCII, where `\"` and `\\` are the only escapes. A bare token
/// (letters, digits and `` !#$%&'*+-.^_`|~:/= ``; e.g. a UUID, a ULID,
/// base64url or `order-123`) is accepted too; `"abc"` and `abc` are the same
/// key. Whitespace around the value is ignored.
///
/// Rejections (all `400`): the header is absent and [`required`](Self::required)
/// (missing), the key is empty, longer than [`max_len`](Self::max_len) bytes
/// after unquoting (default [`DEFAULT_MAX_KEY_LEN`], 255), malformed, or the
/// header was sent more than once.
///
/// The key is not scoped: combine with
/// [`scoped_by_route`](KeyExtractorExt::scoped_by_route) (and a tenant scope)
/// so that one key reused on two endpoints takes two locks.
///
/// ```
/// use tower_redlock::http::{IdempotencyKey, KeyExtractor, SimpleRequest};
///
/// let required = IdempotencyKey::required();
/// let quoted = SimpleRequest::new("POST", "/payments")
///     .header("Idempotency-Key", "\"8e03978e-40d5-43e8-bc93-6894a57f9324\"");
/// let bare = SimpleRequest::new("POST", "/payments")
///     .header("Idempotency-Key", "8e03978e-40d5-43e8-bc93-6894a57f9324");
/// assert_eq!(required.extract(&quoted).unwrap(), required.extract(&bare).unwrap());
///
/// let none = SimpleRequest::new("POST", "/payments");
/// assert!(required.extract(&none).unwrap_err().is_missing());
/// assert_eq!(IdempotencyKey::optional().extract(&none).unwrap(), None);
///
/// let spaced = SimpleRequest::new("POST", "/payments").header("Idempotency-Key", "a b");
/// assert!(required.extract(&spaced).unwrap_err().is_malformed());
/// ```
#[derive(Clone, Debug)]
pub struct IdempotencyKey {
    header: Cow<'static, str>,
    required: bool,
    max_len: usize,
}

impl IdempotencyKey {
    /// Reads `Idempotency-Key`; a request without it is rejected (missing).
    pub fn required() -> Self {
        Self {
            header: Cow::Borrowed("idempotency-key"),
            required: true,
            max_len: DEFAULT_MAX_KEY_LEN,
        }
    }

    /// Reads `Idempotency-Key`; a request without it passes through unlocked.
    /// A present but invalid header is still rejected.
    pub fn optional() -> Self {
        Self {
            required: false,
            ..Self::required()
        }
    }

    /// Bounds the key's length in bytes, after unquoting (default 255).
    #[must_use]
    pub fn max_len(mut self, max: usize) -> Self {
        self.max_len = max;
        self
    }

    /// Reads another header with the same syntax, e.g. `"x-request-id"`
    /// (case-insensitive).
    #[must_use]
    pub fn header_name(mut self, name: impl Into<Cow<'static, str>>) -> Self {
        self.header = header_name(name.into());
        self
    }
}

impl Default for IdempotencyKey {
    /// [`IdempotencyKey::required`].
    fn default() -> Self {
        Self::required()
    }
}

impl KeyExtractor for IdempotencyKey {
    fn extract_into(
        &self,
        req: &dyn RequestView,
        material: &mut KeyMaterial,
    ) -> Result<bool, KeyRejection> {
        let source = || KeySource::Header(self.header.clone());
        let found = single_header(req, &self.header);
        let Some(raw) = found.map_err(|k| KeyRejection::new(k, source()))? else {
            return if self.required {
                Err(KeyRejection::missing(source()))
            } else {
                Ok(false)
            };
        };
        let text = parse_key_text(raw, self.max_len).map_err(|k| KeyRejection::new(k, source()))?;
        material.push(TAG_HEADER).push(self.header.as_bytes());
        text.push_into(material);
        Ok(true)
    }
}

// ===== HeaderKey =====

/// A header's raw value as lock key, e.g. `x-tenant-id` or `x-job-id`.
///
/// The value (whitespace around it ignored) must be non-empty printable
/// ASCII (0x20–0x7E) of at most [`max_len`](Self::max_len) bytes (default
/// 255), and the header must appear once. It is used as is, quotes included:
/// use [`IdempotencyKey::header_name`] for structured-field strings.
/// Required by default.
///
/// ```
/// use tower_redlock::http::{HeaderKey, KeyExtractor, SimpleRequest};
///
/// let by_job = HeaderKey::new("x-job-id");
/// let req = SimpleRequest::new("POST", "/jobs").header("X-Job-Id", "nightly-report");
/// assert!(by_job.extract(&req).unwrap().is_some());
///
/// let none = SimpleRequest::new("POST", "/jobs");
/// assert!(by_job.extract(&none).unwrap_err().is_missing());
/// assert_eq!(by_job.optional().extract(&none).unwrap(), None);
/// ```
#[derive(Clone, Debug)]
pub struct HeaderKey {
    header: Cow<'static, str>,
    required: bool,
    max_len: usize,
}

impl HeaderKey {
    /// Reads header `name` (case-insensitive); required.
    pub fn new(name: impl Into<Cow<'static, str>>) -> Self {
        Self {
            header: header_name(name.into()),
            required: true,
            max_len: DEFAULT_MAX_KEY_LEN,
        }
    }

    /// A request without the header is rejected (missing). The default.
    #[must_use]
    pub fn required(mut self) -> Self {
        self.required = true;
        self
    }

    /// A request without the header passes through unlocked.
    #[must_use]
    pub fn optional(mut self) -> Self {
        self.required = false;
        self
    }

    /// Bounds the value's length in bytes (default 255).
    #[must_use]
    pub fn max_len(mut self, max: usize) -> Self {
        self.max_len = max;
        self
    }

    /// The validated value, `Ok(None)` when absent and optional.
    fn value<'r>(&self, req: &'r dyn RequestView) -> Result<Option<&'r [u8]>, KeyRejection> {
        let source = || KeySource::Header(self.header.clone());
        match single_header(req, &self.header).map_err(|k| KeyRejection::new(k, source()))? {
            None if self.required => Err(KeyRejection::missing(source())),
            None => Ok(None),
            Some(raw) => parse_raw_text(raw, self.max_len)
                .map(Some)
                .map_err(|k| KeyRejection::new(k, source())),
        }
    }
}

impl KeyExtractor for HeaderKey {
    fn extract_into(
        &self,
        req: &dyn RequestView,
        material: &mut KeyMaterial,
    ) -> Result<bool, KeyRejection> {
        match self.value(req)? {
            Some(value) => {
                material
                    .push(TAG_HEADER)
                    .push(self.header.as_bytes())
                    .push(value);
                Ok(true)
            }
            None => Ok(false),
        }
    }
}

// ===== PathKey / MethodPathKey / RouteParamKey =====

/// The request path (without query) as lock key: one lock per resource.
/// Never rejects.
///
/// ```
/// use tower_redlock::http::{KeyExtractor, PathKey, SimpleRequest};
///
/// let a = PathKey.extract(&SimpleRequest::new("PUT", "/docs/1")).unwrap();
/// let b = PathKey.extract(&SimpleRequest::new("DELETE", "/docs/1?force")).unwrap();
/// assert_eq!(a, b);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct PathKey;

impl KeyExtractor for PathKey {
    fn extract_into(
        &self,
        req: &dyn RequestView,
        material: &mut KeyMaterial,
    ) -> Result<bool, KeyRejection> {
        material.push(TAG_PATH).push(req.path());
        Ok(true)
    }
}

/// Method and path as lock key: `PUT /docs/1` and `DELETE /docs/1` take two
/// locks. Never rejects.
///
/// ```
/// use tower_redlock::http::{KeyExtractor, MethodPathKey, SimpleRequest};
///
/// let put = MethodPathKey.extract(&SimpleRequest::new("PUT", "/docs/1")).unwrap();
/// let del = MethodPathKey.extract(&SimpleRequest::new("DELETE", "/docs/1")).unwrap();
/// assert_ne!(put, del);
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct MethodPathKey;

impl KeyExtractor for MethodPathKey {
    fn extract_into(
        &self,
        req: &dyn RequestView,
        material: &mut KeyMaterial,
    ) -> Result<bool, KeyRejection> {
        material
            .push(TAG_METHOD_PATH)
            .push(req.method())
            .push(req.path());
        Ok(true)
    }
}

/// A route parameter as lock key, e.g. `id` in `/accounts/{id}/transfer`.
///
/// The parameter must exist (a missing one means the extractor is mounted on
/// a route without it; the request is rejected with a message saying so),
/// be non-empty and at most [`max_len`](Self::max_len) bytes (default 255).
/// The value is not scoped by route: two routes with the same parameter
/// share locks unless you add
/// [`scoped_by_route`](KeyExtractorExt::scoped_by_route).
///
/// ```
/// use tower_redlock::http::{KeyExtractor, RouteParamKey, SimpleRequest};
///
/// let by_account = RouteParamKey::new("id");
/// let req = SimpleRequest::new("POST", "/accounts/7/transfer")
///     .route("/accounts/{id}/transfer")
///     .param("id", "7");
/// assert!(by_account.extract(&req).unwrap().is_some());
///
/// let wrong_route = SimpleRequest::new("POST", "/health");
/// assert!(by_account.extract(&wrong_route).unwrap_err().is_missing());
/// ```
#[derive(Clone, Debug)]
pub struct RouteParamKey {
    name: Cow<'static, str>,
    max_len: usize,
}

impl RouteParamKey {
    /// Reads route parameter `name`.
    pub fn new(name: impl Into<Cow<'static, str>>) -> Self {
        Self {
            name: name.into(),
            max_len: DEFAULT_MAX_KEY_LEN,
        }
    }

    /// Bounds the value's length in bytes (default 255).
    #[must_use]
    pub fn max_len(mut self, max: usize) -> Self {
        self.max_len = max;
        self
    }
}

impl KeyExtractor for RouteParamKey {
    fn extract_into(
        &self,
        req: &dyn RequestView,
        material: &mut KeyMaterial,
    ) -> Result<bool, KeyRejection> {
        let source = || KeySource::RouteParam(self.name.clone());
        let value = req.path_param(&self.name).ok_or_else(|| {
            if req.path_params_malformed() {
                KeyRejection::malformed(source(), "not valid UTF-8")
            } else {
                KeyRejection::missing(source())
            }
        })?;
        if value.is_empty() {
            return Err(KeyRejection::empty(source()));
        }
        if value.len() > self.max_len {
            return Err(KeyRejection::too_long(source(), self.max_len));
        }
        material
            .push(TAG_ROUTE_PARAM)
            .push(self.name.as_bytes())
            .push(value);
        Ok(true)
    }
}

// ===== Combinators =====

/// Combinators for every [`KeyExtractor`]: scope a key, or change its prefix.
///
/// Scope goes into the key material before the one hash. A scope is only
/// read when the inner extractor found a key: a request that passes through
/// unlocked is never rejected for its scope.
///
/// ```
/// use tower_redlock::http::{IdempotencyKey, KeyExtractor, KeyExtractorExt, SimpleRequest};
///
/// let extractor = IdempotencyKey::required().scoped_by_route();
/// let on = |route: &str| {
///     let req = SimpleRequest::new("POST", route)
///         .route(route)
///         .header("idempotency-key", "\"k1\"");
///     extractor.extract(&req).unwrap().unwrap()
/// };
/// assert_ne!(on("/payments"), on("/refunds"));
/// assert_eq!(on("/payments"), on("/payments"));
/// ```
pub trait KeyExtractorExt: KeyExtractor + Sized {
    /// Scopes the key by the matched route (or, when the router does not
    /// expose it, the path): the same key on two routes takes two locks.
    fn scoped_by_route(self) -> ScopedByRoute<Self> {
        ScopedByRoute { inner: self }
    }

    /// Scopes the key by the request method.
    fn scoped_by_method(self) -> ScopedByMethod<Self> {
        ScopedByMethod { inner: self }
    }

    /// Scopes the key by a header's value, e.g. a tenant id: each tenant has
    /// its own key space.
    ///
    /// When the inner extractor finds a key, the header is required: absent
    /// → missing; also rejected when empty, sent twice, not printable ASCII
    /// or longer than 255 bytes (as [`HeaderKey`]).
    fn scoped_by_header(self, name: impl Into<Cow<'static, str>>) -> ScopedByHeader<Self> {
        ScopedByHeader {
            inner: self,
            header: HeaderKey::new(name),
        }
    }

    /// Scopes the key by what `scope` returns. `None` means "no scope" and is
    /// distinct from `Some` of an empty value.
    ///
    /// ```
    /// use tower_redlock::http::{KeyExtractor, KeyExtractorExt, PathKey, SimpleRequest};
    ///
    /// // One key space per API version, from the first path segment.
    /// let extractor = PathKey.scoped_by(|req| {
    ///     req.path().split('/').nth(1).map(str::to_owned)
    /// });
    /// let key = extractor.extract(&SimpleRequest::new("PUT", "/v2/docs/1")).unwrap();
    /// assert!(key.is_some());
    /// ```
    fn scoped_by<F, S>(self, scope: F) -> ScopedBy<Self, F>
    where
        F: Fn(&dyn RequestView) -> Option<S> + Send + Sync + 'static,
        S: AsRef<[u8]>,
    {
        ScopedBy { inner: self, scope }
    }

    /// Replaces the key's Redis prefix (default [`DEFAULT_KEY_PREFIX`]); the
    /// outermost `prefix` wins.
    ///
    /// ```
    /// use tower_redlock::http::{KeyExtractor, KeyExtractorExt, PathKey, SimpleRequest};
    ///
    /// let key = PathKey.prefix("myapp:")
    ///     .extract(&SimpleRequest::new("PUT", "/docs/1"))
    ///     .unwrap()
    ///     .unwrap();
    /// assert!(key.as_str().starts_with("myapp:"));
    /// ```
    fn prefix(self, prefix: impl Into<Arc<str>>) -> Prefixed<Self> {
        Prefixed {
            inner: self,
            prefix: prefix.into(),
        }
    }
}

impl<E: KeyExtractor> KeyExtractorExt for E {}

/// Scopes a key by route; see [`KeyExtractorExt::scoped_by_route`].
#[derive(Clone, Debug)]
pub struct ScopedByRoute<E> {
    inner: E,
}

impl<E: KeyExtractor> KeyExtractor for ScopedByRoute<E> {
    fn extract_into(
        &self,
        req: &dyn RequestView,
        material: &mut KeyMaterial,
    ) -> Result<bool, KeyRejection> {
        if !self.inner.extract_into(req, material)? {
            return Ok(false);
        }
        let route = req.matched_route().unwrap_or_else(|| req.path());
        material.push(TAG_SCOPE_ROUTE).push(route);
        Ok(true)
    }
}

/// Scopes a key by method; see [`KeyExtractorExt::scoped_by_method`].
#[derive(Clone, Debug)]
pub struct ScopedByMethod<E> {
    inner: E,
}

impl<E: KeyExtractor> KeyExtractor for ScopedByMethod<E> {
    fn extract_into(
        &self,
        req: &dyn RequestView,
        material: &mut KeyMaterial,
    ) -> Result<bool, KeyRejection> {
        if !self.inner.extract_into(req, material)? {
            return Ok(false);
        }
        material.push(TAG_SCOPE_METHOD).push(req.method());
        Ok(true)
    }
}

/// Scopes a key by a header; see [`KeyExtractorExt::scoped_by_header`].
#[derive(Clone, Debug)]
pub struct ScopedByHeader<E> {
    inner: E,
    header: HeaderKey,
}

impl<E: KeyExtractor> KeyExtractor for ScopedByHeader<E> {
    fn extract_into(
        &self,
        req: &dyn RequestView,
        material: &mut KeyMaterial,
    ) -> Result<bool, KeyRejection> {
        if !self.inner.extract_into(req, material)? {
            return Ok(false);
        }
        // `header` is always required, so `None` cannot happen; treat it as
        // missing all the same.
        let value = self
            .header
            .value(req)?
            .ok_or_else(|| KeyRejection::missing(KeySource::Header(self.header.header.clone())))?;
        material
            .push(TAG_SCOPE_HEADER)
            .push(self.header.header.as_bytes())
            .push(value);
        Ok(true)
    }
}

/// Scopes a key by a closure; see [`KeyExtractorExt::scoped_by`].
#[derive(Clone)]
pub struct ScopedBy<E, F> {
    inner: E,
    scope: F,
}

impl<E: fmt::Debug, F> fmt::Debug for ScopedBy<E, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopedBy")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<E, F, S> KeyExtractor for ScopedBy<E, F>
where
    E: KeyExtractor,
    F: Fn(&dyn RequestView) -> Option<S> + Send + Sync + 'static,
    S: AsRef<[u8]>,
{
    fn extract_into(
        &self,
        req: &dyn RequestView,
        material: &mut KeyMaterial,
    ) -> Result<bool, KeyRejection> {
        if !self.inner.extract_into(req, material)? {
            return Ok(false);
        }
        match (self.scope)(req) {
            Some(scope) => {
                material.push(TAG_SCOPE_FN_SOME).push(scope);
            }
            None => {
                material.push(TAG_SCOPE_FN_NONE);
            }
        }
        Ok(true)
    }
}

/// Replaces a key's prefix; see [`KeyExtractorExt::prefix`].
#[derive(Clone, Debug)]
pub struct Prefixed<E> {
    inner: E,
    prefix: Arc<str>,
}

impl<E: KeyExtractor> KeyExtractor for Prefixed<E> {
    fn extract_into(
        &self,
        req: &dyn RequestView,
        material: &mut KeyMaterial,
    ) -> Result<bool, KeyRejection> {
        let found = self.inner.extract_into(req, material)?;
        material.set_prefix(Arc::clone(&self.prefix));
        Ok(found)
    }
}

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
    assert_send_sync::<Box<dyn KeyExtractor>>();
    assert_send_sync::<Arc<dyn KeyExtractor>>();
};

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "SECRET-zebra-4242";

    fn post(path: &str) -> SimpleRequest {
        SimpleRequest::new("POST", path)
    }

    fn idem(value: impl AsRef<[u8]>) -> SimpleRequest {
        post("/payments").header("idempotency-key", value)
    }

    fn extract(
        e: &impl KeyExtractor,
        req: &SimpleRequest,
    ) -> Result<Option<LockKey>, KeyRejection> {
        e.extract(req)
    }

    fn key(e: &impl KeyExtractor, req: &SimpleRequest) -> LockKey {
        match e.extract(req) {
            Ok(Some(key)) => key,
            other => panic!("expected a key, got {other:?}"),
        }
    }

    fn reject(e: &impl KeyExtractor, req: &SimpleRequest) -> KeyRejection {
        match e.extract(req) {
            Err(rejection) => rejection,
            other => panic!("expected a rejection, got {other:?}"),
        }
    }

    /// The key an `Idempotency-Key` with unescaped content `content` must get.
    fn idem_expected(content: &[u8]) -> LockKey {
        LockKey::from_parts([TAG_HEADER, b"idempotency-key", content])
    }

    // --- hashing ---

    #[test]
    fn known_answer_pins_the_encoding() {
        // sha256(00 00 00 00 00 00 00 03 'a' 'b' 'c'), first 16 bytes.
        let k = LockKey::from_parts(["abc"]);
        assert_eq!(k.as_str(), "tower-redlock:c3494ca1a2cf8eeb8a11ded316fb55b8");
        // Empty material: sha256 of nothing.
        assert_eq!(
            KeyMaterial::new().finish().as_str(),
            "tower-redlock:e3b0c44298fc1c149afbf4c8996fb924"
        );
    }

    #[test]
    fn parts_are_length_prefixed() {
        assert_ne!(
            LockKey::from_parts(["ab", "c"]),
            LockKey::from_parts(["a", "bc"])
        );
        assert_ne!(
            LockKey::from_parts(["abc"]),
            LockKey::from_parts(["abc", ""])
        );
    }

    #[test]
    fn lock_key_parts() {
        let k = LockKey::from_parts_with_prefix("app:", ["x"]);
        assert_eq!(k.prefix(), "app:");
        assert_eq!(k.digest_hex().len(), 32);
        assert!(k
            .digest_hex()
            .bytes()
            .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')));
        assert_eq!(k.as_str(), format!("app:{}", k.digest_hex()));
        assert_eq!(k.to_string(), k.as_str());
        assert_eq!(String::from(k.clone()), k.clone().into_string());
        let empty_prefix = LockKey::from_parts_with_prefix("", ["x"]);
        assert_eq!(empty_prefix.prefix(), "");
        assert_eq!(empty_prefix.as_str(), k.digest_hex());
    }

    // --- Idempotency-Key: accepted forms ---

    #[test]
    fn quoted_and_bare_forms_are_the_same_key() {
        let e = IdempotencyKey::required();
        let quoted = key(&e, &idem("\"order-123\""));
        let bare = key(&e, &idem("order-123"));
        assert_eq!(quoted, bare);
        assert_eq!(quoted, idem_expected(b"order-123"));
    }

    #[test]
    fn bare_tokens_people_use() {
        let e = IdempotencyKey::required();
        for token in [
            "8e03978e-40d5-43e8-bc93-6894a57f9324",
            "01ARZ3NDEKTSV4RRFFQ69G5FAV",
            "dGhpcyBpcyBhIGtleQ",
            "dGhpcyBpcyBhIGtleQ==",
            "a+b/c=",
            "urn:uuid:8e03978e",
            "order-123",
            "!#$%&'*+-.^_`|~:/",
        ] {
            assert_eq!(
                key(&e, &idem(token)),
                idem_expected(token.as_bytes()),
                "{token}"
            );
        }
    }

    #[test]
    fn ows_is_trimmed() {
        let e = IdempotencyKey::required();
        assert_eq!(key(&e, &idem(" \t\"abc\"\t ")), idem_expected(b"abc"));
        assert_eq!(key(&e, &idem("  abc  ")), idem_expected(b"abc"));
    }

    #[test]
    fn quoted_keys_may_hold_printable_ascii() {
        let e = IdempotencyKey::required();
        assert_eq!(key(&e, &idem("\"a b, c;d\"")), idem_expected(b"a b, c;d"));
        assert_eq!(key(&e, &idem("\" \"")), idem_expected(b" "));
    }

    #[test]
    fn escapes_are_unescaped() {
        let e = IdempotencyKey::required();
        assert_eq!(key(&e, &idem(r#""a\"b""#)), idem_expected(br#"a"b"#));
        assert_eq!(key(&e, &idem(r#""a\\b""#)), idem_expected(br"a\b"));
        assert_eq!(key(&e, &idem(r#""\\\"""#)), idem_expected(br#"\""#));
        assert_eq!(key(&e, &idem(r#""x\\""#)), idem_expected(br"x\"));
        assert_eq!(key(&e, &idem(r#""\"""#)), idem_expected(br#"""#));
    }

    #[test]
    fn other_header_name() {
        let e = IdempotencyKey::required().header_name("X-Request-Id");
        let req = post("/").header("x-request-id", "\"abc\"");
        assert_eq!(
            key(&e, &req),
            LockKey::from_parts([TAG_HEADER, b"x-request-id", b"abc"])
        );
        // Idempotency-Key is not read any more.
        assert!(reject(&e, &idem("abc")).is_missing());
        let r = reject(&e, &post("/"));
        assert_eq!(r.source_of_key(), &KeySource::header("x-request-id"));
    }

    // --- Idempotency-Key: rejections ---

    #[test]
    fn missing_required_and_optional() {
        let r = reject(&IdempotencyKey::required(), &post("/payments"));
        assert!(r.is_missing());
        assert_eq!(r.kind(), KeyRejectionKind::Missing);
        assert_eq!(r.status(), 400);
        assert!(
            r.detail().contains("`idempotency-key` header"),
            "{}",
            r.detail()
        );
        assert_eq!(
            extract(&IdempotencyKey::optional(), &post("/payments")),
            Ok(None)
        );
        assert!(IdempotencyKey::default().required);
    }

    #[test]
    fn empty_values() {
        for e in [IdempotencyKey::required(), IdempotencyKey::optional()] {
            for v in ["", "   ", "\t", "\"\"", " \"\" "] {
                assert!(reject(&e, &idem(v)).is_empty(), "{v:?}");
            }
        }
    }

    #[test]
    fn malformed_values() {
        let e = IdempotencyKey::required();
        for v in [
            "a b",
            "a,b",
            "\"a\", \"b\"",
            "a\"b",
            "\"abc",
            "\"abc\\\"",
            "\"abc\" x",
            "\"abc\"\"",
            r#""a\nb""#,
            r#""a\b""#,
            "\"a\tb\"",
            "\"a\x7fb\"",
            "\"\\",
            "\"",
            "a;b",
            "a@b",
            "(a)",
            "a\x01",
            "caf\u{e9}",
            "\"caf\u{e9}\"",
        ] {
            let r = reject(&e, &idem(v));
            assert!(r.is_malformed(), "{v:?} gave {r:?}");
            assert_eq!(r.status(), 400);
        }
    }

    #[test]
    fn non_utf8_bytes_are_malformed() {
        let e = IdempotencyKey::required();
        for v in [
            &b"\xff\xfe"[..],
            b"\"\xc3\x28\"",
            b"abc\x80",
            b"\"abc\xff\"",
            b"\x00",
        ] {
            assert!(reject(&e, &idem(v)).is_malformed(), "{v:?}");
        }
    }

    #[test]
    fn length_bound_is_255_after_unquoting() {
        let e = IdempotencyKey::required();
        let ok = "k".repeat(255);
        let long = "k".repeat(256);
        assert!(key(&e, &idem(&ok)) == idem_expected(ok.as_bytes()));
        assert!(key(&e, &idem(format!("\"{ok}\""))) == idem_expected(ok.as_bytes()));
        let r = reject(&e, &idem(&long));
        assert_eq!(r.kind(), KeyRejectionKind::TooLong { max: 255 });
        assert!(reject(&e, &idem(format!("\"{long}\""))).is_too_long());
        // Escapes count once: 253 + `\"` + `\\` is 257 raw bytes, 255 unescaped.
        let escaped = format!("\"{}\\\"\\\\\"", "k".repeat(253));
        assert_eq!(
            key(&e, &idem(&escaped)),
            idem_expected(format!("{}\"\\", "k".repeat(253)).as_bytes())
        );
        let escaped_long = format!("\"{}\\\"\\\\\"", "k".repeat(254));
        assert!(reject(&e, &idem(escaped_long)).is_too_long());
    }

    #[test]
    fn custom_max_len() {
        let e = IdempotencyKey::required().max_len(4);
        assert!(key(&e, &idem("abcd")) == idem_expected(b"abcd"));
        assert!(reject(&e, &idem("abcde")).is_too_long());
        assert!(reject(&e, &idem("\"abcde\"")).is_too_long());
        let r = reject(&e, &idem("abcde"));
        assert!(r.detail().contains("4 bytes"), "{}", r.detail());
        let zero = IdempotencyKey::required().max_len(0);
        assert!(reject(&zero, &idem("a")).is_too_long());
    }

    #[test]
    fn duplicate_header() {
        for e in [IdempotencyKey::required(), IdempotencyKey::optional()] {
            let req = idem("\"a\"").header("Idempotency-Key", "\"a\"");
            assert!(reject(&e, &req).is_duplicate());
        }
    }

    // --- HeaderKey ---

    #[test]
    fn header_key() {
        let e = HeaderKey::new("X-Tenant-Id");
        let req = post("/").header("x-tenant-id", "  acme corp ");
        assert_eq!(
            key(&e, &req),
            LockKey::from_parts([TAG_HEADER, b"x-tenant-id", b"acme corp"])
        );
        // Quotes are part of a raw value.
        let quoted = post("/").header("x-tenant-id", "\"acme corp\"");
        assert_ne!(key(&e, &quoted), key(&e, &req));

        assert!(reject(&e, &post("/")).is_missing());
        assert_eq!(extract(&e.clone().optional(), &post("/")), Ok(None));
        assert!(reject(&e.clone().optional().required(), &post("/")).is_missing());
        assert!(reject(&e, &post("/").header("x-tenant-id", " ")).is_empty());
        assert!(reject(&e, &post("/").header("x-tenant-id", b"a\xffb")).is_malformed());
        assert!(reject(&e, &post("/").header("x-tenant-id", "a\x01")).is_malformed());
        let dup = post("/")
            .header("x-tenant-id", "a")
            .header("X-TENANT-ID", "b");
        assert!(reject(&e, &dup).is_duplicate());
        assert!(
            key(&e, &post("/").header("x-tenant-id", "t".repeat(255)))
                .digest_hex()
                .len()
                == 32
        );
        assert!(reject(&e, &post("/").header("x-tenant-id", "t".repeat(256))).is_too_long());
        assert!(reject(&e.max_len(2), &post("/").header("x-tenant-id", "abc")).is_too_long());
    }

    #[test]
    fn header_keys_agree_on_one_header_and_differ_across_headers() {
        // Same header and same value: the same key (both are "this header's
        // value"); a different header name: a different key.
        let a = key(&HeaderKey::new("x-a"), &post("/").header("x-a", "v"));
        let b = key(&HeaderKey::new("x-b"), &post("/").header("x-b", "v"));
        assert_ne!(a, b);
        let idem = IdempotencyKey::required().header_name("x-a");
        assert_eq!(key(&idem, &post("/").header("x-a", "v")), a);
    }

    // --- path, method, route param ---

    #[test]
    fn path_and_method_path() {
        let put = post("/docs/1");
        let get = SimpleRequest::new("GET", "/docs/1?x=1");
        assert_eq!(key(&PathKey, &put), key(&PathKey, &get));
        assert_ne!(key(&MethodPathKey, &put), key(&MethodPathKey, &get));
        assert_ne!(key(&PathKey, &put), key(&PathKey, &post("/docs/2")));
        // Tags keep extractors apart: a path and a header with the same bytes.
        let h = key(&HeaderKey::new("x"), &post("/").header("x", "/docs/1"));
        assert_ne!(h, key(&PathKey, &put));
    }

    #[test]
    fn route_param() {
        let e = RouteParamKey::new("id");
        let req = post("/a/7").route("/a/{id}").param("id", "7");
        assert_eq!(
            key(&e, &req),
            LockKey::from_parts([TAG_ROUTE_PARAM, b"id", b"7"])
        );
        let r = reject(&e, &post("/health"));
        assert!(r.is_missing());
        assert_eq!(r.source_of_key(), &KeySource::route_param("id"));
        assert!(
            r.detail().contains("route parameter `id`"),
            "{}",
            r.detail()
        );
        assert!(reject(&e, &post("/a/").param("id", "")).is_empty());
        assert!(
            key(&e, &post("/").param("id", "i".repeat(255)))
                .digest_hex()
                .len()
                == 32
        );
        assert!(reject(&e, &post("/").param("id", "i".repeat(256))).is_too_long());
        assert!(reject(&e.max_len(1), &post("/").param("id", "12")).is_too_long());
    }

    // --- combinators ---

    #[test]
    fn scoped_by_route() {
        let e = IdempotencyKey::required().scoped_by_route();
        let on =
            |path: &str, route: &str| post(path).route(route).header("idempotency-key", "\"k\"");
        let pay = key(&e, &on("/payments/1", "/payments/{id}"));
        assert_eq!(pay, key(&e, &on("/payments/2", "/payments/{id}")));
        assert_eq!(pay, key(&e, &on("/payments/1", "/payments/{id}")));
        assert_ne!(pay, key(&e, &on("/refunds/1", "/refunds/{id}")));
        assert_ne!(
            pay,
            key(
                &IdempotencyKey::required(),
                &on("/payments/1", "/payments/{id}")
            )
        );
        // No route known: the path scopes.
        let by_path = |path: &str| post(path).header("idempotency-key", "\"k\"");
        assert_ne!(key(&e, &by_path("/a")), key(&e, &by_path("/b")));
        assert_eq!(key(&e, &by_path("/a")), key(&e, &on("/x", "/a")));
        // Rejections and pass-through come from the inner extractor.
        assert!(reject(&e, &post("/payments")).is_missing());
        let opt = IdempotencyKey::optional().scoped_by_route();
        assert_eq!(extract(&opt, &post("/payments")), Ok(None));
    }

    #[test]
    fn scoped_by_method() {
        let e = IdempotencyKey::required().scoped_by_method();
        let put = SimpleRequest::new("PUT", "/").header("idempotency-key", "k");
        let del = SimpleRequest::new("DELETE", "/").header("idempotency-key", "k");
        assert_ne!(key(&e, &put), key(&e, &del));
        assert_eq!(key(&e, &put), key(&e, &put.clone()));
    }

    #[test]
    fn scoped_by_header() {
        let e = IdempotencyKey::required().scoped_by_header("X-Tenant-Id");
        let t = |tenant: &str| idem("\"k\"").header("x-tenant-id", tenant);
        assert_ne!(key(&e, &t("acme")), key(&e, &t("globex")));
        assert_eq!(key(&e, &t("acme")), key(&e, &t(" acme")));
        let r = reject(&e, &idem("\"k\""));
        assert!(r.is_missing());
        assert_eq!(r.source_of_key(), &KeySource::header("x-tenant-id"));
        assert!(reject(&e, &t("acme").header("x-tenant-id", "acme")).is_duplicate());
        assert!(reject(&e, &t("")).is_empty());
        // The key's own rejection comes first.
        assert!(reject(&e, &post("/").header("x-tenant-id", "acme")).is_missing());
        // No key: the tenant header is not needed.
        let opt = IdempotencyKey::optional().scoped_by_header("x-tenant-id");
        assert_eq!(extract(&opt, &post("/")), Ok(None));
    }

    #[test]
    fn scoped_by_closure() {
        let e = PathKey.scoped_by(|req| req.header("x-v").map(<[u8]>::to_vec));
        let none = key(&e, &post("/a"));
        let empty = key(&e, &post("/a").header("x-v", ""));
        let v1 = key(&e, &post("/a").header("x-v", "1"));
        assert_ne!(none, empty);
        assert_ne!(empty, v1);
        assert_ne!(none, key(&PathKey, &post("/a")));
        assert_eq!(v1, key(&e, &post("/a").header("x-v", "1")));
        // Two optional scopes cannot collide by shifting values.
        let two = PathKey
            .scoped_by(|req| req.header("x-a").map(<[u8]>::to_vec))
            .scoped_by(|req| req.header("x-b").map(<[u8]>::to_vec));
        let only_a = key(&two, &post("/").header("x-a", "scope:fn"));
        let only_b = key(&two, &post("/").header("x-b", "scope:fn"));
        assert_ne!(only_a, only_b);
    }

    #[test]
    fn scoping_order_is_deterministic() {
        let req = idem("k").route("/r").header("x-t", "t");
        let a = IdempotencyKey::required()
            .scoped_by_route()
            .scoped_by_header("x-t");
        let b = IdempotencyKey::required()
            .scoped_by_route()
            .scoped_by_header("x-t");
        assert_eq!(key(&a, &req), key(&b, &req));
        // Expected bytes, to pin that scope goes into the same single hash.
        let expected = LockKey::from_parts([
            TAG_HEADER,
            b"idempotency-key",
            b"k",
            TAG_SCOPE_ROUTE,
            b"/r",
            TAG_SCOPE_HEADER,
            b"x-t",
            b"t",
        ]);
        assert_eq!(key(&a, &req), expected);
    }

    #[test]
    fn prefixes() {
        let req = idem("k").route("/r");
        assert!(key(&IdempotencyKey::required(), &req)
            .as_str()
            .starts_with(DEFAULT_KEY_PREFIX));
        let p = key(&IdempotencyKey::required().prefix("myapp:"), &req);
        assert_eq!(p.prefix(), "myapp:");
        assert_eq!(
            p.digest_hex(),
            key(&IdempotencyKey::required(), &req).digest_hex()
        );
        // Outermost wins; the prefix survives later scoping.
        let outer = IdempotencyKey::required().prefix("a:").prefix("b:");
        assert_eq!(key(&outer, &req).prefix(), "b:");
        let inner = IdempotencyKey::required().prefix("a:").scoped_by_route();
        assert_eq!(key(&inner, &req).prefix(), "a:");
        // `None` keeps no prefix state around.
        assert_eq!(
            extract(&IdempotencyKey::optional().prefix("a:"), &post("/")),
            Ok(None)
        );
    }

    // --- closures, Arc, Box ---

    #[test]
    fn closure_extractors() {
        let e = key_fn(|req| match req.header("x-user") {
            Some([]) => Err(KeyRejection::empty(KeySource::header("x-user"))),
            Some(u) => Ok(Some(LockKey::from_parts([&b"user"[..], u]))),
            None => Ok(None),
        });
        let req = post("/").header("x-user", "u1");
        assert_eq!(key(&e, &req), LockKey::from_parts([&b"user"[..], b"u1"]));
        assert_eq!(extract(&e, &post("/")), Ok(None));
        assert!(reject(&e, &post("/").header("x-user", "")).is_empty());

        // Under combinators the closure's key is one part of a new hash.
        let scoped = key_fn(|req| Ok(req.header("x-user").map(|u| LockKey::from_parts([u]))))
            .scoped_by_route();
        let a = key(&scoped, &req.clone().route("/a"));
        let b = key(&scoped, &req.clone().route("/b"));
        assert_ne!(a, b);
        assert_eq!(a.prefix(), DEFAULT_KEY_PREFIX);
        // A closure's custom prefix is kept, unless replaced.
        let custom = key_fn(|_| Ok(Some(LockKey::from_parts_with_prefix("c:", ["x"]))));
        assert_eq!(key(&custom, &req).prefix(), "c:");
        let custom = key_fn(|_| Ok(Some(LockKey::from_parts_with_prefix("c:", ["x"]))));
        assert_eq!(key(&custom.scoped_by_method(), &req).prefix(), "c:");
        let custom = key_fn(|_| Ok(Some(LockKey::from_parts_with_prefix("c:", ["x"]))));
        assert_eq!(
            key(&custom.scoped_by_method().prefix("d:"), &req).prefix(),
            "d:"
        );

        // Annotated closures work without `key_fn`.
        let plain = |_: &dyn RequestView| -> Result<Option<LockKey>, KeyRejection> { Ok(None) };
        assert_eq!(extract(&plain, &req), Ok(None));
    }

    #[test]
    fn trait_objects() {
        let boxed: Box<dyn KeyExtractor> = Box::new(IdempotencyKey::required().scoped_by_route());
        let shared: Arc<dyn KeyExtractor> = Arc::new(IdempotencyKey::required().scoped_by_route());
        let req = idem("k").route("/r");
        assert_eq!(key(&boxed, &req), key(&shared, &req));
        let scoped = shared.clone().scoped_by_method();
        assert_ne!(key(&scoped, &req), key(&shared, &req));
        let extractors: Vec<Box<dyn KeyExtractor>> =
            vec![Box::new(PathKey), Box::new(MethodPathKey)];
        assert_eq!(extractors.len(), 2);
    }

    // --- nothing leaks the raw key ---

    #[test]
    fn lock_key_never_shows_the_raw_key() {
        let e = IdempotencyKey::required().scoped_by_route();
        let k = key(&e, &idem(format!("\"{SECRET}\"")));
        for shown in [
            format!("{k}"),
            format!("{k:?}"),
            format!("{k:#?}"),
            k.as_str().to_owned(),
        ] {
            assert!(!shown.contains(SECRET), "{shown}");
            assert!(!shown.contains("zebra"), "{shown}");
        }
        let mut material = KeyMaterial::new();
        material.push(SECRET);
        assert!(!format!("{material:?}").contains("zebra"));
        let req = idem(SECRET).param("id", SECRET);
        assert!(!format!("{req:?}").contains("zebra"), "{req:?}");
    }

    #[test]
    fn rejections_never_show_the_raw_key() {
        let e = IdempotencyKey::required().max_len(30);
        let cases = [
            idem(format!("\"{SECRET}")),                    // unterminated
            idem(format!("{SECRET} x")),                    // space
            idem(format!("\"{SECRET}\\n\"")),               // bad escape
            idem(format!("\"{SECRET}\" trailing")),         // trailing garbage
            idem(format!("{SECRET}{SECRET}")),              // too long
            idem(SECRET).header("idempotency-key", SECRET), // duplicate
        ];
        let mut kinds = Vec::new();
        for req in &cases {
            let r = reject(&e, req);
            kinds.push(r.kind());
            for shown in [
                r.to_string(),
                format!("{r:?}"),
                format!("{r:#?}"),
                r.detail(),
                r.title().to_owned(),
                r.code().to_owned(),
            ] {
                assert!(!shown.contains("zebra"), "{shown}");
            }
            assert_eq!(r.status(), 400);
        }
        assert!(kinds
            .iter()
            .any(|k| matches!(k, KeyRejectionKind::TooLong { .. })));
        assert!(kinds
            .iter()
            .any(|k| matches!(k, KeyRejectionKind::Duplicate)));
        assert!(kinds
            .iter()
            .any(|k| matches!(k, KeyRejectionKind::Malformed { .. })));
    }

    #[test]
    fn rejection_texts() {
        let h = || KeySource::header("idempotency-key");
        let all = [
            KeyRejection::missing(h()),
            KeyRejection::empty(h()),
            KeyRejection::too_long(h(), 255),
            KeyRejection::malformed(h(), "the quoted key has no closing quote"),
            KeyRejection::duplicate(h()),
            KeyRejection::missing(KeySource::route_param("id")),
            KeyRejection::missing(KeySource::other("`session` cookie")),
        ];
        let mut titles = std::collections::HashSet::new();
        for r in &all {
            assert_eq!(r.status(), 400);
            assert!(!r.title().is_empty());
            assert!(r.code().starts_with("key-"));
            assert!(r.detail().ends_with('.'), "{}", r.detail());
            assert_eq!(r.detail(), r.to_string());
            titles.insert(r.title());
            let _: &dyn std::error::Error = r;
        }
        assert_eq!(titles.len(), 5);
        assert_eq!(
            all[0].detail(),
            "The request has no `idempotency-key` header, which this endpoint requires."
        );
        assert_eq!(
            all[2].detail(),
            "The `idempotency-key` header is longer than 255 bytes."
        );
        assert_eq!(
            all[3].detail(),
            "The `idempotency-key` header is malformed: the quoted key has no closing quote."
        );
        assert_eq!(
            all[6].detail(),
            "The request has no `session` cookie, which this endpoint requires."
        );
        assert!(all[1].is_empty() && all[4].is_duplicate() && all[2].is_too_long());
    }

    #[test]
    fn simple_request_view() {
        let req = SimpleRequest::new("PATCH", "/x?y=z")
            .header("A", "1")
            .header("a", b"\xff")
            .param("p", "v")
            .route("/{p}");
        let view: &dyn RequestView = &req;
        assert_eq!(view.method(), "PATCH");
        assert_eq!(view.path(), "/x");
        assert_eq!(view.matched_route(), Some("/{p}"));
        assert_eq!(view.header("a"), Some(&b"1"[..]));
        assert_eq!(view.header_count("A"), 2);
        assert_eq!(view.header("b"), None);
        assert_eq!(view.header_count("b"), 0);
        assert_eq!(view.path_param("p"), Some("v"));
        assert_eq!(view.path_param("q"), None);
        let by_ref: &&SimpleRequest = &&req;
        assert_eq!(by_ref.path(), "/x");
    }
}

#[cfg(test)]
mod prop {
    use super::*;
    use proptest::prelude::*;

    fn check_extractor(e: &dyn KeyExtractor, req: &SimpleRequest) -> Result<(), TestCaseError> {
        match e.extract(req) {
            Ok(Some(k)) => {
                prop_assert_eq!(k.digest_hex().len(), 32);
                prop_assert_eq!(k.as_str().len(), k.prefix().len() + 32);
            }
            Ok(None) => {}
            Err(r) => {
                prop_assert_eq!(r.status(), 400);
                prop_assert!(!r.detail().is_empty());
            }
        }
        Ok(())
    }

    /// Escapes `s` into an RFC 8941 string.
    fn sf_string(s: &str) -> String {
        let mut out = String::with_capacity(s.len() + 2);
        out.push('"');
        for c in s.chars() {
            if c == '"' || c == '\\' {
                out.push('\\');
            }
            out.push(c);
        }
        out.push('"');
        out
    }

    proptest! {
        #[test]
        fn arbitrary_header_bytes_never_panic(
            value in proptest::collection::vec(any::<u8>(), 0..600),
            second in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..8)),
        ) {
            let mut req = SimpleRequest::new("POST", "/p")
                .header("idempotency-key", &value)
                .header("x-tenant-id", &value)
                .param("id", String::from_utf8_lossy(&value));
            if let Some(second) = second {
                req = req.header("idempotency-key", second);
            }
            let extractors: [Box<dyn KeyExtractor>; 6] = [
                Box::new(IdempotencyKey::required()),
                Box::new(IdempotencyKey::optional().max_len(8)),
                Box::new(HeaderKey::new("x-tenant-id")),
                Box::new(RouteParamKey::new("id")),
                Box::new(PathKey.scoped_by_header("x-tenant-id")),
                Box::new(IdempotencyKey::required().scoped_by_route().scoped_by_header("x-tenant-id")),
            ];
            for e in &extractors {
                check_extractor(e.as_ref(), &req)?;
            }
        }

        #[test]
        fn quoted_printable_ascii_round_trips(s in "[ -~]{1,255}") {
            let req = SimpleRequest::new("POST", "/").header("idempotency-key", sf_string(&s));
            let k = IdempotencyKey::required().extract(&req);
            prop_assert_eq!(
                k,
                Ok(Some(LockKey::from_parts([TAG_HEADER, b"idempotency-key", s.as_bytes()])))
            );
        }

        #[test]
        fn bare_and_quoted_tokens_agree(s in "[A-Za-z0-9:/=+_.~-]{1,255}") {
            let e = IdempotencyKey::required();
            let bare = e.extract(&SimpleRequest::new("POST", "/").header("idempotency-key", &s));
            let quoted = e.extract(&SimpleRequest::new("POST", "/").header("idempotency-key", format!("\"{s}\"")));
            prop_assert!(matches!(bare, Ok(Some(_))));
            prop_assert_eq!(bare, quoted);
        }

        #[test]
        fn keys_are_deterministic(
            key in "[ -~]{1,64}",
            route in "/[a-z{}/]{0,20}",
            tenant in "[a-z0-9]{1,16}",
        ) {
            let e = IdempotencyKey::required().scoped_by_route().scoped_by_header("x-tenant-id");
            let req = || SimpleRequest::new("POST", "/x")
                .route(route.clone())
                .header("x-tenant-id", &tenant)
                .header("idempotency-key", sf_string(&key));
            let a = e.extract(&req());
            prop_assert!(matches!(a, Ok(Some(_))));
            prop_assert_eq!(a, e.extract(&req()));
        }
    }
}
