//! The sqlx 0.8 adapter (feature `sqlx-0_8`, PostgreSQL): [`SqlxStore`] for the middleware,
//! and the [`KeyRow`] statements a handler runs in its own transaction.

use std::fmt;

use sqlx::postgres::{PgConnection, PgPool, Postgres};
use sqlx::{Row, Transaction};

use super::row::CommitStep;
use super::{FoundRow, KeyRow, NewRecord, RowError, RowFuture, RowStore, Table};

/// A sqlx error as a [`RowError`], by its SQLSTATE.
fn row_error(e: sqlx::Error) -> RowError {
    let code = match &e {
        sqlx::Error::Database(db) => db.code().map(|c| c.into_owned()),
        _ => None,
    };
    RowError::database(e, code.as_deref())
}

/// Key rows in PostgreSQL through a sqlx pool: what [`Durable::new`](super::Durable::new)
/// takes.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use tower_redlock::durable::{sqlx_0_8::SqlxStore, Durable, Table};
///
/// let pool = sqlx::PgPool::connect("postgres://app@127.0.0.1/app").await?;
/// let store = SqlxStore::new(pool).table(Table::new("idempotency_keys")?);
/// store.migrate().await?; // or apply `Table::migration()` with your own tool
/// let durable = Durable::new(store.clone());
/// // Once a day, say: expired rows, 1,000 per statement.
/// let swept = store.sweep(1_000).await?;
/// # let _ = (durable, swept); Ok(()) }
/// ```
#[derive(Clone)]
pub struct SqlxStore {
    pool: PgPool,
    table: Table,
    find_sql: String,
    store_sql: String,
}

impl fmt::Debug for SqlxStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqlxStore")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl SqlxStore {
    /// Rows in the default table (`tower_redlock_keys`) of `pool`'s database.
    pub fn new(pool: PgPool) -> Self {
        Self::with_table(pool, Table::default())
    }

    /// The same pool, rows in `table`.
    pub fn table(self, table: Table) -> Self {
        Self::with_table(self.pool, table)
    }

    fn with_table(pool: PgPool, table: Table) -> Self {
        Self {
            find_sql: table.find_sql(),
            store_sql: table.store_sql(),
            pool,
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
        sqlx::raw_sql(&self.table.migration())
            .execute(&self.pool)
            .await
            .map(drop)
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
        let mut total = 0;
        loop {
            let done = sqlx::query(&sql)
                .bind(batch)
                .execute(&self.pool)
                .await
                .map_err(row_error)?
                .rows_affected();
            total += done;
            if done < batch as u64 {
                return Ok(total);
            }
        }
    }
}

impl RowStore for SqlxStore {
    fn table(&self) -> &Table {
        &self.table
    }

    fn find<'a>(&'a self, key_hash: &'a [u8]) -> RowFuture<'a, Option<FoundRow>> {
        Box::pin(async move {
            let row = sqlx::query(&self.find_sql)
                .bind(key_hash)
                .fetch_optional(&self.pool)
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
            let done = sqlx::query(&self.store_sql)
                .bind(r.key_hash)
                .bind(r.fingerprint)
                .bind(r.record)
                .bind(r.retention_ms)
                .bind(r.lock_timeout)
                .bind(r.run_id)
                .execute(&self.pool)
                .await
                .map_err(row_error)?;
            Ok(done.rows_affected() == 1)
        })
    }
}

/// The handler's statements, with sqlx.
impl KeyRow {
    /// Records the key's row: run it as the **first statement of the transaction** that
    /// does the work (`row.insert_in(&mut tx)`), so that the row commits with the work or
    /// not at all. It sets the transaction's `lock_timeout`
    /// ([`Durable::lock_timeout`](super::Durable::lock_timeout)) for the statements after it,
    /// in place of any the transaction had. On [`RowError::is_completed`], drop the
    /// transaction at once: until it ends it holds the key's row locked, which the first
    /// execution's store waits for.
    ///
    /// # Errors
    ///
    /// [`RowError::is_completed`]: the key's row had committed (another request ran the
    /// work; this one waited for its transaction) — drop the transaction, the middleware
    /// answers from the row. [`RowError::is_busy`]: the wait passed the `lock_timeout`, or
    /// a serialization failure or deadlock — drop it, the middleware answers `409` +
    /// `Retry-After`. Any other: the database's error.
    pub async fn insert_in(&self, tx: &mut Transaction<'_, Postgres>) -> Result<(), RowError> {
        let (key, fingerprint, retention, lock_timeout, run_id, sql) = self.insert_params();
        let sql = &sql.insert;
        let conn: &mut PgConnection = tx;
        let done = sqlx::query(sql)
            .bind(key)
            .bind(fingerprint)
            .bind(retention)
            .bind(lock_timeout)
            .bind(run_id)
            .execute(conn)
            .await;
        match done {
            Ok(done) => self.inserted(done.rows_affected()),
            Err(e) => Err(self.insert_failed(row_error(e))),
        }
    }

    /// Commits `tx`, the transaction the row was recorded in; the middleware then trusts
    /// that the work committed, whatever errors the handler met before (and recovered from,
    /// in a savepoint). It first checks, in the transaction, that the row is still there
    /// (one statement). A transaction whose insert found the key's row committed before is
    /// rolled back instead: its work must not commit. Give it the outer transaction: a
    /// nested one (a savepoint) has the same type, but its "commit" commits nothing.
    ///
    /// # Errors
    ///
    /// [`RowError::is_completed`] for such a transaction (rolled back). Otherwise the
    /// commit's error, classified as [`insert_in`](Self::insert_in)'s: a serialization
    /// failure or deadlock at commit is [`RowError::is_busy`], answered `409` +
    /// `Retry-After` by the middleware.
    pub async fn commit(&self, mut tx: Transaction<'_, Postgres>) -> Result<(), RowError> {
        match self.commit_step() {
            CommitStep::Refuse(kind) => {
                drop(tx.rollback().await);
                return Err(RowError::refused(kind));
            }
            CommitStep::Plain => {
                return tx.commit().await.map_err(|e| self.observe(row_error(e)));
            }
            CommitStep::Check => {}
        }
        // Before the commit: the row is there and the transaction healthy (PostgreSQL
        // answers the COMMIT of an aborted transaction with a silent rollback).
        let (key, _, _, _, run_id, sql) = self.insert_params();
        let conn: &mut PgConnection = &mut tx;
        let checked = sqlx::query(&sql.commit_check)
            .bind(key)
            .bind(run_id)
            .execute(conn)
            .await
            .map_err(|e| self.observe(row_error(e)))?;
        if let Err(e) = self.checked(checked.rows_affected()) {
            drop(tx.rollback().await);
            return Err(e);
        }
        tx.commit().await.map_err(|e| self.observe(row_error(e)))?;
        // Nothing ran between the check and the commit.
        let _ = self.set_committed();
        Ok(())
    }

    /// Any statement's error in the row's transaction, classified: a lock timeout, a
    /// serialization failure or a deadlock there also makes the middleware answer `409` +
    /// `Retry-After` (the transaction rolls back, so nothing ran).
    pub fn check(&self, error: sqlx::Error) -> RowError {
        self.observe(row_error(error))
    }
}
