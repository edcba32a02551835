//! The durable mode's parent side: the workers' answers read as they come (the claims
//! answered, the fail points' kills counted as faults), and the parent's own kills.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{DurableAnswer, Line, Tail};
use crate::checker::clock;
use crate::checker::faults::FaultCounts;

/// How often the answers files are read.
const POLL: Duration = Duration::from_millis(200);

/// The answers of every worker so far.
pub(in crate::checker) struct Progress {
    dir: PathBuf,
    processes: usize,
    tail: Tail,
    next_poll: Instant,
    pub(in crate::checker) answers: Vec<DurableAnswer>,
    /// Claims answered for good (runs, replays, completed-not-stored).
    pub(in crate::checker) answered: u64,
}

/// Worker `id`'s answers file in `dir`.
pub(in crate::checker) fn answers_path(dir: &Path, id: usize) -> PathBuf {
    dir.join(format!("worker-{id}.answers"))
}

impl Progress {
    pub(in crate::checker) fn new(dir: &Path, processes: usize) -> Self {
        Self {
            dir: dir.to_owned(),
            processes,
            tail: Tail::default(),
            next_poll: Instant::now(),
            answers: Vec::new(),
            answered: 0,
        }
    }

    /// Reads what the workers appended (at most every [`POLL`] unless `now`), counting each
    /// fail point's kill as a fault (`kill-after-commit`, `kill-after-row`).
    pub(in crate::checker) fn poll(&mut self, counts: &Mutex<FaultCounts>, now: bool) {
        if !now && Instant::now() < self.next_poll {
            return;
        }
        self.next_poll = Instant::now() + POLL;
        for id in 0..self.processes {
            for line in self.tail.poll(id, &answers_path(&self.dir, id)) {
                match line {
                    Line::Answer(a) => {
                        self.answered += u64::from(a.outcome.answered());
                        self.answers.push(a);
                    }
                    Line::Killed(point) => {
                        let kind = match point {
                            "commit" => "kill-after-commit",
                            _ => "kill-after-row",
                        };
                        let at = clock::now_ns();
                        let mut counts = counts.lock().unwrap_or_else(|p| p.into_inner());
                        counts.add(kind, &[], at, format!("worker {id}"));
                    }
                }
            }
        }
    }
}

/// When the parent SIGKILLs a worker next: every 0.3–1.5 s.
pub(in crate::checker) struct Killer {
    rng: fastrand::Rng,
    next: Instant,
}

impl Killer {
    pub(in crate::checker) fn new() -> Self {
        let mut rng = fastrand::Rng::new();
        // The workers' warm-up first.
        let next = Instant::now() + Duration::from_millis(rng.u64(800..=1500));
        Self { rng, next }
    }

    /// Whether it is time; then the next time is drawn.
    pub(in crate::checker) fn due(&mut self) -> bool {
        if Instant::now() < self.next {
            return false;
        }
        self.next = Instant::now() + Duration::from_millis(self.rng.u64(300..=1500));
        true
    }

    pub(in crate::checker) fn rng(&mut self) -> &mut fastrand::Rng {
        &mut self.rng
    }
}
