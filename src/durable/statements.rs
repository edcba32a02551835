//! [`RowStatements`]: a [`KeyRow`]'s statements for a driver the crate has no adapter for
//! (diesel, …) — the SQL, its parameters, and what each answer means.

use super::row::CommitStep;
use super::{KeyRow, RowError};

impl KeyRow {
    /// The row's statements for a driver of your own. The crate's adapters
    /// (`sqlx_0_8`, `tokio_postgres`) run exactly these.
    pub fn statements(&self) -> RowStatements<'_> {
        RowStatements { row: self }
    }
}

/// A [`KeyRow`]'s statements ([`KeyRow::statements`]), for a driver without an adapter: run
/// them in the handler's transaction and report each answer, and the middleware reads the row
/// as it does with sqlx or tokio-postgres.
///
/// The connection must be in the work's transaction: an insert in autocommit commits the row
/// alone, before and without the work (the tokio-postgres adapter refuses that; here it is
/// yours to ensure). A driver that exposes no SQLSTATE (diesel) cannot tell a lock timeout or
/// a deadlock from another error: those are then answered `500`, not `409` (nothing
/// committed, so the retry runs).
///
/// 1. First statement of the transaction: [`insert_sql`](Self::insert_sql) with `$1`
///    [`key_hash`](Self::key_hash), `$2` [`fingerprint`](Self::fingerprint), `$3`
///    [`retention_ms`](Self::retention_ms), `$4` [`lock_timeout`](Self::lock_timeout), `$5`
///    [`run_id`](Self::run_id); give the rows it affected to [`inserted`](Self::inserted).
/// 2. Any statement's error: [`RowError::database`] with its SQLSTATE, through
///    [`error`](Self::error).
/// 3. Before the commit: [`before_commit`](Self::before_commit). `Err`: roll back. `Ok(None)`:
///    commit. `Ok(Some(sql))`: run `sql` with `$1` the key hash and `$2` the run id, give the
///    rows it affected to [`checked`](Self::checked) (`Err`: roll back), commit **at once**
///    (nothing in between), then call [`committed`](Self::committed) — which refuses a commit
///    not checked just before it.
///
/// ```
/// use tower_redlock::durable::{KeyRow, RowError};
///
/// /// Your driver's transaction (diesel's, say), reduced to what the row needs.
/// trait Tx {
///     fn execute(&mut self, sql: &str, params: &[&dyn std::fmt::Debug]) -> Result<u64, RowError>;
///     fn commit(self) -> Result<(), RowError>;
/// }
///
/// fn record<T: Tx>(row: &KeyRow, tx: &mut T) -> Result<(), RowError> {
///     let s = row.statements();
///     let params: [&dyn std::fmt::Debug; 5] =
///         [&s.key_hash(), &s.fingerprint(), &s.retention_ms(), &s.lock_timeout(), &s.run_id()];
///     let rows = tx.execute(s.insert_sql(), &params).map_err(|e| s.error(e))?;
///     s.inserted(rows)
/// }
///
/// fn commit<T: Tx>(row: &KeyRow, mut tx: T) -> Result<(), RowError> {
///     let s = row.statements();
///     if let Some(sql) = s.before_commit()? {
///         let rows = tx.execute(sql, &[&s.key_hash(), &s.run_id()]).map_err(|e| s.error(e))?;
///         s.checked(rows)?;
///     }
///     tx.commit().map_err(|e| s.error(e))?;
///     s.committed()
/// }
/// # let _ = (record::<Never>, commit::<Never>);
/// # enum Never {}
/// # impl Tx for Never {
/// #     fn execute(&mut self, _: &str, _: &[&dyn std::fmt::Debug]) -> Result<u64, RowError> { match *self {} }
/// #     fn commit(self) -> Result<(), RowError> { match self {} }
/// # }
/// ```
#[derive(Debug, Clone, Copy)]
pub struct RowStatements<'a> {
    row: &'a KeyRow,
}

impl<'a> RowStatements<'a> {
    /// The insert ([`Table::insert_sql`](super::Table::insert_sql)).
    pub fn insert_sql(&self) -> &'a str {
        &self.row.insert_params().5.insert
    }

    /// `$1`: the key hash (`bytea`, 32 bytes).
    pub fn key_hash(&self) -> &'a [u8] {
        self.row.insert_params().0
    }

    /// `$2`: the request's fingerprint (`bytea`).
    pub fn fingerprint(&self) -> &'a [u8] {
        self.row.insert_params().1
    }

    /// `$3`: how long the row is kept, in milliseconds (`int8`).
    pub fn retention_ms(&self) -> i64 {
        self.row.insert_params().2
    }

    /// `$4`: the transaction's `lock_timeout` (`text`, `"<ms>ms"`).
    pub fn lock_timeout(&self) -> String {
        self.row.insert_params().3
    }

    /// `$5`: this execution's run id (`bytea`, 16 bytes).
    pub fn run_id(&self) -> &'a [u8] {
        self.row.insert_params().4
    }

    /// The insert affected `rows`: one, recorded; none, the key's row had committed
    /// ([`RowError::is_completed`]: roll back).
    ///
    /// # Errors
    ///
    /// [`RowError::is_completed`] for none.
    pub fn inserted(&self, rows: u64) -> Result<(), RowError> {
        self.row.inserted(rows)
    }

    /// What to run before the commit: `Ok(Some(sql))`, the check
    /// ([`Table::commit_check_sql`](super::Table::commit_check_sql)); `Ok(None)`, nothing (no
    /// row recorded).
    ///
    /// # Errors
    ///
    /// [`RowError::is_completed`]: the insert found the key done — roll back, this work must
    /// not commit.
    pub fn before_commit(&self) -> Result<Option<&'a str>, RowError> {
        match self.row.commit_step() {
            CommitStep::Refuse(kind) => Err(RowError::refused(kind)),
            CommitStep::Plain => Ok(None),
            CommitStep::Check => Ok(Some(&self.row.insert_params().5.commit_check)),
        }
    }

    /// The check affected `rows`: one, commit.
    ///
    /// # Errors
    ///
    /// The row is gone from its transaction: roll back.
    pub fn checked(&self, rows: u64) -> Result<(), RowError> {
        self.row.checked(rows)
    }

    /// The commit succeeded: the middleware trusts that the work committed, whatever the
    /// handler recovered from before.
    ///
    /// # Errors
    ///
    /// The check did not pass just before the commit (it was not run, or an error was
    /// reported after it): the commit may have rolled back, and the middleware is not told
    /// otherwise.
    pub fn committed(&self) -> Result<(), RowError> {
        if self.row.recorded() && !self.row.set_committed() {
            return Err(KeyRow::unchecked_commit());
        }
        Ok(())
    }

    /// A statement's error, classified for the middleware: a lock timeout, a serialization
    /// failure or a deadlock (by the SQLSTATE given to [`RowError::database`]) makes it answer
    /// `409` + `Retry-After`.
    pub fn error(&self, error: RowError) -> RowError {
        self.row.observe(error)
    }
}
