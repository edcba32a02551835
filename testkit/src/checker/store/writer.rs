//! A worker's writes to the fenced store: one connection per task, each write a
//! read-modify-write in one transaction, in two steps so that a pause can fall between the
//! read and the write — [`Writer::read`] (inside the critical section) and
//! [`Writer::finish`].
//!
//! The read claims the row with the lease's token: the library's claim statement
//! ([`CLAIM_SQL`], `FencedTable::claim_sql` for this table — a test of the root crate checks
//! they are equal; the test kit does not turn on the library's `postgres` feature, which
//! would turn it on in every test build), prepared once per connection, which returns the
//! row it holds until the transaction ends. Each session has `lock_timeout` = [`LOCK_TIMEOUT`]: a
//! claim that waits on a paused holder's claim longer than that gives up (busy) well inside
//! its own section. The negative control (`unclaimed`) reads with a plain `SELECT` and puts
//! the token check in the write instead. Statements are pipelined (sent together, run in
//! order on the connection): `BEGIN` with the read, then the write, the history row and
//! `COMMIT` — the read and the write sit inside the critical section, which must end within
//! the lease's validity on a loaded machine.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio::sync::{Mutex, MutexGuard};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, Statement};

use super::super::log::StoreCounts;
use super::connect;

/// One write in this many pauses past the lease's ttl: alternately before its read and
/// after it (the first at half of it: several of each per process at CI size).
pub(in super::super) const PAUSE_EVERY: u64 = 100;

/// The claim of `fenced`'s row: `FencedTable::with_columns("fenced", "resource", "fence")`'s
/// `claim_sql()`.
pub const CLAIM_SQL: &str =
    r#"UPDATE "fenced" SET "fence" = $2 WHERE "resource" = $1 AND "fence" <= $2 RETURNING *"#;

/// How long a claim waits for a row another transaction holds: far below the validity a
/// section checks it has before it works (`WORK_MARGIN`, 50 ms).
pub(in super::super) const LOCK_TIMEOUT: &str = "10ms";

/// Where a write pauses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in super::super) enum Pause {
    /// Not at all.
    No,
    /// Before its read: the write comes after the lease ran out, with the old token.
    BeforeRead,
    /// Between its read and its write: the read was inside the lease, the write is not.
    /// `long`: the transaction stays open one and a half ttls past the lease's deadline —
    /// the next holders try the row meanwhile (with the claim: busy); else up to a
    /// thirty-second of a ttl past it — about when the next holder reads and writes (with
    /// the negative control's plain read, the interleaving that loses a write).
    AfterRead { long: bool },
}

/// A worker's connections to the store (one per task), and its counts.
pub(in super::super) struct Writer {
    /// Task `i`'s connection: only that task takes its lock.
    conns: Vec<Mutex<Conn>>,
    /// The negative control: a plain read, the token checked only in the write.
    unclaimed: bool,
    /// Sections that reached their write so far: every [`PAUSE_EVERY`]th pauses.
    sections: AtomicU64,
    committed: AtomicU64,
    refused: AtomicU64,
    busy: AtomicU64,
    paused: AtomicU64,
    paused_after_read: AtomicU64,
    paused_refused: AtomicU64,
}

/// One connection with the write's statements prepared on it.
struct Conn {
    client: Client,
    /// The claim (`RETURNING *`: `writes` is the third column), or the plain read.
    read: Statement,
    /// After a claim: the plain update; unclaimed: the update fenced in its `WHERE`.
    write: Statement,
    insert: Statement,
}

impl Conn {
    async fn connect(url: &str, unclaimed: bool) -> Self {
        let client = connect(url).await;
        client
            .batch_execute(&format!("SET lock_timeout = '{LOCK_TIMEOUT}'"))
            .await
            .expect("set lock_timeout");
        let (read, write) = if unclaimed {
            (
                "SELECT writes FROM fenced WHERE resource = $1",
                "UPDATE fenced SET writes = $3, fence = $2 WHERE resource = $1 AND fence <= $2",
            )
        } else {
            (
                CLAIM_SQL,
                "UPDATE fenced SET writes = $3 WHERE resource = $1 AND fence = $2",
            )
        };
        let prepare = |sql: &str| {
            let sql = sql.to_owned();
            let client = &client;
            async move {
                client
                    .prepare(&sql)
                    .await
                    .unwrap_or_else(|e| panic!("prepare {sql:?}: {e}"))
            }
        };
        let read = prepare(read).await;
        let write = prepare(write).await;
        let insert = prepare(
            "INSERT INTO fenced_history (resource, fence, process, task, before) \
             VALUES ($1, $2, $3, $4, $5)",
        )
        .await;
        Self {
            client,
            read,
            write,
            insert,
        }
    }
}

/// A write between its read and its write: the transaction open on the task's connection.
/// It must end in [`Writer::finish`] (`COMMIT` or `ROLLBACK`): dropped before, it would leave
/// its transaction open — and its row claimed — on the connection the task's next write
/// uses, so its `Drop` panics.
pub(in super::super) struct Open<'a> {
    conn: MutexGuard<'a, Conn>,
    fence: i64,
    /// What was read (`writes`), or why nothing was: refused or busy.
    read: Result<i64, Refusal>,
    /// Set by [`Writer::finish`] once the transaction has ended.
    ended: bool,
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        if !self.ended && !std::thread::panicking() {
            panic!("a fenced store write dropped between its read and its write: its transaction would stay open");
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// No row matched the claim: a newer token has claimed it.
    Stale,
    /// The claim waited past `lock_timeout`.
    Busy,
}

impl Writer {
    /// `tasks` connections to `url`.
    pub(in super::super) async fn connect(url: &str, tasks: usize, unclaimed: bool) -> Self {
        let mut conns = Vec::with_capacity(tasks);
        for _ in 0..tasks {
            conns.push(Mutex::new(Conn::connect(url, unclaimed).await));
        }
        Self {
            conns,
            unclaimed,
            sections: AtomicU64::new(0),
            committed: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            busy: AtomicU64::new(0),
            paused: AtomicU64::new(0),
            paused_after_read: AtomicU64::new(0),
            paused_refused: AtomicU64::new(0),
        }
    }

    /// Whether, and where, the section about to write pauses.
    pub(in super::super) fn pause_next(&self) -> Pause {
        let n = self.sections.fetch_add(1, Ordering::Relaxed);
        if n % PAUSE_EVERY != PAUSE_EVERY / 2 {
            Pause::No
        } else if (n / PAUSE_EVERY).is_multiple_of(2) {
            Pause::BeforeRead
        } else {
            // The first after-read pause is long: every run has one.
            Pause::AfterRead {
                long: (n / PAUSE_EVERY) % 4 == 1,
            }
        }
    }

    /// The read: `BEGIN` and the claim (or the plain read), on task `task`'s connection.
    pub(in super::super) async fn read(&self, resource: &str, token: u64, task: usize) -> Open<'_> {
        let fence = i64::try_from(token).expect("a fencing token fits a bigint");
        let conn = self.conns[task].lock().await;
        let c = &conn.client;
        let claim: [&(dyn ToSql + Sync); 2] = [&resource, &fence];
        let params = if self.unclaimed {
            &claim[..1]
        } else {
            &claim[..]
        };
        let (begun, read) = tokio::join!(c.batch_execute("BEGIN"), c.query_opt(&conn.read, params));
        begun.unwrap_or_else(|e| panic!("BEGIN: {}", why(&e)));
        let read = match read {
            Ok(Some(row)) => Ok(row.get::<_, i64>("writes")),
            Ok(None) => Err(Refusal::Stale),
            Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => Err(Refusal::Busy),
            Err(e) => panic!("the fenced store's read: {}", why(&e)),
        };
        Open {
            conn,
            fence,
            read,
            ended: false,
        }
    }

    /// The write of what was read plus one, the history row and `COMMIT` (or `ROLLBACK`
    /// after a refusal); whether it was committed.
    pub(in super::super) async fn finish(
        &self,
        mut open: Open<'_>,
        resource: &str,
        process: usize,
        task: usize,
        pause: Pause,
    ) -> bool {
        let (fence, read) = (open.fence, open.read);
        let conn = &*open.conn;
        let c = &conn.client;
        let (process, task) = (process as i32, task as i32);
        let outcome = match read {
            Err(refusal) => Err(refusal),
            Ok(before) => {
                let after = before + 1;
                let write: [&(dyn ToSql + Sync); 3] = [&resource, &fence, &after];
                let insert: [&(dyn ToSql + Sync); 5] =
                    [&resource, &fence, &process, &task, &before];
                if self.unclaimed {
                    // The fenced write decides: one round trip for it, then the rest.
                    // It may wait on a newer holder's uncommitted write (the interleaving
                    // that loses a write): past `lock_timeout`, busy.
                    match c.execute(&conn.write, &write).await {
                        Ok(1) => {
                            tokio::try_join!(
                                c.execute(&conn.insert, &insert),
                                c.batch_execute("COMMIT")
                            )
                            .unwrap_or_else(|e| panic!("the history row and COMMIT: {}", why(&e)));
                            Ok(())
                        }
                        Ok(_) => Err(Refusal::Stale),
                        Err(e) if e.code() == Some(&SqlState::LOCK_NOT_AVAILABLE) => {
                            Err(Refusal::Busy)
                        }
                        Err(e) => panic!("the fenced write: {}", why(&e)),
                    }
                } else {
                    // Claimed: the row is this transaction's; the write cannot miss it.
                    let (written, _, _) = tokio::try_join!(
                        c.execute(&conn.write, &write),
                        c.execute(&conn.insert, &insert),
                        c.batch_execute("COMMIT")
                    )
                    .unwrap_or_else(|e| {
                        panic!("the write, the history row and COMMIT: {}", why(&e))
                    });
                    assert_eq!(written, 1, "a claimed row is written");
                    Ok(())
                }
            }
        };
        if outcome.is_err() {
            c.batch_execute("ROLLBACK")
                .await
                .unwrap_or_else(|e| panic!("ROLLBACK a refused write: {}", why(&e)));
        }
        open.ended = true;
        let count = |c: &AtomicU64| c.fetch_add(1, Ordering::Relaxed);
        match outcome {
            Ok(()) => count(&self.committed),
            Err(Refusal::Stale) => count(&self.refused),
            Err(Refusal::Busy) => count(&self.busy),
        };
        if pause != Pause::No {
            count(&self.paused);
            if matches!(pause, Pause::AfterRead { .. }) {
                count(&self.paused_after_read);
            }
            if outcome == Err(Refusal::Stale) {
                count(&self.paused_refused);
            }
        }
        outcome.is_ok()
    }

    pub(in super::super) fn counts(&self) -> StoreCounts {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StoreCounts {
            committed: n(&self.committed),
            refused: n(&self.refused),
            busy: n(&self.busy),
            paused: n(&self.paused),
            paused_after_read: n(&self.paused_after_read),
            paused_refused: n(&self.paused_refused),
        }
    }
}

/// An error as a failing run should show it: the server's severity, code and message
/// (`Display` says only "db error"), or the client's own error.
fn why(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!(
            "{} {}: {} (detail: {:?})",
            db.severity(),
            db.code().code(),
            db.message(),
            db.detail()
        ),
        None => format!("{e:?}"),
    }
}
