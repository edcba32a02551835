//! Fenced rows in PostgreSQL (feature `postgres`): [`FencedTable`], a row claimed with a
//! fencing token as the first statement of the transaction that reads and writes it.

use std::fmt;

use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Error, Row, Transaction};

use super::StaleToken;
use crate::rejection::RejectionResponse;

/// A table whose rows carry a fence column (`bigint`). Each row is read and written only by the
/// holder of a fencing token at least the one stored in it. The holder *claims* the row first, in
/// the transaction that then reads and writes it.
///
/// The claim is one statement (with the defaults, key column `id` and fence column
/// `fence`):
///
/// ```sql
/// UPDATE ledger SET fence = $2 WHERE id = $1 AND fence <= $2 RETURNING *
/// ```
///
/// One row: the row is claimed, and returned as it is now — read it from there. The claim
/// also holds the row's lock until the transaction ends, so nothing else writes the row
/// meanwhile: write it with plain statements, then commit. Zero rows: the token is older
/// than the stored one (a newer holder's claim has committed: [`Refused::Stale`]) or the
/// row does not exist ([`Refused::Missing`]; [`claim_or_insert`](Self::claim_or_insert)
/// makes it). A row that does not exist has no fence to compare: keep rows (a tombstone
/// column) rather than delete them. After any refusal, roll back at once: a refused
/// `claim_or_insert` still holds the row's lock (PostgreSQL locks the conflicting row
/// before it checks the `WHERE`), and blocks newer claims until its transaction ends.
///
/// ```no_run
/// # async fn run(db: &mut tokio_postgres::Client, redlock: &tower_redlock::Redlock)
/// # -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use tower_redlock::fenced::postgres::{FencedTable, Refused};
///
/// // CREATE TABLE ledger (id text PRIMARY KEY, balance bigint NOT NULL DEFAULT 0,
/// //                      fence bigint NOT NULL DEFAULT 0);
/// let ledger = FencedTable::new("ledger")?;
/// let lease = redlock.lock("ledger:acct", Duration::from_secs(10)).await?;
/// let token = lease.fencing_token().expect("fencing is on");
///
/// let tx = db.transaction().await?;
/// match ledger.claim(&tx, &"acct", token).await? {
///     Ok(row) => {
///         let balance: i64 = row.get("balance");
///         tx.execute("UPDATE ledger SET balance = $2 WHERE id = $1", &[&"acct", &(balance + 50)])
///             .await?;
///         tx.commit().await?;
///     }
///     // Stale: a newer holder has claimed the row — this lease was lost (a pause past its
///     // validity). Nothing was read or written: roll back now.
///     Err(refused) => {
///         tx.rollback().await?;
///         eprintln!("{refused}");
///     }
/// }
/// lease.release().await?;
/// # Ok(()) }
/// ```
///
/// The runnable version, against a real server, is `examples/fenced_postgres.rs`.
///
/// # What it guarantees
///
/// Per row, with every transaction that reads or writes it starting with a claim:
/// - **a read-modify-write loses no committed write.** A claim waits for the row's lock, so
///   transactions of the row run one after the other. Each reads what the one before it committed.
///   A transaction whose token is older than a committed claim's reads nothing and writes nothing
///   ([`Refused::Stale`]). A holder paused after its read (its lease lost meanwhile) still holds
///   the row. Its write lands if it commits before a newer holder claims, and the newer holder then
///   reads it. Or else its session is ended (below) and nothing of it lands.
/// - **tokens only grow**: a committed fence never goes back. So once a holder's claim has
///   committed, an older one never reads or writes the row again. A claim that rolls back (its
///   session ended, say) is undone with the rest of its transaction. Until a newer claim commits,
///   an older token may still claim the row. It then reads what was committed, so no write is lost
///   either way.
///
/// A write that does not read first (a *blind* write) is protected the same way by a claim before
/// it. A single `UPDATE … SET …, fence = $token WHERE id = $1 AND fence <= $token` also protects it
/// (the check is in the write's own `WHERE`). It does **not** protect a read-modify-write. A holder
/// that read before a newer holder's claim and writes after its read would overwrite what the newer
/// holder computed from the same old value.
///
/// What it assumes: every write of the row goes through a claim (or the fenced `WHERE`),
/// with tokens from one lock resource (per resource, the crate's tokens only grow).
///
/// # The claim holds the row: timeouts
///
/// A holder paused after its claim (a GC pause, a SIGSTOP, a stalled network) blocks the
/// next holder's claim until its transaction ends. Bound both sides:
/// - the idle-in-transaction timeout on the sessions that claim (`SET` below), around the lock's
///   ttl. The server ends the session of a paused holder, and its transaction rolls back (its
///   commit fails: nothing of it was written). The row is then free for the next holder;
/// - `lock_timeout` on the claim, inside the lease's validity: a claim that waited longer
///   fails with `55P03`, here [`Refused::Busy`] — answered like a stale token (`409`), and
///   its transaction rolls back.
///
/// ```sql
/// SET idle_in_transaction_session_timeout = '10s';  -- per session (or role, database)
/// SET LOCAL lock_timeout = '2s';                     -- per transaction, before the claim
/// ```
///
/// Under `REPEATABLE READ` or `SERIALIZABLE`, a claim of a row that another transaction
/// changed since this one's snapshot — having waited for it or not — fails with `40001`
/// ([`Refused::Conflict`]): nothing was read or written; retry the transaction from its
/// start (as with any serialization failure) — with a stale token, the retried claim is
/// [`Refused::Stale`]. Under `SERIALIZABLE` a serialization failure may also come at a later
/// statement or at `COMMIT`: retry then too (it is the driver's error, not a `Refused`).
/// Under `READ COMMITTED` (PostgreSQL's default) the claim re-checks its `WHERE` on the row
/// as the other transaction left it, and returns that row.
///
/// The tests that try to break this against a real PostgreSQL are
/// `tests/fenced_store/claim_postgres.rs` (`fenced_claim_postgres_*`, under `READ
/// COMMITTED`, `REPEATABLE READ` and `SERIALIZABLE`), and the checker's `--store postgres`
/// runs it across processes under faults.
#[derive(Debug, Clone)]
pub struct FencedTable {
    claim: String,
    claim_or_insert: String,
    stored: String,
}

impl FencedTable {
    /// The table `table` (a plain SQL identifier, optionally `schema.table`), key column
    /// `id`, fence column `fence`.
    ///
    /// # Errors
    ///
    /// [`InvalidName`] when the name is not a plain SQL identifier (or `schema.table`).
    pub fn new(table: &str) -> Result<Self, InvalidName> {
        Self::with_columns(table, "id", "fence")
    }

    /// The table `table` with key column `key` (unique: a primary key or a unique
    /// constraint) and fence column `fence` (`bigint`, not null). Names are plain SQL
    /// identifiers (`[A-Za-z_][A-Za-z0-9_]*`, at most 63 bytes; the table may be
    /// `schema.table`), folded to lower case as PostgreSQL folds an unquoted name in
    /// `CREATE TABLE`, and sent quoted, so that a reserved word (`user`, `order`) names the
    /// column rather than meaning the keyword.
    ///
    /// # Errors
    ///
    /// [`InvalidName`] when a name is not a plain SQL identifier (the table may be
    /// `schema.table`) or is longer than 63 bytes.
    pub fn with_columns(table: &str, key: &str, fence: &str) -> Result<Self, InvalidName> {
        let mut parts = table.split('.');
        let (first, second) = (parts.next().unwrap_or(""), parts.next());
        if parts.next().is_some() || !identifier(first) || !second.is_none_or(identifier) {
            return Err(InvalidName::new("table", table));
        }
        if !identifier(key) {
            return Err(InvalidName::new("key column", key));
        }
        if !identifier(fence) {
            return Err(InvalidName::new("fence column", fence));
        }
        let quote = |name: &str| format!("\"{}\"", name.to_ascii_lowercase());
        let table = match second {
            Some(name) => format!("{}.{}", quote(first), quote(name)),
            None => quote(first),
        };
        let (key, fence) = (quote(key), quote(fence));
        Ok(Self {
            claim: format!(
                "UPDATE {table} SET {fence} = $2 WHERE {key} = $1 AND {fence} <= $2 RETURNING *"
            ),
            claim_or_insert: format!(
                "INSERT INTO {table} AS fenced_row ({key}, {fence}) VALUES ($1, $2) \
                 ON CONFLICT ({key}) DO UPDATE SET {fence} = EXCLUDED.{fence} \
                 WHERE fenced_row.{fence} <= EXCLUDED.{fence} RETURNING *"
            ),
            stored: format!("SELECT {fence} FROM {table} WHERE {key} = $1"),
        })
    }

    /// The claim's SQL (`$1` the key, `$2` the token as `bigint`), for a driver of your
    /// choice: [`claim`](Self::claim) runs it with tokio-postgres.
    pub fn claim_sql(&self) -> &str {
        &self.claim
    }

    /// The SQL of [`claim_or_insert`](Self::claim_or_insert) (`$1` the key, `$2` the
    /// token).
    pub fn claim_or_insert_sql(&self) -> &str {
        &self.claim_or_insert
    }

    /// Claims row `key` with `token`, as the first statement of `tx`: `Ok(Ok(row))` the row
    /// as it is now (its fence is `token`), held until `tx` ends; `Ok(Err(refused))`
    /// nothing was read or written (roll back: after [`Refused::Busy`] or
    /// [`Refused::Conflict`] the transaction is aborted); `Err(_)` the database failed.
    ///
    /// # Errors
    ///
    /// `Ok(Err(refused))`: a newer token holds the row ([`Refused::Conflict`]), another
    /// transaction holds it ([`Refused::Busy`]) or there is no row ([`Refused::Missing`]).
    /// `Err(_)`: the database failed.
    pub async fn claim(
        &self,
        tx: &Transaction<'_>,
        key: &(dyn ToSql + Sync),
        token: u64,
    ) -> Result<Result<Row, Refused>, Error> {
        self.run(tx, &self.claim, key, token).await
    }

    /// Claims row `key` as [`claim`](Self::claim) does, or inserts it with only its key and
    /// fence (the other columns need defaults) and claims that: the first write of a row.
    /// [`Refused::Missing`] does not happen.
    ///
    /// # Errors
    ///
    /// As [`claim`](Self::claim), without [`Refused::Missing`].
    pub async fn claim_or_insert(
        &self,
        tx: &Transaction<'_>,
        key: &(dyn ToSql + Sync),
        token: u64,
    ) -> Result<Result<Row, Refused>, Error> {
        self.run(tx, &self.claim_or_insert, key, token).await
    }

    async fn run(
        &self,
        tx: &Transaction<'_>,
        sql: &str,
        key: &(dyn ToSql + Sync),
        token: u64,
    ) -> Result<Result<Row, Refused>, Error> {
        let Ok(fence) = i64::try_from(token) else {
            return Ok(Err(Refused::OutOfRange(token)));
        };
        match tx.query_opt(sql, &[key, &fence]).await {
            Ok(Some(row)) => Ok(Ok(row)),
            Ok(None) => self.stale(tx, key, token).await,
            Err(e) => match refusal(&e) {
                Some(refused) => Ok(Err(refused)),
                None => Err(e),
            },
        }
    }

    /// The refusal of a claim that matched no row: the fence stored now, or no row.
    async fn stale(
        &self,
        tx: &Transaction<'_>,
        key: &(dyn ToSql + Sync),
        token: u64,
    ) -> Result<Result<Row, Refused>, Error> {
        let Some(row) = tx.query_opt(&self.stored, &[key]).await? else {
            return Ok(Err(Refused::Missing));
        };
        let stored: i64 = row.try_get(0)?;
        // A fence below zero was not written by a claim: read as 0.
        let stored = u64::try_from(stored).unwrap_or(0);
        if stored <= token {
            // Under `READ COMMITTED` this read's snapshot is newer than the claim's: the row
            // was made (or its fence lowered) in between. Not a stale token: retry.
            return Ok(Err(Refused::Conflict));
        }
        Ok(Err(Refused::Stale(StaleToken::new(token, stored))))
    }
}

/// The refusals among a claim's errors: a wait past `lock_timeout`, a serialization
/// failure, a deadlock.
fn refusal(e: &Error) -> Option<Refused> {
    let code = e.code()?;
    if *code == SqlState::LOCK_NOT_AVAILABLE {
        Some(Refused::Busy)
    } else if *code == SqlState::T_R_SERIALIZATION_FAILURE
        || *code == SqlState::T_R_DEADLOCK_DETECTED
    {
        Some(Refused::Conflict)
    } else {
        None
    }
}

/// Whether `name` is a plain SQL identifier: `[A-Za-z_][A-Za-z0-9_]*`, at most 63 bytes
/// (PostgreSQL's limit).
fn identifier(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && name.len() <= 63
}

/// A claim that read and wrote nothing. Roll the transaction back (dropping a
/// `Transaction` does); [`to_problem_json`](Self::to_problem_json) is the request's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refused {
    /// A newer holder's claim of the row has committed: its fence is larger than the
    /// token. This holder lost its lease (a pause past its validity).
    Stale(StaleToken),
    /// The row does not exist (under `READ COMMITTED`: as of the read after the claim):
    /// [`FencedTable::claim_or_insert`] makes it.
    Missing,
    /// The claim waited for the row longer than `lock_timeout` (`55P03`): another
    /// transaction holds it — an older holder paused after its own claim, usually. Answered
    /// like a stale token: this request cannot write safely within its lease.
    Busy,
    /// A serialization failure (`40001`: `REPEATABLE READ` or `SERIALIZABLE`, the row
    /// changed since the transaction's snapshot), a deadlock (`40P01`), or a row made between
    /// the claim and the read of its fence: retry the transaction from its start.
    Conflict,
    /// A token above `i64::MAX` (no lease of this crate has one: its tokens stay below
    /// 2^53): not storable in a `bigint` fence.
    OutOfRange(u64),
}

impl Refused {
    /// The answer for the client of the refused request: `409` problem+json
    /// ([`StaleToken::PROBLEM_TYPE`]) for a stale token and for a claim that waited too
    /// long or conflicted; `404` for a missing row; `500` for a token out of range.
    pub fn to_problem_json(&self) -> RejectionResponse {
        let (status, detail) = match self {
            Refused::Stale(stale) => return stale.to_problem_json(),
            Refused::Busy | Refused::Conflict => (
                409,
                "this request could not claim its data within its lock: another holder's \
                 transaction has it",
            ),
            Refused::Missing => (404, "the data this request would change does not exist"),
            Refused::OutOfRange(_) => (500, "the fencing token does not fit the data's fence"),
        };
        let (kind, title) = match status {
            409 => (StaleToken::PROBLEM_TYPE, "Stale fencing token"),
            404 => ("about:blank", "Not Found"),
            _ => ("about:blank", "Internal Server Error"),
        };
        let body = format!(
            "{{\"type\":\"{kind}\",\"title\":\"{title}\",\"status\":{status},\"detail\":\"{detail}\"}}"
        );
        RejectionResponse::new(status, "application/problem+json", body)
    }
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refused::Stale(stale) => stale.fmt(f),
            Refused::Missing => f.write_str("no such row to claim"),
            Refused::Busy => f.write_str("the claim waited past lock_timeout: the row is held"),
            Refused::Conflict => {
                f.write_str("the claim conflicted with another transaction: retry it")
            }
            Refused::OutOfRange(token) => write!(f, "fencing token {token} is beyond a bigint"),
        }
    }
}

impl std::error::Error for Refused {}

/// A table or column name that is not a plain SQL identifier: [`FencedTable::new`] and
/// [`FencedTable::with_columns`] refuse it rather than quote it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidName {
    what: &'static str,
    name: String,
}

impl InvalidName {
    fn new(what: &'static str, name: &str) -> Self {
        Self {
            what,
            name: name.into(),
        }
    }
}

impl fmt::Display for InvalidName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {:?} is not a plain SQL identifier: use letters, digits and `_` (not first a \
             digit), at most 63 bytes{}",
            self.what,
            self.name,
            if self.what == "table" {
                ", optionally as schema.table"
            } else {
                ""
            }
        )
    }
}

impl std::error::Error for InvalidName {}

#[cfg(test)]
mod tests;
