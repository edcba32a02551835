//! The same idempotent payment endpoint as `axum_idempotent`, on actix-web.
//!
//! `POST /payments` requires an `Idempotency-Key` header; the first request with a key runs
//! the handler (a new `payment_id`) and its response is stored on the masters. While it
//! runs, every other request with that key — on any replica sharing the masters, axum or
//! actix — gets `409 Conflict` with `Retry-After`; after it, the stored response with
//! `idempotency-replayed: true` (whichever replica stored it); the key with another body,
//! `422`.
//!
//! Environment: `REDLOCK_URLS` (comma-separated voter URLs, see the axum example; unset →
//! in-memory node), `BIND_ADDR`
//! (default `127.0.0.1:3000`), `WORK_MS` (default 200), `TTL_MS` (default 10 000), `ON_LOST`
//! (`abort` or, by default, finish: see the axum example), `RUST_LOG`.
//!
//! ```text
//! cargo run --features actix --example actix_idempotent
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use actix_web::{web, App, HttpResponse, HttpServer};
use serde_json::{json, Value};
use tower_redlock::policy::{LockPolicy, OnLost};
use tower_redlock::RedlockMiddleware;
use tower_redlock::{LeaseHandle, Redlock};

#[derive(Clone, Copy)]
struct Config {
    work: Duration,
    replica: SocketAddr,
}

async fn pay(
    lease: LeaseHandle,
    order: web::Json<Value>,
    config: web::Data<Config>,
) -> HttpResponse {
    // Runs once per Idempotency-Key, fleet-wide: a duplicate gets this very response (the
    // same `payment_id`) replayed.
    tokio::time::sleep(config.work).await;
    HttpResponse::Ok().json(json!({
        "payment_id": uuid::Uuid::new_v4().to_string(),
        "status": "charged",
        "amount_cents": order["amount_cents"],
        "replica": config.replica.to_string(),
        "lock": {
            "resource": lease.resource(),
            "validity_ms": lease.validity().as_millis() as u64,
            "lost": lease.is_lost(),
        },
    }))
}

#[actix_web::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // Every lock outcome (acquired, contended, released) is logged at debug.
                .unwrap_or_else(|_| "info,tower_redlock=debug".into()),
        )
        // No colour codes in a log file or a pipe.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();

    let bind: SocketAddr = std::env::var("BIND_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:3000".into())
        .parse()?;
    let ms = |name: &str, default: u64| {
        let ms = std::env::var(name).ok().and_then(|v| v.parse().ok());
        Duration::from_millis(ms.unwrap_or(default))
    };
    let (work, ttl) = (ms("WORK_MS", 200), ms("TTL_MS", 10_000));
    // `ON_LOST=abort`: a handler whose lease is lost (masters paused past the ttl, so the
    // keep-alive cannot extend it) is stopped, its client answered `503` lock-lost and its
    // key marked "outcome unknown"; by default it finishes, answered with `Lock-Lost: true`.
    let on_lost = match std::env::var("ON_LOST").as_deref() {
        Ok("abort") => OnLost::Abort,
        _ => OnLost::Finish,
    };
    let redlock = match std::env::var("REDLOCK_URLS") {
        Ok(urls) if !urls.trim().is_empty() => {
            // Commas separate voters; a Sentinel's or a Cluster's hosts stay together.
            let urls = tower_redlock::node::split_urls(&urls);
            println!(
                "[{bind}] locking on {} Redis voters (actix-web)",
                urls.len()
            );
            Redlock::new(urls)?
        }
        _ => {
            println!("[{bind}] REDLOCK_URLS is not set: locking with the in-memory node (this process only)");
            Redlock::in_memory()
        }
    };
    // The same policy as the axum example, so both protect — and replay — the same keys.
    // (With the default ttl, `RedlockMiddleware::new(LockPolicy::idempotent(redlock).build()?)` says the same.)
    let policy = LockPolicy::idempotent(redlock)
        .ttl(ttl)
        .on_lost(on_lost)
        .build()?;
    let config = Config {
        work,
        replica: bind,
    };

    println!(
        "[{bind}] listening: POST /payments (WORK_MS={}, TTL_MS={}, ON_LOST={on_lost:?})",
        work.as_millis(),
        ttl.as_millis()
    );
    HttpServer::new(move || {
        App::new()
            .app_data(web::Data::new(config))
            .route("/health", web::get().to(|| async { "ok" }))
            // The lock wraps the route that needs it (after `.to`): /health is never
            // locked, an unknown path answers 404 and `GET /payments` 405, not 400 or 409
            // (a resource's `wrap` would wrap its 405 too).
            .service(
                web::resource("/payments").route(
                    web::post()
                        .to(pay)
                        .wrap(RedlockMiddleware::new(policy.clone())),
                ),
            )
    })
    .workers(2)
    // A client that goes away cancels its handler, which releases the lock at once.
    .h1_allow_half_closed(false)
    .bind(bind)?
    .run()
    .await?;
    Ok(())
}
