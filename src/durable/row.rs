//! The handler's side: [`KeyRow`], the value it records the key's row through, and the
//! errors of a row's statements ([`RowError`]).

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The key's row for one request, given to the handler by the middleware (an axum or
/// actix-web extractor; in a tonic service, `request.extensions().get::<KeyRow>()`) when the
/// policy's replay is [durable](crate::durable::Durable). The handler records it as the
/// **first statement of its own transaction** — with sqlx, `row.insert_in(&mut tx)` (feature
/// `sqlx-0_8`); with tokio-postgres, `row.postgres().insert_in(&tx)` (feature
/// `tokio-postgres`); with another driver, [`statements`](Self::statements) — so that the row
/// commits with the work or not at all. See the [module](crate::durable) for the whole
/// pattern.
///
/// It holds the key's hash, never the key. Clones share one state: what the handler's
/// statements found ([`recorded`](Self::recorded)) is what the middleware reads after
/// the handler.
#[derive(Clone)]
pub struct KeyRow {
    shared: Arc<Shared>,
}

struct Shared {
    key: RowKey,
    /// This execution's id (a random UUID): only it stores its response in its row.
    run_id: [u8; 16],
    fingerprint: [u8; 32],
    retention: Duration,
    lock_timeout: Duration,
    sql: Arc<RowSql>,
    /// Whether the handler's insert recorded the row (in a transaction that may still
    /// roll back).
    inserted: AtomicBool,
    state: AtomicU8,
    /// Bumped by every insert and every error observed: a commit check counts only if
    /// nothing happened after it.
    events: AtomicU64,
    /// `events + 1` when the commit check last passed (0: never).
    checked_at: AtomicU64,
}

/// The handler's statements, made once per policy from its [`Table`](super::Table).
#[derive(Debug)]
pub(crate) struct RowSql {
    pub(crate) insert: String,
    pub(crate) commit_check: String,
}

impl RowSql {
    pub(crate) fn of(table: &super::Table) -> Self {
        Self {
            insert: table.insert_sql(),
            commit_check: table.commit_check_sql(),
        }
    }
}

/// What the handler's statements found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RowState {
    /// The handler has not recorded the row (yet).
    Unrecorded = 0,
    /// Inserted in the handler's transaction (committed or not: the store finds out).
    Recorded = 1,
    /// Inserted, checked and committed (`KeyRow::commit`): what the handler's statements
    /// found before (and recovered from) no longer matters.
    Committed = 4,
    /// The key's row had committed: the work ran before, the handler's must not commit.
    Completed = 2,
    /// A lock timeout, a serialization failure or a deadlock: nothing committed.
    Busy = 3,
}

impl fmt::Debug for KeyRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyRow")
            .field("key_hash", &self.key_hash())
            .field("state", &self.state())
            .finish_non_exhaustive()
    }
}

impl KeyRow {
    pub(crate) fn new(
        key: RowKey,
        fingerprint: [u8; 32],
        retention: Duration,
        lock_timeout: Duration,
        sql: Arc<RowSql>,
    ) -> Self {
        Self {
            shared: Arc::new(Shared {
                key,
                run_id: *uuid::Uuid::new_v4().as_bytes(),
                fingerprint,
                retention,
                lock_timeout,
                sql,
                inserted: AtomicBool::new(false),
                state: AtomicU8::new(RowState::Unrecorded as u8),
                events: AtomicU64::new(0),
                checked_at: AtomicU64::new(0),
            }),
        }
    }

    /// The key's hash in hex (64 characters): the row's `key_hash`. Keep it beside the
    /// business data the request makes if a [rebuild](crate::durable) should find it.
    pub fn key_hash(&self) -> String {
        self.shared.key.hex()
    }

    /// Whether the handler's insert recorded the row (in a transaction that may still roll
    /// back, or committed with [`commit`](Self::commit)).
    pub fn recorded(&self) -> bool {
        self.shared.inserted.load(Ordering::Acquire)
    }

    /// The insert recorded the row.
    pub(crate) fn set_inserted(&self) {
        self.shared.events.fetch_add(1, Ordering::AcqRel);
        self.shared.inserted.store(true, Ordering::Release);
        self.set(RowState::Recorded);
    }

    /// This execution's run id: the row's `run_id`.
    pub(crate) fn run_id(&self) -> &[u8; 16] {
        &self.shared.run_id
    }

    pub(crate) fn key(&self) -> &RowKey {
        &self.shared.key
    }

    pub(crate) fn state(&self) -> RowState {
        match self.shared.state.load(Ordering::Acquire) {
            1 => RowState::Recorded,
            2 => RowState::Completed,
            3 => RowState::Busy,
            4 => RowState::Committed,
            _ => RowState::Unrecorded,
        }
    }

    pub(crate) fn set(&self, state: RowState) {
        self.shared.state.store(state as u8, Ordering::Release);
    }

    /// The insert's parameters, in order: key hash, fingerprint, retention (ms), lock
    /// timeout (`"<ms>ms"`), run id, and the statement
    /// ([`Table::insert_sql`](super::Table::insert_sql)).
    pub(crate) fn insert_params(&self) -> (&[u8], &[u8], i64, String, &[u8], &RowSql) {
        let s = &*self.shared;
        (
            &s.key.0,
            &s.fingerprint,
            millis(s.retention),
            format!("{}ms", millis(s.lock_timeout)),
            &s.run_id,
            &s.sql,
        )
    }

    /// What the insert's affected-row count means: one, recorded; none, the key's row had
    /// committed before.
    pub(crate) fn inserted(&self, rows: u64) -> Result<(), RowError> {
        if rows == 1 {
            self.set_inserted();
            Ok(())
        } else {
            Err(self.insert_failed(RowError::completed()))
        }
    }

    /// The insert failed (or found the key done): this transaction holds no row of this
    /// execution, whatever an earlier transaction's insert recorded.
    pub(crate) fn insert_failed(&self, error: RowError) -> RowError {
        self.shared.inserted.store(false, Ordering::Release);
        self.observe(error)
    }

    /// The first step of a commit, for every adapter: refuse a transaction whose insert
    /// found the key done, commit one that recorded no row as it is, or check the row first
    /// ([`RowSql::commit_check`], then [`checked`](Self::checked)).
    pub(crate) fn commit_step(&self) -> CommitStep {
        match self.state() {
            RowState::Completed => CommitStep::Refuse(RowErrorKind::Completed),
            // No row, and the middleware answers `409` + `Retry-After` whatever the handler
            // does: committed work would run again on the retry.
            RowState::Busy if !self.recorded() => CommitStep::Refuse(RowErrorKind::Busy),
            _ if !self.recorded() => CommitStep::Plain,
            _ => CommitStep::Check,
        }
    }

    /// What the commit check's affected-row count means: one, commit (and the check counts
    /// until anything else is observed); else the row is gone from its transaction (roll
    /// back).
    pub(crate) fn checked(&self, rows: u64) -> Result<(), RowError> {
        if rows == 1 {
            let now = self.shared.events.load(Ordering::Acquire);
            self.shared.checked_at.store(now + 1, Ordering::Release);
            Ok(())
        } else {
            Err(RowError::database(
                "the key's row is gone from its transaction",
                None,
            ))
        }
    }

    /// After a checked commit that succeeded: the middleware trusts the work committed.
    ///
    /// Only after a check that passed with nothing observed since (an error after the check
    /// may have aborted the transaction, whose COMMIT PostgreSQL answers with a silent
    /// rollback): `false` otherwise, and the state is left as it is.
    #[must_use]
    pub(crate) fn set_committed(&self) -> bool {
        let now = self.shared.events.load(Ordering::Acquire);
        if self.shared.checked_at.load(Ordering::Acquire) != now + 1 {
            return false;
        }
        self.set(RowState::Committed);
        true
    }

    /// The error of a commit that was not checked just before it.
    pub(crate) fn unchecked_commit() -> RowError {
        RowError::database(
            "committed without a passing check just before: the commit may have rolled back",
            None,
        )
    }

    /// Reads what a statement's error means for the key: a lock timeout, a serialization
    /// failure or a deadlock marks the request busy (the middleware answers `409` +
    /// `Retry-After`, whatever the handler answers — unless the handler recovers, in a
    /// savepoint, and commits with [`commit`](Self::commit)).
    pub(crate) fn observe(&self, error: RowError) -> RowError {
        self.shared.events.fetch_add(1, Ordering::AcqRel);
        match error.kind {
            // After a checked commit, a busy statement is another transaction's: the work
            // committed whatever it meets.
            RowErrorKind::Busy => {
                let busy = RowState::Busy as u8;
                let committed = RowState::Committed as u8;
                let _ = self
                    .shared
                    .state
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |s| {
                        (s != committed).then_some(busy)
                    });
            }
            RowErrorKind::Completed => self.set(RowState::Completed),
            _ => {}
        }
        error
    }
}

/// What a commit does first ([`KeyRow::commit_step`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CommitStep {
    /// The insert found the key's row committed (`Completed`), or no row was recorded and a
    /// busy error stands (`Busy`): roll back, answer that.
    Refuse(RowErrorKind),
    /// No row recorded: commit as it is.
    Plain,
    /// Check the row in the transaction, then commit.
    Check,
}

/// Milliseconds, at least 1, in an `int8`.
pub(crate) fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX).max(1)
}

/// A row's key: the SHA-256 of the middleware's lock key (itself a hash of the scoped
/// request key).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct RowKey(pub(crate) [u8; 32]);

impl RowKey {
    pub(crate) fn of(lock_key: &str) -> Self {
        use sha2::{Digest, Sha256};
        Self(Sha256::digest(lock_key.as_bytes()).into())
    }

    pub(crate) fn hex(&self) -> String {
        use std::fmt::Write;
        self.0.iter().fold(String::with_capacity(64), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
    }
}

/// The SQLSTATEs that mean "try again later": `55P03` lock not available (the
/// `lock_timeout`), `40001` serialization failure, `40P01` deadlock detected.
const BUSY: [&str; 3] = ["55P03", "40001", "40P01"];

/// An error of a key row's statement, or of the middleware's lookup or store. The kind
/// tells the handler what to do; the middleware answers by it whatever the handler
/// returns (see the [module](crate::durable)).
#[derive(Debug)]
pub struct RowError {
    kind: RowErrorKind,
    sqlstate: Option<Box<str>>,
    source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

/// What a [`RowError`] means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum RowErrorKind {
    /// The key's row had committed: the work ran before. Roll back (drop the
    /// transaction; [`KeyRow::commit`] refuses to commit it); the middleware answers from
    /// the row.
    Completed,
    /// A lock timeout, a serialization failure or a deadlock (SQLSTATE `55P03`, `40001`,
    /// `40P01`): roll back; the middleware answers `409` + `Retry-After`.
    Busy,
    /// The statement did not answer in time.
    Timeout,
    /// Any other database error.
    Database,
}

impl RowError {
    /// The error of a driver: classified by its SQLSTATE, when it has one. For adapters
    /// of other drivers.
    pub fn database(
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
        sqlstate: Option<&str>,
    ) -> Self {
        let kind = match sqlstate {
            Some(code) if BUSY.contains(&code) => RowErrorKind::Busy,
            _ => RowErrorKind::Database,
        };
        Self {
            kind,
            sqlstate: sqlstate.map(Into::into),
            source: Some(source.into()),
        }
    }

    /// A statement that did not answer within `after`.
    pub fn timeout(after: Duration) -> Self {
        Self {
            kind: RowErrorKind::Timeout,
            sqlstate: None,
            source: Some(format!("no answer within {after:?}").into()),
        }
    }

    pub(crate) fn completed() -> Self {
        Self {
            kind: RowErrorKind::Completed,
            sqlstate: None,
            source: None,
        }
    }

    /// The error of a refused commit ([`CommitStep::Refuse`]).
    pub(crate) fn refused(kind: RowErrorKind) -> Self {
        Self {
            kind,
            sqlstate: None,
            source: None,
        }
    }

    /// What it means.
    pub fn kind(&self) -> RowErrorKind {
        self.kind
    }

    /// The key's row had committed before ([`RowErrorKind::Completed`]).
    pub fn is_completed(&self) -> bool {
        self.kind == RowErrorKind::Completed
    }

    /// Try again later ([`RowErrorKind::Busy`]).
    pub fn is_busy(&self) -> bool {
        self.kind == RowErrorKind::Busy
    }

    /// The SQLSTATE the database answered, if any.
    pub fn sqlstate(&self) -> Option<&str> {
        self.sqlstate.as_deref()
    }
}

impl fmt::Display for RowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.kind {
            RowErrorKind::Completed => {
                f.write_str("the idempotency key's row has committed before")?
            }
            RowErrorKind::Busy => {
                f.write_str("the idempotency key's row is busy: try again later")?
            }
            RowErrorKind::Timeout => {
                f.write_str("the idempotency key's row did not answer in time")?
            }
            RowErrorKind::Database => f.write_str("the idempotency key's row failed")?,
        }
        if let Some(code) = &self.sqlstate {
            write!(f, " (SQLSTATE {code})")?;
        }
        Ok(())
    }
}

impl std::error::Error for RowError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|e| e as _)
    }
}
