//! [`RejectionResponse`]: the framework-neutral answer a responder builds, and the header
//! checks it makes.

use std::borrow::Cow;

use bytes::Bytes;

/// A framework-neutral response: what the glue turns into an axum or actix-web response.
///
/// Built with [`new`](Self::new) and the `with_*` methods, so it can grow without breaking
/// responders.
///
/// ```
/// use tower_redlock::rejection::RejectionResponse;
///
/// let res = RejectionResponse::new(409, "text/plain; charset=utf-8", "busy, retry")
///     .with_retry_after(3)
///     .with_header("x-request-state", "in-progress")
///     .with_header("bad name", "dropped"); // not a valid header name: dropped, logged
/// assert_eq!(res.status(), 409);
/// assert_eq!(res.retry_after(), Some(3));
/// assert_eq!(res.headers().collect::<Vec<_>>(), [("x-request-state", "in-progress")]);
/// assert_eq!(&res.body()[..], b"busy, retry");
/// ```
#[derive(Debug, Clone)]
pub struct RejectionResponse {
    status: u16,
    content_type: Cow<'static, str>,
    retry_after: Option<u64>,
    headers: Vec<(Cow<'static, str>, String)>,
    body: Bytes,
}

impl RejectionResponse {
    /// A response with this status (a status outside 100–999 is answered as `500`),
    /// `Content-Type` and body.
    pub fn new(
        status: u16,
        content_type: impl Into<Cow<'static, str>>,
        body: impl Into<Bytes>,
    ) -> Self {
        let mut content_type = content_type.into();
        if !is_header_value(&content_type) {
            tracing::error!("invalid Content-Type of a rejection replaced by text/plain");
            content_type = Cow::Borrowed("text/plain; charset=utf-8");
        }
        Self {
            status,
            content_type,
            retry_after: None,
            headers: Vec::new(),
            body: body.into(),
        }
    }

    /// Adds a `Retry-After` header, in seconds.
    #[must_use]
    pub fn with_retry_after(mut self, secs: u64) -> Self {
        self.retry_after = Some(secs);
        self
    }

    /// Adds a header. Some headers are dropped and logged at error: a name that is not an HTTP
    /// token, a value with control characters (CR, LF, ...), or one of `Content-Type`,
    /// `Content-Length`, `Transfer-Encoding` and `Retry-After`. (Those are set from the constructor
    /// and [`with_retry_after`](Self::with_retry_after).) A rejection must always be sendable.
    #[must_use]
    pub fn with_header(
        mut self,
        name: impl Into<Cow<'static, str>>,
        value: impl Into<String>,
    ) -> Self {
        let (name, value) = (name.into(), value.into());
        // The framing and the headers set from the fields are the rejection's own.
        let reserved = [
            "content-type",
            "content-length",
            "transfer-encoding",
            "retry-after",
        ]
        .iter()
        .any(|r| name.eq_ignore_ascii_case(r));
        if !reserved && is_token(&name) && is_header_value(&value) {
            self.headers.push((name, value));
        } else {
            tracing::error!(header = %name.escape_debug(), "invalid header of a rejection dropped");
        }
        self
    }

    /// The HTTP status code.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// The `Content-Type` header.
    pub fn content_type(&self) -> &str {
        &self.content_type
    }

    /// The `Retry-After` header, in seconds.
    pub fn retry_after(&self) -> Option<u64> {
        self.retry_after
    }

    /// The extra headers, in the order they were added.
    pub fn headers(&self) -> impl Iterator<Item = (&str, &str)> + '_ {
        self.headers.iter().map(|(n, v)| (&**n, v.as_str()))
    }

    /// The body.
    pub fn body(&self) -> &Bytes {
        &self.body
    }

    /// The body, taken out (for the glue).
    #[cfg(any(feature = "tower", feature = "actix"))]
    pub(crate) fn into_body(self) -> Bytes {
        self.body
    }
}

/// Whether `s` is an HTTP token (RFC 9110 §5.6.2): header and method names.
pub(crate) fn is_token(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Whether `s` can be a header value: visible ASCII, spaces and tabs.
fn is_header_value(s: &str) -> bool {
    s.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
}
