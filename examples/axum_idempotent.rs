//! An idempotent payment endpoint behind `RedlockLayer`, with replay.
//!
//! `POST /payments` requires an `Idempotency-Key` header. The first request with a key runs
//! the handler (which makes a new `payment_id`) and its response is stored on the Redis
//! masters. Meanwhile, every other request with the key — on this replica or any other
//! sharing the masters, axum or actix — gets `409 Conflict` with `Retry-After`; after it,
//! the stored response with `idempotency-replayed: true` (the handler does not run again);
//! the same key with another body, `422`.
//!
//! Environment:
//! - `REDLOCK_URLS`: comma-separated voter URLs — masters (`redis://`), Sentinel groups
//!   (`redis+sentinel://h:p,h:p/name`), Clusters (`redis+cluster://h:p,h:p`, with the
//!   `cluster` feature); unset → the in-memory node (this process only);
//! - `BIND_ADDR`: where to listen (default `127.0.0.1:3000`);
//! - `WORK_MS`: how long the handler "works" (default 200);
//! - `TTL_MS`: the lock's ttl (default 10 000), kept alive while the handler works;
//! - `ON_LOST`: `abort` stops a handler whose lease is lost (e.g. the masters paused past
//!   the ttl) and answers `503` lock-lost; otherwise it finishes, with `Lock-Lost: true`;
//! - `RUST_LOG`: log filter (default `info`: one line per lock call, release and lease as
//!   its span closes, with the outcome; `tower_redlock=debug` adds each try and node answer).
//!
//! Built with the feature `metrics`, it also serves `GET /metrics`: the `redlock_*` counters,
//! histograms (with the buckets of `tower_redlock::metrics::SECONDS_BUCKETS`, for the
//! dashboard's percentiles in `ops/grafana/`) and gauges in the Prometheus text format; the
//! series of fixed labels are exported at 0 from the start, so that `rate()` sees their
//! first increase.
//!
//! ```text
//! cargo run --features axum,metrics --example axum_idempotent
//! curl -i localhost:3000/payments -H 'Idempotency-Key: "8e03978e-40d5-43e8"' \
//!      -H 'content-type: application/json' -d '{"amount_cents": 1250}'
//! curl -s localhost:3000/metrics | grep '^redlock_'
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use tower_redlock::policy::{LockPolicy, OnLost};
use tower_redlock::{LeaseHandle, Redlock, RedlockLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        // The crate's outcomes are fields of its info spans (`redlock.acquire`,
        // `redlock.release`, …): print each span as it closes, with its fields and times.
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        // No colour codes in a log file or a pipe.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();

    // The recorder goes in before the client is built (which registers its metrics).
    #[cfg(feature = "metrics")]
    let prometheus = scrape::install()?;

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
            println!("[{bind}] locking on {} Redis voters", urls.len());
            Redlock::new(urls)?
        }
        _ => {
            println!("[{bind}] REDLOCK_URLS is not set: locking with the in-memory node (this process only)");
            Redlock::in_memory()
        }
    };

    // Idempotency-Key required, scoped by route; responses replayed for 24 h. (With the
    // default ttl, `RedlockLayer::new(LockPolicy::idempotent(redlock).build()?)` says the same.)
    let policy = LockPolicy::idempotent(redlock)
        .ttl(ttl)
        .on_lost(on_lost)
        .build()?;
    // The lock goes on the route that needs it (`route_layer`): /health is never locked,
    // an unknown path answers 404 and `GET /payments` 405, not 400 or 409.
    let app = Router::new()
        .route(
            "/payments",
            post(move |lease: LeaseHandle, Json(order): Json<Value>| pay(lease, order, work, bind))
                .route_layer(RedlockLayer::new(policy)),
        )
        .route("/health", get(|| async { "ok" }));
    #[cfg(feature = "metrics")]
    let app = app.route("/metrics", get(move || scrape::render(prometheus.clone())));

    let listener = tokio::net::TcpListener::bind(bind).await?;
    println!(
        "[{bind}] listening: POST /payments (WORK_MS={}, TTL_MS={}, ON_LOST={on_lost:?})",
        work.as_millis(),
        ttl.as_millis()
    );
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}

async fn pay(lease: LeaseHandle, order: Value, work: Duration, replica: SocketAddr) -> Json<Value> {
    // Runs once per Idempotency-Key across every replica sharing the masters: a duplicate
    // gets this very response (the same `payment_id`) replayed.
    tokio::time::sleep(work).await;
    Json(json!({
        "payment_id": uuid::Uuid::new_v4().to_string(),
        "status": "charged",
        "amount_cents": order["amount_cents"],
        "replica": replica.to_string(),
        "lock": {
            "resource": lease.resource(),
            "validity_ms": lease.validity().as_millis() as u64,
            "lost": lease.is_lost(),
        },
    }))
}

/// `GET /metrics` (feature `metrics`): Prometheus text, from a recorder installed globally.
#[cfg(feature = "metrics")]
mod scrape {
    use std::time::Duration;

    use axum::http::header::CONTENT_TYPE;
    use axum::response::IntoResponse;
    use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};
    use tower_redlock::metrics::SECONDS_BUCKETS;

    /// Installs the recorder, the `redlock_` histograms with buckets
    /// ([`SECONDS_BUCKETS`]: a dashboard's percentiles over several replicas need them;
    /// without buckets they render as summaries); its upkeep (draining histogram samples
    /// between scrapes) runs every 5 s.
    pub fn install() -> Result<PrometheusHandle, BuildError> {
        let handle = PrometheusBuilder::new()
            .set_buckets_for_metric(Matcher::Prefix("redlock_".into()), &SECONDS_BUCKETS)?
            .install_recorder()?;
        let upkeep = handle.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                upkeep.run_upkeep();
            }
        });
        Ok(handle)
    }

    pub async fn render(handle: PrometheusHandle) -> impl IntoResponse {
        let text = handle.render();
        ([(CONTENT_TYPE, "text/plain; version=0.0.4")], text)
    }
}
