//! The service's parts: the database (the keys' table and `payments`), the policy (durable
//! replay over either adapter), and the hooks a handler stopped half-way talks to the test
//! through. The work is in `work.rs`, the frameworks that serve it in `web.rs`.

use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::{PgPool, PgPoolOptions};
use tokio::sync::{mpsc, Semaphore};
use tower_redlock::durable::sqlx_0_8::SqlxStore;
use tower_redlock::durable::tokio_postgres::PgStore;
use tower_redlock::durable::{Durable, Rebuilt, RowError};
use tower_redlock::key::{IdempotencyKey, KeyExtractorExt};
use tower_redlock::policy::LockPolicy;
use tower_redlock::replay::Replay;
use tower_redlock::Redlock;
use tower_redlock_testkit as support;

use super::work::{Driver, DriverKind};

/// The business table: one row per run of the work.
pub const PAYMENTS: &str = "CREATE TABLE IF NOT EXISTS payments (
    id bigserial PRIMARY KEY, key_hash text NOT NULL, body text NOT NULL);
    CREATE TABLE IF NOT EXISTS coupons (code text PRIMARY KEY)";

/// A PostgreSQL server, one per test: each variant of it gets a database of its own.
pub type Server = Arc<support::PostgresServer>;

/// Starts a server.
pub async fn server() -> Server {
    let server = tokio::task::spawn_blocking(support::PostgresServer::start)
        .await
        .expect("start postgres");
    Arc::new(server)
}

/// A fresh database with the keys' table and `payments`, and a pool on it.
pub struct Db {
    pub url: String,
    pub pool: PgPool,
}

impl Db {
    /// A new database on `server`.
    pub async fn create(server: &Server) -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let name = format!(
            "variant_{}",
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        let admin = pool(&server.url()).await;
        sqlx::raw_sql(&format!("CREATE DATABASE {name}"))
            .execute(&admin)
            .await
            .expect("create the database");
        admin.close().await;
        let url = format!("postgres://postgres@127.0.0.1:{}/{name}", server.port());
        let pool = pool(&url).await;
        SqlxStore::new(pool.clone())
            .migrate()
            .await
            .expect("migrate");
        sqlx::raw_sql(PAYMENTS)
            .execute(&pool)
            .await
            .expect("payments");
        Self { url, pool }
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

    /// Tells the test the handler reached `point`, and waits until it is let go.
    pub async fn reach(&self, point: &str) {
        let _ = self.reached.send(point.to_owned());
        self.go.acquire().await.expect("open").forget();
    }

    /// A statement's error, told to the test (`sqlstate <code>`), then answered.
    pub fn failed(&self, e: RowError) -> RowError {
        if let Some(code) = e.sqlstate() {
            let _ = self.reached.send(format!("sqlstate {code}"));
        }
        e
    }
}

/// The policy: the `Idempotency-Key` header, replay with the row in the database at `url`
/// through the adapter `kind`, a short ttl (a killed replica's lock ends soon), the given
/// `lock_timeout`.
pub fn policy(kind: DriverKind, redlock: Redlock, url: &str, lock_timeout: Duration) -> LockPolicy {
    policy_of(redlock, durable(kind, url).lock_timeout(lock_timeout))
}

/// The tests' durable settings through the adapter `kind`, its connections opened on first
/// use: a 1 s timeout (a row without its response is in flight for the ttl and that second).
pub fn durable(kind: DriverKind, url: &str) -> Durable {
    let durable = match Driver::lazy(kind, url) {
        Driver::Sqlx(pool) => Durable::new(SqlxStore::new(pool)),
        // The middleware's statements on the clients of a pool.
        Driver::TokioPostgres(clients) => Durable::new(PgStore::from_fn(move || {
            let clients = clients.clone();
            async move { clients.get().await }
        })),
    };
    durable.timeout(Duration::from_secs(1))
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
pub fn rebuilding(kind: DriverKind, url: &str) -> Durable {
    let Driver::Sqlx(db) = Driver::lazy(DriverKind::Sqlx, url) else {
        unreachable!("a sqlx pool")
    };
    durable(kind, url).rebuild(move |key_hash| {
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
