//! Why a request has no usable key: [`KeyRejection`], its kind and source.

use super::*;

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
/// use tower_redlock::key::{IdempotencyKey, KeyExtractor, SimpleRequest};
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
