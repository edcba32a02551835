//! A readiness endpoint on [`Redlock::node_status`]: `GET /ready` answers `200` while a
//! quorum of the voters is neither suspended nor abstaining — the client can lock — and
//! `503` otherwise, with a JSON body listing every voter's status (its name, `host:port` for
//! a master: never a password). Point a load balancer's or Kubernetes' readiness probe at it, so that a
//! replica that cannot lock is taken out of rotation instead of answering `503` to clients.
//!
//! ```text
//! cargo run --features axum --example readiness            # self-check, then exit
//! REDLOCK_URLS=redis://127.0.0.1:7777,redis://127.0.0.1:7778,redis://127.0.0.1:7779 \
//!     BIND_ADDR=127.0.0.1:3001 cargo run --features axum --example readiness   # serve
//! curl -i localhost:3001/ready
//! ```
//!
//! Environment: `REDLOCK_URLS` (comma-separated voter URLs; unset → the in-memory node),
//! `BIND_ADDR` (set: serve there until Ctrl-C; unset: take and release one lock, so that the
//! client has asked every voter, then serve on a free loopback port, ask `/ready` once,
//! print the answer and exit — non-zero when not ready).
//!
//! A voter is *suspended* after repeated timeouts without an answer; a probe restores it
//! within about 200 ms of its return (see `RedlockBuilder::suspend_after`). A suspended node
//! is one the client does not even ask, so `/ready` turns `503` only once a majority of the
//! voters stopped answering — not on a slow request. It reflects the requests made so far:
//! a client that has asked nothing yet reports every voter up (the self-check locks once
//! first for that reason). A voter *abstains* while its master may evict keys (a
//! `maxmemory` with a policy other than `noeviction`; see
//! `RedisNodeOptions::allow_eviction`): its `eviction_policy` says which.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Json, Router};
use serde_json::{json, Value};
use tower_redlock::Redlock;

/// `GET /ready`: 200 with a quorum of voters neither suspended nor abstaining (a master that
/// may evict keys), else 503; the status of each.
async fn ready(State(redlock): State<Redlock>) -> (StatusCode, Json<Value>) {
    let status = redlock.node_status();
    let up = status
        .iter()
        .filter(|s| !s.is_suspended() && !s.is_abstaining())
        .count();
    let ready = up >= redlock.quorum();
    let nodes: Vec<Value> = status
        .iter()
        .map(|s| {
            json!({
                "name": s.name(),
                "suspended": s.is_suspended(),
                "consecutive_timeouts": s.consecutive_timeouts(),
                "eviction_policy": s.eviction_policy(),
                "abstaining": s.is_abstaining(),
            })
        })
        .collect();
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = json!({
        "ready": ready,
        "quorum": redlock.quorum(),
        "up": up,
        "nodes": nodes,
    });
    (code, Json(body))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let redlock = match std::env::var("REDLOCK_URLS") {
        Ok(urls) if !urls.trim().is_empty() => {
            // Commas separate voters; a Sentinel's or a Cluster's hosts stay together.
            let urls = tower_redlock::node::split_urls(&urls);
            println!("{} Redis voters, quorum {}", urls.len(), urls.len() / 2 + 1);
            Redlock::new(urls)?
        }
        _ => {
            println!("REDLOCK_URLS is not set: the in-memory node (this process only)");
            Redlock::in_memory()
        }
    };
    let app = Router::new()
        .route("/ready", get(ready))
        .with_state(redlock.clone());

    let serve_at = std::env::var("BIND_ADDR").ok();
    let bind: SocketAddr = serve_at.as_deref().unwrap_or("127.0.0.1:0").parse()?;
    let listener = tokio::net::TcpListener::bind(bind).await?;
    let addr = listener.local_addr()?;
    if serve_at.is_some() {
        println!("[{addr}] GET /ready");
        axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await?;
        return Ok(());
    }

    // Run plain: lock once (every voter is asked; dead ones time out, and the retries of
    // `lock` take long enough to suspend them), ask /ready, print the answer, exit.
    match redlock
        .lock("readiness:self-check", Duration::from_secs(2))
        .await
    {
        Ok(lease) => {
            println!("a lock on the voters: taken");
            lease.release().await?;
        }
        Err(e) => println!("a lock on the voters: {e}"),
    }
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let res = reqwest::get(format!("http://{addr}/ready")).await?;
    let status = res.status();
    let body: Value = serde_json::from_slice(&res.bytes().await?)?;
    server.abort();
    println!("GET /ready -> {status}");
    println!("{}", serde_json::to_string_pretty(&body)?);
    if status != reqwest::StatusCode::OK {
        return Err(format!("not ready: {status}").into());
    }
    Ok(())
}
