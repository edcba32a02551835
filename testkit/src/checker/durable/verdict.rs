//! The durable mode's verdict, from PostgreSQL's business rows and the workers' answers.

use std::collections::{BTreeMap, HashMap};

use super::{DurableAnswer, Outcome, BUSINESS_SQL};
use crate::checker::store::connect;

/// One run of the work, as `checker_runs` keeps it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BusinessRow {
    pub id: i64,
    pub key: i64,
    pub worker: i32,
    pub run_id: i64,
}

/// What the business rows and the answers show.
#[derive(Debug, Clone, Default)]
pub struct DurableVerdict {
    /// Rows in `checker_runs`: the runs that committed.
    pub business_rows: usize,
    /// Keys with at least one.
    pub keys: usize,
    /// Keys with more than one business row, with them: the work ran twice. A violation.
    pub double_runs: Vec<Vec<BusinessRow>>,
    /// `2xx` answers whose run id is none of the key's business runs: an answer for work
    /// that never committed, or for another key's run. A violation.
    pub phantoms: Vec<DurableAnswer>,
    /// The answers, by outcome.
    pub outcomes: BTreeMap<Outcome, usize>,
    /// Answers with a status the workload never expects (counted in `outcomes` as `other`),
    /// a few of them.
    pub odd: Vec<DurableAnswer>,
}

impl DurableVerdict {
    /// Double runs and phantom answers.
    pub fn violations(&self) -> usize {
        self.double_runs.len() + self.phantoms.len()
    }

    /// Claims answered for good: runs, replays, completed-not-stored.
    pub fn answered(&self) -> usize {
        self.outcomes
            .iter()
            .filter(|(o, _)| o.answered())
            .map(|(_, n)| n)
            .sum()
    }

    pub fn count(&self, outcome: Outcome) -> usize {
        self.outcomes.get(&outcome).copied().unwrap_or(0)
    }
}

impl DurableVerdict {
    /// What makes the run fail, for the report.
    pub(in crate::checker) fn problems(&self, p: &mut Vec<String>) {
        for rows in self.double_runs.iter().take(10) {
            let runs: Vec<String> = rows
                .iter()
                .map(|r| format!("run {} by worker {} (row {})", r.run_id, r.worker, r.id))
                .collect();
            p.push(format!(
                "DOUBLE RUN of key {}: {} business rows: {}",
                rows[0].key,
                rows.len(),
                runs.join(", ")
            ));
        }
        for a in self.phantoms.iter().take(10) {
            p.push(format!(
                "PHANTOM ANSWER: worker {} was answered {} ({}) for key {} naming run {}, which \
                 is none of the key's business rows",
                a.worker,
                a.status,
                a.outcome.name(),
                a.key,
                a.run_id.map_or("-".to_owned(), |r| r.to_string())
            ));
        }
        if !self.odd.is_empty() {
            p.push(format!(
                "{} unexpected answers (neither a run, a replay, 409 nor 503), e.g. {:?}",
                self.count(Outcome::Other),
                self.odd
            ));
        }
        if self.business_rows == 0 || self.count(Outcome::Replay) == 0 {
            p.push(format!(
                "could not set up the scenario: {} business rows, {} replays",
                self.business_rows,
                self.count(Outcome::Replay)
            ));
        }
    }

    /// Its rows of the summary table.
    pub(in crate::checker) fn summary(&self, out: &mut String) {
        use std::fmt::Write as _;
        let outcomes: Vec<String> = Outcome::ALL
            .iter()
            .map(|&o| format!("{} {}", o.name(), self.count(o)))
            .collect();
        let rows = [
            ("answers", outcomes.join(", ")),
            (
                "business rows",
                format!("{} (of {} keys)", self.business_rows, self.keys),
            ),
            (
                "double runs",
                format!(
                    "{} (keys with more than one business row)",
                    self.double_runs.len()
                ),
            ),
            (
                "phantom answers",
                format!(
                    "{} (2xx naming none of the key's business runs)",
                    self.phantoms.len()
                ),
            ),
        ];
        for (name, value) in rows {
            let _ = writeln!(out, "  {name:<18} {value}");
        }
    }
}

/// Checks the business rows against themselves (one per key) and every `2xx` answer against
/// its key's rows.
pub fn check_durable(rows: &[BusinessRow], answers: &[DurableAnswer]) -> DurableVerdict {
    let mut by_key: HashMap<i64, Vec<BusinessRow>> = HashMap::new();
    for r in rows {
        by_key.entry(r.key).or_default().push(*r);
    }
    let mut v = DurableVerdict {
        business_rows: rows.len(),
        keys: by_key.len(),
        ..DurableVerdict::default()
    };
    let mut doubles: Vec<Vec<BusinessRow>> =
        by_key.values().filter(|r| r.len() > 1).cloned().collect();
    doubles.sort_by_key(|r| r[0].id);
    v.double_runs = doubles;
    for a in answers {
        *v.outcomes.entry(a.outcome).or_default() += 1;
        if a.outcome == Outcome::Other && v.odd.len() < 5 {
            v.odd.push(*a);
        }
        if (200..300).contains(&a.status) {
            let theirs = by_key.get(&a.key).map(Vec::as_slice).unwrap_or(&[]);
            if !theirs.iter().any(|r| Some(r.run_id) == a.run_id) {
                v.phantoms.push(*a);
            }
        }
    }
    v
}

/// The parent: the key rows' table (the library's migration) and the business table.
pub(in crate::checker) async fn setup(url: &str) {
    let client = connect(url).await;
    let keys = tower_redlock::durable::Table::default().migration();
    client
        .batch_execute(&format!("{keys};\n{BUSINESS_SQL};"))
        .await
        .unwrap_or_else(|e| panic!("create the durable mode's tables: {e}"));
}

/// The parent, after the run: every business row.
pub(in crate::checker) async fn read_business(url: &str) -> Vec<BusinessRow> {
    connect(url)
        .await
        .query(
            "SELECT id, key, worker, run_id FROM checker_runs ORDER BY id",
            &[],
        )
        .await
        .unwrap_or_else(|e| panic!("read checker_runs: {e}"))
        .into_iter()
        .map(|r| BusinessRow {
            id: r.get(0),
            key: r.get(1),
            worker: r.get(2),
            run_id: r.get(3),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: i64, key: i64, run_id: i64) -> BusinessRow {
        BusinessRow {
            id,
            key,
            worker: 0,
            run_id,
        }
    }

    fn answer(key: i64, status: u16, outcome: Outcome, run_id: Option<i64>) -> DurableAnswer {
        DurableAnswer {
            key,
            worker: 1,
            status,
            outcome,
            run_id,
        }
    }

    #[test]
    fn the_durable_check_finds_double_runs_and_phantoms() {
        let rows = [row(1, 7, 70), row(2, 8, 80), row(3, 8, 81)];
        let answers = [
            answer(7, 201, Outcome::Run, Some(70)),
            answer(7, 201, Outcome::Replay, Some(70)),
            answer(7, 409, Outcome::Busy, None),
            // A run no business row has, and another key's run.
            answer(9, 201, Outcome::Run, Some(90)),
            answer(7, 201, Outcome::Replay, Some(80)),
            answer(9, 409, Outcome::NotStored, None),
        ];
        let v = check_durable(&rows, &answers);
        assert_eq!((v.business_rows, v.keys), (3, 2));
        assert_eq!(v.double_runs, vec![vec![row(2, 8, 80), row(3, 8, 81)]]);
        assert_eq!(v.phantoms, vec![answers[3], answers[4]]);
        assert_eq!(v.violations(), 3);
        assert_eq!(v.answered(), 5);
        assert_eq!(v.count(Outcome::Busy), 1);
    }
}
