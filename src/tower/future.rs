use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use pin_project::pin_project;
use tower_service::Service;

use super::replay::Replayed;
use super::{LeaseBody, RequestBody};
use crate::http::{
    AfterResponse, Decision, KeepAliveTimer, RejectionResponse, ReleaseOn, Unlocked,
};
use crate::Lease;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The response future of [`RedlockService`](super::RedlockService).
///
/// Dropping it (a cancelled request) drops the lease, whose release is then spawned in the
/// background.
#[pin_project]
pub struct ResponseFuture<S, ReqBody>
where
    S: Service<Request<RequestBody<ReqBody>>>,
{
    #[pin]
    state: State<S, ReqBody>,
}

#[pin_project(project = StateProj)]
enum State<S, ReqBody>
where
    S: Service<Request<RequestBody<ReqBody>>>,
{
    Rejected {
        response: Option<RejectionResponse>,
    },
    Acquiring {
        acquire: BoxFuture<Decision>,
        inner: Option<S>,
        req: Option<Request<RequestBody<ReqBody>>>,
        release_on: ReleaseOn,
        keep_alive: bool,
        /// The request header for the fencing token.
        fencing: Option<http::HeaderName>,
    },
    /// A replay policy's whole flow (see `replay.rs`).
    Replaying {
        flow: BoxFuture<Result<Replayed<S::Response>, S::Error>>,
    },
    Calling {
        #[pin]
        fut: S::Future,
        /// Starts the lease's keep-alive if the handler outlives ttl/3.
        #[pin]
        timer: KeepAliveTimer,
        lease: Option<Lease>,
        release_on: ReleaseOn,
    },
    Releasing {
        release: BoxFuture<()>,
        result: Option<Result<S::Response, S::Error>>,
    },
}

impl<S, ReqBody> std::fmt::Debug for ResponseFuture<S, ReqBody>
where
    S: Service<Request<RequestBody<ReqBody>>>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Rejected { .. } => "rejected",
            State::Acquiring { .. } => "acquiring",
            State::Calling { .. } => "calling",
            State::Releasing { .. } => "releasing",
            State::Replaying { .. } => "replaying",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}

impl<S, ReqBody> ResponseFuture<S, ReqBody>
where
    S: Service<Request<RequestBody<ReqBody>>>,
{
    pub(crate) fn rejected(response: RejectionResponse) -> Self {
        Self {
            state: State::Rejected {
                response: Some(response),
            },
        }
    }

    pub(crate) fn pass(fut: S::Future) -> Self {
        Self {
            state: State::Calling {
                fut,
                timer: KeepAliveTimer::off(),
                lease: None,
                release_on: ReleaseOn::Response,
            },
        }
    }

    pub(crate) fn acquiring(
        acquire: BoxFuture<Decision>,
        inner: S,
        req: Request<RequestBody<ReqBody>>,
        release_on: ReleaseOn,
        keep_alive: bool,
        fencing: Option<http::HeaderName>,
    ) -> Self {
        Self {
            state: State::Acquiring {
                acquire,
                inner: Some(inner),
                req: Some(req),
                release_on,
                keep_alive,
                fencing,
            },
        }
    }
}

impl<S, ReqBody> ResponseFuture<S, ReqBody>
where
    S: Service<Request<RequestBody<ReqBody>>>,
{
    pub(crate) fn replaying(flow: BoxFuture<Result<Replayed<S::Response>, S::Error>>) -> Self {
        Self {
            state: State::Replaying { flow },
        }
    }
}

/// Turns a neutral rejection into an `http` 1.x response.
pub(crate) fn rejection_response<B: Body>(r: RejectionResponse) -> Response<LeaseBody<B>> {
    let (head, body) = rejection_head(r);
    Response::from_parts(head, LeaseBody::full(body))
}

/// A neutral rejection as an `http` 1.x response head and body.
pub(crate) fn rejection_head(r: RejectionResponse) -> (http::response::Parts, Bytes) {
    let status = StatusCode::from_u16(r.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut headers = http::HeaderMap::new();
    // Checked when the rejection was built: none of these conversions fails.
    if let Ok(v) = HeaderValue::from_str(r.content_type()) {
        headers.insert(http::header::CONTENT_TYPE, v);
    }
    if let Some(secs) = r.retry_after() {
        headers.insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
    }
    for (name, value) in r.headers() {
        if let (Ok(n), Ok(v)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) {
            headers.append(n, v);
        }
    }
    let mut res = Response::new(());
    *res.status_mut() = status;
    *res.headers_mut() = headers;
    (res.into_parts().0, r.into_body())
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody>
where
    S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>>,
    ResBody: Body,
    ResBody::Data: From<Bytes>,
{
    type Output = Result<Response<LeaseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Rejected { response } => {
                    let r = response.take().expect("polled after completion");
                    return Poll::Ready(Ok(rejection_response(r)));
                }
                StateProj::Acquiring {
                    acquire,
                    inner,
                    req,
                    release_on,
                    keep_alive,
                    fencing,
                } => {
                    let decision = ready!(acquire.as_mut().poll(cx));
                    let mut req = req.take().expect("polled after completion");
                    let mut inner = inner.take().expect("polled after completion");
                    let lease = match decision {
                        Decision::Reject(r) => {
                            this.state.set(State::Rejected { response: Some(r) });
                            continue;
                        }
                        Decision::Replay(_) => unreachable!("only a replay policy replays"),
                        Decision::Locked(lease, _) => {
                            if let (Some(name), Some(token)) =
                                (fencing.take(), lease.fencing_token())
                            {
                                req.headers_mut().insert(name, HeaderValue::from(token));
                            }
                            req.extensions_mut().insert(lease.handle());
                            Some(lease)
                        }
                        Decision::Unlocked => {
                            req.extensions_mut().insert(Unlocked);
                            None
                        }
                    };
                    let release_on = *release_on;
                    let timer = KeepAliveTimer::new(lease.as_ref(), *keep_alive);
                    let fut = inner.call(req);
                    this.state.set(State::Calling {
                        fut,
                        timer,
                        lease,
                        release_on,
                    });
                }
                StateProj::Calling {
                    fut,
                    timer,
                    lease,
                    release_on,
                } => {
                    let result = match fut.poll(cx) {
                        Poll::Ready(result) => result,
                        Poll::Pending => {
                            timer.poll(cx, lease.as_mut());
                            return Poll::Pending;
                        }
                    };
                    let Some(lease) = lease.take() else {
                        return Poll::Ready(result.map(|res| res.map(|b| LeaseBody::new(b, None))));
                    };
                    let body_to_send = matches!(&result, Ok(res) if !res.body().is_end_stream());
                    match (
                        AfterResponse::decide(lease, *release_on, body_to_send),
                        result,
                    ) {
                        (AfterResponse::HoldToBodyEnd(mut lease), Ok(res)) => {
                            timer.hand_over(&mut lease);
                            return Poll::Ready(Ok(res.map(|b| LeaseBody::new(b, Some(lease)))));
                        }
                        (
                            AfterResponse::ReleaseNow(lease) | AfterResponse::HoldToBodyEnd(lease),
                            result,
                        ) => {
                            this.state.set(State::Releasing {
                                release: Box::pin(crate::http::release(lease)),
                                result: Some(result),
                            });
                        }
                    }
                }
                StateProj::Replaying { flow } => {
                    let res = match ready!(flow.as_mut().poll(cx))? {
                        Replayed::Inner(res) => res.map(|b| LeaseBody::new(b, None)),
                        Replayed::Held(res, lease) => res.map(|b| LeaseBody::new(b, Some(lease))),
                        Replayed::Full(head, body) => {
                            Response::from_parts(head, LeaseBody::full(body))
                        }
                    };
                    return Poll::Ready(Ok(res));
                }
                StateProj::Releasing { release, result } => {
                    ready!(release.as_mut().poll(cx));
                    let result = result.take().expect("polled after completion");
                    return Poll::Ready(result.map(|res| res.map(|b| LeaseBody::new(b, None))));
                }
            }
        }
    }
}
