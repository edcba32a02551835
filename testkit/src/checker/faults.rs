//! The record of the faults the nemesis injected: how many of each kind, and when (the
//! lanes that inject them are in `nemesis/`).

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;

use super::clock;

/// Faults injected, by kind, and when.
#[derive(Debug, Clone, Default)]
pub struct FaultCounts {
    pub by_kind: BTreeMap<&'static str, u64>,
    /// Every fault, in the order healed; a restart is followed by the master's
    /// `abstaining` window (delayed-restart protection, as the nemesis expects it), and a
    /// scenario of several steps by a span per step.
    pub timeline: Vec<FaultSpan>,
}

/// One fault on the shared clock (`CLOCK_MONOTONIC` ns, as the sections).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultSpan {
    pub kind: &'static str,
    /// The voters affected (their index, `0..MASTERS`: the bare masters first, then a
    /// Sentinel group's voter, then a Cluster's; see the report's voter list).
    pub masters: Vec<usize>,
    pub from_ns: i64,
    /// Healed (for `abstaining`: when the schedule counts the master as voting again).
    pub to_ns: i64,
    /// Anything else (the latency added).
    pub detail: String,
}

impl FaultCounts {
    /// One fault injected on `masters` from `from_ns` until now.
    pub(in crate::checker) fn add(
        &mut self,
        kind: &'static str,
        masters: &[usize],
        from_ns: i64,
        detail: String,
    ) {
        *self.by_kind.entry(kind).or_default() += 1;
        self.span(kind, masters, from_ns, clock::now_ns(), detail);
    }

    /// A span on the timeline that is not counted as a fault of its own (a restarted
    /// master's abstention, one step of a scenario).
    pub(in crate::checker) fn span(
        &mut self,
        kind: &'static str,
        masters: &[usize],
        from_ns: i64,
        to_ns: i64,
        detail: String,
    ) {
        self.timeline.push(FaultSpan {
            kind,
            masters: masters.to_vec(),
            from_ns,
            to_ns,
            detail,
        });
    }

    /// How many faults of the given kinds were injected.
    pub fn count_of(&self, kinds: &[&str]) -> u64 {
        kinds
            .iter()
            .map(|k| self.by_kind.get(k).copied().unwrap_or(0))
            .sum()
    }

    pub fn total(&self) -> u64 {
        self.by_kind.values().sum()
    }

    /// The faults active at some moment of `[from_ns, to_ns]`.
    pub fn during(&self, from_ns: i64, to_ns: i64) -> impl Iterator<Item = &FaultSpan> {
        self.timeline
            .iter()
            .filter(move |f| f.from_ns <= to_ns && f.to_ns >= from_ns)
    }

    /// Writes the timeline, one fault a line: `kind masters from_ns to_ns detail`.
    pub(super) fn write_timeline(&self, path: &Path) -> std::io::Result<()> {
        let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
        for f in &self.timeline {
            let masters: Vec<String> = f.masters.iter().map(usize::to_string).collect();
            writeln!(
                out,
                "{} {} {} {} {}",
                f.kind,
                masters.join(","),
                f.from_ns,
                f.to_ns,
                f.detail
            )?;
        }
        out.flush()
    }
}
