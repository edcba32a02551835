//! The actix-web 4 middleware [`RedlockMiddleware`](crate::RedlockMiddleware) (feature
//! `actix`) and the types it is made of.
//!
//! The same keys, policies and answers as [`RedlockLayer`](crate::RedlockLayer) —
//! both are built on [`LockPolicy`](crate::policy::LockPolicy) and differ only in framework
//! glue: `409` + `Retry-After` on contention (or a bounded wait), `503` or fail-open when the
//! quorum is unreachable, `400` for a bad key, problem+json bodies (gRPC statuses for a
//! gRPC request, see [`grpc`](crate::grpc)); with
//! [replay](crate::replay), the stored response of a completed key (identical to the one
//! an axum replica stores or replays), `422` for a reused key, `413` for a body over the
//! limit. The handler gets the lease as a [`LeaseHandle`](crate::LeaseHandle) extractor.
//!
//! **Cancellation:** actix-web keeps running a handler whose client has gone unless the
//! server is built with `HttpServer::h1_allow_half_closed(false)`; only then is the handler
//! dropped and the lock released at once (otherwise it is held, and kept alive, until the
//! handler returns).
//!
//! ```
//! use actix_web::{web, App, HttpResponse};
//! use tower_redlock::key::IdempotencyKey;
//! use tower_redlock::{LeaseHandle, Redlock, RedlockMiddleware};
//!
//! async fn pay(lease: LeaseHandle) -> HttpResponse {
//!     HttpResponse::Ok().body(format!("charged under lock {}", lease.resource()))
//! }
//!
//! # #[actix_web::main] async fn main() -> Result<(), tower_redlock::Error> {
//! let redlock = Redlock::in_memory(); // Redlock::new([url1, url2, url3])? in production
//! // Wrap the route (`Route::wrap`, after `.to`), not the app or the resource: only a served
//! // route takes the lock, so an unknown path answers 404 and a wrong method 405, never 400
//! // or 409 (a resource's `wrap` also wraps its 405).
//! let lock = RedlockMiddleware::new(redlock, IdempotencyKey::required())?;
//! let app = App::new().service(
//!     web::resource("/payments").route(web::post().to(pay).wrap(lock)),
//! );
//! # let _ = app;
//! # Ok(()) }
//! ```

mod body;
mod extract;
mod glue;
pub(crate) mod middleware;
mod view;

pub use self::body::LeaseBody;
pub use self::middleware::RedlockMiddlewareService;
pub(crate) use self::view::ActixRequestView;
