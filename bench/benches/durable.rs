//! Criterion benchmarks of durable replay ([`tower_redlock::durable`]) against a real
//! PostgreSQL (the test kit's throwaway cluster) and 3 Redis masters, in-process requests
//! through `RedlockLayer` (`tower::ServiceExt::oneshot`, no sockets):
//!
//! - `lookup_miss`: the row lookup every first execution pays (`RowStore::find` of a key
//!   with no row);
//! - `first/replay`: a first execution under replay, its handler running one transaction
//!   with one business insert; `first/durable`: the same with the key's row recorded in that
//!   transaction (the lookup before, the row's insert, the store after);
//! - `replay_hit/redis` and `replay_hit/row`: a completed key's retry answered from the Redis
//!   record, and from the row (every voter's record deleted before each retry: the lookup, the
//!   record restored).
//!
//! ```text
//! cargo bench -p tower-redlock-bench --bench durable
//! ```

use tower_redlock_testkit as support;

use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::State;
use axum::routing::post;
use axum::Router;
use criterion::{criterion_group, criterion_main, Criterion};
use http_body_util::BodyExt;
use sqlx::PgPool;
use support::Masters;
use tower::ServiceExt;
use tower_redlock::durable::sqlx_0_8::SqlxStore;
use tower_redlock::durable::{Durable, KeyRow, RowStore};
use tower_redlock::policy::LockPolicy;
use tower_redlock::replay::Replay;
use tower_redlock::RedlockLayer;

static SEQ: AtomicU64 = AtomicU64::new(0);

fn key() -> String {
    format!("k-{}", SEQ.fetch_add(1, Ordering::Relaxed))
}

fn request(key: &str) -> http::Request<axum::body::Body> {
    http::Request::post("/pay")
        .header("idempotency-key", format!("\"{key}\""))
        .body(axum::body::Body::from("10 EUR"))
        .unwrap()
}

/// The work without the row: one transaction, one insert.
async fn plain(State(db): State<PgPool>) -> &'static str {
    let mut tx = db.begin().await.unwrap();
    sqlx::query("INSERT INTO payments (body) VALUES ('x')")
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    "paid"
}

/// The same work with the key's row first.
async fn durable(State(db): State<PgPool>, row: KeyRow) -> &'static str {
    let mut tx = db.begin().await.unwrap();
    row.insert_in(&mut tx).await.unwrap();
    sqlx::query("INSERT INTO payments (body) VALUES ('x')")
        .execute(&mut *tx)
        .await
        .unwrap();
    row.commit(tx).await.unwrap();
    "paid"
}

async fn send(app: &Router, key: &str) {
    let res = app.clone().oneshot(request(key)).await.unwrap();
    assert!(res.status().is_success(), "{}", res.status());
    res.into_body().collect().await.unwrap();
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let pg = support::PostgresServer::start();
    let masters = Masters::start(3);
    let pool = rt.block_on(async {
        let pool = PgPool::connect(&pg.url()).await.unwrap();
        SqlxStore::new(pool.clone()).migrate().await.unwrap();
        sqlx::raw_sql("CREATE TABLE payments (id bigserial PRIMARY KEY, body text)")
            .execute(&pool)
            .await
            .unwrap();
        pool
    });
    let store = SqlxStore::new(pool.clone());
    let redlock = rt.block_on(async { masters.client() });
    let policy = |replay: Replay| {
        LockPolicy::idempotent(redlock.clone())
            .replay(replay)
            .build()
            .unwrap()
    };
    let replay_app = Router::new()
        .route("/pay", post(plain))
        .layer(RedlockLayer::new(policy(Replay::new())))
        .with_state(pool.clone());
    let durable_app = Router::new()
        .route("/pay", post(durable))
        .layer(RedlockLayer::new(policy(
            Replay::new().durable(Durable::new(store.clone())),
        )))
        .with_state(pool.clone());

    c.bench_function("durable/lookup_miss", |b| {
        b.to_async(&rt).iter(|| async {
            assert!(store.find(&[7; 32]).await.unwrap().is_none());
        })
    });
    let mut first = c.benchmark_group("durable/first");
    first.bench_function("replay", |b| {
        b.to_async(&rt)
            .iter(|| async { send(&replay_app, &key()).await })
    });
    first.bench_function("durable", |b| {
        b.to_async(&rt)
            .iter(|| async { send(&durable_app, &key()).await })
    });
    first.finish();

    let done = key();
    rt.block_on(send(&durable_app, &done));
    let mut hit = c.benchmark_group("durable/replay_hit");
    hit.bench_function("redis", |b| {
        b.to_async(&rt).iter(|| send(&durable_app, &done))
    });
    let servers: Vec<_> = masters.iter().collect();
    hit.bench_function("row", |b| {
        b.to_async(&rt).iter(|| async {
            for server in &servers {
                let _: () = server.query(&redis::cmd("FLUSHALL")).await;
            }
            send(&durable_app, &done).await
        })
    });
    hit.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
