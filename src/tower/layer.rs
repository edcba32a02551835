use tower_layer::Layer;

use super::RedlockService;
use crate::http::{KeyExtractor, LockPolicy};
use crate::Redlock;

/// Applies [`RedlockService`] to a service: lock a key per request. See the
/// [module docs](crate::tower).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_redlock::Error> {
/// use std::time::Duration;
/// use tower_redlock::key::{IdempotencyKey, KeyExtractorExt};
/// use tower_redlock::policy::LockPolicy;
/// use tower_redlock::{Redlock, RedlockLayer};
///
/// let redlock = Redlock::in_memory();
/// // Defaults: POST/PUT/PATCH/DELETE locked, ttl 30 s kept alive, 409 at once, 503 when
/// // Redis is down.
/// let simple = RedlockLayer::new(redlock.clone(), IdempotencyKey::required())?;
/// // Or a full policy:
/// let waiting = RedlockLayer::with_policy(
///     LockPolicy::builder(redlock, IdempotencyKey::required().scoped_by_route())
///         .wait(Duration::from_secs(2))
///         .build()?,
/// );
/// # let _ = (simple, waiting);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RedlockLayer {
    policy: LockPolicy,
}

impl RedlockLayer {
    /// A layer locking the key `extractor` derives, on `redlock`'s nodes, with the default
    /// [`LockPolicy`].
    ///
    /// # Errors
    ///
    /// When the defaults do not fit `redlock` (e.g. its nodes' `restart_protection` is
    /// shorter than the default ttl of 30 s): a misconfiguration is reported here, never
    /// per request. Use [`LockPolicy::builder`] to choose a ttl that fits.
    pub fn new(redlock: Redlock, extractor: impl KeyExtractor) -> crate::Result<Self> {
        Ok(Self {
            policy: LockPolicy::builder(redlock, extractor).build()?,
        })
    }

    /// An idempotent endpoint with the defaults: the `Idempotency-Key` header (required,
    /// scoped by route) locks the first request, whose response is stored and replayed to
    /// every later request with that key for 24 h (a reused key with another request:
    /// `422`). See [`LockPolicy::idempotent`] and [`replay`](crate::replay).
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new).
    pub fn idempotent(redlock: Redlock) -> crate::Result<Self> {
        Ok(Self::with_policy(LockPolicy::idempotent(redlock).build()?))
    }

    /// A layer with a configured policy (checked when it was built).
    pub fn with_policy(policy: LockPolicy) -> Self {
        Self { policy }
    }

    /// The layer's policy.
    pub fn policy(&self) -> &LockPolicy {
        &self.policy
    }
}

impl From<LockPolicy> for RedlockLayer {
    fn from(policy: LockPolicy) -> Self {
        Self::with_policy(policy)
    }
}

impl<S> Layer<S> for RedlockLayer {
    type Service = RedlockService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RedlockService::new(inner, self.policy.clone())
    }
}
