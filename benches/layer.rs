//! Criterion micro-benchmarks of the tower layer, in-process (`tower::ServiceExt::oneshot`,
//! no sockets): an axum handler bare, and behind `RedlockLayer` with the memory node (with
//! and without the default keep-alive) and with 3 Redis masters. Every request carries a
//! fresh `Idempotency-Key`, so every request takes and releases a lock.
//!
//! ```text
//! cargo bench --bench layer
//! ```
//!
//! For requests over loopback HTTP at 64 connections, see `benches/compare.rs`.

#[path = "common/mod.rs"]
mod common;
#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::routing::post;
use axum::Router;
use criterion::{criterion_group, criterion_main, Criterion};
use http_body_util::BodyExt;
use support::Masters;
use tower::ServiceExt;
use tower_redlock::http::{IdempotencyKey, LockPolicy};
use tower_redlock::tower::RedlockLayer;
use tower_redlock::Redlock;

async fn pay() -> &'static str {
    "paid"
}

static SEQ: AtomicU64 = AtomicU64::new(0);

fn request() -> http::Request<axum::body::Body> {
    http::Request::post("/pay")
        .header(
            "idempotency-key",
            format!("k-{}", SEQ.fetch_add(1, Ordering::Relaxed)),
        )
        .body(axum::body::Body::empty())
        .expect("request")
}

fn layer(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let masters = Masters::start(3);
    let routers: Vec<(&str, Router)> = rt.block_on(async {
        let route = || Router::new().route("/pay", post(pay));
        let no_keep_alive = LockPolicy::builder(Redlock::in_memory(), IdempotencyKey::required())
            .keep_alive(false)
            .build()
            .expect("policy");
        vec![
            ("bare handler", route()),
            (
                "RedlockLayer, memory node",
                route().layer(RedlockLayer::new(
                    Redlock::in_memory(),
                    IdempotencyKey::required(),
                )),
            ),
            (
                "RedlockLayer, memory node, no keep-alive",
                route().layer(RedlockLayer::with_policy(no_keep_alive)),
            ),
            (
                "RedlockLayer, 3 Redis masters",
                route().layer(RedlockLayer::new(
                    common::ours(&masters.urls(), Duration::from_millis(50)),
                    IdempotencyKey::required(),
                )),
            ),
        ]
    });
    let mut group = c.benchmark_group("layer/oneshot");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for (name, router) in &routers {
        group.bench_function(*name, |b| {
            b.to_async(&rt).iter(|| async {
                let res = router.clone().oneshot(request()).await.expect("infallible");
                assert!(res.status().is_success(), "status {}", res.status());
                res.into_body().collect().await.expect("body");
            })
        });
    }
    group.finish();
    drop(masters);
}

criterion_group!(benches, layer);
criterion_main!(benches);
