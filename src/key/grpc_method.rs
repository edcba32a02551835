//! Keys from a gRPC call's method path (`/package.Service/Method`): [`GrpcMethodKey`] and
//! the scope [`ScopedByGrpcMethod`].
//!
//! gRPC metadata are HTTP/2 headers, so [`IdempotencyKey`] and [`HeaderKey`] already read
//! a key sent as metadata (`idempotency-key`). The method is the request path. On a plain
//! tonic server (`Server::builder().layer(..)`) no router has matched a route yet, so
//! [`scoped_by_route`](KeyExtractorExt::scoped_by_route) falls back to the path and scopes
//! by method too; behind an axum router, though, the matched route of a tonic service is
//! `/package.Service/{*rest}`, one scope for all its methods. The extractors here always
//! read the method path, and check its shape.

use super::*;

/// What a gRPC method key is read from, for rejections.
fn source() -> KeySource {
    KeySource::other("gRPC method path")
}

/// The service and method of a gRPC method path `/service/method`, at most `max_len`
/// bytes long. Both parts are non-empty and made of ASCII letters, digits, `_`, `.`, `-`
/// and `$` (proto identifiers, dot-separated).
fn method_path(path: &str, max_len: usize) -> Result<(&str, &str), KeyRejection> {
    if path.len() > max_len {
        return Err(KeyRejection::too_long(source(), max_len));
    }
    let name = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_.-$".contains(&b))
    };
    path.strip_prefix('/')
        .and_then(|rest| rest.split_once('/'))
        .filter(|(service, method)| name(service) && name(method))
        .ok_or_else(|| KeyRejection::malformed(source(), "not /package.Service/Method"))
}

/// The gRPC method as lock key: one lock per method, `/shop.Orders/Create` (what
/// [`MethodPathKey`] is for REST). Rejects a path that is not `/service/method` or is longer
/// than [`max_len`](Self::max_len) bytes (default 255) as a bad key (gRPC
/// `INVALID_ARGUMENT`).
///
/// ```
/// use tower_redlock::key::{GrpcMethodKey, KeyExtractor, SimpleRequest};
///
/// let call = |path: &str| {
///     SimpleRequest::new("POST", path).header("content-type", "application/grpc")
/// };
/// let create = GrpcMethodKey::new().extract(&call("/shop.Orders/Create")).unwrap();
/// let cancel = GrpcMethodKey::new().extract(&call("/shop.Orders/Cancel")).unwrap();
/// assert_ne!(create, cancel);
/// assert!(GrpcMethodKey::new().extract(&call("/health")).unwrap_err().is_malformed());
/// ```
#[derive(Clone, Copy, Debug)]
pub struct GrpcMethodKey {
    max_len: usize,
}

impl GrpcMethodKey {
    /// Reads the method path, up to 255 bytes.
    pub fn new() -> Self {
        Self {
            max_len: DEFAULT_MAX_KEY_LEN,
        }
    }

    /// Bounds the method path's length in bytes (default 255).
    #[must_use]
    pub fn max_len(mut self, max: usize) -> Self {
        self.max_len = max;
        self
    }
}

impl Default for GrpcMethodKey {
    fn default() -> Self {
        Self::new()
    }
}

impl KeyExtractor for GrpcMethodKey {
    fn extract_into(
        &self,
        req: &dyn RequestView,
        material: &mut KeyMaterial,
    ) -> Result<bool, KeyRejection> {
        let (service, method) = method_path(req.path(), self.max_len)?;
        material.push(TAG_GRPC_METHOD).push(service).push(method);
        Ok(true)
    }
}

/// Scopes a key by the gRPC method; see
/// [`KeyExtractorExt::scoped_by_grpc_method`].
#[derive(Clone, Debug)]
pub struct ScopedByGrpcMethod<E> {
    pub(super) inner: E,
    pub(super) max_len: usize,
}

impl<E> ScopedByGrpcMethod<E> {
    /// Bounds the method path's length in bytes (default 255).
    #[must_use]
    pub fn max_len(mut self, max: usize) -> Self {
        self.max_len = max;
        self
    }
}

impl<E: KeyExtractor> KeyExtractor for ScopedByGrpcMethod<E> {
    fn extract_into(
        &self,
        req: &dyn RequestView,
        material: &mut KeyMaterial,
    ) -> Result<bool, KeyRejection> {
        if !self.inner.extract_into(req, material)? {
            return Ok(false);
        }
        let (service, method) = method_path(req.path(), self.max_len)?;
        material
            .push(TAG_SCOPE_GRPC_METHOD)
            .push(service)
            .push(method);
        Ok(true)
    }
}

/// Keys only the calls of one gRPC service; see
/// [`KeyExtractorExt::only_grpc_service`].
#[derive(Clone, Debug)]
pub struct OnlyGrpcService<E> {
    pub(super) inner: E,
    /// `/package.Service/`: the start of the service's method paths.
    pub(super) prefix: String,
}

impl<E: KeyExtractor> KeyExtractor for OnlyGrpcService<E> {
    fn extract_into(
        &self,
        req: &dyn RequestView,
        material: &mut KeyMaterial,
    ) -> Result<bool, KeyRejection> {
        if !req.path().starts_with(self.prefix.as_str()) {
            // Another service (a health check, reflection): no key, through unlocked.
            return Ok(false);
        }
        self.inner.extract_into(req, material)
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn only_the_named_service_is_keyed() {
        let e = IdempotencyKey::required()
            .scoped_by_grpc_method()
            .only_grpc_service("shop.Payments");
        let keyed = e.extract(&call("/shop.Payments/Pay")).unwrap();
        let scoped = IdempotencyKey::required().scoped_by_grpc_method();
        assert_eq!(keyed, scoped.extract(&call("/shop.Payments/Pay")).unwrap());
        let health = SimpleRequest::new("POST", "/grpc.health.v1.Health/Check")
            .header("content-type", "application/grpc");
        assert_eq!(e.extract(&health).unwrap(), None, "no key, not refused");
        // A service whose name only starts like it is another service.
        assert_eq!(e.extract(&call("/shop.PaymentsAdmin/Pay")).unwrap(), None);
        // The named service's calls still need their key.
        let keyless = SimpleRequest::new("POST", "/shop.Payments/Pay");
        assert!(e.extract(&keyless).unwrap_err().is_missing());
    }
    use super::*;

    fn call(path: &str) -> SimpleRequest {
        SimpleRequest::new("POST", path)
            .header("content-type", "application/grpc")
            .header("idempotency-key", "k-1")
    }

    #[test]
    fn the_method_key_hashes_service_and_method() {
        let key = GrpcMethodKey::new().extract(&call("/shop.v1.Orders/Create"));
        let expected = LockKey::from_parts([TAG_GRPC_METHOD, b"shop.v1.Orders", b"Create"]);
        assert_eq!(key.unwrap(), Some(expected));
    }

    #[test]
    fn the_scope_adds_service_and_method_after_the_key() {
        let e = IdempotencyKey::required().scoped_by_grpc_method();
        let key = e.extract(&call("/shop.Orders/Create")).unwrap();
        let expected = LockKey::from_parts([
            TAG_HEADER,
            b"idempotency-key",
            b"k-1",
            TAG_SCOPE_GRPC_METHOD,
            b"shop.Orders",
            b"Create",
        ]);
        assert_eq!(key, Some(expected));
        let other = e.extract(&call("/shop.Orders/Cancel")).unwrap();
        assert_ne!(key, other);
        // Not the route scope: the domain tags differ.
        let by_route = IdempotencyKey::required().scoped_by_route();
        assert_ne!(key, by_route.extract(&call("/shop.Orders/Create")).unwrap());
    }

    #[test]
    fn a_keyless_request_is_not_rejected_for_its_scope() {
        let e = IdempotencyKey::optional().scoped_by_grpc_method();
        let req = SimpleRequest::new("POST", "/not a method");
        assert_eq!(e.extract(&req), Ok(None));
    }

    #[test]
    fn paths_that_are_not_methods_are_rejected_without_echo() {
        for path in [
            "",
            "/",
            "/Service",
            "//Method",
            "/Service/",
            "/a/b/c",
            "Service/Method",
            "/zebra svc/Method",
            "/zebra%20svc/Method",
        ] {
            let r = GrpcMethodKey::new().extract(&call(path)).unwrap_err();
            assert!(r.is_malformed(), "{path}: {r}");
            assert!(!r.detail().contains("zebra"), "{r}");
            let r = IdempotencyKey::required()
                .scoped_by_grpc_method()
                .extract(&call(path))
                .unwrap_err();
            assert!(r.is_malformed(), "{path}: {r}");
        }
    }

    #[test]
    fn the_length_is_bounded() {
        let path = format!("/zebra.{}/M", "z".repeat(300));
        let r = GrpcMethodKey::new().extract(&call(&path)).unwrap_err();
        assert!(r.is_too_long() && !r.detail().contains("zebra"), "{r}");
        let e = IdempotencyKey::required().scoped_by_grpc_method();
        assert!(e.extract(&call(&path)).unwrap_err().is_too_long());
        assert!(e.max_len(400).extract(&call(&path)).unwrap().is_some());
        assert!(GrpcMethodKey::new()
            .max_len(8)
            .extract(&call("/a.B/Call"))
            .unwrap_err()
            .is_too_long());
    }
}
