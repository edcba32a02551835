//! What the workers record — their critical sections and counts — and the log file each
//! worker writes and the parent reads back.
//!
//! The log is plain text, one record a line, fields separated by one space:
//!
//! ```text
//! counts <acquisitions> <contended> <unavailable> <other> <release errors> <warm-up ms> <elapsed ms>
//! error <message>
//! s <resource> <enter ns> <leave ns> <deadline ns> <valid 0|1> <task> <token, or - for none>
//! end
//! ```
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
    /// `Lease::is_valid()` when leaving.
    pub valid: bool,
    pub worker: usize,
    pub task: usize,
    /// The lease's fencing token (`Lease::fencing_token()`): `None` without fencing.
    pub token: Option<u64>,
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

/// One worker's log: its counts, its sections and a few error samples.
#[derive(Debug, Clone, Default)]
pub struct WorkerLog {
    pub counts: Counts,
    pub sections: Vec<Section>,
    pub errors: Vec<String>,
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
            writeln!(
                out,
                "s {} {} {} {} {} {} {}",
                s.resource,
                s.enter_ns,
                s.leave_ns,
                s.deadline_ns,
                u8::from(s.valid),
                s.task,
                s.token.map_or_else(|| "-".to_owned(), |t| t.to_string())
            )?;
        }
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
                Some("error") => log.errors.push(line["error ".len()..].to_owned()),
                Some("s") => {
                    let v: Vec<&str> = f.collect();
                    let [r, enter, leave, deadline, valid, task, token] = v[..] else {
                        return Err(bad());
                    };
                    let int = |x: &str| x.parse::<i64>().map_err(|_| bad());
                    let index = |x: &str| x.parse::<usize>().map_err(|_| bad());
                    log.sections.push(Section {
                        resource: index(r)?,
                        enter_ns: int(enter)?,
                        leave_ns: int(leave)?,
                        deadline_ns: int(deadline)?,
                        valid: match valid {
                            "1" => true,
                            "0" => false,
                            _ => return Err(bad()),
                        },
                        worker,
                        task: index(task)?,
                        token: match token {
                            "-" => None,
                            t => Some(t.parse().map_err(|_| bad())?),
                        },
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

#[cfg(test)]
mod tests {
    use super::*;

    fn section(task: usize, token: Option<u64>) -> Section {
        Section {
            resource: 2,
            enter_ns: 1_000,
            leave_ns: 2_000,
            deadline_ns: 3_000,
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
            errors: vec!["two\nlines".into()],
        };
        log.write(&path).unwrap();
        let back = WorkerLog::read(&path, 7).unwrap();
        assert_eq!(back.sections, log.sections);
        assert_eq!(back.counts.acquisitions, 3);
        assert_eq!(back.counts.warm_up_ms, 5);
        assert_eq!(back.errors, ["two lines"]);

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
