//! The harness that runs one scenario against both frameworks: an app described once
//! ([`app`]), served by either glue through [`Framework`] ([`axum_glue`], [`actix_glue`]),
//! the handlers' probes ([`probe`]), the lock keys the apps take ([`keys`]), and requests
//! written by hand for what the HTTP client does not send ([`raw`]).

pub mod actix_glue;
pub mod app;
pub mod axum_glue;
pub mod keys;
pub mod probe;
pub mod raw;

use std::future::Future;
use std::net::SocketAddr;

use tower_redlock::key::KeyExtractor;
use tower_redlock::policy::LockPolicy;
use tower_redlock::Redlock;

pub use actix_glue::Actix;
pub use app::App;
pub use axum_glue::Axum;

/// A web framework the lock middleware supports: what a scenario needs to run on it.
pub trait Framework {
    /// Its name, for messages.
    const NAME: &'static str;

    /// Serves `app` on `127.0.0.1:0`, in a server of its own.
    fn serve(app: &App) -> impl Future<Output = Served>;

    /// The middleware's checked constructor with the default policy (`RedlockLayer::new`,
    /// `RedlockMiddleware::new`); the policy of the middleware it built.
    fn checked_new(
        redlock: Redlock,
        extractor: impl KeyExtractor,
    ) -> tower_redlock::Result<LockPolicy>;

    /// The middleware's idempotent short form (`RedlockLayer::idempotent`,
    /// `RedlockMiddleware::idempotent`: `Idempotency-Key` required, scoped by route, replay
    /// with the defaults); the policy of the middleware it built.
    fn idempotent(redlock: Redlock) -> tower_redlock::Result<LockPolicy>;
}

/// A served app: its address, and the guard that stops its server (at once when dropped, as
/// in a failed test; gracefully through [`Served::stop`]).
pub struct Served {
    addr: SocketAddr,
    server: Server,
}

enum Server {
    Axum(crate::support::HttpApp),
    Actix(actix_glue::ActixServer),
}

impl Served {
    fn axum(app: crate::support::HttpApp) -> Self {
        Self {
            addr: app.addr(),
            server: Server::Axum(app),
        }
    }

    fn actix(server: actix_glue::ActixServer) -> Self {
        Self {
            addr: server.addr(),
            server: Server::Actix(server),
        }
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Stops the server: actix-web's gracefully, waiting until it has stopped; axum's accept
    /// loop is aborted.
    pub async fn stop(self) {
        match self.server {
            Server::Axum(app) => drop(app),
            Server::Actix(server) => server.stop().await,
        }
    }
}
