//! [`RedlockMiddleware`]: the actix-web 4 middleware (feature `actix`).
//!
//! The same keys, policies and answers as [`RedlockLayer`](crate::tower::RedlockLayer) —
//! both are built on [`LockPolicy`](crate::http::LockPolicy) and differ only in framework
//! glue: `409` + `Retry-After` on contention (or a bounded wait), `503` or fail-open when the
//! quorum is unreachable, `400` for a bad key, problem+json bodies. The handler gets the lease
//! as a [`LeaseHandle`](crate::LeaseHandle) extractor.
//!
//! **Cancellation:** actix-web keeps running a handler whose client has gone unless the
//! server is built with `HttpServer::h1_allow_half_closed(false)`; only then is the handler
//! dropped and the lock released at once (otherwise it is held, and kept alive, until the
//! handler returns).
//!
//! ```
//! use actix_web::{web, App, HttpResponse};
//! use tower_redlock::actix::RedlockMiddleware;
//! use tower_redlock::http::IdempotencyKey;
//! use tower_redlock::{LeaseHandle, Redlock};
//!
//! async fn pay(lease: LeaseHandle) -> HttpResponse {
//!     HttpResponse::Ok().body(format!("charged under lock {}", lease.resource()))
//! }
//!
//! # #[actix_web::main] async fn main() {
//! let redlock = Redlock::in_memory(); // Redlock::new([url1, url2, url3])? in production
//! let app = App::new().service(
//!     web::scope("/payments")
//!         .wrap(RedlockMiddleware::new(redlock, IdempotencyKey::required()))
//!         .route("", web::post().to(pay)),
//! );
//! # let _ = app;
//! # }
//! ```

mod body;
mod extract;
mod middleware;
mod view;

pub use self::body::LeaseBody;
pub use self::middleware::{RedlockMiddleware, RedlockMiddlewareService};
pub use self::view::ActixRequestView;
