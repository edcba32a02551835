//! The service under test: `POST /payments` behind `RedlockLayer` with durable replay, whose
//! handler records the key's row first in its transaction, then inserts a payment row (the
//! business data) and answers its id. The request header `x-mode` picks what else it does.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use sqlx::postgres::{PgPool, PgPoolOptions};
use tokio::sync::{mpsc, Semaphore};
use tower_redlock::durable::sqlx_0_8::SqlxStore;
use tower_redlock::durable::{Durable, KeyRow, Rebuilt, RowError};
use tower_redlock::key::{IdempotencyKey, KeyExtractorExt};
use tower_redlock::policy::LockPolicy;
use tower_redlock::replay::Replay;
use tower_redlock::{Redlock, RedlockLayer};
use tower_redlock_testkit as support;

/// The business table: one row per run of the work.
pub const PAYMENTS: &str = "CREATE TABLE IF NOT EXISTS payments (
    id bigserial PRIMARY KEY, key_hash text NOT NULL, body text NOT NULL);
    CREATE TABLE IF NOT EXISTS coupons (code text PRIMARY KEY)";

/// A PostgreSQL with the keys' table and `payments`, and a pool on it.
pub struct Db {
    pub server: support::PostgresServer,
    pub pool: PgPool,
}

impl Db {
    pub async fn start() -> Self {
        let server = tokio::task::spawn_blocking(support::PostgresServer::start)
            .await
            .expect("start postgres");
        let pool = pool(&server.url()).await;
        SqlxStore::new(pool.clone())
            .migrate()
            .await
            .expect("migrate");
        sqlx::raw_sql(PAYMENTS)
            .execute(&pool)
            .await
            .expect("payments");
        Self { server, pool }
    }

    /// How many payments the work made.
    pub async fn payments(&self) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM payments")
            .fetch_one(&self.pool)
            .await
            .expect("count payments")
    }

    /// How many key rows exist, and how many of them hold a response.
    pub async fn key_rows(&self) -> (i64, i64) {
        sqlx::query_as("SELECT count(*), count(record) FROM tower_redlock_keys")
            .fetch_one(&self.pool)
            .await
            .expect("count key rows")
    }
}

pub async fn pool(url: &str) -> PgPool {
    PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(Duration::from_secs(30))
        .connect(url)
        .await
        .expect("connect to postgres")
}

/// What the handler tells the test, and waits for, in the modes that stop half-way.
#[derive(Clone)]
pub struct Hooks {
    /// `hold`: sent after the payment's insert, before the commit; `committed`
    /// (`commit-then-wait`): after the commit; `sqlstate <code>`: a statement's error.
    pub reached: mpsc::UnboundedSender<String>,
    /// What a stopped handler waits for (a permit) before it goes on.
    pub go: Arc<Semaphore>,
}

impl Hooks {
    pub fn new() -> (Self, mpsc::UnboundedReceiver<String>) {
        let (reached, rx) = mpsc::unbounded_channel();
        let hooks = Self {
            reached,
            go: Arc::new(Semaphore::new(0)),
        };
        (hooks, rx)
    }
}

#[derive(Clone)]
struct App {
    pool: PgPool,
    hooks: Hooks,
}

/// The policy: the `Idempotency-Key` header, replay with the row in `pool`'s database, a
/// short ttl (a killed replica's lock ends soon), the given `lock_timeout`.
pub fn policy(redlock: Redlock, pool: &PgPool, lock_timeout: Duration) -> LockPolicy {
    policy_of(redlock, durable(pool).lock_timeout(lock_timeout))
}

/// The tests' durable settings: a 1 s timeout (a row without its response is in flight
/// for the ttl and that second).
pub fn durable(pool: &PgPool) -> Durable {
    Durable::new(SqlxStore::new(pool.clone())).timeout(Duration::from_secs(1))
}

/// [`policy`] with these durable settings.
pub fn policy_of(redlock: Redlock, durable: Durable) -> LockPolicy {
    LockPolicy::builder(redlock, IdempotencyKey::required().scoped_by_route())
        .ttl(Duration::from_secs(2))
        .replay(Replay::new().durable(durable))
        .build()
        .expect("valid policy")
}

/// Durable settings whose rebuild hook answers a key's payment from the `payments` table
/// (`201`, `payment <id>`, as the handler does).
pub fn rebuilding(pool: &PgPool) -> Durable {
    let db = pool.clone();
    durable(pool).rebuild(move |key_hash| {
        let db = db.clone();
        async move {
            let id: i64 = sqlx::query_scalar("SELECT id FROM payments WHERE key_hash = $1")
                .bind(key_hash)
                .fetch_optional(&db)
                .await
                .ok()??;
            Some(
                Rebuilt::new(201, format!("payment {id}"))
                    .header("content-type", "text/plain; charset=utf-8"),
            )
        }
    })
}

pub fn router(policy: LockPolicy, pool: PgPool, hooks: Hooks) -> Router {
    Router::new()
        .route("/payments", post(pay))
        .layer(RedlockLayer::new(policy))
        .with_state(App { pool, hooks })
}

/// The work: the key's row, then a payment, then commit; `201` with `payment <id>`.
/// `x-mode`: `unrecorded` (no key row), `rollback-402` / `rollback-500` (roll back and
/// answer that), `hold` (stop before the commit until let go), `hold-then-402` (stop, then
/// roll back and answer `402`), `commit-then-wait` (stop after the commit until let go),
/// `repeatable` (repeatable read), `deadlock` (take advisory locks 1 then 2 after the
/// payment), `coupon` (a unique violation of the business data, recovered in a savepoint),
/// `busy-savepoint` (a lock timeout, recovered in a savepoint), `stubborn` (goes on after
/// its insert found the key done).
async fn pay(State(app): State<App>, row: KeyRow, headers: HeaderMap, body: String) -> Response {
    let mode = headers
        .get("x-mode")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("ok")
        .to_owned();
    // A statement's error, told to the test, then answered as the handler would.
    let failed = |e: RowError| {
        if let Some(code) = e.sqlstate() {
            let _ = app.hooks.reached.send(format!("sqlstate {code}"));
        }
        e.into_response()
    };
    let mut tx = match app.pool.begin().await {
        Ok(tx) => tx,
        Err(e) => return failed(row.check(e)),
    };
    if mode == "repeatable" {
        let set = sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ");
        if let Err(e) = set.execute(&mut *tx).await {
            return failed(row.check(e));
        }
    }
    if mode != "unrecorded" {
        if let Err(e) = row.insert_in(&mut tx).await {
            // `stubborn` goes on as if nothing happened: `row.commit` must refuse.
            if mode != "stubborn" {
                return failed(e);
            }
        }
    }
    let id: i64 = match sqlx::query_scalar(
        "INSERT INTO payments (key_hash, body) VALUES ($1, $2) RETURNING id",
    )
    .bind(row.key_hash())
    .bind(&body)
    .fetch_one(&mut *tx)
    .await
    {
        Ok(id) => id,
        Err(e) => return failed(row.check(e)),
    };
    match mode.as_str() {
        "rollback-402" => return (StatusCode::PAYMENT_REQUIRED, "declined").into_response(),
        "rollback-500" => return StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        "hold" | "hold-then-402" => {
            let _ = app.hooks.reached.send("hold".to_owned());
            app.hooks.go.acquire().await.expect("open").forget();
            if mode == "hold-then-402" {
                tx.rollback().await.unwrap();
                return (StatusCode::PAYMENT_REQUIRED, "declined").into_response();
            }
        }
        "deadlock" => {
            for lock in [1_i64, 2] {
                let take = sqlx::query("SELECT pg_advisory_xact_lock($1)").bind(lock);
                if let Err(e) = take.execute(&mut *tx).await {
                    return failed(row.check(e));
                }
            }
        }
        "busy-savepoint" => {
            // Advisory lock 9 is the test's: the wait passes this savepoint's lock_timeout
            // (55P03), and the handler recovers.
            for sql in ["SAVEPOINT busy", "SET LOCAL lock_timeout = '100ms'"] {
                sqlx::query(sql).execute(&mut *tx).await.unwrap();
            }
            let wait = sqlx::query("SELECT pg_advisory_xact_lock(9)").execute(&mut *tx);
            let error = row.check(wait.await.expect_err("a lock timeout"));
            assert_eq!(error.sqlstate(), Some("55P03"));
            let undo = sqlx::query("ROLLBACK TO SAVEPOINT busy");
            undo.execute(&mut *tx).await.unwrap();
        }
        "coupon" => {
            // The coupon is taken twice: the second insert's unique violation is the
            // business's own error, recovered from in a savepoint.
            for sql in ["SAVEPOINT coupon", "INSERT INTO coupons VALUES ('c')"] {
                sqlx::query(sql).execute(&mut *tx).await.unwrap();
            }
            let again = sqlx::query("INSERT INTO coupons VALUES ('c')").execute(&mut *tx);
            let error = row.check(again.await.expect_err("a unique violation"));
            assert_eq!(error.sqlstate(), Some("23505"));
            let undo = sqlx::query("ROLLBACK TO SAVEPOINT coupon");
            undo.execute(&mut *tx).await.unwrap();
        }
        _ => {}
    }
    if let Err(e) = row.commit(tx).await {
        return failed(e);
    }
    if mode == "commit-then-wait" {
        let _ = app.hooks.reached.send("committed".to_owned());
        app.hooks.go.acquire().await.expect("open").forget();
    }
    (StatusCode::CREATED, format!("payment {id}")).into_response()
}
