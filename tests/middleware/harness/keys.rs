//! The lock keys the suite's apps take, as Redis sees them, and the policies they use.

use tower_redlock::key::{IdempotencyKey, KeyExtractor, KeyExtractorExt, SimpleRequest};
use tower_redlock::policy::{LockPolicy, LockPolicyBuilder};
use tower_redlock::Redlock;

use crate::support::apps::IDEMPOTENCY_KEY;

/// The key extractor of most apps here: `Idempotency-Key`, scoped by the matched route.
pub fn extractor() -> impl KeyExtractor + Clone {
    IdempotencyKey::required().scoped_by_route()
}

/// A policy builder with [`extractor`].
pub fn policy_of(redlock: &Redlock) -> LockPolicyBuilder {
    LockPolicy::builder(redlock.clone(), extractor())
}

/// The default policy with [`extractor`].
pub fn default_policy(redlock: &Redlock) -> LockPolicy {
    policy_of(redlock).build().expect("a valid policy")
}

/// The Redis key the middleware locks for `POST path` matched by `route` with
/// `Idempotency-Key: key` and [`extractor`] (default prefix; the test clients add no key
/// prefix).
pub fn redis_key(route: &str, path: &str, key: &str) -> String {
    let req = SimpleRequest::new("POST", path)
        .route(route)
        .header(IDEMPOTENCY_KEY, key);
    key_of(&extractor(), &req)
}

/// The Redis key `extractor` derives for `req`, which must have one.
pub fn key_of(extractor: &impl KeyExtractor, req: &SimpleRequest) -> String {
    extractor
        .extract(req)
        .expect("a valid key")
        .expect("a key")
        .into_string()
}
