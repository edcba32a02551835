use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::glue::Tower;
use super::{HttpRequestView, LeaseBody, RequestBody, ResponseFuture};
use crate::middleware::flow::{self, Route};
use crate::policy::LockPolicy;

/// The middleware service of [`RedlockLayer`](crate::RedlockLayer).
#[derive(Debug, Clone)]
pub struct RedlockService<S> {
    inner: S,
    policy: LockPolicy,
}

impl<S> RedlockService<S> {
    /// Wraps `inner` with `policy`.
    pub fn new(inner: S, policy: LockPolicy) -> Self {
        Self { inner, policy }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the inner service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for RedlockService<S>
where
    S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>>
        + Clone
        + Send
        + 'static,
    S::Future: Send,
    S::Error: Send,
    ReqBody: Body + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Send,
    ResBody: Body + Send + 'static,
    ResBody::Data: From<Bytes> + Send,
    ResBody::Error: Send,
{
    type Response = Response<LeaseBody<ResBody>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, ReqBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let (mut parts, body) = req.into_parts();
        if let Some(name) = self.policy.fencing_header() {
            // Only the lock's token reaches the inner service under this name.
            parts.headers.remove(name);
        }
        let route = flow::route(&self.policy, &HttpRequestView::new(&mut parts));
        let req = Request::from_parts(parts, RequestBody::new(body));
        match route {
            Route::Reject(rejection) => ResponseFuture::rejected(rejection),
            Route::Pass => ResponseFuture::pass(self.inner.call(req)),
            Route::Lock(keyed) => {
                // The ready service goes into the future; a fresh clone stays for the next
                // call (tower's `mem::replace` idiom).
                let clone = self.inner.clone();
                let inner = Tower::new(std::mem::replace(&mut self.inner, clone));
                let policy = self.policy.clone();
                let flow = flow::run(inner, policy, keyed, req);
                ResponseFuture::flowing(Box::pin(flow))
            }
        }
    }
}
