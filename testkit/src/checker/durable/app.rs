//! The durable mode's app (see the [module](super)): `RedlockLayer` with durable replay over
//! the sqlx adapter, in front of a handler that records the key's row first in its
//! transaction, then a business row, then commits — or, the negative control, commits the
//! work first and the key's row after it, in a transaction of its own.
//!
//! Compiled with the testkit's feature `durable` (which the root crate's test builds switch
//! on: its `tests/checker.rs` runs this mode).

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use crate::checker::durable::{AppConfig, Crash};
use axum::extract::{Extension, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use sqlx::postgres::{PgPool, PgPoolOptions};
use tower_redlock::durable::sqlx_0_8::SqlxStore;
use tower_redlock::durable::{
    Durable, FoundRow, KeyRow, NewRecord, Rebuilt, RowFuture, RowStore, Table,
};
use tower_redlock::key::IdempotencyKey;
use tower_redlock::policy::LockPolicy;
use tower_redlock::replay::Replay;
use tower_redlock::RedlockLayer;

/// The app of one worker process (an [`AppFactory`](super::AppFactory)).
pub fn app(config: AppConfig) -> Pin<Box<dyn Future<Output = Router> + Send>> {
    Box::pin(async move {
        let pool = PgPoolOptions::new()
            .max_connections(config.connections)
            .acquire_timeout(Duration::from_secs(30))
            .connect(&config.store_url)
            .await
            .unwrap_or_else(|e| panic!("connect to {}: {e}", config.store_url));
        let store = Crashing {
            inner: SqlxStore::new(pool.clone()),
            crash: config.crash.clone(),
        };
        let db = pool.clone();
        // A row whose response never reached it (its worker killed after the commit) is
        // answered from the business row.
        let durable =
            Durable::new(store)
                .timeout(Duration::from_secs(1))
                .rebuild(move |key_hash| {
                    let db = db.clone();
                    async move {
                        let (key, run): (i64, i64) = sqlx::query_as(
                            "SELECT key, run_id FROM checker_runs WHERE key_hash = $1 ORDER BY id \
                         LIMIT 1",
                        )
                        .bind(key_hash)
                        .fetch_optional(&db)
                        .await
                        .ok()??;
                        Some(Rebuilt::new(201, format!("run {key} {run}")))
                    }
                });
        let policy = LockPolicy::builder(config.redlock.clone(), IdempotencyKey::required())
            .ttl(config.ttl)
            .replay(Replay::new().retention(config.retention).durable(durable))
            .build()
            .expect("a valid policy");
        let work = Work {
            pool,
            worker: i32::try_from(config.worker).unwrap_or(i32::MAX),
            handler: config.handler,
            outside: config.row_outside_tx,
            crash: config.crash,
        };
        Router::new()
            .route("/work", post(handler))
            .layer(RedlockLayer::new(policy))
            .with_state(work)
    })
}

#[derive(Clone)]
struct Work {
    pool: PgPool,
    worker: i32,
    handler: Duration,
    outside: bool,
    crash: Crash,
}

/// The work: the key's row, a business row, a wait, the commit; `201 run <key> <run id>`.
/// A statement's error is a `500` (the middleware answers a completed or busy row in its
/// place).
async fn handler(
    State(w): State<Work>,
    Extension(row): Extension<KeyRow>,
    body: String,
) -> Response {
    let Ok(key) = body.trim().parse::<i64>() else {
        return (StatusCode::BAD_REQUEST, "a key number").into_response();
    };
    let run_id = fastrand::i64(1..i64::MAX);
    let wait = Duration::from_millis(fastrand::u64(0..=w.handler.as_millis() as u64));
    let done = if w.outside {
        outside(&w, &row, key, run_id, wait).await
    } else {
        inside(&w, &row, key, run_id, wait).await
    };
    match done {
        Ok(()) => (StatusCode::CREATED, format!("run {key} {run_id}")).into_response(),
        Err(()) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

/// The pattern: the key's row first in the work's transaction.
async fn inside(w: &Work, row: &KeyRow, key: i64, run_id: i64, wait: Duration) -> Result<(), ()> {
    let mut tx = w.pool.begin().await.map_err(|e| drop(row.check(e)))?;
    row.insert_in(&mut tx).await.map_err(drop)?;
    insert_run(&mut tx, row, key, w.worker, run_id).await?;
    tokio::time::sleep(wait).await;
    row.commit(tx).await.map_err(drop)?;
    w.crash.maybe("commit");
    Ok(())
}

/// The negative control: the work commits, then the key's row in a transaction of its own.
async fn outside(w: &Work, row: &KeyRow, key: i64, run_id: i64, wait: Duration) -> Result<(), ()> {
    let mut tx = w.pool.begin().await.map_err(|e| drop(row.check(e)))?;
    insert_run(&mut tx, row, key, w.worker, run_id).await?;
    tokio::time::sleep(wait).await;
    tx.commit().await.map_err(|e| drop(row.check(e)))?;
    w.crash.maybe("commit");
    let mut tx = w.pool.begin().await.map_err(|e| drop(row.check(e)))?;
    row.insert_in(&mut tx).await.map_err(drop)?;
    row.commit(tx).await.map_err(drop)
}

async fn insert_run(
    tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
    row: &KeyRow,
    key: i64,
    worker: i32,
    run_id: i64,
) -> Result<(), ()> {
    sqlx::query("INSERT INTO checker_runs (key, key_hash, worker, run_id) VALUES ($1, $2, $3, $4)")
        .bind(key)
        .bind(row.key_hash())
        .bind(worker)
        .bind(run_id)
        .execute(&mut **tx)
        .await
        .map(drop)
        .map_err(|e| drop(row.check(e)))
}

/// The sqlx store, with a fail point after a response is stored in its row (before the
/// middleware's Redis record).
struct Crashing {
    inner: SqlxStore,
    crash: Crash,
}

impl RowStore for Crashing {
    fn table(&self) -> &Table {
        RowStore::table(&self.inner)
    }

    fn find<'a>(&'a self, key_hash: &'a [u8]) -> RowFuture<'a, Option<FoundRow>> {
        self.inner.find(key_hash)
    }

    fn store<'a>(&'a self, record: NewRecord<'a>) -> RowFuture<'a, bool> {
        Box::pin(async move {
            let stored = self.inner.store(record).await;
            if matches!(stored, Ok(true)) {
                self.crash.maybe("row");
            }
            stored
        })
    }
}
