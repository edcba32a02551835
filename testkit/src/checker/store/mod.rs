//! The fenced PostgreSQL store (`--store postgres`): the parent starts one throwaway server
//! and makes the tables, each worker writes through one connection per task
//! ([`writer`]), and after the run the history is checked.
//!
//! ```sql
//! CREATE TABLE fenced (resource text PRIMARY KEY, fence bigint NOT NULL, writes bigint NOT NULL);
//! CREATE TABLE fenced_history (seq bigserial PRIMARY KEY, resource text, fence bigint,
//!                              process int, task int, before bigint);
//! ```
//!
//! A write is a read-modify-write in one transaction: the row claimed with the lease's
//! token (the library's `FencedTable::claim`, which returns `writes`), `writes` set to what
//! was read plus one, a history row with the value read (`before`), `COMMIT`. A claim that
//! matched no row was refused (a newer token had claimed); one that waited past the
//! session's `lock_timeout` is busy (a paused holder has the row). Rows start with fence 0
//! and 0 writes. The history is checked per resource in commit order (`seq`): fences never
//! go back and grow whenever the writer changed, and every committed write is in the final
//! value's lineage — each history row read what the row before it wrote (`before` = its
//! position), and the row's `writes` equals the history's length. A write computed from a
//! value another committed write had already replaced is a **lost write**.
//!
//! The negative control (`--broken unclaimed-read`) reads with a plain `SELECT` and checks
//! the token only in the write (`UPDATE … WHERE fence <= $token`): the pattern that loses a
//! paused reader's acknowledged write once the next holder has read.

use tokio_postgres::{Client, NoTls};

use super::log::StoreCounts;

mod writer;

pub use writer::CLAIM_SQL;
pub(super) use writer::{Open, Pause, Writer};

/// One committed write, as `fenced_history` keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryRow {
    pub seq: i64,
    pub resource: String,
    pub fence: i64,
    pub process: i32,
    pub task: i32,
    /// The `writes` it read (and wrote plus one).
    pub before: i64,
}

/// What the store's history shows.
#[derive(Debug, Clone, Default)]
pub struct StoreVerdict {
    /// Rows of `fenced_history`: the committed writes.
    pub history: usize,
    /// `sum(writes)` over `fenced`: must equal `history` (every committed write counted once
    /// in the final values: none lost).
    pub row_writes: i64,
    /// The workers' own counts, summed.
    pub counts: StoreCounts,
    /// Committed writes whose fence is below an earlier committed write's on the same
    /// resource: (the earlier one with the largest fence so far, the later one).
    pub out_of_order: Vec<(HistoryRow, HistoryRow)>,
    /// Committed writes by another writer (process, task) than the previous one on the
    /// resource, with a fence not strictly above every earlier one: (previous, this one).
    pub not_increased: Vec<(HistoryRow, HistoryRow)>,
    /// Lost writes: committed writes that read a value an earlier committed write had
    /// already replaced — the earlier one is not in the final value's lineage: (the
    /// previous committed write on the resource, the one that read past it).
    pub lost: Vec<(HistoryRow, HistoryRow)>,
}

impl StoreVerdict {
    /// Out-of-order writes, writer changes without a larger fence, lost writes.
    pub fn violations(&self) -> usize {
        self.out_of_order.len() + self.not_increased.len() + self.lost.len()
    }
}

/// Checks the history, in commit order (`seq`) per resource: no fence below the largest
/// one before it, a strictly larger one whenever the writer changed, and each write read
/// what the one before it wrote (the first one 0).
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
                if row.before != p.before + 1 {
                    v.lost.push((p.clone(), row.clone()));
                }
                if row.fence > t.fence {
                    top = Some(row.clone());
                }
                previous = Some(row);
                continue;
            }
        }
        if row.before != 0 {
            // The resource's first committed write read a value nobody committed.
            v.lost.push((row.clone(), row.clone()));
        }
        top = Some(row.clone());
        previous = Some(row);
    }
    v
}

/// A client on `url`, its connection driven by a task of the current runtime.
pub(in crate::checker) async fn connect(url: &str) -> Client {
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
             fence bigint, process int, task int, before bigint);",
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
            "SELECT seq, resource, fence, process, task, before FROM fenced_history ORDER BY seq",
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
            before: r.get(5),
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
            before: 0,
        }
    }

    /// `rows` of one resource, each reading what the one before it wrote.
    fn lineage(mut rows: Vec<HistoryRow>) -> Vec<HistoryRow> {
        rows.sort_by_key(|r| r.seq);
        for (i, r) in rows.iter_mut().enumerate() {
            r.before = i as i64;
        }
        rows
    }

    #[test]
    fn the_history_check_can_fail() {
        // In order; the same writer again with its fence; another resource lower.
        let mut rows = lineage(vec![
            row(3, "a", 20, 1, 0),
            row(1, "a", 10, 0, 0),
            row(4, "a", 20, 1, 0),
        ]);
        rows.push(row(2, "b", 5, 2, 1));
        let clean = check_history(rows);
        assert_eq!(clean.violations(), 0, "{clean:?}");
        assert_eq!(clean.history, 4);

        // 10, 30, 20, 25: 20 and 25 both below 30; then another writer with 30 again.
        let bad = check_history(lineage(vec![
            row(1, "a", 10, 0, 0),
            row(2, "a", 30, 1, 0),
            row(3, "a", 20, 2, 0),
            row(4, "a", 25, 0, 1),
            row(5, "a", 30, 0, 2),
        ]));
        assert_eq!(bad.out_of_order.len(), 2, "{bad:?}");
        assert!(bad.out_of_order.iter().all(|(t, _)| t.fence == 30));
        assert_eq!(bad.not_increased.len(), 1, "{bad:?}");
        assert_eq!(bad.not_increased[0].1.seq, 5);
        assert_eq!(bad.violations(), 3);
        assert!(bad.lost.is_empty());
    }

    #[test]
    fn the_lineage_check_finds_a_lost_write() {
        // Writer 1 read 1 and wrote 2 (seq 2), writer 2 read 1 too (seq 3): writer 1's write
        // is not in the final value's lineage.
        let mut rows = lineage(vec![row(1, "a", 10, 0, 0), row(2, "a", 20, 1, 0)]);
        let mut late = row(3, "a", 30, 2, 0);
        late.before = 1;
        rows.push(late);
        let v = check_history(rows);
        assert_eq!(v.lost.len(), 1, "{v:?}");
        assert_eq!((v.lost[0].0.seq, v.lost[0].1.seq), (2, 3));
        assert_eq!(v.violations(), 1);
        // A first write that read a value nobody committed.
        let mut first = row(1, "b", 10, 0, 0);
        first.before = 4;
        assert_eq!(check_history(vec![first]).lost.len(), 1);
    }
}
