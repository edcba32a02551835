//! The fenced PostgreSQL store (`--store postgres`): the parent starts one throwaway server
//! and makes the tables, each worker writes through one connection, and after the run the
//! history is checked.
//!
//! ```sql
//! CREATE TABLE fenced (resource text PRIMARY KEY, fence bigint NOT NULL, writes bigint NOT NULL);
//! CREATE TABLE fenced_history (seq bigserial PRIMARY KEY, resource text, fence bigint, process int, task int);
//! ```
//!
//! A write is one transaction: `UPDATE fenced SET fence = $token, writes = writes + 1 WHERE
//! resource = $1 AND fence <= $token`, and only when it updated the row, an insert into
//! `fenced_history`; then `COMMIT`. No row updated: the write was refused (a newer token
//! had written). Rows start with fence 0. Each task of a worker has a connection of its
//! own, made once, and pipelines its write in two round trips (`BEGIN` with the update,
//! then the insert with `COMMIT`): the write sits inside the critical section, which must
//! end within the lease's validity on a loaded machine.

use std::sync::atomic::{AtomicU64, Ordering};

use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls, Statement};

use super::log::StoreCounts;

/// One committed write, as `fenced_history` keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryRow {
    pub seq: i64,
    pub resource: String,
    pub fence: i64,
    pub process: i32,
    pub task: i32,
}

/// What the store's history shows.
#[derive(Debug, Clone, Default)]
pub struct StoreVerdict {
    /// Rows of `fenced_history`: the committed writes.
    pub history: usize,
    /// `sum(writes)` over `fenced`: must equal `history` (one transaction each).
    pub row_writes: i64,
    /// The workers' own counts, summed.
    pub counts: StoreCounts,
    /// Committed writes whose fence is below an earlier committed write's on the same
    /// resource: (the earlier one with the largest fence so far, the later one).
    pub out_of_order: Vec<(HistoryRow, HistoryRow)>,
    /// Committed writes by another writer (process, task) than the previous one on the
    /// resource, with a fence not strictly above every earlier one: (previous, this one).
    pub not_increased: Vec<(HistoryRow, HistoryRow)>,
}

impl StoreVerdict {
    /// Out-of-order writes and writer changes without a larger fence.
    pub fn violations(&self) -> usize {
        self.out_of_order.len() + self.not_increased.len()
    }
}

/// Checks the history, in commit order (`seq`) per resource: no fence below the largest
/// one before it, and a strictly larger one whenever the writer changed.
pub fn check_history(mut rows: Vec<HistoryRow>) -> StoreVerdict {
    let mut v = StoreVerdict {
        history: rows.len(),
        ..StoreVerdict::default()
    };
    rows.sort_by(|a, b| (&a.resource, a.seq).cmp(&(&b.resource, b.seq)));
    // Per resource: the row with the largest fence so far, and the previous row.
    let mut top: Option<HistoryRow> = None;
    let mut previous: Option<HistoryRow> = None;
    for row in rows {
        if let (Some(t), Some(p)) = (&top, &previous) {
            if t.resource == row.resource {
                let changed = (p.process, p.task) != (row.process, row.task);
                if row.fence < t.fence {
                    v.out_of_order.push((t.clone(), row.clone()));
                } else if changed && row.fence == t.fence {
                    v.not_increased.push((p.clone(), row.clone()));
                }
                if row.fence > t.fence {
                    top = Some(row.clone());
                }
                previous = Some(row);
                continue;
            }
        }
        top = Some(row.clone());
        previous = Some(row);
    }
    v
}

/// A client on `url`, its connection driven by a task of the current runtime.
async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect to the fenced store {url}: {e}"));
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("fenced store connection: {e}");
        }
    });
    client
}

/// The parent: makes both tables and one row per resource, fence 0.
pub(super) async fn setup(url: &str, resources: &[String]) {
    let client = connect(url).await;
    client
        .batch_execute(
            "CREATE TABLE fenced (resource text PRIMARY KEY, fence bigint NOT NULL, \
             writes bigint NOT NULL);
             CREATE TABLE fenced_history (seq bigserial PRIMARY KEY, resource text, \
             fence bigint, process int, task int);",
        )
        .await
        .unwrap_or_else(|e| panic!("create the fenced store's tables: {e}"));
    for r in resources {
        client
            .execute(
                "INSERT INTO fenced (resource, fence, writes) VALUES ($1, 0, 0)",
                &[r],
            )
            .await
            .unwrap_or_else(|e| panic!("insert the row of {r}: {e}"));
    }
}

/// The parent, after the run: the history checked, with `sum(writes)` beside it.
pub(super) async fn verdict(url: &str, counts: StoreCounts) -> StoreVerdict {
    let client = connect(url).await;
    let rows = client
        .query(
            "SELECT seq, resource, fence, process, task FROM fenced_history ORDER BY seq",
            &[],
        )
        .await
        .unwrap_or_else(|e| panic!("read fenced_history: {e}"))
        .into_iter()
        .map(|r| HistoryRow {
            seq: r.get(0),
            resource: r.get(1),
            fence: r.get(2),
            process: r.get(3),
            task: r.get(4),
        })
        .collect();
    let mut v = check_history(rows);
    v.row_writes = client
        .query_one("SELECT coalesce(sum(writes), 0)::bigint FROM fenced", &[])
        .await
        .unwrap_or_else(|e| panic!("read fenced: {e}"))
        .get(0);
    v.counts = counts;
    v
}

/// A worker's connections to the store (one per task), and its counts.
pub(super) struct Writer {
    /// Task `i`'s connection: only that task takes its lock.
    conns: Vec<tokio::sync::Mutex<Conn>>,
    /// Sections that reached their write so far: every [`PAUSE_EVERY`]th pauses.
    sections: AtomicU64,
    committed: AtomicU64,
    refused: AtomicU64,
    paused: AtomicU64,
    paused_refused: AtomicU64,
}

/// One write in this many comes after a pause past the lease's ttl (the first at half of
/// it: a few per process at CI size).
pub(super) const PAUSE_EVERY: u64 = 200;

/// One connection with the write's statements prepared on it.
struct Conn {
    client: Client,
    update: Statement,
    insert: Statement,
}

impl Conn {
    async fn connect(url: &str) -> Self {
        let client = connect(url).await;
        let update = client
            .prepare(
                "UPDATE fenced SET fence = $2, writes = writes + 1 \
                 WHERE resource = $1 AND fence <= $2",
            )
            .await
            .expect("prepare the fenced update");
        let insert = client
            .prepare(
                "INSERT INTO fenced_history (resource, fence, process, task) \
                 VALUES ($1, $2, $3, $4)",
            )
            .await
            .expect("prepare the history insert");
        Self {
            client,
            update,
            insert,
        }
    }
}

impl Writer {
    /// `tasks` connections to `url`.
    pub(super) async fn connect(url: &str, tasks: usize) -> Self {
        let mut conns = Vec::with_capacity(tasks);
        for _ in 0..tasks {
            conns.push(tokio::sync::Mutex::new(Conn::connect(url).await));
        }
        Self {
            conns,
            sections: AtomicU64::new(0),
            committed: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            paused: AtomicU64::new(0),
            paused_refused: AtomicU64::new(0),
        }
    }

    /// Whether the section about to write pauses first.
    pub(super) fn pause_next(&self) -> bool {
        self.sections.fetch_add(1, Ordering::Relaxed) % PAUSE_EVERY == PAUSE_EVERY / 2
    }

    /// One fenced write, in one transaction; whether it was accepted (and committed).
    pub(super) async fn write(
        &self,
        resource: &str,
        token: u64,
        process: usize,
        task: usize,
        paused: bool,
    ) -> bool {
        let fence = i64::try_from(token).expect("a fencing token fits a bigint");
        let conn = self.conns[task].lock().await;
        let (process, task) = (process as i32, task as i32);
        let c = &conn.client;
        // Pipelined: the statements go out in the order they are first polled, and the
        // server runs them in that order on this connection.
        let update: [&(dyn ToSql + Sync); 2] = [&resource, &fence];
        let (_, updated) =
            tokio::try_join!(c.batch_execute("BEGIN"), c.execute(&conn.update, &update))
                .unwrap_or_else(|e| panic!("the fenced update: {e}"));
        if updated == 1 {
            let insert: [&(dyn ToSql + Sync); 4] = [&resource, &fence, &process, &task];
            tokio::try_join!(c.execute(&conn.insert, &insert), c.batch_execute("COMMIT"))
                .unwrap_or_else(|e| panic!("the history insert and its commit: {e}"));
        } else {
            c.batch_execute("COMMIT")
                .await
                .unwrap_or_else(|e| panic!("commit a refused write: {e}"));
        }
        let accepted = updated == 1;
        let count = |c: &AtomicU64| c.fetch_add(1, Ordering::Relaxed);
        count(if accepted {
            &self.committed
        } else {
            &self.refused
        });
        if paused {
            count(&self.paused);
            if !accepted {
                count(&self.paused_refused);
            }
        }
        accepted
    }

    pub(super) fn counts(&self) -> StoreCounts {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StoreCounts {
            committed: n(&self.committed),
            refused: n(&self.refused),
            paused: n(&self.paused),
            paused_refused: n(&self.paused_refused),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(seq: i64, resource: &str, fence: i64, process: i32, task: i32) -> HistoryRow {
        HistoryRow {
            seq,
            resource: resource.into(),
            fence,
            process,
            task,
        }
    }

    #[test]
    fn the_history_check_can_fail() {
        // In order; the same writer again with its fence; another resource lower.
        let clean = check_history(vec![
            row(3, "a", 20, 1, 0),
            row(1, "a", 10, 0, 0),
            row(4, "a", 20, 1, 0),
            row(2, "b", 5, 2, 1),
        ]);
        assert_eq!(clean.violations(), 0, "{clean:?}");
        assert_eq!(clean.history, 4);

        // 10, 30, 20, 25: 20 and 25 both below 30; then another writer with 30 again.
        let bad = check_history(vec![
            row(1, "a", 10, 0, 0),
            row(2, "a", 30, 1, 0),
            row(3, "a", 20, 2, 0),
            row(4, "a", 25, 0, 1),
            row(5, "a", 30, 0, 2),
        ]);
        assert_eq!(bad.out_of_order.len(), 2, "{bad:?}");
        assert!(bad.out_of_order.iter().all(|(t, _)| t.fence == 30));
        assert_eq!(bad.not_increased.len(), 1, "{bad:?}");
        assert_eq!(bad.not_increased[0].1.seq, 5);
        assert_eq!(bad.violations(), 3);
    }
}
