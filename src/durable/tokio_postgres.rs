//! The tokio-postgres adapter (feature `tokio-postgres`): [`PgStore`] for the middleware, and
//! [`PgKeyRow`] — the [`KeyRow`] statements a handler runs in its own transaction, on any
//! [`GenericClient`] (a [`Transaction`], or a client in a transaction it began itself).
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use tower_redlock::durable::{tokio_postgres::PgStore, Durable, KeyRow, RowError};
//!
//! // The middleware's lookups and stores, here on one connection of their own; in a service,
//! // give them a pool's clients (`PgStore::from_fn`): a store may wait up to the
//! // `lock_timeout` on a key's row, and one connection answers in order.
//! let (client, connection) =
//!     tokio_postgres::connect("postgres://app@127.0.0.1/app", tokio_postgres::NoTls).await?;
//! tokio::spawn(connection);
//! let store = PgStore::new(Arc::new(client));
//! store.migrate().await?; // or apply `Table::migration()` with your own tool
//! let durable = Durable::new(store);
//!
//! // The handler: the row first in its transaction, then the work, then the checked commit.
//! async fn pay(db: &mut tokio_postgres::Client, row: KeyRow, body: &str) -> Result<i64, RowError> {
//!     let row = row.postgres();
//!     let tx = db.transaction().await.map_err(|e| row.check(e))?;
//!     row.insert_in(&tx).await?; // the first statement
//!     let id: i64 = tx
//!         .query_one("INSERT INTO payments (body) VALUES ($1) RETURNING id", &[&body])
//!         .await
//!         .map_err(|e| row.check(e))?
//!         .get(0);
//!     row.commit(tx).await?;
//!     Ok(id)
//! }
//! # let _ = durable; Ok(()) }
//! ```

use std::fmt;
use std::future::Future;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::Arc;

use tokio_postgres::{Client, GenericClient, Transaction};

use super::row::CommitStep;
use super::{FoundRow, KeyRow, NewRecord, RowError, RowFuture, RowStore, Table};

/// A tokio-postgres error as a [`RowError`], by its SQLSTATE.
fn row_error(e: tokio_postgres::Error) -> RowError {
    let code = e.code().map(|c| c.code().to_owned());
    RowError::database(e, code.as_deref())
}

/// A client the store runs one statement on.
type SharedClient = Box<dyn Deref<Target = Client> + Send + Sync>;
type ClientFuture = Pin<Box<dyn Future<Output = Result<SharedClient, RowError>> + Send>>;
type ClientSource = Arc<dyn Fn() -> ClientFuture + Send + Sync>;

/// Key rows in PostgreSQL through tokio-postgres: what
/// [`Durable::new`](super::Durable::new) takes. Its statements are single ones (each its
/// own transaction), on a client of its own ([`new`](Self::new)) or one from your pool
/// ([`from_fn`](Self::from_fn)).
#[derive(Clone)]
pub struct PgStore {
    client: ClientSource,
    table: Table,
    find_sql: String,
    store_sql: String,
}

impl fmt::Debug for PgStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PgStore")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// Rows in the default table (`tower_redlock_keys`), read and stored through `client`,
    /// shared by every request: tokio-postgres pipelines their statements on its one
    /// connection, in order — so a store that waits on a key's row (up to the
    /// `lock_timeout`, while a duplicate's transaction holds it) delays every lookup behind
    /// it, and a closed connection fails every lookup (answered `503`). For a service, prefer
    /// [`from_fn`](Self::from_fn) with a pool.
    pub fn new(client: Arc<Client>) -> Self {
        Self::from_fn(move || std::future::ready(Ok::<_, RowError>(client.clone())))
    }

    /// Rows in the default table, each statement on a client `client` gives — a pool's
    /// connection, say. The client must dereference to a [`Client`]: a pool whose object
    /// does so through a wrapper of its own (deadpool-postgres) needs a newtype.
    ///
    /// ```no_run
    /// # use std::sync::Arc;
    /// # fn pool() -> Arc<tokio_postgres::Client> { unimplemented!() }
    /// use tower_redlock::durable::tokio_postgres::PgStore;
    ///
    /// let shared = pool(); // any `Deref<Target = Client>`: here an `Arc<Client>`
    /// let store = PgStore::from_fn(move || {
    ///     let client = shared.clone();
    ///     async move { Ok::<_, std::io::Error>(client) }
    /// });
    /// ```
    pub fn from_fn<F, Fut, C, E>(client: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<C, E>> + Send + 'static,
        C: Deref<Target = Client> + Send + Sync + 'static,
        E: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let source: ClientSource = Arc::new(move || {
            let fut = client();
            Box::pin(async move {
                match fut.await {
                    Ok(c) => Ok(Box::new(c) as SharedClient),
                    Err(e) => Err(RowError::database(e, None)),
                }
            })
        });
        Self::with_table(source, Table::default())
    }

    /// The same clients, rows in `table`.
    pub fn table(self, table: Table) -> Self {
        Self::with_table(self.client, table)
    }

    fn with_table(client: ClientSource, table: Table) -> Self {
        Self {
            find_sql: table.find_sql(),
            store_sql: table.store_sql(),
            client,
            table,
        }
    }

    /// Applies [`Table::migration`] (idempotent): for tests and demos; a service applies it
    /// with its migration tool.
    ///
    /// # Errors
    ///
    /// The database's error.
    pub async fn migrate(&self) -> Result<(), RowError> {
        let client = (self.client)().await?;
        client
            .batch_execute(&self.table.migration())
            .await
            .map_err(row_error)
    }

    /// The retention sweep: deletes every expired row, `batch` per statement (each its own
    /// short transaction, skipping rows another transaction holds), and returns how many.
    ///
    /// # Errors
    ///
    /// The database's error (the batches before it stay deleted).
    pub async fn sweep(&self, batch: u32) -> Result<u64, RowError> {
        let batch = i64::from(batch.max(1));
        let sql = self.table.sweep_sql();
        let client = (self.client)().await?;
        let mut total = 0;
        loop {
            let done = client.execute(&sql, &[&batch]).await.map_err(row_error)?;
            total += done;
            if done < batch.unsigned_abs() {
                return Ok(total);
            }
        }
    }
}

impl RowStore for PgStore {
    fn table(&self) -> &Table {
        &self.table
    }

    fn find<'a>(&'a self, key_hash: &'a [u8]) -> RowFuture<'a, Option<FoundRow>> {
        Box::pin(async move {
            let client = (self.client)().await?;
            let row = client
                .query_opt(&self.find_sql, &[&key_hash])
                .await
                .map_err(row_error)?;
            let Some(row) = row else { return Ok(None) };
            Ok(Some(FoundRow::from_columns(
                row.try_get("fingerprint").map_err(row_error)?,
                row.try_get("record").map_err(row_error)?,
                row.try_get("run_id").map_err(row_error)?,
                row.try_get("age_ms").map_err(row_error)?,
                row.try_get("left_ms").map_err(row_error)?,
            )))
        })
    }

    fn store<'a>(&'a self, r: NewRecord<'a>) -> RowFuture<'a, bool> {
        Box::pin(async move {
            let client = (self.client)().await?;
            let done = client
                .execute(
                    &self.store_sql,
                    &[
                        &r.key_hash,
                        &r.fingerprint,
                        &r.record,
                        &r.retention_ms,
                        &r.lock_timeout,
                        &r.run_id,
                    ],
                )
                .await
                .map_err(row_error)?;
            Ok(done == 1)
        })
    }
}

impl KeyRow {
    /// The row's statements with tokio-postgres.
    pub fn postgres(&self) -> PgKeyRow<'_> {
        PgKeyRow { row: self }
    }
}

/// A [`KeyRow`]'s statements with tokio-postgres ([`KeyRow::postgres`]): the same steps as
/// the sqlx adapter's, on any [`GenericClient`].
#[derive(Debug, Clone, Copy)]
pub struct PgKeyRow<'a> {
    row: &'a KeyRow,
}

impl PgKeyRow<'_> {
    /// Records the key's row: run it as the **first statement of the transaction** that
    /// does the work, so that the row commits with the work or not at all. `client` must be
    /// in that transaction (a [`Transaction`], or a client that ran `BEGIN`): on a client in
    /// autocommit it refuses (one more round trip checks it). It sets the
    /// transaction's `lock_timeout` ([`Durable::lock_timeout`](super::Durable::lock_timeout))
    /// for the statements after it. On [`RowError::is_completed`], drop the transaction at
    /// once: until it ends it holds the key's row locked.
    ///
    /// # Errors
    ///
    /// As the sqlx adapter's `insert_in`: [`RowError::is_completed`] (the key's row had
    /// committed: drop the transaction, the middleware answers from the row),
    /// [`RowError::is_busy`] (drop it: `409` + `Retry-After`), or the database's error.
    pub async fn insert_in<C: GenericClient + Sync>(&self, client: &C) -> Result<(), RowError> {
        // A `Client` that did not run BEGIN is in autocommit: the insert would commit the row
        // at once, before and without the work (a failure then leaves the key completed
        // without ever running). A savepoint is refused outside a transaction block (25P01).
        if let Err(e) = client
            .batch_execute("SAVEPOINT tower_redlock_row; RELEASE SAVEPOINT tower_redlock_row")
            .await
        {
            let e = RowError::database(
                "the key's row needs a transaction: the client is not in one (run BEGIN, or use a Transaction)",
                e.code().map(|c| c.code()),
            );
            return Err(self.row.insert_failed(e));
        }
        let (key, fingerprint, retention, lock_timeout, run_id, sql) = self.row.insert_params();
        let done = client
            .execute(
                &sql.insert,
                &[&key, &fingerprint, &retention, &lock_timeout, &run_id],
            )
            .await;
        match done {
            Ok(rows) => self.row.inserted(rows),
            Err(e) => Err(self.row.insert_failed(row_error(e))),
        }
    }

    /// Commits `tx`, the transaction the row was recorded in, after checking in it that the
    /// row is still there; a transaction whose insert found the key done is rolled back
    /// instead. Give it the outer transaction (a savepoint's commit commits nothing).
    ///
    /// # Errors
    ///
    /// [`RowError::is_completed`] for such a transaction (rolled back); otherwise the
    /// commit's error, classified as [`insert_in`](Self::insert_in)'s.
    pub async fn commit(&self, tx: Transaction<'_>) -> Result<(), RowError> {
        match self.before_commit(&tx).await {
            Ok(()) => {}
            Err(e) => {
                drop(tx.rollback().await);
                return Err(e);
            }
        }
        self.committed(tx.commit().await)
    }

    /// The first half of [`commit`](Self::commit), for a transaction that is not a
    /// tokio-postgres [`Transaction`] (a pool's wrapper of one, or a client that ran
    /// `BEGIN`): checks the row in `tx`. On `Ok`, commit it **at once** (no statement in
    /// between: PostgreSQL answers the COMMIT of a transaction an error aborted with a silent
    /// rollback) and give the commit's result to [`committed`](Self::committed); on `Err`,
    /// roll it back.
    ///
    /// # Errors
    ///
    /// [`RowError::is_completed`]: the insert found the key done, this work must not commit.
    /// Otherwise the check's error: the row is gone, or the transaction failed.
    pub async fn before_commit<C: GenericClient + Sync>(&self, tx: &C) -> Result<(), RowError> {
        match self.row.commit_step() {
            CommitStep::Refuse(kind) => Err(RowError::refused(kind)),
            CommitStep::Plain => Ok(()),
            CommitStep::Check => {
                let (key, _, _, _, run_id, sql) = self.row.insert_params();
                let rows = tx
                    .execute(&sql.commit_check, &[&key, &run_id])
                    .await
                    .map_err(|e| self.check(e))?;
                self.row.checked(rows)
            }
        }
    }

    /// The second half of [`commit`](Self::commit): the commit's result, after
    /// [`before_commit`](Self::before_commit) passed. From `Ok` on, the middleware trusts
    /// that the work committed.
    ///
    /// # Errors
    ///
    /// The commit's error, classified as [`insert_in`](Self::insert_in)'s; or, for a
    /// transaction that recorded the row, a commit whose check did not pass just before it
    /// (not run, or an error was classified after it): the commit may have been a rollback,
    /// and the middleware is not told that the work committed.
    pub fn committed(&self, result: Result<(), tokio_postgres::Error>) -> Result<(), RowError> {
        result.map_err(|e| self.check(e))?;
        if self.row.recorded() && !self.row.set_committed() {
            return Err(KeyRow::unchecked_commit());
        }
        Ok(())
    }

    /// Any statement's error in the row's transaction, classified: a lock timeout, a
    /// serialization failure or a deadlock there also makes the middleware answer `409` +
    /// `Retry-After`.
    pub fn check(&self, error: tokio_postgres::Error) -> RowError {
        self.row.observe(row_error(error))
    }
}
