use std::future::{ready, Ready};
use std::rc::Rc;

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{forward_ready, Service, ServiceRequest, ServiceResponse, Transform};
use futures_util::future::LocalBoxFuture;

use super::glue::{rejection_response, Actix};
use super::{ActixRequestView, LeaseBody};
use crate::middleware::flow::{self, Route};
use crate::policy::LockPolicy;

/// The actix-web middleware: lock a key per request. Attach it to the routes that need it
/// with `Route::wrap` (`web::post().to(handler).wrap(mw)`), so an unknown path stays 404 and
/// an unserved method 405; `Resource::wrap`, `Scope::wrap` and `App::wrap` work too, but
/// also wrap those answers (a method the policy locks is then locked before its 405). See
/// the [module docs](crate::actix).
#[derive(Debug, Clone)]
pub struct RedlockMiddleware {
    policy: LockPolicy,
}

crate::policy::policy_constructors!(RedlockMiddleware, "middleware");

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
        let route = flow::route(&self.policy, &ActixRequestView::new(&req));
        let keyed = match route {
            Route::Reject(r) => {
                let res = req
                    .into_response(rejection_response(r))
                    .map_into_right_body();
                return Box::pin(ready(Ok(res)));
            }
            Route::Pass => {
                let fut = self.service.call(req);
                return Box::pin(async move {
                    Ok(fut
                        .await?
                        .map_body(|_, b| LeaseBody::new(b, None, None))
                        .map_into_left_body())
                });
            }
            Route::Lock(keyed) => keyed,
        };
        let service = Rc::clone(&self.service);
        let policy = self.policy.clone();
        Box::pin(flow::run(Actix(service), policy, keyed, req))
    }
}
