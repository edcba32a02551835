use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tower_service::Service;

use super::{HttpRequestView, LeaseBody, RequestBody, ResponseFuture};
use crate::http::{LockPolicy, Wire};

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
        let fencing = self.policy.fencing_header().map(|name| {
            // Only the lock's token reaches the inner service under this name.
            parts.headers.remove(name);
            http::HeaderName::from_bytes(name.as_bytes())
                .expect("checked when the policy was built")
        });
        let (key, fingerprint, wire) = {
            let view = HttpRequestView::new(&mut parts);
            let key = self.policy.key(&view);
            let fingerprint = match key {
                Ok(Some(_)) => self.policy.fingerprint(&view),
                _ => None,
            };
            (key, fingerprint, Wire::of(&view))
        };
        match key {
            Err(rejection) => ResponseFuture::rejected(rejection),
            Ok(None) => {
                let req = Request::from_parts(parts, RequestBody::new(body));
                ResponseFuture::pass(self.inner.call(req))
            }
            Ok(Some(key)) => {
                // The ready service goes into the future; a fresh clone stays for the next
                // call (tower's `mem::replace` idiom).
                let clone = self.inner.clone();
                let inner = std::mem::replace(&mut self.inner, clone);
                if let Some(fingerprint) = fingerprint {
                    let req = Request::from_parts(parts, body);
                    let policy = self.policy.clone();
                    return ResponseFuture::replaying(Box::pin(super::replay::call(
                        policy,
                        key,
                        fingerprint,
                        fencing,
                        wire,
                        inner,
                        req,
                    )));
                }
                let req = Request::from_parts(parts, RequestBody::new(body));
                ResponseFuture::acquiring(
                    Box::pin(self.policy.clone().acquire(key, None, wire)),
                    inner,
                    req,
                    self.policy.release_on(),
                    self.policy.keeps_alive(),
                    fencing,
                )
            }
        }
    }
}
