//! `axum_idempotent`'s payment endpoint with **durable replay**: the idempotency key's row is
//! written in the payment's own PostgreSQL transaction (feature `sqlx-0_8`), so a replica
//! killed after its commit, or Redis masters that lost their records, never mean a second
//! charge.
//!
//! `POST /payments` (`{"amount_cents": 1250}`, an `Idempotency-Key` header) runs one
//! transaction: the key's row first (`row.insert_in`), then the payment (a new `payment_id`,
//! kept beside `row.key_hash()`), then `row.commit`. The middleware stores the response in the
//! key's row, then on the Redis masters. A replica that dies between its commit and that
//! store leaves a row without a response: a retry then gets the response rebuilt from the
//! `payments` table by the [`Durable::rebuild`] hook — the same status, body and
//! `payment_id`, replayed — never a second payment.
//!
//! Environment:
//! - `DATABASE_URL` (required): the PostgreSQL database; its tables (the keys' and
//!   `payments`) are made on start;
//! - `REDLOCK_URLS`: comma-separated voter URLs, as for `axum_idempotent`; unset → the
//!   in-memory node (this process only);
//! - `BIND_ADDR`: where to listen (default `127.0.0.1:3000`);
//! - `TTL_MS`: the lock's ttl (default 10 000);
//! - `DURABLE_TIMEOUT_MS`: [`Durable::timeout`] (default 5 000). A row without its
//!   response is answered `409` + `Retry-After` until it is older than the ttl and this
//!   timeout (its replica may still be storing the response), then rebuilt;
//! - `CRASH_AFTER_COMMIT=1`: a failpoint for the demo — the handler `SIGKILL`s its own
//!   process right after `row.commit`, before the response is stored anywhere.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
//!     cargo run --features axum,sqlx-0_8 --example axum_durable
//! curl -i localhost:3000/payments -H 'Idempotency-Key: "8e03978e-40d5-43e8"' \
//!      -H 'content-type: application/json' -d '{"amount_cents": 1250}'
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::{Json, State};
use axum::http::header::CONTENT_TYPE;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use serde::Deserialize;
use sqlx::PgPool;
use tower_redlock::durable::sqlx_0_8::SqlxStore;
use tower_redlock::durable::{Durable, KeyRow, Rebuilt, RowError};
use tower_redlock::policy::LockPolicy;
use tower_redlock::replay::Replay;
use tower_redlock::{Redlock, RedlockLayer};

/// The business data: one row per payment, with the key's hash the rebuild looks it up by.
const PAYMENTS: &str = "CREATE TABLE IF NOT EXISTS payments (
    payment_id   text        PRIMARY KEY,
    key_hash     text        NOT NULL,
    amount_cents bigint      NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT now());
CREATE INDEX IF NOT EXISTS payments_key_hash ON payments (key_hash)";

#[derive(Clone)]
struct App {
    db: PgPool,
    bind: SocketAddr,
    crash_after_commit: bool,
}

#[derive(Deserialize)]
struct Order {
    amount_cents: i64,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                // Not PostgreSQL's notices ("relation … already exists, skipping").
                .unwrap_or_else(|_| "info,sqlx::postgres::notice=warn".into()),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();

    let bind: SocketAddr = std::env::var("BIND_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:3000".into())
        .parse()?;
    let ms = |name: &str, default: u64| {
        let ms = std::env::var(name).ok().and_then(|v| v.parse().ok());
        Duration::from_millis(ms.unwrap_or(default))
    };
    let (ttl, durable_timeout) = (ms("TTL_MS", 10_000), ms("DURABLE_TIMEOUT_MS", 5_000));
    let crash_after_commit = std::env::var("CRASH_AFTER_COMMIT").is_ok_and(|v| v == "1");
    let database_url = std::env::var("DATABASE_URL")
        .map_err(|_| "set DATABASE_URL to a PostgreSQL database (postgres://…)")?;
    let redlock = match std::env::var("REDLOCK_URLS") {
        Ok(urls) if !urls.trim().is_empty() => {
            Redlock::new(tower_redlock::node::split_urls(&urls))?
        }
        _ => Redlock::in_memory(),
    };

    // The keys' table (`Table::migration()`; a service applies it with its migration tool)
    // and the business table.
    let db = PgPool::connect(&database_url).await?;
    let store = SqlxStore::new(db.clone());
    store.migrate().await?;
    sqlx::raw_sql(PAYMENTS).execute(&db).await?;

    // Durable replay, with a hook that rebuilds a payment's response from its row in
    // `payments` when the key's row committed without one (its replica died first).
    let rebuild_db = db.clone();
    let durable = Durable::new(store)
        .timeout(durable_timeout)
        .rebuild(move |key_hash| rebuild(rebuild_db.clone(), key_hash, bind));
    let policy = LockPolicy::idempotent(redlock)
        .ttl(ttl)
        .replay(Replay::new().durable(durable))
        .build()?;
    let app = Router::new()
        .route(
            "/payments",
            post(pay).route_layer(RedlockLayer::new(policy)),
        )
        .route("/health", get(|| async { "ok" }))
        .with_state(App {
            db,
            bind,
            crash_after_commit,
        });

    let listener = tokio::net::TcpListener::bind(bind).await?;
    println!(
        "[{bind}] listening: POST /payments, durable replay in PostgreSQL (TTL_MS={}, DURABLE_TIMEOUT_MS={}{})",
        ttl.as_millis(),
        durable_timeout.as_millis(),
        if crash_after_commit { ", CRASH_AFTER_COMMIT=1" } else { "" }
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

/// The payment: the key's row, then the payment, in one transaction.
async fn pay(
    State(app): State<App>,
    row: KeyRow,
    Json(order): Json<Order>,
) -> Result<impl IntoResponse, RowError> {
    let mut tx = app.db.begin().await.map_err(|e| row.check(e))?;
    // The first statement: the row commits with the payment or not at all. A duplicate
    // whose key committed meanwhile gets an error here, which the middleware answers.
    row.insert_in(&mut tx).await?;
    let payment_id = uuid::Uuid::new_v4().to_string();
    sqlx::query("INSERT INTO payments (payment_id, key_hash, amount_cents) VALUES ($1, $2, $3)")
        .bind(&payment_id)
        .bind(row.key_hash())
        .bind(order.amount_cents)
        .execute(&mut *tx)
        .await
        .map_err(|e| row.check(e))?;
    row.commit(tx).await?;
    if app.crash_after_commit {
        crash(app.bind, &payment_id, &row.key_hash());
    }
    Ok((
        [(CONTENT_TYPE, "application/json")],
        receipt(&payment_id, order.amount_cents),
    ))
}

/// The response's body, the same bytes from the handler and from the rebuild.
fn receipt(payment_id: &str, amount_cents: i64) -> String {
    serde_json::json!({
        "payment_id": payment_id,
        "status": "charged",
        "amount_cents": amount_cents,
    })
    .to_string()
}

/// [`Durable::rebuild`]'s hook: the key's payment, answered as the handler did; `None` (the
/// middleware answers `409` completed-not-stored) when it cannot be read.
async fn rebuild(db: PgPool, key_hash: String, bind: SocketAddr) -> Option<Rebuilt> {
    let found: Option<(String, i64)> = sqlx::query_as(
        "SELECT payment_id, amount_cents FROM payments WHERE key_hash = $1
         ORDER BY created_at DESC LIMIT 1",
    )
    .bind(&key_hash)
    .fetch_optional(&db)
    .await
    .ok()?;
    let (payment_id, amount_cents) = found?;
    println!(
        "[{bind}] rebuilt the response of key {}… from payments: payment_id {payment_id}",
        &key_hash[..12]
    );
    Some(
        Rebuilt::new(200, receipt(&payment_id, amount_cents))
            .header("content-type", "application/json"),
    )
}

/// The failpoint `CRASH_AFTER_COMMIT=1`: `SIGKILL` to this process, after the commit and
/// before the middleware stores the response — no destructor, no task runs after it.
fn crash(bind: SocketAddr, payment_id: &str, key_hash: &str) -> ! {
    println!(
        "[{bind}] CRASH_AFTER_COMMIT: payment_id {payment_id} committed (key {}…); SIGKILL before its response is stored",
        &key_hash[..12]
    );
    let pid = std::process::id().to_string();
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &pid])
        .status();
    // Only if `kill` could not be run.
    std::process::abort()
}
