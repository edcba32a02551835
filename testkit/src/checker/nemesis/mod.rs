//! The nemesis: the faults injected while the workers run. Each kind of a run
//! (`--nemesis k1,k2`) is a lane, a thread of its own; the lanes share one budget of
//! affected voters, so that however they mix, at most [`MAX_AFFECTED`] of the [`MASTERS`]
//! voters are affected at once — but for the `records` scenario, which holds them all (no
//! other lane injects meanwhile) and takes four out for a moment — and every fault is
//! healed before the run ends.
//!
//! The kinds, what each does and the faults each counts are in one table, in the checker's
//! module docs (`checker/mod.rs`); each kind's lane is a file here.

mod budget;
mod classic;
mod cluster;
mod crash;
mod evict;
mod lost;
mod operator;
mod records;
mod reply;
mod sentinel;
mod skew;

use std::sync::Mutex;
use std::time::Duration;

pub(super) use budget::{Budget, Stop};

use super::faults::FaultCounts;
use super::settings::Settings;
use super::topology::Topology;
#[cfg(doc)]
use super::{MASTERS, MAX_AFFECTED};

/// One kind of fault a run can mix in (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Classic,
    ReplyReset,
    Skew,
    Sentinel,
    Cluster,
    Records,
    Operator,
    Evict,
    Lost,
    Crash,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 10] = [
        Kind::Classic,
        Kind::ReplyReset,
        Kind::Skew,
        Kind::Sentinel,
        Kind::Cluster,
        Kind::Records,
        Kind::Operator,
        Kind::Evict,
        Kind::Lost,
        Kind::Crash,
    ];

    /// The name `--nemesis` takes.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Classic => "classic",
            Kind::ReplyReset => "reply-reset",
            Kind::Skew => "skew",
            Kind::Sentinel => "sentinel",
            Kind::Cluster => "cluster",
            Kind::Records => "records",
            Kind::Operator => "operator",
            Kind::Evict => "evict",
            Kind::Lost => "lost",
            Kind::Crash => "crash",
        }
    }

    /// A comma-separated list of kinds; panics on an unknown one.
    pub fn parse_list(list: &str) -> Vec<Kind> {
        let mut out: Vec<Kind> = list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(|s| {
                *Self::ALL.iter().find(|k| k.name() == s).unwrap_or_else(|| {
                    let names: Vec<&str> = Self::ALL.iter().map(|k| k.name()).collect();
                    panic!("unknown nemesis {s:?}: one of {}", names.join(", "))
                })
            })
            .collect();
        out.sort();
        out.dedup();
        assert!(!out.is_empty(), "--nemesis needs at least one kind");
        out
    }

    /// The faults (as counted in [`FaultCounts`]) that show this kind at work: groups of
    /// which each must reach `--min-faults` (the counts of a group's faults added up).
    /// `restarts`: whether the run restarts masters and fails them over (not in the replay
    /// workload, see [`Settings`]). The `skew` count itself (the offset masters, fixed at
    /// the start) is not among them: only its restarts grow.
    pub fn evidence(self, restarts: bool) -> &'static [&'static [&'static str]] {
        match self {
            Kind::Skew if !restarts => &[],
            Kind::Sentinel if !restarts => &[&["sentinel-cut"]],
            Kind::Classic => &[&[
                "freeze",
                "freeze-two",
                "partition",
                "freeze+partition",
                "latency",
                "reset",
                "restart",
            ]],
            Kind::ReplyReset => &[&["reply-reset"]],
            Kind::Skew => &[&["skew-restart"]],
            Kind::Sentinel => &[&["sentinel-cut"], &["sentinel-failover"]],
            Kind::Cluster => &[&["cluster-reply-reset"], &["cluster-partition"]],
            Kind::Records => &[&["records"]],
            Kind::Operator => &[&["operator-rerun"]],
            Kind::Evict => &[&["evict"]],
            Kind::Lost => &[&["lost-cut"]],
            Kind::Crash => &[
                &["kill"],
                &["kill-after-commit"],
                &["kill-after-row"],
                &["flushall"],
                &["redis-restart"],
            ],
        }
    }
}

/// What every lane works with.
pub(super) struct Ctx<'a> {
    pub(super) topology: &'a Topology,
    pub(super) settings: &'a Settings,
    /// The resources the workers lock (the lock workload's keys).
    pub(super) resources: &'a [String],
    /// The parent's runtime (the proxies run there; async topology calls block on it).
    pub(super) rt: tokio::runtime::Handle,
    pub(super) stop: &'a Stop,
    pub(super) budget: &'a Budget,
    pub(super) counts: &'a Mutex<FaultCounts>,
}

impl Ctx<'_> {
    /// Waits `d` unless told to stop; true when told to stop.
    pub(super) fn pause(&self, d: Duration) -> bool {
        self.stop.pause(d)
    }

    /// Takes `n` voters that `eligible` accepts out of the budget, waiting (in turn with the
    /// other lanes) while it has no room; `None` when told to stop first.
    pub(super) fn take(
        &self,
        rng: &mut fastrand::Rng,
        n: usize,
        eligible: impl Fn(usize) -> bool,
    ) -> Option<Vec<usize>> {
        self.budget.take_in_turn(rng, n, eligible, self.stop)
    }

    /// Counts one fault on `voters` from `from_ns` until now.
    pub(super) fn add(&self, kind: &'static str, voters: &[usize], from_ns: i64, detail: String) {
        self.counts().add(kind, voters, from_ns, detail);
    }

    /// Counts `n` faults of `kind` without a span on the timeline (yet).
    pub(super) fn count(&self, kind: &'static str, n: u64) {
        *self.counts().by_kind.entry(kind).or_default() += n;
    }

    /// Puts a span on the timeline (not counted as a fault).
    pub(super) fn span(
        &self,
        kind: &'static str,
        voters: &[usize],
        from_ns: i64,
        to_ns: i64,
        detail: String,
    ) {
        self.counts().span(kind, voters, from_ns, to_ns, detail);
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, FaultCounts> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether voter `i` is a bare master.
    pub(super) fn is_bare(&self, i: usize) -> bool {
        i < self.topology.masters.len()
    }
}

/// Runs one lane per kind of `ctx.settings.nemesis` until `ctx.stop` is set; returns when
/// every lane has healed what it injected.
pub(super) fn unleash(ctx: &Ctx<'_>) {
    std::thread::scope(|s| {
        let lanes: Vec<_> = ctx
            .settings
            .nemesis
            .iter()
            .map(|&kind| {
                s.spawn(move || {
                    let lane = std::panic::AssertUnwindSafe(|| match kind {
                        Kind::Classic => classic::lane(ctx),
                        Kind::ReplyReset => reply::lane(ctx),
                        Kind::Skew => skew::lane(ctx),
                        Kind::Sentinel => sentinel::lane(ctx),
                        Kind::Cluster => cluster::lane(ctx),
                        Kind::Records => records::lane(ctx),
                        Kind::Operator => operator::lane(ctx),
                        Kind::Evict => evict::lane(ctx),
                        Kind::Lost => lost::lane(ctx),
                        Kind::Crash => crash::lane(ctx),
                    });
                    let done = std::panic::catch_unwind(lane);
                    if done.is_err() {
                        // A broken harness: the other lanes heal and return, the run ends.
                        ctx.stop.set();
                    }
                    done
                })
            })
            .collect();
        let mut panicked = None;
        for lane in lanes {
            let outcome = lane.join().unwrap_or_else(Err);
            if let Err(p) = outcome {
                panicked.get_or_insert(p);
            }
        }
        if let Some(p) = panicked {
            std::panic::resume_unwind(p);
        }
    });
}

pub(super) fn ms(rng: &mut fastrand::Rng, range: std::ops::RangeInclusive<u64>) -> Duration {
    Duration::from_millis(rng.u64(range))
}
