//! The framework-neutral request view that key extractors read, and [`SimpleRequest`] for
//! tests.

use std::any::{Any, TypeId};
use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;

/// The framework-neutral view of an HTTP request that key extractors read.
///
/// The tower/axum and actix-web glue implement it for their request types;
/// [`SimpleRequest`] implements it for tests.
pub trait RequestView {
    /// The request method, e.g. `"POST"`.
    fn method(&self) -> &str;

    /// The request path without the query string, e.g. `"/payments/42"`: the whole path the
    /// client sent, also inside an axum router nested under a prefix.
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
    /// UTF-8 once percent-decoded; [`path_param`](Self::path_param) then has
    /// no value for them): a route parameter key then rejects the request as
    /// malformed, not as missing. Default: `false`.
    fn path_params_malformed(&self) -> bool {
        false
    }

    /// The query string without the `?`, e.g. `"page=2&sort=asc"`, if the request has one.
    /// Default: `None`.
    fn query(&self) -> Option<&str> {
        None
    }

    /// The address of the peer that sent the request, when the framework knows it (actix-web
    /// always; axum when served with `into_make_service_with_connect_info::<SocketAddr>()`).
    /// Behind a proxy this is the proxy's address. Default: `None`.
    fn peer_addr(&self) -> Option<SocketAddr> {
        None
    }

    /// The request extension of the type `ty` names, if there is one: what an earlier layer
    /// (authentication, tenancy) put into the request. Read it typed with
    /// [`extension`](trait.RequestView.html#method.extension) on `dyn RequestView`;
    /// implement it with [`ExtensionType::type_id`] over your own map. Default: none.
    fn extension_of(&self, ty: &ExtensionType) -> Option<&dyn Any> {
        let _ = ty;
        None
    }
}

impl dyn RequestView + '_ {
    /// The request extension of type `T`: e.g. the principal an authentication layer put
    /// into the request, to scope keys by it (see
    /// [`scoped_by_extension`](crate::key::KeyExtractorExt::scoped_by_extension)).
    ///
    /// ```
    /// use tower_redlock::key::{RequestView, SimpleRequest};
    ///
    /// #[derive(Clone)]
    /// struct Tenant(String);
    ///
    /// let req = SimpleRequest::new("POST", "/payments").extension(Tenant("acme".into()));
    /// let view: &dyn RequestView = &req;
    /// assert_eq!(view.extension::<Tenant>().map(|t| t.0.as_str()), Some("acme"));
    /// assert!(view.extension::<u32>().is_none());
    /// ```
    pub fn extension<T: Send + Sync + 'static>(&self) -> Option<&T> {
        self.extension_of(&ExtensionType::of::<T>())?.downcast_ref()
    }
}

/// Names a type to look up in a request's extensions, for [`RequestView::extension_of`].
///
/// It carries the type's [`TypeId`] (for views over your own map) and the lookups into the
/// extension maps of the frameworks this crate supports, which are typed: so the glue can
/// answer through the object-safe [`RequestView`].
#[derive(Clone, Copy)]
pub struct ExtensionType {
    id: TypeId,
    name: &'static str,
    #[cfg(feature = "tower")]
    http: for<'x> fn(&'x http::Extensions) -> Option<&'x dyn Any>,
    #[cfg(feature = "actix")]
    actix: for<'x> fn(&'x actix_web::dev::Extensions) -> Option<&'x dyn Any>,
}

impl ExtensionType {
    /// The extension type `T`.
    pub fn of<T: Send + Sync + 'static>() -> Self {
        Self {
            id: TypeId::of::<T>(),
            name: std::any::type_name::<T>(),
            #[cfg(feature = "tower")]
            http: |e| e.get::<T>().map(|t| t as &dyn Any),
            #[cfg(feature = "actix")]
            actix: |e| e.get::<T>().map(|t| t as &dyn Any),
        }
    }

    /// The type's id: the key to your own extension map.
    pub fn type_id(&self) -> TypeId {
        self.id
    }

    /// The type's name, for diagnostics.
    pub fn type_name(&self) -> &'static str {
        self.name
    }

    /// The extension in an `http` 1.x request's extensions.
    #[cfg(feature = "tower")]
    pub(crate) fn in_http<'x>(&self, extensions: &'x http::Extensions) -> Option<&'x dyn Any> {
        (self.http)(extensions)
    }

    /// The extension in an actix-web request's extensions.
    #[cfg(feature = "actix")]
    pub(crate) fn in_actix<'x>(
        &self,
        extensions: &'x actix_web::dev::Extensions,
    ) -> Option<&'x dyn Any> {
        (self.actix)(extensions)
    }
}

impl fmt::Debug for ExtensionType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("ExtensionType").field(&self.name).finish()
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
    fn query(&self) -> Option<&str> {
        (**self).query()
    }
    fn peer_addr(&self) -> Option<SocketAddr> {
        (**self).peer_addr()
    }
    fn extension_of(&self, ty: &ExtensionType) -> Option<&dyn Any> {
        (**self).extension_of(ty)
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
/// use tower_redlock::key::{RequestView, SimpleRequest};
///
/// let req = SimpleRequest::new("POST", "/payments/42?expand=all")
///     .route("/payments/{id}")
///     .param("id", "42")
///     .header("Idempotency-Key", "\"abc\"")
///     .peer("127.0.0.1:40000".parse().unwrap());
///
/// assert_eq!(req.path(), "/payments/42"); // the query is split off
/// assert_eq!(req.query(), Some("expand=all"));
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
    query: Option<String>,
    peer: Option<SocketAddr>,
    extensions: Vec<(TypeId, Arc<dyn Any + Send + Sync>)>,
}

impl SimpleRequest {
    /// A request with this method and path; anything after a `?` in `path` is the
    /// [query](RequestView::query), as [`RequestView::path`] has none.
    pub fn new(method: impl Into<String>, path: impl Into<String>) -> Self {
        let mut path = path.into();
        let query = path.find('?').map(|at| {
            let query = path[at + 1..].to_owned();
            path.truncate(at);
            query
        });
        Self {
            method: method.into(),
            path,
            query,
            ..Self::default()
        }
    }

    /// Sets the peer address.
    #[must_use]
    pub fn peer(mut self, addr: SocketAddr) -> Self {
        self.peer = Some(addr);
        self
    }

    /// Adds a request extension (replacing one of the same type), as an authentication
    /// layer would.
    #[must_use]
    pub fn extension<T: Send + Sync + 'static>(mut self, value: T) -> Self {
        let id = TypeId::of::<T>();
        self.extensions.retain(|(t, _)| *t != id);
        self.extensions.push((id, Arc::new(value)));
        self
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
    fn query(&self) -> Option<&str> {
        self.query.as_deref()
    }
    fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer
    }
    fn extension_of(&self, ty: &ExtensionType) -> Option<&dyn Any> {
        self.extensions
            .iter()
            .find(|(t, _)| *t == ty.type_id())
            .map(|(_, v)| &**v as &dyn Any)
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
            .field("extensions", &self.extensions.len())
            .finish_non_exhaustive()
    }
}

/// Whether `path`, percent-decoded, is UTF-8 (a `%` not followed by two hex digits stays as
/// it is, as actix-web leaves it).
#[cfg_attr(not(feature = "actix"), allow(dead_code))]
pub(crate) fn percent_decodes_to_utf8(path: &str) -> bool {
    let bytes = path.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                let (h, l) = (hex(h).unwrap_or(0), hex(l).unwrap_or(0));
                decoded.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _, _) => {
                decoded.push(b);
                i += 1;
            }
        }
    }
    std::str::from_utf8(&decoded).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lossy_route_params_are_malformed_real_replacement_characters_are_not() {
        assert!(percent_decodes_to_utf8("/a/%E2%82%AC/%zz/%"));
        assert!(percent_decodes_to_utf8("/a/%EF%BF%BD"));
        assert!(!percent_decodes_to_utf8("/a/%FF"));
        assert!(!percent_decodes_to_utf8("/a/%C3"));
    }
}
