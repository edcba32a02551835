//! The verdict: every critical section checked against every other; in the replay
//! workload, also every key's runs and every replay's record.

use std::collections::{BTreeMap, HashMap};

use super::log::{Completion, Replay, Run, Section};
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
    /// The fenced store's history (`--store`), checked after the run.
    pub store: Option<StoreVerdict>,
}

impl Verdict {
    /// Overlaps, late exits, fencing tokens out of order, double runs, phantom replays and
    /// the fenced store's writes out of token order.
    pub fn violations(&self) -> usize {
        self.overlaps.len()
            + self.late.len()
            + self.fencing.len()
            + self.double_runs.len()
            + self.phantom_replays.len()
            + self.store.as_ref().map_or(0, StoreVerdict::violations)
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
    v
}

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
