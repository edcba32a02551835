//! [`KeyExtractorExt`]: scoping an extractor (route, method, header, closure) and its Redis prefix.

use std::marker::PhantomData;

use super::*;

/// Combinators for every [`KeyExtractor`]: scope a key, or change its prefix.
///
/// Scope goes into the key material before the one hash. A scope is only
/// read when the inner extractor found a key: a request that passes through
/// unlocked is never rejected for its scope.
///
/// ```
/// use tower_redlock::key::{IdempotencyKey, KeyExtractor, KeyExtractorExt, SimpleRequest};
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

    /// Scopes the key by the gRPC method (the request path `/package.Service/Method`): the
    /// same `idempotency-key` metadata on two methods takes two locks. Unlike
    /// [`scoped_by_route`](Self::scoped_by_route) it reads the method path also behind a
    /// router that matched a wider route (axum matches a tonic service as
    /// `/package.Service/{*rest}`).
    ///
    /// When the inner extractor finds a key, the path must be a method path. A path that is not
    /// `/service/method` (ASCII letters, digits, `_`, `.`, `-`, `$`) is rejected as malformed. One
    /// longer than 255 bytes ([`ScopedByGrpcMethod::max_len`]) is rejected as too long. Either is
    /// rejected with gRPC `INVALID_ARGUMENT`, and never echoed.
    ///
    /// ```
    /// use tower_redlock::key::{IdempotencyKey, KeyExtractor, KeyExtractorExt, SimpleRequest};
    ///
    /// let extractor = IdempotencyKey::required().scoped_by_grpc_method();
    /// let call = |method: &str| {
    ///     let req = SimpleRequest::new("POST", method)
    ///         .header("content-type", "application/grpc")
    ///         .header("idempotency-key", "k-1"); // metadata are headers
    ///     extractor.extract(&req).unwrap().unwrap()
    /// };
    /// assert_ne!(call("/shop.Orders/Create"), call("/shop.Orders/Cancel"));
    /// assert_eq!(call("/shop.Orders/Create"), call("/shop.Orders/Create"));
    /// ```
    fn scoped_by_grpc_method(self) -> ScopedByGrpcMethod<Self> {
        ScopedByGrpcMethod {
            inner: self,
            max_len: DEFAULT_MAX_KEY_LEN,
        }
    }

    /// Keys only the calls of the gRPC service `service` (`package.Service`, as in the
    /// method path `/package.Service/Method`); every other request gets no key and passes
    /// through unlocked. For a layer on a whole tonic server, which also sees health
    /// checks (`/grpc.health.v1.Health/Check`, Kubernetes gRPC probes) and reflection:
    /// with a required key alone they would be refused with `INVALID_ARGUMENT`.
    ///
    /// ```
    /// use tower_redlock::key::{IdempotencyKey, KeyExtractor, KeyExtractorExt, SimpleRequest};
    ///
    /// let extractor = IdempotencyKey::required()
    ///     .scoped_by_grpc_method()
    ///     .only_grpc_service("shop.Payments");
    /// let grpc = |path: &str| {
    ///     SimpleRequest::new("POST", path).header("content-type", "application/grpc")
    /// };
    /// let pay = grpc("/shop.Payments/Pay").header("idempotency-key", "k-1");
    /// assert!(extractor.extract(&pay).unwrap().is_some());
    /// // A health check: no key, not refused — it runs unlocked.
    /// assert_eq!(extractor.extract(&grpc("/grpc.health.v1.Health/Check")).unwrap(), None);
    /// // A call of the service without its key is still refused.
    /// assert!(extractor.extract(&grpc("/shop.Payments/Pay")).unwrap_err().is_missing());
    /// ```
    fn only_grpc_service(self, service: &str) -> OnlyGrpcService<Self> {
        OnlyGrpcService {
            inner: self,
            prefix: format!("/{service}/"),
        }
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

    /// Scopes the key by a request extension an earlier layer put into the request — typically the
    /// authenticated principal or its tenant — through `scope`. Each principal has its own key
    /// space, so one tenant's key can never meet (or, with replay, read) another tenant's. Add the
    /// authentication layer *outside* the lock middleware so it runs first.
    ///
    /// When the inner extractor finds a key, the extension is required: a request without
    /// it is rejected as missing (`400`): the route is not behind the authentication
    /// layer, or the request was not authenticated. Its type name is logged at debug, never
    /// sent to the client.
    ///
    /// ```
    /// use tower_redlock::key::{IdempotencyKey, KeyExtractor, KeyExtractorExt, SimpleRequest};
    ///
    /// #[derive(Clone)]
    /// struct Principal { tenant: String }
    ///
    /// let extractor = IdempotencyKey::required()
    ///     .scoped_by_extension(|p: &Principal| p.tenant.clone());
    /// let as_tenant = |tenant: &str| {
    ///     SimpleRequest::new("POST", "/payments")
    ///         .header("idempotency-key", "\"k1\"")
    ///         .extension(Principal { tenant: tenant.into() })
    /// };
    /// let acme = extractor.extract(&as_tenant("acme")).unwrap().unwrap();
    /// assert_ne!(acme, extractor.extract(&as_tenant("globex")).unwrap().unwrap());
    ///
    /// let anonymous = SimpleRequest::new("POST", "/payments").header("idempotency-key", "\"k1\"");
    /// assert!(extractor.extract(&anonymous).unwrap_err().is_missing());
    /// ```
    fn scoped_by_extension<T, F, S>(self, scope: F) -> ScopedByExtension<Self, T, F>
    where
        T: Send + Sync + 'static,
        F: Fn(&T) -> S + Send + Sync + 'static,
        S: AsRef<[u8]>,
    {
        ScopedByExtension {
            inner: self,
            scope,
            _type: PhantomData,
        }
    }

    /// Scopes the key by what `scope` returns. `None` means "no scope" and is
    /// distinct from `Some` of an empty value.
    ///
    /// ```
    /// use tower_redlock::key::{KeyExtractor, KeyExtractorExt, PathKey, SimpleRequest};
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

    /// Replaces the key's Redis prefix (default [`LockKey::DEFAULT_PREFIX`](crate::key::LockKey::DEFAULT_PREFIX)); the
    /// outermost `prefix` wins.
    ///
    /// ```
    /// use tower_redlock::key::{KeyExtractor, KeyExtractorExt, PathKey, SimpleRequest};
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

/// Scopes a key by a request extension; see [`KeyExtractorExt::scoped_by_extension`].
pub struct ScopedByExtension<E, T, F> {
    inner: E,
    scope: F,
    _type: PhantomData<fn() -> T>,
}

impl<E: Clone, T, F: Clone> Clone for ScopedByExtension<E, T, F> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            scope: self.scope.clone(),
            _type: PhantomData,
        }
    }
}

impl<E: fmt::Debug, T, F> fmt::Debug for ScopedByExtension<E, T, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScopedByExtension")
            .field("inner", &self.inner)
            .field("extension", &std::any::type_name::<T>())
            .finish_non_exhaustive()
    }
}

impl<E, T, F, S> KeyExtractor for ScopedByExtension<E, T, F>
where
    E: KeyExtractor,
    T: Send + Sync + 'static,
    F: Fn(&T) -> S + Send + Sync + 'static,
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
        let Some(value) = req.extension::<T>() else {
            tracing::debug!(
                extension = std::any::type_name::<T>(),
                "lock key scope missing: no such request extension"
            );
            return Err(KeyRejection::missing(KeySource::other(
                "authenticated scope (set by the server's authentication)",
            )));
        };
        material.push(TAG_SCOPE_EXTENSION).push((self.scope)(value));
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
