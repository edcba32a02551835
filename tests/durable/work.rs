//! The work, written once for both drivers: the key's row first in the transaction, then a
//! payment row (the business data), then the checked commit — with sqlx 0.8 or with
//! tokio-postgres, the crate's two adapters. The request header `x-mode` picks what else it
//! does (see [`work`]).

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex};

use sqlx::postgres::{PgPool, PgPoolOptions, Postgres};
use tokio_postgres::{Client, NoTls};
use tower_redlock::durable::{KeyRow, RowError};

use super::app::Hooks;

/// Which adapter the handler and the middleware use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriverKind {
    Sqlx,
    TokioPostgres,
}

/// The app's connections, opened on first use — on the runtime that serves the requests
/// (an actix-web worker has one of its own).
#[derive(Clone)]
pub enum Driver {
    Sqlx(PgPool),
    TokioPostgres(Arc<Clients>),
}

impl Driver {
    pub fn lazy(kind: DriverKind, url: &str) -> Self {
        match kind {
            DriverKind::Sqlx => Self::Sqlx(
                PgPoolOptions::new()
                    .max_connections(8)
                    .acquire_timeout(std::time::Duration::from_secs(30))
                    .connect_lazy(url)
                    .expect("a valid postgres url"),
            ),
            DriverKind::TokioPostgres => Self::TokioPostgres(Arc::new(Clients {
                url: url.to_owned(),
                idle: Mutex::default(),
            })),
        }
    }
}

/// tokio-postgres clients, a connection each, reused (the smallest pool there is).
pub struct Clients {
    url: String,
    idle: Mutex<Vec<Client>>,
}

impl Clients {
    /// An idle client, or a new connection.
    pub async fn get(self: &Arc<Self>) -> Result<ClientGuard, tokio_postgres::Error> {
        let idle = self.idle.lock().unwrap().pop();
        let client = match idle {
            Some(client) if !client.is_closed() => client,
            _ => {
                let (client, connection) = tokio_postgres::connect(&self.url, NoTls).await?;
                tokio::spawn(connection);
                client
            }
        };
        Ok(ClientGuard {
            client: Some(client),
            home: self.clone(),
        })
    }
}

/// A client lent by [`Clients`], given back when dropped.
pub struct ClientGuard {
    client: Option<Client>,
    home: Arc<Clients>,
}

impl Deref for ClientGuard {
    type Target = Client;
    fn deref(&self) -> &Client {
        self.client.as_ref().expect("lent")
    }
}

impl DerefMut for ClientGuard {
    fn deref_mut(&mut self) -> &mut Client {
        self.client.as_mut().expect("lent")
    }
}

impl Drop for ClientGuard {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            self.home.idle.lock().unwrap().push(client);
        }
    }
}

/// The handler's transaction, with either adapter.
enum Tx<'a> {
    Sqlx(sqlx::Transaction<'static, Postgres>),
    TokioPostgres(tokio_postgres::Transaction<'a>),
}

impl Tx<'_> {
    async fn insert_row(&mut self, row: &KeyRow) -> Result<(), RowError> {
        match self {
            Tx::Sqlx(tx) => row.insert_in(tx).await,
            Tx::TokioPostgres(tx) => row.postgres().insert_in(tx).await,
        }
    }

    /// A statement without parameters; its error classified by the row.
    async fn exec(&mut self, row: &KeyRow, sql: &str) -> Result<(), RowError> {
        match self {
            Tx::Sqlx(tx) => sqlx::query(sql)
                .execute(&mut **tx)
                .await
                .map(drop)
                .map_err(|e| row.check(e)),
            Tx::TokioPostgres(tx) => tx
                .execute(sql, &[])
                .await
                .map(drop)
                .map_err(|e| row.postgres().check(e)),
        }
    }

    async fn payment(&mut self, row: &KeyRow, body: &str) -> Result<i64, RowError> {
        let sql = "INSERT INTO payments (key_hash, body) VALUES ($1, $2) RETURNING id";
        let key_hash = row.key_hash();
        match self {
            Tx::Sqlx(tx) => sqlx::query_scalar(sql)
                .bind(key_hash)
                .bind(body)
                .fetch_one(&mut **tx)
                .await
                .map_err(|e| row.check(e)),
            Tx::TokioPostgres(tx) => tx
                .query_one(sql, &[&key_hash, &body])
                .await
                .map(|r| r.get(0))
                .map_err(|e| row.postgres().check(e)),
        }
    }

    async fn commit(self, row: &KeyRow) -> Result<(), RowError> {
        match self {
            Tx::Sqlx(tx) => row.commit(tx).await,
            Tx::TokioPostgres(tx) => row.postgres().commit(tx).await,
        }
    }

    async fn rollback(self) {
        match self {
            Tx::Sqlx(tx) => tx.rollback().await.unwrap(),
            Tx::TokioPostgres(tx) => tx.rollback().await.unwrap(),
        }
    }
}

/// The handler's answer: a status and a text body, or the row's error it answers with.
pub type Outcome = Result<(u16, String), RowError>;

/// The request's work in a transaction of `driver`: see [`work`].
pub async fn handle(
    driver: &Driver,
    hooks: &Hooks,
    row: KeyRow,
    mode: &str,
    body: &str,
) -> Outcome {
    let failed = |e: RowError| hooks.failed(e);
    match driver {
        Driver::Sqlx(pool) => {
            let tx = pool.begin().await.map_err(|e| failed(row.check(e)))?;
            work(hooks, Tx::Sqlx(tx), &row, mode, body).await
        }
        Driver::TokioPostgres(clients) => {
            let check = |e| failed(row.postgres().check(e));
            let mut client = clients.get().await.map_err(check)?;
            let tx = client.transaction().await.map_err(check)?;
            work(hooks, Tx::TokioPostgres(tx), &row, mode, body).await
        }
    }
}

/// The work: the key's row, then a payment, then commit; `201` with `payment <id>`.
/// `x-mode`: `unrecorded` (no key row), `rollback-402` / `rollback-500` (roll back and
/// answer that), `hold` (stop before the commit until let go), `hold-then-402` (stop, then
/// roll back and answer `402`), `commit-then-wait` (stop after the commit until let go),
/// `repeatable` (repeatable read), `deadlock` (take advisory locks 1 then 2 after the
/// payment), `coupon` (a unique violation of the business data, recovered in a savepoint),
/// `busy-savepoint` (a lock timeout, recovered in a savepoint), `stubborn` (goes on after
/// its insert found the key done).
async fn work(hooks: &Hooks, mut tx: Tx<'_>, row: &KeyRow, mode: &str, body: &str) -> Outcome {
    let failed = |e: RowError| hooks.failed(e);
    if mode == "repeatable" {
        let set = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ";
        tx.exec(row, set).await.map_err(failed)?;
    }
    if mode != "unrecorded" {
        if let Err(e) = tx.insert_row(row).await {
            // `stubborn` goes on as if nothing happened: `row.commit` must refuse.
            if mode != "stubborn" {
                return Err(failed(e));
            }
        }
    }
    let id = tx.payment(row, body).await.map_err(failed)?;
    match mode {
        "rollback-402" => return Ok((402, "declined".to_owned())),
        "rollback-500" => return Ok((500, String::new())),
        "hold" | "hold-then-402" => {
            hooks.reach("hold").await;
            if mode == "hold-then-402" {
                tx.rollback().await;
                return Ok((402, "declined".to_owned()));
            }
        }
        "deadlock" => {
            for lock in [
                "SELECT pg_advisory_xact_lock(1)",
                "SELECT pg_advisory_xact_lock(2)",
            ] {
                tx.exec(row, lock).await.map_err(failed)?;
            }
        }
        "busy-savepoint" => {
            // Advisory lock 9 is the test's: the wait passes this savepoint's lock_timeout
            // (55P03), and the handler recovers.
            for sql in ["SAVEPOINT busy", "SET LOCAL lock_timeout = '100ms'"] {
                tx.exec(row, sql).await.unwrap();
            }
            let wait = tx.exec(row, "SELECT pg_advisory_xact_lock(9)").await;
            assert_eq!(wait.expect_err("a lock timeout").sqlstate(), Some("55P03"));
            tx.exec(row, "ROLLBACK TO SAVEPOINT busy").await.unwrap();
        }
        "coupon" => {
            // The coupon is taken twice: the second insert's unique violation is the
            // business's own error, recovered from in a savepoint.
            for sql in ["SAVEPOINT coupon", "INSERT INTO coupons VALUES ('c')"] {
                tx.exec(row, sql).await.unwrap();
            }
            let again = tx.exec(row, "INSERT INTO coupons VALUES ('c')").await;
            assert_eq!(
                again.expect_err("a unique violation").sqlstate(),
                Some("23505")
            );
            tx.exec(row, "ROLLBACK TO SAVEPOINT coupon").await.unwrap();
        }
        _ => {}
    }
    tx.commit(row).await.map_err(failed)?;
    if mode == "commit-then-wait" {
        hooks.reach("committed").await;
    }
    Ok((201, format!("payment {id}")))
}
