//! The [`KeyExtractor`] trait, its blanket impls for closures and pointers, and [`key_fn`].

use super::*;

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
/// use tower_redlock::key::{KeyExtractor, KeyMaterial, KeyRejection, KeySource, RequestView, SimpleRequest};
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
/// use tower_redlock::key::{KeyExtractor, LockKey, SimpleRequest, key_fn};
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
