use tower_layer::Layer;

use super::RedlockService;
use crate::policy::LockPolicy;

/// Applies [`RedlockService`] to a service: lock a key per request. See the
/// [module docs](crate::tower).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_redlock::Error> {
/// use std::time::Duration;
/// use tower_redlock::key::{IdempotencyKey, KeyExtractorExt};
/// use tower_redlock::policy::{LockPolicy, OnContention};
/// use tower_redlock::{Redlock, RedlockLayer};
///
/// let redlock = Redlock::in_memory();
/// // Defaults: POST/PUT/PATCH/DELETE locked, ttl 30 s kept alive, 409 at once, 503 when
/// // Redis is down.
/// let simple = RedlockLayer::new(LockPolicy::builder(redlock.clone(), IdempotencyKey::required()).build()?);
/// // Or a full policy:
/// let waiting = RedlockLayer::new(
///     LockPolicy::builder(redlock.clone(), IdempotencyKey::required().scoped_by_route())
///         .on_contention(OnContention::wait(Duration::from_secs(2)))
///         .build()?,
/// );
/// // An idempotent endpoint: `Idempotency-Key` required, responses replayed.
/// let idempotent = RedlockLayer::new(LockPolicy::idempotent(redlock).build()?);
/// # let _ = (simple, waiting, idempotent);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct RedlockLayer {
    policy: LockPolicy,
}

crate::policy::policy_constructors!(RedlockLayer, "layer");

impl<S> Layer<S> for RedlockLayer {
    type Service = RedlockService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RedlockService::new(inner, self.policy.clone())
    }
}
