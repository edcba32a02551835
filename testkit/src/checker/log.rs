//! What the workers record — their critical sections and counts — and the log file each
//! worker writes and the parent reads back.
//!
//! The log is plain text, one record a line, fields separated by one space:
//!
//! ```text
//! counts <acquisitions> <contended> <unavailable> <other> <release errors> <warm-up ms> <elapsed ms>
//! error <message>
//! s <resource> <enter ns> <leave ns> <deadline ns> <valid 0|1> <task> <token, or - for none>
//! r <key> <enter ns> <leave ns> <deadline ns> <valid 0|1> <task> <token, or -> <completion>
//! p <key> <worker> <task> <enter ns>
//! store <committed> <refused> <busy> <paused> <paused after read> <paused refused>
//! end
//! ```
//!
//! `s` is a critical section (the lock workload), `r` a run of the replay workload's handler
//! (the section of a claim that locked, with how its completion ended: `stored`,
//! `minority`, `lost`, `expired`, `failed`), and `p` a replay: a claim answered with a
//! completion record, which names the run that stored it (its worker, task and entry).
//! `store` (with `--store` only) counts the worker's writes through the fenced store: those
//! committed and those refused (a newer token had written), and of them the writes made
//! after a deliberate pause past the lease's ttl (before the read or after it), and how
//! many of those were refused.
//!
//! A log without its `end` line (the worker died writing it) is refused.

use std::io::{BufRead, BufReader, Write as _};
use std::path::Path;

/// One critical section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Section {
    pub resource: usize,
    /// Entered (the lock was granted), on the shared clock.
    pub enter_ns: i64,
    /// Left (before the release was sent), on the shared clock.
    pub leave_ns: i64,
    /// The lease's validity deadline, on the shared clock.
    pub deadline_ns: i64,
    /// When the section planned to have left, on the shared clock: when it began its work,
    /// plus the time that work takes with the margin the worker allows for a yield and a
    /// timer (a section without work: its entry). A section that left after its deadline
    /// though it planned to leave before is a paused process (see `verdict.rs`).
    pub plan_ns: i64,
    /// How long the section's thread waited for a CPU (runnable, not run) between its check
    /// of its validity and its exit (`clock::Starvation`), in ns; -1 where the system does
    /// not say. A paused section must show at least its overrun here.
    pub starved_ns: i64,
    /// `Lease::is_valid()` when leaving.
    pub valid: bool,
    pub worker: usize,
    pub task: usize,
    /// The lease's fencing token (`Lease::fencing_token()`): `None` without fencing.
    pub token: Option<u64>,
}

/// How a run's [`Lease::complete`](tower_redlock::Lease::complete) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Completion {
    /// `Ok`: a quorum stored the record.
    Stored,
    /// Unavailable: the record reached too few nodes (the library keeps at it in the
    /// background, where the lock holds).
    Minority,
    /// Lost: the lease no longer held on a quorum.
    Lost,
    /// The lease was no longer valid when the handler ended: nothing was tried (the
    /// library's contract allows the work to run again then; the run is also late).
    Expired,
    /// Any other error.
    Failed,
}

impl Completion {
    pub const ALL: [Completion; 5] = [
        Completion::Stored,
        Completion::Minority,
        Completion::Lost,
        Completion::Expired,
        Completion::Failed,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Completion::Stored => "stored",
            Completion::Minority => "minority",
            Completion::Lost => "lost",
            Completion::Expired => "expired",
            Completion::Failed => "failed",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name() == s)
    }
}

/// One run of the replay workload's handler: the critical section of a claim that locked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// The section (its `resource` is the key's number).
    pub section: Section,
    pub completion: Completion,
}

/// A claim answered with a completion record, and the run the record names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replay {
    /// The key's number.
    pub key: usize,
    /// The worker that claimed.
    pub worker: usize,
    /// The run named in the record: its worker, task and entry.
    pub run_worker: usize,
    pub run_task: usize,
    pub run_enter_ns: i64,
}

/// A duplicate's answer in the lost-lease mode of the replay workload (`--nemesis lost`):
/// a replayed record naming a run, or `409` outcome-unknown. Every duplicate of a key must
/// get the key's first answer (see `verdict.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    /// The key's number.
    pub key: usize,
    /// The worker that claimed.
    pub worker: usize,
    /// When the answer came, on the shared clock.
    pub at_ns: i64,
    /// The run the record names (its worker, task and entry); `None`: outcome unknown.
    pub run: Option<(usize, usize, i64)>,
}

/// What one worker counted.
#[derive(Debug, Clone, Default)]
pub struct Counts {
    pub acquisitions: u64,
    /// `lock_with` calls that gave up because the resource stayed held.
    pub contended: u64,
    /// `lock_with` calls that gave up because no quorum answered.
    pub unavailable: u64,
    /// Any other error (should be none).
    pub other: u64,
    /// Releases that did not reach a quorum (the lock then expires with its ttl).
    pub release_errors: u64,
    /// Time from start until a first lock was taken (connections up, masters voting).
    pub warm_up_ms: u64,
    pub elapsed_ms: u64,
}

/// What one worker's writes through the fenced store (`--store`) came to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StoreCounts {
    /// Committed (the row written and a history row inserted).
    pub committed: u64,
    /// Refused: the row's fence was above the writer's token (the claim, or the negative
    /// control's write, matched no row).
    pub refused: u64,
    /// Busy: the claim waited past `lock_timeout` for a row a paused holder had claimed.
    pub busy: u64,
    /// Writes whose writer paused past its lease's ttl, before or after its read
    /// (committed, refused or busy).
    pub paused: u64,
    /// Of those, the writes paused between their read and their write (the rest paused
    /// before their read).
    pub paused_after_read: u64,
    /// Of the paused writes (before or after their read), the refused ones.
    pub paused_refused: u64,
}

impl StoreCounts {
    pub fn add(&mut self, o: &StoreCounts) {
        self.committed += o.committed;
        self.refused += o.refused;
        self.busy += o.busy;
        self.paused += o.paused;
        self.paused_after_read += o.paused_after_read;
        self.paused_refused += o.paused_refused;
    }
}

/// One worker's log: its counts, its sections (or runs and replays) and a few error
/// samples.
#[derive(Debug, Clone, Default)]
pub struct WorkerLog {
    pub counts: Counts,
    pub sections: Vec<Section>,
    pub runs: Vec<Run>,
    pub replays: Vec<Replay>,
    /// The lost-lease mode's answers to duplicates (replays and outcome-unknown).
    pub answers: Vec<Answer>,
    pub errors: Vec<String>,
    /// Its writes through the fenced store (all 0 without one).
    pub store: StoreCounts,
}

impl WorkerLog {
    pub(super) fn write(&self, path: &Path) -> std::io::Result<()> {
        let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
        let c = &self.counts;
        writeln!(
            out,
            "counts {} {} {} {} {} {} {}",
            c.acquisitions,
            c.contended,
            c.unavailable,
            c.other,
            c.release_errors,
            c.warm_up_ms,
            c.elapsed_ms
        )?;
        for e in &self.errors {
            writeln!(out, "error {}", e.replace('\n', " "))?;
        }
        for s in &self.sections {
            writeln!(out, "s {}", section_fields(s))?;
        }
        for r in &self.runs {
            writeln!(
                out,
                "r {} {}",
                section_fields(&r.section),
                r.completion.name()
            )?;
        }
        for p in &self.replays {
            writeln!(
                out,
                "p {} {} {} {}",
                p.key, p.run_worker, p.run_task, p.run_enter_ns
            )?;
        }
        for a in &self.answers {
            let run = a
                .run
                .map_or_else(|| "unknown".to_owned(), |(w, t, e)| format!("{w} {t} {e}"));
            writeln!(out, "a {} {} {run}", a.key, a.at_ns)?;
        }
        let st = &self.store;
        writeln!(
            out,
            "store {} {} {} {} {} {}",
            st.committed, st.refused, st.busy, st.paused, st.paused_after_read, st.paused_refused
        )?;
        writeln!(out, "end")?;
        out.flush()
    }

    pub(super) fn read(path: &Path, worker: usize) -> Result<Self, String> {
        let file = std::fs::File::open(path).map_err(|e| format!("open {path:?}: {e}"))?;
        let mut log = WorkerLog::default();
        let mut complete = false;
        for (n, line) in BufReader::new(file).lines().enumerate() {
            let line = line.map_err(|e| format!("read {path:?}: {e}"))?;
            let bad = || format!("{path:?} line {}: malformed: {line:?}", n + 1);
            let mut f = line.split(' ');
            match f.next() {
                Some("counts") => {
                    let v: Vec<u64> = f
                        .map(|x| x.parse().map_err(|_| bad()))
                        .collect::<Result<_, _>>()?;
                    let [a, c, u, o, r, w, e] = v[..] else {
                        return Err(bad());
                    };
                    log.counts = Counts {
                        acquisitions: a,
                        contended: c,
                        unavailable: u,
                        other: o,
                        release_errors: r,
                        warm_up_ms: w,
                        elapsed_ms: e,
                    };
                }
                Some("store") => {
                    let v: Vec<u64> = f
                        .map(|x| x.parse().map_err(|_| bad()))
                        .collect::<Result<_, _>>()?;
                    let [committed, refused, busy, paused, paused_after_read, paused_refused] =
                        v[..]
                    else {
                        return Err(bad());
                    };
                    log.store = StoreCounts {
                        committed,
                        refused,
                        busy,
                        paused,
                        paused_after_read,
                        paused_refused,
                    };
                }
                Some("error") => log.errors.push(line["error ".len()..].to_owned()),
                Some("s") => {
                    let v: Vec<&str> = f.collect();
                    log.sections
                        .push(parse_section(&v, worker).ok_or_else(bad)?);
                }
                Some("r") => {
                    let v: Vec<&str> = f.collect();
                    let [fields @ .., completion] = &v[..] else {
                        return Err(bad());
                    };
                    log.runs.push(Run {
                        section: parse_section(fields, worker).ok_or_else(bad)?,
                        completion: Completion::parse(completion).ok_or_else(bad)?,
                    });
                }
                Some("p") => {
                    let v: Vec<&str> = f.collect();
                    let [key, run_worker, run_task, enter] = v[..] else {
                        return Err(bad());
                    };
                    let index = |x: &str| x.parse::<usize>().map_err(|_| bad());
                    log.replays.push(Replay {
                        key: index(key)?,
                        worker,
                        run_worker: index(run_worker)?,
                        run_task: index(run_task)?,
                        run_enter_ns: enter.parse().map_err(|_| bad())?,
                    });
                }
                Some("a") => {
                    let v: Vec<&str> = f.collect();
                    let index = |x: &str| x.parse::<usize>().map_err(|_| bad());
                    let (key, at, run) = match v[..] {
                        [key, at, "unknown"] => (key, at, None),
                        [key, at, w, t, e] => (
                            key,
                            at,
                            Some((index(w)?, index(t)?, e.parse().map_err(|_| bad())?)),
                        ),
                        _ => return Err(bad()),
                    };
                    log.answers.push(Answer {
                        key: index(key)?,
                        worker,
                        at_ns: at.parse().map_err(|_| bad())?,
                        run,
                    });
                }
                Some("end") => complete = true,
                _ => return Err(bad()),
            }
        }
        if !complete {
            return Err(format!("{path:?} is incomplete (no `end` line)"));
        }
        Ok(log)
    }
}

/// A section's fields after its tag (the worker is the log's).
fn section_fields(s: &Section) -> String {
    format!(
        "{} {} {} {} {} {} {} {} {}",
        s.resource,
        s.enter_ns,
        s.leave_ns,
        s.deadline_ns,
        s.plan_ns,
        s.starved_ns,
        u8::from(s.valid),
        s.task,
        s.token.map_or_else(|| "-".to_owned(), |t| t.to_string())
    )
}

fn parse_section(v: &[&str], worker: usize) -> Option<Section> {
    let [r, enter, leave, deadline, plan, starved, valid, task, token] = v[..] else {
        return None;
    };
    Some(Section {
        resource: r.parse().ok()?,
        enter_ns: enter.parse().ok()?,
        leave_ns: leave.parse().ok()?,
        deadline_ns: deadline.parse().ok()?,
        plan_ns: plan.parse().ok()?,
        starved_ns: starved.parse().ok()?,
        valid: match valid {
            "1" => true,
            "0" => false,
            _ => return None,
        },
        worker,
        task: task.parse().ok()?,
        token: match token {
            "-" => None,
            t => Some(t.parse().ok()?),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(task: usize, token: Option<u64>) -> Section {
        Section {
            resource: 2,
            enter_ns: 1_000,
            leave_ns: 2_000,
            deadline_ns: 3_000,
            plan_ns: 1_500,
            starved_ns: -1,
            valid: task != 1,
            worker: 7,
            task,
            token,
        }
    }

    #[test]
    fn a_log_reads_back_as_written() {
        let dir = std::env::temp_dir().join(format!("checker-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("worker.log");
        let log = WorkerLog {
            counts: Counts {
                acquisitions: 3,
                contended: 1,
                warm_up_ms: 5,
                ..Counts::default()
            },
            sections: vec![
                section(0, Some(u64::MAX)),
                section(1, None),
                section(2, Some(0)),
            ],
            runs: vec![
                Run {
                    section: section(3, Some(5)),
                    completion: Completion::Minority,
                },
                Run {
                    section: section(4, None),
                    completion: Completion::Expired,
                },
            ],
            replays: vec![Replay {
                key: 2,
                worker: 7,
                run_worker: 1,
                run_task: 3,
                run_enter_ns: -4,
            }],
            answers: vec![
                Answer {
                    key: 2,
                    worker: 7,
                    at_ns: 9,
                    run: Some((1, 3, -4)),
                },
                Answer {
                    key: 3,
                    worker: 7,
                    at_ns: 10,
                    run: None,
                },
            ],
            errors: vec!["two\nlines".into()],
            store: StoreCounts {
                committed: 9,
                refused: 2,
                busy: 3,
                paused: 4,
                paused_after_read: 2,
                paused_refused: 1,
            },
        };
        log.write(&path).unwrap();
        let back = WorkerLog::read(&path, 7).unwrap();
        assert_eq!(back.sections, log.sections);
        assert_eq!(back.runs, log.runs);
        assert_eq!(back.replays, log.replays);
        assert_eq!(back.answers, log.answers);
        assert_eq!(back.counts.acquisitions, 3);
        assert_eq!(back.counts.warm_up_ms, 5);
        assert_eq!(back.errors, ["two lines"]);
        assert_eq!(back.store, log.store);

        // A section line without its token, or a truncated log, is refused.
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace(" -\n", "\n")).unwrap();
        assert!(WorkerLog::read(&path, 7).unwrap_err().contains("malformed"));
        std::fs::write(&path, text.replace("end\n", "")).unwrap();
        assert!(WorkerLog::read(&path, 7)
            .unwrap_err()
            .contains("incomplete"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
