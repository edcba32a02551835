//! The framework-neutral request view that key extractors read, and [`SimpleRequest`] for
//! tests.

use std::fmt;

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
