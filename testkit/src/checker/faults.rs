//! The fault schedule: one fault at a time on a minority of the masters, each healed; and
//! the record of what was injected when.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::proxy::{Fault, FaultProxy};
use crate::Masters;

use super::clock;
use super::MAX_AFFECTED;

/// Faults injected, by kind, and when.
#[derive(Debug, Clone, Default)]
pub struct FaultCounts {
    pub by_kind: BTreeMap<&'static str, u64>,
    /// Every fault, in the order injected; a restart is followed by the master's
    /// `abstaining` window (delayed-restart protection, as the schedule expects it).
    pub timeline: Vec<FaultSpan>,
}

/// One fault on the shared clock (`CLOCK_MONOTONIC` ns, as the sections).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FaultSpan {
    pub kind: &'static str,
    /// The masters affected (their index, `0..MASTERS`).
    pub masters: Vec<usize>,
    pub from_ns: i64,
    /// Healed (for `abstaining`: when the schedule counts the master as voting again).
    pub to_ns: i64,
    /// Anything else (the latency added).
    pub detail: String,
}

impl FaultCounts {
    /// One fault injected on `masters` from `from_ns` until now.
    fn add(&mut self, kind: &'static str, masters: &[usize], from_ns: i64, detail: String) {
        *self.by_kind.entry(kind).or_default() += 1;
        self.timeline.push(FaultSpan {
            kind,
            masters: masters.to_vec(),
            from_ns,
            to_ns: clock::now_ns(),
            detail,
        });
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

/// Sleeps for `d` unless told to stop; true when told to stop.
fn pause(stop: &mpsc::Receiver<()>, d: Duration) -> bool {
    !matches!(stop.recv_timeout(d), Err(mpsc::RecvTimeoutError::Timeout))
}

fn ms(rng: &mut fastrand::Rng, range: std::ops::RangeInclusive<u64>) -> Duration {
    Duration::from_millis(rng.u64(range))
}

/// Injects one fault at a time on at most [`MAX_AFFECTED`] masters — counting a restarted
/// master that still abstains (delayed-restart protection) as affected — and heals it, until
/// `stop` says so. Every fault is healed before this returns.
pub(super) fn fault_schedule(
    masters: &Masters,
    proxies: &[FaultProxy],
    stop: &mpsc::Receiver<()>,
    abstention: Duration,
) -> FaultCounts {
    let mut rng = fastrand::Rng::new();
    let mut counts = FaultCounts::default();
    let mut abstaining_until: Vec<Option<Instant>> = vec![None; masters.len()];
    // Let the workers warm up and take their first locks undisturbed.
    let mut stopped = pause(stop, Duration::from_millis(300));
    while !stopped {
        let now = Instant::now();
        let busy = abstaining_until
            .iter()
            .filter(|u| u.is_some_and(|u| u > now))
            .count();
        let mut free: Vec<usize> = (0..masters.len())
            .filter(|&i| abstaining_until[i].is_none_or(|u| u <= now))
            .collect();
        rng.shuffle(&mut free);
        let room = MAX_AFFECTED.saturating_sub(busy);
        if room == 0 {
            stopped = pause(stop, Duration::from_millis(100));
            continue;
        }
        let a = free[0];
        let b = free[1];
        let hold = ms(&mut rng, 150..=450);
        let from_ns = clock::now_ns();
        match rng.u8(0..7) {
            0 => {
                masters[a].freeze();
                stopped = pause(stop, hold);
                masters[a].thaw();
                counts.add("freeze", &[a], from_ns, String::new());
            }
            1 if room >= 2 => {
                masters[a].freeze();
                masters[b].freeze();
                stopped = pause(stop, hold);
                masters[a].thaw();
                masters[b].thaw();
                counts.add("freeze-two", &[a, b], from_ns, String::new());
            }
            2 => {
                proxies[a].set(Fault::BlackHole);
                stopped = pause(stop, hold);
                proxies[a].set(Fault::Pass);
                counts.add("partition", &[a], from_ns, String::new());
            }
            3 if room >= 2 => {
                // One master frozen, another partitioned: two different stalls at once.
                masters[a].freeze();
                proxies[b].set(Fault::BlackHole);
                stopped = pause(stop, hold);
                masters[a].thaw();
                proxies[b].set(Fault::Pass);
                let detail = format!("{a} frozen, {b} partitioned");
                counts.add("freeze+partition", &[a, b], from_ns, detail);
            }
            4 => {
                // Slow, sometimes slower than the node timeout (then: answers arrive late).
                let latency = ms(&mut rng, 5..=250);
                proxies[a].set(Fault::Latency(latency));
                stopped = pause(stop, hold);
                proxies[a].set(Fault::Pass);
                counts.add("latency", &[a], from_ns, format!("+{latency:?}"));
            }
            5 => {
                proxies[a].set(Fault::Reset);
                stopped = pause(stop, ms(&mut rng, 20..=200));
                proxies[a].set(Fault::Pass);
                counts.add("reset", &[a], from_ns, String::new());
            }
            6 => {
                // Killed, down a moment, back empty: it abstains for a while (delayed-restart
                // protection), during which it counts as affected.
                masters[a].stop();
                stopped = pause(stop, ms(&mut rng, 50..=300));
                masters[a].restart();
                abstaining_until[a] = Some(Instant::now() + abstention);
                counts.add("restart", &[a], from_ns, String::new());
                let back_ns = clock::now_ns();
                counts.timeline.push(FaultSpan {
                    kind: "abstaining",
                    masters: vec![a],
                    from_ns: back_ns,
                    to_ns: back_ns + clock::nanos(abstention),
                    detail: String::new(),
                });
            }
            _ => continue,
        }
        if !stopped {
            stopped = pause(stop, ms(&mut rng, 100..=400));
        }
    }
    counts
}
