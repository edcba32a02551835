//! The frameworks that serve the work: `POST /payments` behind `RedlockLayer` (axum) or
//! `RedlockMiddleware` (actix-web), the handler taking `KeyRow` as an extractor and
//! answering with `work.rs`'s outcome; and the variants every test runs over.

use std::future::Future;
use std::net::SocketAddr;

use actix_web::dev::ServerHandle;
use tower_redlock::durable::KeyRow;
use tower_redlock::policy::LockPolicy;
use tower_redlock_testkit as support;

use super::app::{self, Hooks};
use super::work::{handle, Driver, DriverKind};

/// The web framework serving a replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Web {
    Axum,
    Actix,
}

/// A framework and an adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Variant {
    pub web: Web,
    pub driver: DriverKind,
}

/// What every test runs over: both frameworks with sqlx, and tokio-postgres (axum).
/// `durable_answers_are_byte_identical_over_every_framework_and_driver` adds actix-web with
/// tokio-postgres.
pub const VARIANTS: [Variant; 3] = [
    Variant::new(Web::Axum, DriverKind::Sqlx),
    Variant::new(Web::Actix, DriverKind::Sqlx),
    Variant::new(Web::Axum, DriverKind::TokioPostgres),
];

impl Variant {
    pub const fn new(web: Web, driver: DriverKind) -> Self {
        Self { web, driver }
    }

    /// Its name in the replica process's configuration.
    pub fn name(self) -> String {
        format!("{:?}/{:?}", self.web, self.driver)
    }

    pub fn parse(name: &str) -> Self {
        let all = [Web::Axum, Web::Actix].into_iter().flat_map(|web| {
            [DriverKind::Sqlx, DriverKind::TokioPostgres]
                .into_iter()
                .map(move |driver| Variant::new(web, driver))
        });
        all.into_iter()
            .find(|v| v.name() == name)
            .expect("a variant")
    }
}

/// Runs `scenario` over every variant, one after the other, on one PostgreSQL server (each
/// variant makes a database of its own on it, and starts its own masters); a failure's
/// output names the variant.
pub async fn each<F, Fut>(scenario: F)
where
    F: Fn(Variant, app::Server) -> Fut,
    Fut: Future<Output = ()>,
{
    let server = app::server().await;
    for variant in VARIANTS {
        eprintln!("-- over {}", variant.name());
        scenario(variant, server.clone()).await;
    }
}

/// A served replica, stopped when dropped.
pub enum Served {
    Axum(support::HttpApp),
    Actix(SocketAddr, ServerHandle),
}

impl Served {
    /// Serves the work over `variant`'s framework and adapter, under `policy`.
    pub async fn start(variant: Variant, url: &str, policy: LockPolicy, hooks: Hooks) -> Self {
        let driver = Driver::lazy(variant.driver, url);
        match variant.web {
            Web::Axum => {
                Self::Axum(support::HttpApp::serve(axum_app::router(policy, driver, hooks)).await)
            }
            Web::Actix => {
                let (addr, handle) = actix_app::serve(policy, driver, hooks);
                Self::Actix(addr, handle)
            }
        }
    }

    pub fn addr(&self) -> SocketAddr {
        match self {
            Self::Axum(app) => app.addr(),
            Self::Actix(addr, _) => *addr,
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Self::Actix(_, handle) = self {
            // Sends the command at once; the server task carries it out.
            drop(handle.stop(false));
        }
    }
}

/// The `x-mode` header's value (`ok` without one).
fn mode(value: Option<&[u8]>) -> String {
    let mode = value.and_then(|v| std::str::from_utf8(v).ok());
    mode.unwrap_or("ok").to_owned()
}

mod axum_app {
    use axum::extract::State;
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::{IntoResponse, Response};
    use axum::routing::post;
    use axum::Router;
    use tower_redlock::RedlockLayer;

    use super::*;

    pub fn router(policy: LockPolicy, driver: Driver, hooks: Hooks) -> Router {
        Router::new()
            .route("/payments", post(pay))
            .layer(RedlockLayer::new(policy))
            .with_state((driver, hooks))
    }

    async fn pay(
        State((driver, hooks)): State<(Driver, Hooks)>,
        row: KeyRow,
        headers: HeaderMap,
        body: String,
    ) -> Response {
        let mode = mode(headers.get("x-mode").map(|v| v.as_bytes()));
        match handle(&driver, &hooks, row, &mode, &body).await {
            Ok((status, body)) => (StatusCode::from_u16(status).unwrap(), body).into_response(),
            Err(e) => e.into_response(),
        }
    }
}

mod actix_app {
    use actix_web::http::StatusCode;
    use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
    use tower_redlock::durable::RowError;
    use tower_redlock::RedlockMiddleware;

    use super::*;

    /// An actix-web server with one worker on `127.0.0.1:0` (its worker gets a thread and a
    /// runtime of its own), run on the test's runtime; a request whose client goes away is
    /// cancelled, as on axum.
    pub fn serve(policy: LockPolicy, driver: Driver, hooks: Hooks) -> (SocketAddr, ServerHandle) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let server = HttpServer::new(move || {
            App::new()
                .app_data(web::Data::new((driver.clone(), hooks.clone())))
                .service(
                    web::resource("/payments")
                        .wrap(RedlockMiddleware::new(policy.clone()))
                        .route(web::post().to(pay)),
                )
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(1)
        // A client that goes away cancels its request, as on axum (hyper).
        .h1_allow_half_closed(false)
        .listen(listener)
        .expect("listen on the bound socket")
        .run();
        let handle = server.handle();
        tokio::spawn(server);
        (addr, handle)
    }

    async fn pay(
        state: web::Data<(Driver, Hooks)>,
        row: KeyRow,
        req: HttpRequest,
        body: String,
    ) -> Result<HttpResponse, RowError> {
        let (driver, hooks) = &**state;
        let mode = mode(req.headers().get("x-mode").map(|v| v.as_bytes()));
        let (status, body) = handle(driver, hooks, row, &mode, &body).await?;
        Ok(HttpResponse::build(StatusCode::from_u16(status).unwrap())
            .content_type("text/plain; charset=utf-8")
            .body(body))
    }
}

/// A replica of the service, in this process.
pub struct Replica {
    pub served: Served,
    pub hooks: Hooks,
    pub reached: tokio::sync::mpsc::UnboundedReceiver<String>,
}

impl Replica {
    pub async fn start(
        variant: Variant,
        masters: &support::Masters,
        db: &app::Db,
        lock_timeout: std::time::Duration,
    ) -> Self {
        let url = db.url.clone();
        let policy = app::policy(variant.driver, masters.client(), &url, lock_timeout);
        Self::with_policy(variant, db, policy).await
    }

    pub async fn with_policy(variant: Variant, db: &app::Db, policy: LockPolicy) -> Self {
        let (hooks, reached) = Hooks::new();
        let served = Served::start(variant, &db.url.clone(), policy, hooks.clone()).await;
        Self {
            served,
            hooks,
            reached,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}/payments", self.served.addr())
    }

    /// Waits for the handler to reach `what`.
    pub async fn reached(&mut self, what: &str) {
        let got = support::http::within(what.to_owned(), self.reached.recv()).await;
        assert_eq!(
            got.as_deref(),
            Some(what),
            "the handler reached another point"
        );
    }
}
