//! Fencing through the middleware: an axum handler that writes through a fenced store with the
//! token of its `LeaseHandle`, so that a handler paused past its lease loses its late write —
//! and its client gets `409 /problems/fencing-token-stale`, not a `200`.
//!
//! `PUT /ledger/{id}` (body: the new value) is locked per id (ttl 1 s, keep-alive off, so a
//! pause can outlive it); `?pause_ms=N` makes the handler sleep N ms before it writes, as a GC
//! pause or a stalled VM would. The data lives in Redis (`fenced::FencedRedis`).
//!
//! ```text
//! # three masters on 7777-7779 (the lock), the data on the first
//! REDLOCK_URLS=redis://127.0.0.1:7777,redis://127.0.0.1:7778,redis://127.0.0.1:7779 \
//!     cargo run --features axum --example fenced_axum
//! curl -s -X PUT 'localhost:3000/ledger/1?pause_ms=2000' -d old & sleep 1.2
//! curl -s -X PUT 'localhost:3000/ledger/1' -d new          # {"written":"new","token":…}
//! wait                                                      # the paused one: 409 fencing-token-stale
//! ```
//!
//! Environment: `REDLOCK_URLS` (required: the lock's masters), `DATA_REDIS_URL` (default: the
//! first of them), `BIND_ADDR` (default `127.0.0.1:3000`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::routing::put;
use axum::{Json, Router};
use redis::aio::ConnectionManager;
use serde_json::{json, Value};
use tower_redlock::fenced::{FencedRedis, StaleToken};
use tower_redlock::key::RouteParamKey;
use tower_redlock::policy::LockPolicy;
use tower_redlock::{LeaseHandle, Redlock, RedlockLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Ok(urls) = std::env::var("REDLOCK_URLS") else {
        eprintln!("set REDLOCK_URLS to the lock's Redis masters (see the example's docs)");
        std::process::exit(2);
    };
    let urls = tower_redlock::node::split_urls(&urls);
    let data_url = std::env::var("DATA_REDIS_URL").unwrap_or_else(|_| urls[0].to_owned());
    let bind: SocketAddr = std::env::var("BIND_ADDR")
        .unwrap_or_else(|_| "127.0.0.1:3000".into())
        .parse()?;

    let redlock = urls
        .iter()
        .fold(Redlock::builder(), |b, url| b.redis(url))
        .fencing(true)
        .build()?;
    let policy = LockPolicy::builder(redlock, RouteParamKey::new("id"))
        .any_method()
        .ttl(Duration::from_secs(1))
        .keep_alive(false)
        .build()?;
    let data = FencedRedis::new(ConnectionManager::new(redis::Client::open(data_url)?).await?);
    let app = Router::new()
        .route(
            "/ledger/{id}",
            put(write).route_layer(RedlockLayer::new(policy)),
        )
        .with_state(data);
    println!("[{bind}] PUT /ledger/{{id}}[?pause_ms=N], fenced writes");
    let listener = tokio::net::TcpListener::bind(bind).await?;
    axum::serve(listener, app).await?;
    Ok(())
}

/// Writes the body as the ledger entry's value, with the lease's fencing token.
async fn write(
    State(mut data): State<FencedRedis<ConnectionManager>>,
    Path(id): Path<String>,
    Query(query): Query<HashMap<String, u64>>,
    lease: LeaseHandle,
    value: String,
) -> Result<Json<Value>, Refused> {
    if let Some(ms) = query.get("pause_ms") {
        tokio::time::sleep(Duration::from_millis(*ms)).await;
    }
    let token = lease.fencing_token().expect("the client has fencing on");
    // `{…}`: a hash tag, so the value and its token share a Cluster slot.
    let key = format!("{{ledger:{id}}}");
    data.set(&key, value.as_bytes(), token).await??;
    Ok(Json(json!({ "written": value, "token": token })))
}

/// A refused write (`409`, the crate's answer) or a data Redis that failed (`503`).
enum Refused {
    Stale(StaleToken),
    Redis(redis::RedisError),
}

impl From<StaleToken> for Refused {
    fn from(stale: StaleToken) -> Self {
        Self::Stale(stale)
    }
}

impl From<redis::RedisError> for Refused {
    fn from(e: redis::RedisError) -> Self {
        Self::Redis(e)
    }
}

impl axum::response::IntoResponse for Refused {
    fn into_response(self) -> axum::response::Response {
        match self {
            Self::Stale(stale) => stale.into_response(),
            Self::Redis(e) => {
                (axum::http::StatusCode::SERVICE_UNAVAILABLE, e.to_string()).into_response()
            }
        }
    }
}
