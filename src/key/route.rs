//! Keys from where the request goes: [`PathKey`], [`MethodPathKey`], [`RouteParamKey`].

use super::*;

/// The request path (without query) as lock key: one lock per resource.
/// Never rejects.
///
/// ```
/// use tower_redlock::key::{KeyExtractor, PathKey, SimpleRequest};
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
/// use tower_redlock::key::{KeyExtractor, MethodPathKey, SimpleRequest};
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
/// use tower_redlock::key::{KeyExtractor, RouteParamKey, SimpleRequest};
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
