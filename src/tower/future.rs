use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use pin_project::pin_project;
use tower_service::Service;

use super::glue::{rejection_response, Answer};
use super::{LeaseBody, RequestBody};
use crate::rejection::RejectionResponse;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The response future of [`RedlockService`](super::RedlockService).
///
/// Dropping it (a cancelled request) drops the lease, whose release is then spawned in the
/// background (with [replay](crate::replay) on, once the handler has started, the key is
/// marked completed instead).
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
    /// The key was refused: answered without the inner service.
    Rejected { response: Option<RejectionResponse> },
    /// No key: the inner service, without a lock.
    Passing {
        #[pin]
        fut: S::Future,
    },
    /// The request flow (`http::flow`) of a keyed request.
    Flowing {
        flow: BoxFuture<Result<Answer<S::Response>, S::Error>>,
    },
}

impl<S, ReqBody> std::fmt::Debug for ResponseFuture<S, ReqBody>
where
    S: Service<Request<RequestBody<ReqBody>>>,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Rejected { .. } => "rejected",
            State::Passing { .. } => "passing",
            State::Flowing { .. } => "flowing",
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
        let response = Some(response);
        Self {
            state: State::Rejected { response },
        }
    }

    pub(crate) fn pass(fut: S::Future) -> Self {
        Self {
            state: State::Passing { fut },
        }
    }

    pub(crate) fn flowing(flow: BoxFuture<Result<Answer<S::Response>, S::Error>>) -> Self {
        Self {
            state: State::Flowing { flow },
        }
    }
}

impl<S, ReqBody, ResBody> Future for ResponseFuture<S, ReqBody>
where
    S: Service<Request<RequestBody<ReqBody>>, Response = Response<ResBody>>,
    ResBody: Body,
    ResBody::Data: From<Bytes>,
{
    type Output = Result<Response<LeaseBody<ResBody>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().state.project() {
            StateProj::Rejected { response } => {
                let r = response.take().expect("polled after completion");
                Poll::Ready(Ok(rejection_response(r)))
            }
            StateProj::Passing { fut } => {
                let res = ready!(fut.poll(cx))?;
                Poll::Ready(Ok(res.map(|b| LeaseBody::new(b, None, None))))
            }
            StateProj::Flowing { flow } => {
                Poll::Ready(ready!(flow.as_mut().poll(cx)).map(Answer::into_response))
            }
        }
    }
}
