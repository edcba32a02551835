//! Criterion micro-benchmarks of the tower layer, in-process (`tower::ServiceExt::oneshot`,
//! no sockets): an axum handler bare, and behind `RedlockLayer` with the memory node (with
//! and without the default keep-alive) and with 3 Redis masters. Every request carries a
//! fresh `Idempotency-Key`, so every request takes and releases a lock.
//!
//! ```text
//! cargo bench -p tower-redlock-bench --bench layer
//! ```
//!
//! For requests over loopback HTTP at 64 connections, see `bench/benches/compare.rs`.
//!
//! Before the timings it prints the heap allocations per request of each app (counted by a
//! wrapper around the system allocator, switched on only while counting), and of a bare
//! memory-node lock cycle: the layer's own share is the difference.

use tower_redlock_bench as common;
use tower_redlock_testkit as support;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::routing::post;
use axum::Router;
use criterion::{criterion_group, criterion_main, Criterion};
use http_body_util::BodyExt;
use support::Masters;
use tower::ServiceExt;
use tower_redlock::key::IdempotencyKey;
use tower_redlock::policy::{LockPolicy, OnLost};
use tower_redlock::{Redlock, RedlockLayer};

#[global_allocator]
static ALLOCATOR: common::counting::Counting = common::counting::Counting;

/// Allocations per run of `f`, averaged over `n` runs (after one uncounted run).
async fn allocations<F, Fut>(n: u64, mut f: F) -> f64
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    f().await;
    common::counting::begin();
    for _ in 0..n {
        f().await;
    }
    common::counting::end().0 as f64 / n as f64
}

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
                    LockPolicy::builder(Redlock::in_memory(), IdempotencyKey::required())
                        .build()
                        .expect("the policy"),
                )),
            ),
            (
                "RedlockLayer, memory node, no keep-alive",
                route().layer(RedlockLayer::new(no_keep_alive)),
            ),
            (
                "RedlockLayer, memory node, OnLost::Abort",
                route().layer(RedlockLayer::new(
                    LockPolicy::builder(Redlock::in_memory(), IdempotencyKey::required())
                        .on_lost(OnLost::Abort)
                        .build()
                        .expect("policy"),
                )),
            ),
            (
                "RedlockLayer, 3 Redis masters",
                route().layer(RedlockLayer::new(
                    LockPolicy::builder(
                        common::ours(&masters.urls(), Duration::from_millis(50)),
                        IdempotencyKey::required(),
                    )
                    .build()
                    .expect("the policy"),
                )),
            ),
        ]
    });
    rt.block_on(async {
        // On this task, so the count includes nothing of other tasks (the memory node
        // spawns none).
        let memory = Redlock::in_memory();
        let cycle = allocations(1000, || async {
            let id = SEQ.fetch_add(1, Ordering::Relaxed);
            let lease = memory
                .try_lock(&format!("k-{id}"), Duration::from_secs(30))
                .await
                .expect("lock");
            lease.release().await.expect("release");
        })
        .await;
        println!("allocations per request (in-process oneshot, memory node):");
        println!("  memory node: try_lock + release, alone: {cycle:.1}");
        for (name, router) in routers.iter().filter(|(n, _)| !n.contains("Redis")) {
            let per = allocations(1000, || async {
                let res = router.clone().oneshot(request()).await.expect("infallible");
                res.into_body().collect().await.expect("body");
            })
            .await;
            println!("  {name}: {per:.1}");
        }
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
