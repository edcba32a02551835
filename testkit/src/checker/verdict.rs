//! The verdict: every critical section checked against every other; in the replay
//! workload, also every key's runs and every replay's record.

use std::collections::{BTreeMap, HashMap};

use super::durable::DurableVerdict;
use super::log::{Answer, Completion, Replay, Run, Section};
use super::store::StoreVerdict;

/// What the merged logs show.
#[derive(Debug, Clone, Default)]
pub struct Verdict {
    pub sections: usize,
    /// Pairs of sections on one resource that overlap: (earlier, later).
    pub overlaps: Vec<(Section, Section)>,
    /// Sections that left at or after their lease deadline, or whose lease was not valid
    /// when they left, and were neither [`paused`](Self::paused) nor
    /// [`expired on arrival`](Self::expired_on_arrival): they began work their validity did
    /// not cover, or overran it with their own code (a blocking call holding the thread). A
    /// violation.
    pub late: Vec<Section>,
    /// Sections that left at or after their deadline though they had planned to leave
    /// before it (they checked the validity had room for their work), and whose thread
    /// waited for a CPU — runnable, not run by the machine — at least as long as they
    /// overran: a starved, that is paused, process. Redlock cannot stop a paused process —
    /// the lock promises nothing after its deadline, fencing tokens do — so this is counted,
    /// not a violation: the part before the deadline is checked for overlaps, and the token
    /// order holds in full. Without that evidence (or where the system gives none) an
    /// overrun is late.
    pub paused: Vec<Section>,
    /// Sections that reached their entry at or after their deadline and left at once,
    /// doing nothing: the lease came back valid — the library checks its validity as it
    /// returns it, and never returns one without (`an_acquisition_slower_than_the_ttl_never_returns_a_lease`)
    /// — but the worker's thread was descheduled between that check and the entry (seen
    /// beside a CPU hog: 3 to 45 ms late, part of it inside the library's last poll, where
    /// no evidence of starvation can look). Not a violation: such a section did nothing and
    /// covers nothing (checked as empty, at its deadline, for overlaps and token order).
    /// Many of them mean the machine did not run the workers (the report then fails the run).
    pub expired_on_arrival: Vec<Section>,
    /// Sections that carried a fencing token: each was checked against the earlier ones.
    pub fenced: usize,
    /// Sections without a fencing token. Not a violation by itself (without fencing there
    /// are none); the report calls them a problem when the run had fencing on.
    pub unfenced: Vec<Section>,
    /// Fencing tokens out of order on one resource: (the earlier section with the largest
    /// token so far, a later section whose token is not larger).
    pub fencing: Vec<(Section, Section)>,
    /// The smallest `deadline − leave` seen: how close a section came to its deadline.
    pub min_margin_ns: Option<i64>,
    /// The smallest gap between one holder's exit and the next holder's entry.
    pub min_handover_ns: Option<i64>,
    /// The smallest rise of a resource's token from one section to the next (1: the
    /// counters decided; large: the masters' clocks, in µs, did).
    pub min_token_step: Option<u64>,
    /// The replay workload: runs of the handler (each also a section above, its resource
    /// the key).
    pub runs: usize,
    /// Two runs for one key: (the first, a later one). The work ran twice.
    pub double_runs: Vec<(Run, Run)>,
    /// Replays whose record names no run of that key (a record nobody stored).
    pub phantom_replays: Vec<Replay>,
    /// Claims answered with a record.
    pub replays: usize,
    /// Replays of a run whose completion missed its quorum at first (the record reached a
    /// quorum later, in the background, or the replaying claim found a minority's copy).
    pub replays_of_minority: usize,
    /// How the runs' completions ended.
    pub completions: BTreeMap<Completion, usize>,
    /// The lost-lease mode (`--nemesis lost`): duplicates' answers (replays and
    /// outcome-unknown).
    pub answers: usize,
    /// Answers that differ from their key's first answer, but for the case below: (the
    /// first, a later one). A violation.
    pub differing_answers: Vec<(Answer, Answer)>,
    /// Of the answers that differ, those where a first answer from a lost lease's record
    /// turned into outcome-unknown once another lost lease of the key — one that left
    /// before the later answer, and whose record could still be on its way when the first
    /// was given (the middleware tries for 30 s after the handler's exit) — stored a record
    /// that differs: what the copy of a rule-5 answer prevents (`src/lock/records.rs`; the
    /// library before it, `890a05b`, showed 52 in 20,000 claims). A violation too, counted
    /// apart.
    pub changed_by_a_later_lost_lease: Vec<(Answer, Answer)>,
    /// Runs whose lease was lost (not valid when the handler left, or its completion came
    /// after the deadline): their part before the deadline is checked; a later run of the
    /// key is not a double run.
    pub lost_runs: usize,
    /// The fenced store's history (`--store`), checked after the run.
    pub store: Option<StoreVerdict>,
    /// The durable mode's business rows and answers (`--workload replay --store postgres`),
    /// checked after the run.
    pub durable: Option<DurableVerdict>,
}

impl Verdict {
    /// Overlaps, late exits, fencing tokens out of order, double runs, phantom replays,
    /// the fenced store's writes out of token order and the durable mode's double runs and
    /// phantom answers.
    pub fn violations(&self) -> usize {
        self.overlaps.len()
            + self.late.len()
            + self.fencing.len()
            + self.double_runs.len()
            + self.phantom_replays.len()
            + self.differing_answers.len()
            + self.changed_by_a_later_lost_lease.len()
            + self.store.as_ref().map_or(0, StoreVerdict::violations)
            + self.durable.as_ref().map_or(0, DurableVerdict::violations)
    }
}

/// Checks the replay workload's logs: the runs as sections (overlapping runs of one key,
/// late exits, tokens), and then that no key ran twice — whenever the runs happened — and
/// that every replay's record names a run of its key.
pub fn check_runs(mut runs: Vec<Run>, replays: &[Replay]) -> Verdict {
    let mut v = check(runs.iter().map(|r| r.section).collect());
    v.runs = runs.len();
    v.replays = replays.len();
    for r in &runs {
        *v.completions.entry(r.completion).or_default() += 1;
    }
    runs.sort_by_key(|r| (r.section.resource, r.section.enter_ns));
    // Every run after the first of its key is a double run, paired with that first one.
    let mut first: Option<Run> = None;
    for r in &runs {
        match first {
            Some(f) if f.section.resource == r.section.resource => v.double_runs.push((f, *r)),
            _ => first = Some(*r),
        }
    }
    check_replays(&runs, replays, &mut v);
    v
}

/// Every replay's record must name a run of its key.
fn check_replays(runs: &[Run], replays: &[Replay], v: &mut Verdict) {
    let by_run: HashMap<(usize, usize, usize, i64), Completion> = runs
        .iter()
        .map(|r| {
            let s = &r.section;
            ((s.resource, s.worker, s.task, s.enter_ns), r.completion)
        })
        .collect();
    for p in replays {
        match by_run.get(&(p.key, p.run_worker, p.run_task, p.run_enter_ns)) {
            None => v.phantom_replays.push(*p),
            Some(Completion::Minority) => v.replays_of_minority += 1,
            Some(_) => {}
        }
    }
}

/// Checks the lost-lease mode's logs (`--nemesis lost`): a run whose lease was lost
/// ([`Completion::Lost`]) is checked for the part before its deadline only (overlaps,
/// tokens) and lets its key run again — the lock promised nothing past its deadline —
/// but a run after one completed under a valid lease is a double run; every replay names
/// a run of its key; and every duplicate's answer is the key's first answer (in the order
/// they came, on the shared clock).
pub fn check_lost_runs(mut runs: Vec<Run>, replays: &[Replay], answers: &[Answer]) -> Verdict {
    let covered = runs
        .iter()
        .map(|r| {
            let mut s = r.section;
            if r.completion == Completion::Lost {
                // What the lock covered: the run until its deadline.
                s.leave_ns = s.leave_ns.min(s.deadline_ns - 1).max(s.enter_ns);
                s.plan_ns = s.plan_ns.min(s.leave_ns);
                s.valid = true;
            }
            s
        })
        .collect();
    let mut v = check(covered);
    v.runs = runs.len();
    v.replays = replays.len();
    v.answers = answers.len();
    for r in &runs {
        *v.completions.entry(r.completion).or_default() += 1;
        v.lost_runs += usize::from(r.completion == Completion::Lost);
    }
    runs.sort_by_key(|r| (r.section.resource, r.section.enter_ns));
    // Per key, the first run that completed under a valid lease: any later run is a
    // double run.
    let mut done: Option<Run> = None;
    for r in &runs {
        match done {
            Some(f) if f.section.resource == r.section.resource => v.double_runs.push((f, *r)),
            _ if r.completion != Completion::Lost => done = Some(*r),
            _ => done = None,
        }
    }
    check_replays(&runs, replays, &mut v);
    let lost: HashMap<(usize, usize, usize, i64), i64> = runs
        .iter()
        .filter(|r| r.completion == Completion::Lost)
        .map(|r| {
            let s = &r.section;
            ((s.resource, s.worker, s.task, s.enter_ns), s.leave_ns)
        })
        .collect();
    let mut answers = answers.to_vec();
    answers.sort_by_key(|a| (a.key, a.at_ns));
    let mut first: Option<Answer> = None;
    for a in answers {
        match first {
            Some(f) if f.key == a.key => {
                if f.run == a.run {
                    continue;
                }
                let residual = match (f.run, a.run) {
                    (Some((w, t, e)), None) => {
                        lost.contains_key(&(f.key, w, t, e))
                            && lost.iter().any(|(&(k, lw, lt, le), &leave)| {
                                k == f.key
                                    && (lw, lt, le) != (w, t, e)
                                    && leave <= a.at_ns
                                    && leave + LOST_RECORD_PATIENCE_NS >= f.at_ns
                            })
                    }
                    _ => false,
                };
                if residual {
                    v.changed_by_a_later_lost_lease.push((f, a));
                } else {
                    v.differing_answers.push((f, a));
                }
            }
            _ => first = Some(a),
        }
    }
    v
}

/// How long the middleware goes on storing a lost lease's record after the handler's exit
/// (its `LOST_RECORD_PATIENCE`, 30 s — three ttls if longer; the checker's ttls are short).
const LOST_RECORD_PATIENCE_NS: i64 = 30_000_000_000;

/// Checks the merged sections: no overlap on any resource, every exit before its deadline
/// (a section that planned to leave in time and was starved past it is counted as paused,
/// one that reached its entry after its deadline and left at once as expired on arrival,
/// its part before the deadline checked for overlaps), and the fencing tokens of each resource strictly increasing in the order the sections
/// were entered (sections without a token are skipped there, and listed).
pub fn check(mut sections: Vec<Section>) -> Verdict {
    let mut v = Verdict {
        sections: sections.len(),
        ..Verdict::default()
    };
    for s in &mut sections {
        let overrun = s.leave_ns - s.deadline_ns;
        if s.enter_ns >= s.deadline_ns && s.plan_ns == s.enter_ns {
            v.expired_on_arrival.push(*s);
            // What the lock covered: nothing.
            (s.enter_ns, s.leave_ns) = (s.deadline_ns, s.deadline_ns);
        } else if overrun >= 0 && s.plan_ns < s.deadline_ns && s.starved_ns >= overrun {
            v.paused.push(*s);
            // What the lock covered: the section until its deadline.
            s.leave_ns = s.deadline_ns;
        } else if overrun >= 0 || !s.valid {
            v.late.push(*s);
        }
        let margin = s.deadline_ns - s.leave_ns;
        v.min_margin_ns = Some(v.min_margin_ns.map_or(margin, |m| m.min(margin)));
        match s.token {
            Some(_) => v.fenced += 1,
            None => v.unfenced.push(*s),
        }
    }
    sections.sort_by_key(|s| (s.resource, s.enter_ns, s.leave_ns));
    // Per resource, the section that left last so far: a later entry before its exit is an
    // overlap (comparing with the latest exit, not just the previous one, also catches a
    // section nested inside a long one).
    let mut last: Option<Section> = None;
    // Per resource, the section with the largest token so far: a later token must exceed
    // it (not just the previous one: 5, 3, 4 is two violations, 3 and 4 both come after 5).
    let mut top: Option<Section> = None;
    for s in sections {
        match last {
            Some(l) if l.resource == s.resource => {
                let gap = s.enter_ns - l.leave_ns;
                if gap < 0 {
                    v.overlaps.push((l, s));
                } else {
                    v.min_handover_ns = Some(v.min_handover_ns.map_or(gap, |m| m.min(gap)));
                }
                if s.leave_ns > l.leave_ns {
                    last = Some(s);
                }
            }
            _ => {
                last = Some(s);
                top = None;
            }
        }
        let Some(token) = s.token else { continue };
        match top.and_then(|t| Some((t, t.token?))) {
            Some((t, max)) if token <= max => v.fencing.push((t, s)),
            Some((_, max)) => {
                let step = token - max;
                v.min_token_step = Some(v.min_token_step.map_or(step, |m| m.min(step)));
                top = Some(s);
            }
            None => top = Some(s),
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: i64 = 1_000_000;

    /// A run of key 7 by `task`, entered at `enter` ms, for 10 ms, its deadline at 100 ms.
    fn run(task: usize, enter: i64, completion: Completion) -> Run {
        Run {
            section: Section {
                resource: 7,
                enter_ns: enter * MS,
                leave_ns: (enter + 10) * MS,
                deadline_ns: (enter + 100) * MS,
                plan_ns: enter * MS,
                starved_ns: -1,
                valid: completion != Completion::Lost,
                worker: 0,
                task,
                token: Some(enter as u64),
            },
            completion,
        }
    }

    fn answer(at: i64, run: Option<&Run>) -> Answer {
        Answer {
            key: 7,
            worker: 1,
            at_ns: at * MS,
            run: run.map(|r| (r.section.worker, r.section.task, r.section.enter_ns)),
        }
    }

    /// A lost run lets its key run again; a run completed under a valid lease does not.
    #[test]
    fn a_run_after_a_lost_one_is_no_double_run_after_a_stored_one_it_is() {
        let (a, b, c) = (
            run(0, 0, Completion::Lost),
            run(1, 200, Completion::Stored),
            run(2, 400, Completion::Stored),
        );
        let v = check_lost_runs(vec![a, b, c], &[], &[]);
        assert_eq!(v.double_runs, [(b, c)]);
        assert_eq!(v.lost_runs, 1);
        assert_eq!(v.overlaps.len() + v.late.len(), 0);
    }

    /// Every answer must be the key's first; a lost lease's record answered, then
    /// outcome-unknown once another lost lease's record landed, is counted apart.
    #[test]
    fn answers_that_differ_from_the_first_are_violations() {
        let (a, b) = (run(0, 0, Completion::Stored), run(1, 200, Completion::Lost));
        let replay_a = answer(300, Some(&a));
        let v = check_lost_runs(
            vec![a, b],
            &[],
            &[replay_a, answer(400, Some(&a)), answer(500, None)],
        );
        assert_eq!(v.differing_answers, [(replay_a, answer(500, None))]);
        assert_eq!(v.violations(), 2, "a double run (b after a) and the answer");

        let (a, b) = (run(0, 0, Completion::Lost), run(1, 200, Completion::Lost));
        let first = answer(250, Some(&a));
        let v = check_lost_runs(vec![a, b], &[], &[first, answer(500, None)]);
        assert!(v.differing_answers.is_empty());
        assert_eq!(
            v.changed_by_a_later_lost_lease,
            [(first, answer(500, None))]
        );
        assert_eq!(v.violations(), 1);

        // The other way round — unknown first, a record later — is never the residual.
        let v = check_lost_runs(vec![a, b], &[], &[answer(250, None), answer(500, Some(&b))]);
        assert_eq!(v.differing_answers.len(), 1);
    }
}
