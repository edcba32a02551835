//! The outcome of a run: its problems and the summary table.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use super::clock::nanos;
use super::faults::FaultCounts;
use super::log::{Completion, Counts, Section, WorkerLog};
use super::settings::{Settings, Workload};
use super::verdict::Verdict;
use super::{MASTERS, MAX_AFFECTED};

/// How many faults the report lists around one violation.
const FAULTS_LISTED: usize = 40;

/// The outcome of a run.
#[derive(Debug)]
pub struct Report {
    pub settings: Settings,
    /// One line per voter (what it was, its clock offset).
    pub voters: Vec<String>,
    pub logs: Vec<WorkerLog>,
    /// Workers that did not exit cleanly, with what they said.
    pub failed_workers: Vec<String>,
    pub faults: FaultCounts,
    pub verdict: Verdict,
    pub elapsed: Duration,
    /// Kept on failure, removed on success.
    pub dir: PathBuf,
}

/// How many paused sections a run may have (or 1 % of its sections, if more) before it
/// says the machine starved it too much to show anything.
const MAX_PAUSED: usize = 10;

impl Report {
    pub fn total(&self) -> Counts {
        let mut t = Counts::default();
        for l in &self.logs {
            let c = &l.counts;
            t.acquisitions += c.acquisitions;
            t.contended += c.contended;
            t.unavailable += c.unavailable;
            t.other += c.other;
            t.release_errors += c.release_errors;
            t.warm_up_ms = t.warm_up_ms.max(c.warm_up_ms);
            t.elapsed_ms = t.elapsed_ms.max(c.elapsed_ms);
        }
        t
    }

    /// Everything that makes the run fail; empty when it passed.
    pub fn problems(&self) -> Vec<String> {
        let mut p = Vec::new();
        for w in &self.failed_workers {
            p.push(format!("worker failed: {w}"));
        }
        let t = self.total();
        let done = t.acquisitions + self.verdict.replays.max(self.verdict.answers) as u64;
        if done < self.settings.acquisitions {
            // The machine ran the workload too slowly (every section still checked): a
            // scenario it could not set up, not a broken promise.
            p.push(format!(
                "could not set up the scenario: only {done} of {} {} within {:?} (a machine \
                 too busy for the workload; the sections that ran were checked)",
                self.settings.acquisitions,
                self.what(),
                self.settings.time_limit
            ));
        }
        if t.other > 0 {
            let samples: Vec<_> = self.logs.iter().flat_map(|l| l.errors.iter()).collect();
            p.push(format!(
                "{} unexpected lock errors, e.g. {samples:?}",
                t.other
            ));
        }
        for (a, b) in self.verdict.overlaps.iter().take(10) {
            p.push(format!(
                "OVERLAP on resource {}: worker {} task {} held [{}, {}] ns, worker {} task {} \
                 entered at {} ns ({} µs before the first left)",
                a.resource,
                a.worker,
                a.task,
                a.enter_ns,
                a.leave_ns,
                b.worker,
                b.task,
                b.enter_ns,
                (a.leave_ns - b.enter_ns) / 1000
            ));
            p.push(format!("  faults around it: {}", self.faults_around(a, b)));
        }
        for (a, b) in self.verdict.fencing.iter().take(10) {
            let token = |s: &Section| s.token.map_or("none".into(), |t| t.to_string());
            p.push(format!(
                "FENCING TOKEN OUT OF ORDER on resource {}: worker {} task {} held [{}, {}] ns \
                 with token {}, then worker {} task {} held [{}, {}] ns ({} µs after the first \
                 left) with token {}",
                a.resource,
                a.worker,
                a.task,
                a.enter_ns,
                a.leave_ns,
                token(a),
                b.worker,
                b.task,
                b.enter_ns,
                b.leave_ns,
                (b.enter_ns - a.leave_ns) / 1000,
                token(b),
            ));
            p.push(format!("  faults around it: {}", self.faults_around(a, b)));
        }
        let unfenced = &self.verdict.unfenced;
        if self.settings.fencing && !unfenced.is_empty() {
            let samples: Vec<String> = unfenced
                .iter()
                .take(5)
                .map(|s| {
                    format!(
                        "worker {} task {} on resource {} at {} ns",
                        s.worker, s.task, s.resource, s.enter_ns
                    )
                })
                .collect();
            p.push(format!(
                "{} of {} sections carry no fencing token though fencing is on, e.g. {}",
                unfenced.len(),
                self.verdict.sections,
                samples.join("; ")
            ));
        }
        for s in self.verdict.late.iter().take(10) {
            p.push(format!(
                "LATE: worker {} task {} left resource {} {} µs after its lease deadline \
                 (planned {} µs before it; its thread waited {} µs for a CPU; is_valid: {})",
                s.worker,
                s.task,
                s.resource,
                (s.leave_ns - s.deadline_ns) / 1000,
                (s.deadline_ns - s.plan_ns) / 1000,
                s.starved_ns / 1000,
                s.valid
            ));
        }
        // A few starved sections are a loaded machine; many mean the run showed little.
        let paused = self.verdict.paused.len();
        if paused > MAX_PAUSED.max(self.verdict.sections / 100) {
            p.push(format!(
                "could not set up the scenario: {paused} of {} sections were starved past \
                 their deadline (paused): the machine did not run the workers enough",
                self.verdict.sections
            ));
        }
        let expired = self.verdict.expired_on_arrival.len();
        if expired > MAX_PAUSED.max(self.verdict.sections / 100) {
            p.push(format!(
                "could not set up the scenario: {expired} of {} sections reached their entry \
                 after their deadline (expired on arrival): the machine did not run the \
                 workers enough — or the library returned leases without validity",
                self.verdict.sections
            ));
        }
        for (a, b) in self.verdict.double_runs.iter().take(10) {
            let (x, y) = (&a.section, &b.section);
            p.push(format!(
                "DOUBLE RUN of key {}: worker {} task {} ran it [{}, {}] ns (completion: {}), \
                 then worker {} task {} ran it again at {} ns ({} ms after the first left; \
                 completion: {})",
                x.resource,
                x.worker,
                x.task,
                x.enter_ns,
                x.leave_ns,
                a.completion.name(),
                y.worker,
                y.task,
                y.enter_ns,
                (y.enter_ns - x.leave_ns) / 1_000_000,
                b.completion.name()
            ));
            p.push(format!("  faults around it: {}", self.faults_around(x, y)));
        }
        let v = &self.verdict;
        let differing = v.differing_answers.iter();
        for (a, b) in differing.chain(&v.changed_by_a_later_lost_lease).take(10) {
            let say = |x: &super::log::Answer| {
                x.run.map_or("outcome unknown".to_owned(), |(w, t, e)| {
                    format!("the run of worker {w} task {t} at {e} ns")
                })
            };
            p.push(format!(
                "DIFFERING ANSWERS for key {}: worker {} was answered at {} ns with {}, then \
                 worker {} at {} ns ({} ms later) with {}",
                a.key,
                a.worker,
                a.at_ns,
                say(a),
                b.worker,
                b.at_ns,
                (b.at_ns - a.at_ns) / 1_000_000,
                say(b)
            ));
        }
        for r in self.verdict.phantom_replays.iter().take(10) {
            p.push(format!(
                "PHANTOM REPLAY: worker {} was answered for key {} with a record naming a run \
                 (worker {} task {} at {} ns) that no log has",
                r.worker, r.key, r.run_worker, r.run_task, r.run_enter_ns
            ));
        }
        if let Some(st) = &self.verdict.store {
            for (a, b) in st.out_of_order.iter().take(10) {
                p.push(format!(
                    "STORE WRITE OUT OF TOKEN ORDER on {}: history row {} (worker {} task {}) \
                     committed fence {}, then row {} (worker {} task {}) committed fence {}",
                    b.resource,
                    a.seq,
                    a.process,
                    a.task,
                    a.fence,
                    b.seq,
                    b.process,
                    b.task,
                    b.fence
                ));
            }
            for (a, b) in st.not_increased.iter().take(10) {
                p.push(format!(
                    "STORE WRITER CHANGED WITHOUT A LARGER FENCE on {}: history row {} (worker \
                     {} task {}) fence {}, then row {} (worker {} task {}) fence {}",
                    b.resource,
                    a.seq,
                    a.process,
                    a.task,
                    a.fence,
                    b.seq,
                    b.process,
                    b.task,
                    b.fence
                ));
            }
            for (a, b) in st.lost.iter().take(10) {
                p.push(format!(
                    "STORE WRITE LOST on {}: history row {} (worker {} task {}, fence {}) wrote \
                     {}, then row {} (worker {} task {}, fence {}) read {} — the first write is \
                     not in the final value's lineage",
                    b.resource,
                    a.seq,
                    a.process,
                    a.task,
                    a.fence,
                    a.before + 1,
                    b.seq,
                    b.process,
                    b.task,
                    b.fence,
                    b.before
                ));
            }
            let c = &st.counts;
            if st.history as u64 != c.committed || st.row_writes != st.history as i64 {
                p.push(format!(
                    "the fenced store's history has {} rows, its rows count {} writes, the \
                     workers committed {}: they must agree",
                    st.history, st.row_writes, c.committed
                ));
            }
            if c.committed == 0 {
                p.push("no write committed to the fenced store: nothing was checked".into());
            }
            if c.paused_after_read == 0 || c.paused_after_read == c.paused {
                p.push(format!(
                    "could not set up the scenario: {} writes paused, {} of them after their \
                     read: both pauses (before the read, after it) must happen",
                    c.paused, c.paused_after_read
                ));
            }
            if c.paused_refused == 0 {
                p.push(format!(
                    "no paused writer was refused by the fenced store ({} paused writes): the \
                     run could not have failed",
                    c.paused
                ));
            }
        }
        if let Some(d) = &self.verdict.durable {
            d.problems(&mut p);
        }
        if self.faults.total() == 0 {
            p.push("no fault was injected: the run was too short to test anything".into());
        }
        let min = self.settings.min_faults;
        for kind in &self.settings.nemesis {
            for group in kind.evidence(self.settings.restarts()) {
                let n = self.faults.count_of(group);
                if n < min {
                    p.push(format!(
                        "the {} nemesis injected {n} {} faults, fewer than --min-faults {min}",
                        kind.name(),
                        group.join("/")
                    ));
                }
            }
        }
        p
    }

    /// What the run counts: acquisitions, or claims.
    fn what(&self) -> &'static str {
        match self.settings.workload {
            Workload::Lock => "acquisitions",
            Workload::Replay => "claims",
        }
    }

    /// The faults active from a ttl before `a` entered (its lock was being taken) until `b`
    /// left, with times in ms relative to `a`'s entry — or, when `b` came more than a few
    /// ttls after `a` (a key run again much later), those around each of them.
    fn faults_around(&self, a: &Section, b: &Section) -> String {
        let ttl = nanos(self.settings.ttl);
        if b.enter_ns - a.leave_ns <= 4 * ttl {
            return self.faults_in(a.enter_ns - ttl, a.leave_ns.max(b.leave_ns), a.enter_ns);
        }
        // The first one's lock and its record's fate (its completion may go on for a ttl
        // past the validity), then the second one's claim.
        format!(
            "around the first: {}; around the second: {}",
            self.faults_in(a.enter_ns - ttl, a.deadline_ns + 2 * ttl, a.enter_ns),
            self.faults_in(b.enter_ns - ttl, b.leave_ns, a.enter_ns)
        )
    }

    /// The faults active at some moment of `[from, to]` (the run-long `skew` spans left
    /// out: the voter list shows the offsets), at most [`FAULTS_LISTED`]. Times in ms
    /// relative to `origin`.
    fn faults_in(&self, from: i64, to: i64, origin: i64) -> String {
        let ms = |ns: i64| format!("{:+.1}", (ns - origin) as f64 / 1e6);
        let all: Vec<_> = self
            .faults
            .during(from, to)
            .filter(|f| f.kind != "skew")
            .collect();
        let more = all.len().saturating_sub(FAULTS_LISTED);
        let active: Vec<String> = all
            .into_iter()
            .take(FAULTS_LISTED)
            .map(|f| {
                let masters: Vec<String> = f.masters.iter().map(usize::to_string).collect();
                format!(
                    "{} of voter {} [{}, {}] ms{}{}",
                    f.kind,
                    masters.join("+"),
                    ms(f.from_ns),
                    ms(f.to_ns),
                    if f.detail.is_empty() { "" } else { " " },
                    f.detail
                )
            })
            .chain((more > 0).then(|| format!("… and {more} more (see faults.log)")))
            .collect();
        if active.is_empty() {
            "none (times relative to the first section's entry)".into()
        } else {
            format!(
                "{} (times relative to the first section's entry)",
                active.join("; ")
            )
        }
    }

    /// The summary table.
    pub fn summary(&self) -> String {
        let s = &self.settings;
        let t = self.total();
        let v = &self.verdict;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "checker: {} processes × {} tasks, {MASTERS} voters (≤ {MAX_AFFECTED} faulty at once), \
             {} workload{}, ttl {:?}, node timeout {:?}, nemesis {}{}{}",
            s.processes,
            s.tasks,
            s.workload.name(),
            match s.workload {
                Workload::Lock => format!(" on {} resources", s.resources),
                Workload::Replay => String::new(),
            },
            s.ttl,
            s.node_timeout,
            s.nemesis_names(),
            s.broken
                .map_or(String::new(), |b| format!(", BROKEN CLIENT {}", b.name())),
            s.store.map_or(String::new(), |st| match s.durable() {
                true => format!(", durable: key rows in {}", st.name()),
                false => format!(", fenced {} store", st.name()),
            })
        );
        for voter in &self.voters {
            let _ = writeln!(out, "  {voter}");
        }
        let row = |out: &mut String, name: &str, value: String| {
            let _ = writeln!(out, "  {name:<18} {value}");
        };
        let done = t.acquisitions + v.replays.max(v.answers) as u64;
        row(
            &mut out,
            self.what(),
            format!(
                "{done} (target {}, {:.0}/s)",
                s.acquisitions,
                done as f64 / self.elapsed.as_secs_f64().max(1e-9)
            ),
        );
        if s.workload == Workload::Replay && !s.durable() {
            row(&mut out, "runs", v.runs.to_string());
            row(&mut out, "replays", v.replays.to_string());
            let completions: Vec<String> = Completion::ALL
                .iter()
                .filter_map(|c| v.completions.get(c).map(|n| format!("{} {n}", c.name())))
                .collect();
            row(&mut out, "completions", completions.join(", "));
            row(
                &mut out,
                "minority replayed",
                format!(
                    "{} (replays of a record that missed its quorum at first)",
                    v.replays_of_minority
                ),
            );
        }
        row(&mut out, "contended", t.contended.to_string());
        row(&mut out, "unavailable", t.unavailable.to_string());
        row(&mut out, "other errors", t.other.to_string());
        row(&mut out, "release errors", t.release_errors.to_string());
        let kinds: Vec<_> = self
            .faults
            .by_kind
            .iter()
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        row(
            &mut out,
            "faults injected",
            format!("{} ({})", self.faults.total(), kinds.join(", ")),
        );
        row(&mut out, "overlaps", v.overlaps.len().to_string());
        row(&mut out, "late exits", v.late.len().to_string());
        let late_by = v
            .expired_on_arrival
            .iter()
            .map(|s| s.enter_ns - s.deadline_ns)
            .max();
        row(
            &mut out,
            "expired on arrival",
            format!(
                "{} (reached their section after its deadline, left at once; latest {} past \
                 it: not a violation, they did nothing)",
                v.expired_on_arrival.len(),
                late_by.map_or("-".into(), |n| format!("{:.3} ms", n as f64 / 1e6))
            ),
        );
        let overrun = v.paused.iter().map(|s| s.leave_ns - s.deadline_ns).max();
        row(
            &mut out,
            "paused sections",
            format!(
                "{} (left after their deadline, starved past their margin; longest {} past \
                 it: not a violation, the part before the deadline checked)",
                v.paused.len(),
                overrun.map_or("-".into(), |n| format!("{:.3} ms", n as f64 / 1e6))
            ),
        );
        row(
            &mut out,
            "fenced sections",
            if s.fencing {
                format!(
                    "{} of {} (tokens checked per resource, in entry order)",
                    v.fenced, v.sections
                )
            } else {
                format!("{} (fencing off)", v.fenced)
            },
        );
        row(&mut out, "token violations", v.fencing.len().to_string());
        if let Some(d) = &v.durable {
            d.summary(&mut out);
        } else if s.workload == Workload::Replay {
            row(&mut out, "double runs", v.double_runs.len().to_string());
            row(
                &mut out,
                "phantom replays",
                v.phantom_replays.len().to_string(),
            );
        }
        if s.lost_leases() {
            row(
                &mut out,
                "lost runs",
                format!(
                    "{} (their lease lost while they ran: checked until their deadline, and \
                     their key may run again)",
                    v.lost_runs
                ),
            );
            row(
                &mut out,
                "answers",
                format!(
                    "{} (duplicates answered: replays, outcome-unknown)",
                    v.answers
                ),
            );
            row(
                &mut out,
                "changed answers",
                format!(
                    "{} (a first answer from a lost lease's record, outcome-unknown after a \
                     later lost lease's record: what the copy of a rule-5 answer prevents)",
                    v.changed_by_a_later_lost_lease.len()
                ),
            );
            row(
                &mut out,
                "differing answers",
                format!(
                    "{} (a duplicate answered unlike its key's first answer)",
                    v.differing_answers.len()
                ),
            );
        }
        if let Some(st) = &v.store {
            let c = &st.counts;
            row(
                &mut out,
                "store writes",
                format!(
                    "{} committed, {} refused, {} busy ({} history rows, {} in the final values)",
                    c.committed, c.refused, c.busy, st.history, st.row_writes
                ),
            );
            row(
                &mut out,
                "paused writes",
                format!(
                    "{} (past the ttl: {} before the read, {} after it), {} refused",
                    c.paused,
                    c.paused.saturating_sub(c.paused_after_read),
                    c.paused_after_read,
                    c.paused_refused
                ),
            );
            row(
                &mut out,
                "store violations",
                format!(
                    "{} out of token order, {} writer changes without a larger fence, {} lost \
                     writes",
                    st.out_of_order.len(),
                    st.not_increased.len(),
                    st.lost.len()
                ),
            );
        }
        row(
            &mut out,
            "min token step",
            v.min_token_step.map_or("-".into(), |n| n.to_string()),
        );
        row(&mut out, "violations", v.violations().to_string());
        let ms = |ns: Option<i64>| ns.map_or("-".into(), |n| format!("{:.3} ms", n as f64 / 1e6));
        row(&mut out, "min deadline margin", ms(v.min_margin_ns));
        row(&mut out, "min handover gap", ms(v.min_handover_ns));
        row(
            &mut out,
            "warm-up",
            format!("{} ms (slowest worker)", t.warm_up_ms),
        );
        row(
            &mut out,
            "elapsed",
            format!("{:.1} s", self.elapsed.as_secs_f64()),
        );
        for (i, l) in self.logs.iter().enumerate() {
            let c = &l.counts;
            row(
                &mut out,
                &format!("worker {i}"),
                format!(
                    "{} acquisitions, {} contended, {} unavailable, {} other, {:.1} s",
                    c.acquisitions,
                    c.contended,
                    c.unavailable,
                    c.other,
                    c.elapsed_ms as f64 / 1000.0
                ),
            );
        }
        out
    }
}
