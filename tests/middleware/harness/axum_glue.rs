//! [`Axum`]: an [`App`] as an axum `Router` — each route's handlers in one method router with
//! the `RedlockLayer` as its `route_layer` (so only a matched route and method take the lock:
//! a wrong method answers 405, an unknown path 404), the authentication layer outside — served
//! by the testkit's `HttpApp` on `127.0.0.1:0`.

use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::{from_fn, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, MethodRouter};
use axum::{Json, Router};
use tower_redlock::key::KeyExtractor;
use tower_redlock::policy::{LockPolicy, Unlocked};
use tower_redlock::{LeaseHandle, Redlock, RedlockLayer};

use super::app::{chunks, Answer, App, Method, Principal, Seen, FENCING_HEADER, USER_HEADER};
use super::{Framework, Served};
use crate::support::HttpApp;

/// The tower/axum glue: `RedlockLayer` in an axum 0.8 router.
pub struct Axum;

impl Framework for Axum {
    const NAME: &'static str = "axum";

    async fn serve(app: &App) -> Served {
        Served::axum(HttpApp::serve(router(app)).await)
    }

    fn checked_new(
        redlock: Redlock,
        extractor: impl KeyExtractor,
    ) -> tower_redlock::Result<LockPolicy> {
        LockPolicy::builder(redlock, extractor)
            .build()
            .map(|p| RedlockLayer::new(p).policy().clone())
    }

    fn idempotent(redlock: Redlock) -> tower_redlock::Result<LockPolicy> {
        LockPolicy::idempotent(redlock)
            .build()
            .map(|p| RedlockLayer::new(p).policy().clone())
    }
}

/// The app as a router.
pub fn router(app: &App) -> Router {
    let mut router = Router::new();
    for route in &app.routes {
        let mut methods = MethodRouter::new();
        for (method, handler) in &route.handlers {
            let handler = handler.clone();
            // The lease through the `Option<LeaseHandle>` extractor, the rest from the
            // request's extensions.
            let handle = move |lease: Option<LeaseHandle>, req: Request| {
                let handler = handler.clone();
                async move {
                    let mut seen = seen(lease, &req);
                    if handler.reads_body() {
                        let body = axum::body::to_bytes(req.into_body(), usize::MAX).await;
                        seen.body = Some(body.expect("the request body is read"));
                    }
                    respond(handler.answer(seen).await)
                }
            };
            methods = methods.on(filter(*method), handle);
        }
        if let Some(policy) = &route.policy {
            methods = methods.route_layer(RedlockLayer::new(policy.clone()));
        }
        router = router.route(route.path, methods);
    }
    router.layer(from_fn(authenticate))
}

fn filter(method: Method) -> MethodFilter {
    match method {
        Method::Get => MethodFilter::GET,
        Method::Post => MethodFilter::POST,
        Method::Put => MethodFilter::PUT,
        Method::Patch => MethodFilter::PATCH,
        Method::Delete => MethodFilter::DELETE,
    }
}

fn seen(lease: Option<LeaseHandle>, req: &Request) -> Seen {
    Seen {
        method: req.method().to_string(),
        path: req
            .uri()
            .path_and_query()
            .map_or_else(|| req.uri().path().to_owned(), |p| p.as_str().to_owned()),
        body: None,
        lease,
        unlocked: req.extensions().get::<Unlocked>().is_some(),
        principal: req.extensions().get::<Principal>().cloned(),
        fencing_header: req
            .headers()
            .get(FENCING_HEADER)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
    }
}

fn respond(answer: Answer) -> Response {
    match answer {
        Answer::Json(v) => Json(v).into_response(),
        Answer::Stale(stale) => stale.into_response(),
        Answer::Text(text) => text.into_response(),
        Answer::Stream(body) => axum::body::Body::from_stream(chunks(body)).into_response(),
        Answer::Full {
            status,
            headers,
            body,
        } => {
            let mut res = Response::new(axum::body::Body::from(body));
            *res.status_mut() = StatusCode::from_u16(status).expect("a valid status");
            for (name, value) in headers {
                let value = HeaderValue::from_str(&value).expect("a valid header value");
                res.headers_mut().append(name, value);
            }
            res
        }
    }
}

/// The authentication layer: `x-user: T` becomes the extension `Principal { tenant: T }`.
async fn authenticate(mut req: Request, next: Next) -> Response {
    let tenant = req
        .headers()
        .get(USER_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if let Some(tenant) = tenant {
        req.extensions_mut().insert(Principal { tenant });
    }
    next.run(req).await
}
