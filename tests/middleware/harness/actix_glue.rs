//! [`Actix`]: an [`App`] as an actix-web app — each route pattern a `web::resource` with a
//! route per method, each route wrapped in the `RedlockMiddleware` (`Route::wrap`: only a
//! served route takes the lock, so an unknown path answers 404 and an unserved method 405 — a resource wrap would
//! wrap its 405 too), the authentication middleware
//! app-wide (it runs before the lock) — served by an `HttpServer` with one worker on
//! `127.0.0.1:0`.

use std::net::SocketAddr;

use actix_web::dev::{ServerHandle, Service};
use actix_web::http::{Method as ActixMethod, StatusCode};
use actix_web::{web, HttpMessage, HttpRequest, HttpResponse, HttpServer};
use bytes::BytesMut;
use futures_util::StreamExt;
use tower_redlock::key::KeyExtractor;
use tower_redlock::policy::{LockPolicy, Unlocked};
use tower_redlock::{LeaseHandle, Redlock, RedlockMiddleware};

use super::app::{chunks, Answer, App, Method, Principal, Seen, FENCING_HEADER, USER_HEADER};
use super::{Framework, Served};
use crate::support::http::within;

/// The actix-web glue: `RedlockMiddleware` in an actix-web 4 app.
pub struct Actix;

impl Framework for Actix {
    const NAME: &'static str = "actix-web";

    async fn serve(app: &App) -> Served {
        Served::actix(ActixServer::serve(app.clone()))
    }

    fn checked_new(
        redlock: Redlock,
        extractor: impl KeyExtractor,
    ) -> tower_redlock::Result<LockPolicy> {
        LockPolicy::builder(redlock, extractor)
            .build()
            .map(|p| RedlockMiddleware::new(p).policy().clone())
    }

    fn idempotent(redlock: Redlock) -> tower_redlock::Result<LockPolicy> {
        LockPolicy::idempotent(redlock)
            .build()
            .map(|p| RedlockMiddleware::new(p).policy().clone())
    }
}

/// The app's routes, as resources.
pub fn configure(app: &App, cfg: &mut web::ServiceConfig) {
    for route in &app.routes {
        let mut resource = web::resource(route.path);
        for (method, handler) in &route.handlers {
            let handler = handler.clone();
            // The lease through the `Option<LeaseHandle>` extractor, the rest from the
            // request's extensions.
            let handle =
                move |lease: Option<LeaseHandle>, req: HttpRequest, mut payload: web::Payload| {
                    let handler = handler.clone();
                    async move {
                        let mut seen = seen(lease, &req);
                        if handler.reads_body() {
                            let mut body = BytesMut::new();
                            while let Some(chunk) = payload.next().await {
                                body.extend_from_slice(&chunk.expect("the request body is read"));
                            }
                            seen.body = Some(body.freeze());
                        }
                        respond(handler.answer(seen).await)
                    }
                };
            let mut one = web::method(method_of(*method)).to(handle);
            if let Some(policy) = &route.policy {
                one = one.wrap(RedlockMiddleware::new(policy.clone()));
            }
            resource = resource.route(one);
        }
        cfg.service(resource);
    }
}

fn method_of(method: Method) -> ActixMethod {
    match method {
        Method::Get => ActixMethod::GET,
        Method::Post => ActixMethod::POST,
        Method::Put => ActixMethod::PUT,
        Method::Patch => ActixMethod::PATCH,
        Method::Delete => ActixMethod::DELETE,
    }
}

fn seen(lease: Option<LeaseHandle>, req: &HttpRequest) -> Seen {
    let extensions = req.extensions();
    let path = match req.query_string() {
        "" => req.path().to_owned(),
        query => format!("{}?{query}", req.path()),
    };
    Seen {
        method: req.method().to_string(),
        path,
        body: None,
        lease,
        unlocked: extensions.get::<Unlocked>().is_some(),
        principal: extensions.get::<Principal>().cloned(),
        fencing_header: req
            .headers()
            .get(FENCING_HEADER)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned()),
    }
}

fn respond(answer: Answer) -> HttpResponse {
    match answer {
        Answer::Json(v) => HttpResponse::Ok()
            .content_type("application/json")
            .body(v.to_string()),
        Answer::Text(text) => HttpResponse::Ok().body(text),
        Answer::Stale(stale) => actix_web::ResponseError::error_response(&stale),
        Answer::Stream(body) => HttpResponse::Ok().streaming(chunks(body)),
        Answer::Full {
            status,
            headers,
            body,
        } => {
            let mut res =
                HttpResponse::build(StatusCode::from_u16(status).expect("a valid status"));
            for (name, value) in headers {
                res.append_header((name, value));
            }
            res.body(body)
        }
    }
}

/// An actix-web server with one worker on `127.0.0.1:0`, run on the test's Tokio runtime
/// (its worker gets a thread and a runtime of its own). Stopped by [`ActixServer::stop`], or
/// at once when dropped (a failed test).
pub struct ActixServer {
    addr: SocketAddr,
    handle: ServerHandle,
    server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl ActixServer {
    /// Serves `app`, with the authentication middleware app-wide: registered on the `App`, it
    /// runs before the resources' lock middleware.
    pub fn serve(app: App) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        // `h1_allow_half_closed` (default `true`): a client that closes its side of the
        // connection does not cancel the request in progress.
        let half_closed = !app.cancel_on_close;
        let server = HttpServer::new(move || {
            let app = app.clone();
            actix_web::App::new()
                .wrap_fn(|req, srv| {
                    let tenant = req
                        .headers()
                        .get(USER_HEADER)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned);
                    if let Some(tenant) = tenant {
                        req.extensions_mut().insert(Principal { tenant });
                    }
                    srv.call(req)
                })
                .configure(move |cfg| configure(&app, cfg))
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(5)
        .h1_allow_half_closed(half_closed)
        .listen(listener)
        .expect("listen on the bound socket")
        .run();
        let handle = server.handle();
        Self {
            addr,
            handle,
            server: Some(tokio::spawn(server)),
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops the server gracefully and waits until it has stopped.
    pub async fn stop(mut self) {
        self.handle.stop(true).await;
        if let Some(server) = self.server.take() {
            within("the actix-web server to stop", server)
                .await
                .expect("the server task")
                .expect("the server");
        }
    }
}

impl Drop for ActixServer {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            // Sends the command at once; the server task carries it out.
            drop(self.handle.stop(false));
            drop(server);
        }
    }
}
