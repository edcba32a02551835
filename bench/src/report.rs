//! The comparison runner's report: the cells its markdown tables share (a value and its ratio
//! to a baseline, a fault's outcome), the workload rows of the replay tables, the targets'
//! verdict, and the machine line.

use std::fmt::Write as _;
use std::time::Duration;

use crate::{fmt_dur, fmt_rate, percentile, Latency};

/// The machine the report was measured on: CPUs, kernel, redis-server.
pub fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_else(|| "unknown CPU".into());
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| std::env::consts::OS.into());
    let redis = tower_redlock_testkit::redis_server_version().unwrap_or_default();
    format!("{cpus} CPUs ({model}), Linux {kernel}, redis-server {redis}")
}

/// The `q`-th percentile of `v` ([`percentile`]).
pub fn p(v: &[Duration], q: f64) -> Option<Duration> {
    percentile(v, q)
}

/// A target's verdict.
pub fn mark(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "NOT met"
    }
}

/// `value (ratio×)` against `base`; lower is better for latencies.
pub fn lat_cell(v: Option<Duration>, base: Option<Duration>, show_ratio: bool) -> String {
    match (v, base) {
        (Some(v), Some(b)) if show_ratio && !b.is_zero() => {
            format!("{} ({:.2}×)", fmt_dur(v), v.as_secs_f64() / b.as_secs_f64())
        }
        (Some(v), _) => fmt_dur(v),
        (None, _) => "—".into(),
    }
}

/// `rate (ratio×)` against `base`; higher is better.
pub fn rate_cell(v: f64, base: f64, show_ratio: bool) -> String {
    if show_ratio && base > 0.0 {
        format!("{} ({:.2}×)", fmt_rate(v), v / base)
    } else {
        fmt_rate(v)
    }
}

/// The p50 of `l`'s acquisitions (`acquire`) or cycles under a fault, against `base`; a
/// client that hung says so.
pub fn fault_cell(l: &Latency, base: Option<Duration>, show_ratio: bool, acquire: bool) -> String {
    let v = if acquire { &l.acquire } else { &l.cycle };
    if l.hung && v.is_empty() {
        return "hangs (no timeout)".into();
    }
    let mut c = lat_cell(p(v, 50.0), base, show_ratio);
    if l.hung {
        c.push_str(", then hangs");
    }
    c
}

/// One row a workload at `n` masters, `| N | workload | p50 | p99 | p50 / base p50 | p99 /
/// base p99 | failures |`: each line is its name, the [`Latency`] it was measured in (for
/// its failures) and the times to read from it; `base` is the times the ratios are taken to.
pub fn workload_rows(
    o: &mut String,
    n: usize,
    base: &[Duration],
    lines: &[(&str, &Latency, &[Duration])],
) {
    let base50 = p(base, 50.0);
    let base99 = p(base, 99.0);
    for &(what, l, v) in lines {
        let failures = if l.hung {
            format!("{}, then hangs", l.failures)
        } else {
            l.failures.to_string()
        };
        let ratio = |q: f64, base: Option<Duration>| match (p(v, q), base) {
            (Some(v), Some(b)) if !b.is_zero() => {
                format!("{:.2}×", v.as_secs_f64() / b.as_secs_f64())
            }
            _ => "—".into(),
        };
        let _ = writeln!(
            o,
            "| {n} | {what} | {} | {} | {} | {} | {failures} |",
            lat_cell(p(v, 50.0), None, false),
            lat_cell(p(v, 99.0), None, false),
            ratio(50.0, base50),
            ratio(99.0, base99),
        );
    }
}

/// `{what}: N=3: 0, N=5: 1.` — a count at each N, on a line of its own.
pub fn counts(o: &mut String, what: &str, counts: impl Iterator<Item = (usize, u64)>) {
    let each: Vec<String> = counts.map(|(n, c)| format!("N={n}: {c}")).collect();
    let _ = writeln!(o, "{what}: {}.", each.join(", "));
}
