use std::future::{ready, Ready};
use std::rc::Rc;

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{forward_ready, Service, ServiceRequest, ServiceResponse, Transform};
use futures_util::future::LocalBoxFuture;

use super::glue::{rejection_response, Actix};
use super::{ActixRequestView, LeaseBody};
use crate::http::{flow, KeyExtractor, LockPolicy, Wire};
use crate::Redlock;

/// The actix-web middleware: lock a key per request. Attach it to the routes that need it
/// with `Route::wrap` (`web::post().to(handler).wrap(mw)`), so an unknown path stays 404 and
/// an unserved method 405; `Resource::wrap`, `Scope::wrap` and `App::wrap` work too, but
/// also wrap those answers (a method the policy locks is then locked before its 405). See
/// the [module docs](crate::actix).
#[derive(Debug, Clone)]
pub struct RedlockMiddleware {
    policy: LockPolicy,
}

impl RedlockMiddleware {
    /// A middleware locking the key `extractor` derives, on `redlock`'s nodes, with the
    /// default [`LockPolicy`].
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

    /// A middleware with a configured policy (checked when it was built).
    pub fn with_policy(policy: LockPolicy) -> Self {
        Self { policy }
    }

    /// The middleware's policy.
    pub fn policy(&self) -> &LockPolicy {
        &self.policy
    }
}

impl From<LockPolicy> for RedlockMiddleware {
    fn from(policy: LockPolicy) -> Self {
        Self::with_policy(policy)
    }
}

impl<S, B> Transform<S, ServiceRequest> for RedlockMiddleware
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<LeaseBody<B>>>;
    type Error = actix_web::Error;
    type Transform = RedlockMiddlewareService<S>;
    type InitError = ();
    type Future = Ready<Result<Self::Transform, Self::InitError>>;

    fn new_transform(&self, service: S) -> Self::Future {
        ready(Ok(RedlockMiddlewareService {
            service: Rc::new(service),
            policy: self.policy.clone(),
        }))
    }
}

/// The service [`RedlockMiddleware`] wraps around the inner service.
#[derive(Debug)]
pub struct RedlockMiddlewareService<S> {
    service: Rc<S>,
    policy: LockPolicy,
}

impl<S, B> Service<ServiceRequest> for RedlockMiddlewareService<S>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error> + 'static,
    B: MessageBody + 'static,
{
    type Response = ServiceResponse<EitherBody<LeaseBody<B>>>;
    type Error = actix_web::Error;
    type Future = LocalBoxFuture<'static, Result<Self::Response, Self::Error>>;

    forward_ready!(service);

    fn call(&self, mut req: ServiceRequest) -> Self::Future {
        if let Some(name) = self.policy.fencing_header() {
            // Only the lock's token reaches the inner service under this name.
            req.headers_mut().remove(name);
        }
        let (key, fingerprint, wire) = {
            let view = ActixRequestView::new(&req);
            let key = self.policy.key(&view);
            let fingerprint = match key {
                Ok(Some(_)) => self.policy.fingerprint(&view),
                _ => None,
            };
            (key, fingerprint, Wire::of(&view))
        };
        let key = match key {
            Err(r) => {
                let res = req
                    .into_response(rejection_response(r))
                    .map_into_right_body();
                return Box::pin(ready(Ok(res)));
            }
            Ok(None) => {
                let fut = self.service.call(req);
                return Box::pin(async move {
                    Ok(fut
                        .await?
                        .map_body(|_, b| LeaseBody::new(b, None))
                        .map_into_left_body())
                });
            }
            Ok(Some(key)) => key,
        };
        let service = Rc::clone(&self.service);
        let policy = self.policy.clone();
        Box::pin(flow::run(
            Actix(service),
            policy,
            key,
            fingerprint,
            wire,
            req,
        ))
    }
}
