//! Header keys: [`IdempotencyKey`] and [`HeaderKey`].

use super::*;

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
/// after unquoting (default [`IdempotencyKey::DEFAULT_MAX_LEN`](crate::key::IdempotencyKey::DEFAULT_MAX_LEN), 255), malformed, or the
/// header was sent more than once.
///
/// The key is not scoped: combine with
/// [`scoped_by_route`](KeyExtractorExt::scoped_by_route) (and a tenant scope)
/// so that one key reused on two endpoints takes two locks.
///
/// ```
/// use tower_redlock::key::{IdempotencyKey, KeyExtractor, SimpleRequest};
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
    pub(super) required: bool,
    max_len: usize,
}

impl IdempotencyKey {
    /// The default bound, in bytes, on a key taken from a header or a route parameter
    /// (after unquoting): of [`IdempotencyKey`], [`HeaderKey`] and
    /// [`RouteParamKey`](crate::key::RouteParamKey).
    pub const DEFAULT_MAX_LEN: usize = DEFAULT_MAX_KEY_LEN;

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
/// use tower_redlock::key::{HeaderKey, KeyExtractor, SimpleRequest};
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
    pub(super) header: Cow<'static, str>,
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
    pub(super) fn value<'r>(
        &self,
        req: &'r dyn RequestView,
    ) -> Result<Option<&'r [u8]>, KeyRejection> {
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
