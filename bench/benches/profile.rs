//! Where this crate's client loses against the limit: an ablation.
//!
//! The limit (Redlock written directly on redis-rs, `bench/src/limit.rs`) is run with one extra
//! cost of this crate's client switched on at a time — the `ConnectionManager`, the Lua
//! acquire script, waiting for the in-flight `SET`s before a release, boxed node futures —
//! then with all of them, and next to this crate's client itself. For each: the single-task
//! cycle p50, the 64-task throughput, the CPU time per cycle of this process and of the
//! Redis masters (on a 2-core machine throughput is CPU-bound, so CPU per cycle is the
//! currency), and the heap allocations per cycle (a counting allocator, on only while
//! counting).
//!
//! ```text
//! cargo bench -p tower-redlock-bench --bench profile
//! REDLOCK_BENCH_N=5 REDLOCK_BENCH_ROUNDS=5 cargo bench -p tower-redlock-bench --bench profile
//! ```
//!
//! Settings: `REDLOCK_BENCH_SCALE` (1.0), `REDLOCK_BENCH_ROUNDS` (3), `REDLOCK_BENCH_N` (3),
//! `REDLOCK_BENCH_NODE_TIMEOUT_MS` (50), `REDLOCK_PROFILE_WORKLOAD=onekey` (32 tasks on one
//! key instead of 64 tasks on their own keys), `REDLOCK_PROFILE_VARIANTS` (comma-separated
//! variant names: run only those, each paired with the limit), `REDLOCK_PROFILE_ONLY` (a variant name: run
//! only it, with 64 tasks, for a long time — for `perf record -g -p <pid>`).

use tower_redlock_bench as common;
use tower_redlock_testkit as support;

use std::sync::Arc;
use std::time::Duration;

use common::{fmt_dur, fmt_rate, median, percentile, Extras, Limit, Locker};
use support::Masters;

#[global_allocator]
static ALLOCATOR: common::counting::Counting = common::counting::Counting;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Variant {
    Limit(Extras, &'static str),
    Ours,
}

impl Variant {
    fn name(&self) -> &'static str {
        match self {
            Variant::Limit(_, n) => n,
            Variant::Ours => "tower-redlock",
        }
    }
}

fn variants() -> Vec<Variant> {
    let x = Extras::default();
    // This crate's structure since `f0c7829` (see BENCHMARKS.md for the one before).
    let ours = Extras {
        manager: true,
        manager_inherent: true,
        cmd_per_node: true,
        drain_before_spawn: true,
        ..x
    };
    vec![
        Variant::Limit(x, "limit"),
        Variant::Limit(
            Extras {
                drain_before_spawn: true,
                ..x
            },
            "limit + drain answers before spawning",
        ),
        Variant::Limit(
            Extras {
                response_timeout: true,
                ..x
            },
            "limit + 1 s response timeout (2nd timer)",
        ),
        Variant::Limit(
            Extras {
                manager: true,
                response_timeout: true,
                ..x
            },
            "limit + ConnectionManager as called here",
        ),
        Variant::Limit(
            Extras {
                manager: true,
                manager_inherent: true,
                response_timeout: true,
                ..x
            },
            "limit + ConnectionManager, inherent call",
        ),
        Variant::Limit(
            Extras {
                manager: true,
                manager_inherent: true,
                ..x
            },
            "limit + ConnectionManager, inherent call, no response timeout",
        ),
        Variant::Limit(
            Extras {
                cmd_per_node: true,
                ..x
            },
            "limit + a Cmd per node",
        ),
        Variant::Limit(
            Extras {
                script_acquire: true,
                ..x
            },
            "limit + Lua acquire script",
        ),
        Variant::Limit(
            Extras {
                set_pttl: true,
                ..x
            },
            "limit + SET NX PX;PTTL pipeline",
        ),
        Variant::Limit(
            Extras {
                wait_in_flight: true,
                ..x
            },
            "limit + release waits for in-flight SETs",
        ),
        Variant::Limit(Extras { boxed: true, ..x }, "limit + boxed node futures"),
        Variant::Limit(
            ours,
            "limit + this crate's structure (manager, a Cmd per node, drain)",
        ),
        Variant::Ours,
    ]
}

#[derive(Default)]
struct Result {
    cycle_ratios: Vec<f64>,
    rate_ratios: Vec<f64>,
    cycles: Vec<Duration>,
    rates: Vec<f64>,
    client_cpu_us: Vec<f64>,
    redis_cpu_us: Vec<f64>,
    allocs: f64,
    bytes: f64,
}

/// CPU time of this process (user + system), from /proc (10 ms ticks).
fn process_cpu() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after ')'.
    let ticks: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// CPU time of the first `n` masters (user + system), from `INFO cpu`.
async fn redis_cpu(masters: &Masters, n: usize) -> Duration {
    let mut total = 0.0;
    for m in masters.iter().take(n) {
        let info: String = m.query(redis::cmd("INFO").arg("cpu")).await;
        for line in info.lines() {
            if let Some(v) = line
                .strip_prefix("used_cpu_sys:")
                .or_else(|| line.strip_prefix("used_cpu_user:"))
            {
                total += v.trim().parse::<f64>().unwrap_or(0.0);
            }
        }
    }
    Duration::from_secs_f64(total)
}

async fn build(v: Variant, urls: &[String], timeout: Duration) -> Locker {
    match v {
        Variant::Limit(x, _) => Locker::Limit(Arc::new(Limit::connect(urls, timeout, x).await)),
        Variant::Ours => Locker::Ours(common::ours(urls, timeout)),
    }
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!(
            "the profile runs only under `cargo bench -p tower-redlock-bench --bench profile`"
        );
        return;
    }
    let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let scale: f64 = var("REDLOCK_BENCH_SCALE").map_or(1.0, |v| v.parse().expect("scale"));
    let rounds: usize = var("REDLOCK_BENCH_ROUNDS").map_or(3, |v| v.parse().expect("rounds"));
    let n: usize = var("REDLOCK_BENCH_N").map_or(3, |v| v.parse().expect("N"));
    let timeout = Duration::from_millis(
        var("REDLOCK_BENCH_NODE_TIMEOUT_MS").map_or(50, |v| v.parse().expect("ms")),
    );
    let only = var("REDLOCK_PROFILE_ONLY");
    let one_key = var("REDLOCK_PROFILE_WORKLOAD").is_some_and(|w| w == "onekey");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let masters = Masters::start(n);
    let urls = masters.urls();

    // A subset, for quick iterations: the limit (always first, every variant's pair) and
    // these comma-separated names.
    let subset: Option<Vec<String>> = var("REDLOCK_PROFILE_VARIANTS")
        .map(|v| v.split(',').map(|s| s.trim().to_owned()).collect());
    let vs: Vec<Variant> = variants()
        .into_iter()
        .filter(|v| only.as_deref().is_none_or(|o| v.name() == o))
        .filter(|v| {
            only.is_some()
                || v.name() == "limit"
                || subset
                    .as_ref()
                    .is_none_or(|s| s.iter().any(|n| n == v.name()))
        })
        .collect();
    if vs.is_empty() {
        eprintln!("no variant named {only:?}; the names are:");
        for v in variants() {
            eprintln!("  {}", v.name());
        }
        std::process::exit(2);
    }
    if only.is_some() {
        // One variant, 64 tasks, for a long time: `perf record -g -p <pid>` meanwhile.
        rt.block_on(async {
            let l = build(vs[0], &urls, timeout).await;
            common::latency(
                &l,
                "profile:warm",
                200,
                Duration::from_secs(5),
                Duration::from_secs(5),
            )
            .await;
            eprintln!(
                "pid {}: running {} with 64 tasks",
                std::process::id(),
                vs[0].name()
            );
            let r = common::throughput(
                &l,
                "profile:many",
                64,
                Duration::from_secs_f64(20.0 * scale),
            )
            .await;
            println!("{}: {} cycles/s", vs[0].name(), fmt_rate(r.per_sec()));
        });
        return;
    }

    let lockers: Vec<Locker> = rt.block_on(async {
        let mut out = Vec::new();
        for v in &vs {
            let l = build(*v, &urls, timeout).await;
            let w = common::latency(
                &l,
                "profile:warm",
                200,
                Duration::from_secs(5),
                Duration::from_secs(5),
            )
            .await;
            assert_eq!(w.failures, 0, "{} failed its warm-up", v.name());
            out.push(l);
        }
        out
    });
    let mut results: Vec<Result> = vs.iter().map(|_| Result::default()).collect();
    let k = vs.len();
    let cycles = ((300.0 * scale) as usize).max(50);
    let dur = Duration::from_secs_f64(0.5 * scale);
    rt.block_on(async {
        // Paired runs: every variant right next to a run of the limit, in alternating order,
        // so that the ratio of the two cancels the machine's slow drift; the table shows the
        // median of the rounds' ratios.
        for round in 0..rounds {
            for j in 0..k {
                let i = (j + round) % k;
                if i == 0 && k > 1 {
                    continue;
                }
                let pair = if round % 2 == 0 { [0, i] } else { [i, 0] };
                let mut lat = [Duration::ZERO; 2];
                let mut rate = [0.0; 2];
                for &v in &pair {
                    let l = common::latency(
                        &lockers[v],
                        "profile:lat",
                        cycles,
                        Duration::from_secs(10),
                        Duration::from_secs(5),
                    )
                    .await;
                    let p50 = percentile(&l.cycle, 50.0).unwrap_or_default();
                    results[v].cycles.extend(l.cycle);
                    lat[usize::from(v != 0)] = p50;
                }
                for &v in &pair {
                    let cpu0 = process_cpu();
                    let redis0 = redis_cpu(&masters, n).await;
                    let r = if one_key {
                        common::one_key(&lockers[v], "profile:one", 32, dur).await
                    } else {
                        common::throughput(&lockers[v], "profile:many", 64, dur).await
                    };
                    let cpu = process_cpu() - cpu0;
                    let redis = redis_cpu(&masters, n).await - redis0;
                    let total = r.ok.max(1) as f64;
                    results[v].rates.push(r.per_sec());
                    results[v]
                        .client_cpu_us
                        .push(cpu.as_secs_f64() * 1e6 / total);
                    results[v]
                        .redis_cpu_us
                        .push(redis.as_secs_f64() * 1e6 / total);
                    rate[usize::from(v != 0)] = r.per_sec();
                }
                results[i]
                    .cycle_ratios
                    .push(lat[1].as_secs_f64() / lat[0].as_secs_f64());
                results[i].rate_ratios.push(rate[1] / rate[0]);
            }
        }
        // Allocations per cycle: one task, counting on.
        for (i, l) in lockers.iter().enumerate() {
            let count = 2000;
            tokio::time::sleep(Duration::from_millis(100)).await;
            common::counting::begin();
            common::latency(
                l,
                "profile:alloc",
                count,
                Duration::from_secs(30),
                Duration::from_secs(5),
            )
            .await;
            // Let the background tasks of the last cycle finish inside the window.
            tokio::time::sleep(Duration::from_millis(20)).await;
            let (allocs, bytes) = common::counting::end();
            results[i].allocs = allocs as f64 / count as f64;
            results[i].bytes = bytes as f64 / count as f64;
        }
    });

    // Pacing: the acquire p50 of the same client when the runtime is busy (cycles back to
    // back) and when it idles between cycles (as in a run whose release waits for a slow
    // node): an idle runtime parks its workers, and waking them costs latency.
    let gap = Duration::from_millis(20);
    let paced: Vec<(&'static str, Duration, Duration)> = rt.block_on(async {
        let mut out = Vec::new();
        for (v, l) in vs.iter().zip(&lockers) {
            if !matches!(v, Variant::Ours | Variant::Limit(_, "limit")) {
                continue;
            }
            let hot = common::latency(
                l,
                "profile:hot",
                300,
                Duration::from_secs(10),
                Duration::from_secs(5),
            )
            .await;
            let mut idle = common::Latency::default();
            for _ in 0..((100.0 * scale) as usize).max(20) {
                tokio::time::sleep(gap).await;
                idle.merge(
                    common::latency(
                        l,
                        "profile:idle",
                        1,
                        Duration::from_secs(1),
                        Duration::from_secs(5),
                    )
                    .await,
                );
            }
            out.push((
                v.name(),
                percentile(&hot.acquire, 50.0).unwrap_or_default(),
                percentile(&idle.acquire, 50.0).unwrap_or_default(),
            ));
        }
        out
    });

    println!("### Ablation: N = {n}, node timeout {timeout:?}, {rounds} rounds, each variant paired with the limit\n");
    if one_key {
        println!("(workload: 32 tasks on one key; the rate column counts successes)\n");
    }
    println!("| variant | cycle p50 | × limit (median of pairs) | 64 tasks: cycles/s | × limit (median of pairs, range) | client CPU per cycle | Redis CPU per cycle (all masters) | allocations per cycle | bytes allocated per cycle |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for (i, (v, r)) in vs.iter().zip(&results).enumerate() {
        let c = percentile(&r.cycles, 50.0).unwrap_or_default();
        let (cr, rr, range) = if i == 0 {
            ("1".to_owned(), "1".to_owned(), String::new())
        } else {
            let lo = r.rate_ratios.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = r.rate_ratios.iter().copied().fold(0.0, f64::max);
            (
                format!("{:.2}", median(&r.cycle_ratios)),
                format!("{:.2}", median(&r.rate_ratios)),
                format!(" ({lo:.2}–{hi:.2})"),
            )
        };
        println!(
            "| {} | {} | {cr}× | {} | {rr}×{range} | {:.1} µs | {:.1} µs | {:.1} | {:.0} |",
            v.name(),
            fmt_dur(c),
            fmt_rate(median(&r.rates)),
            median(&r.client_cpu_us),
            median(&r.redis_cpu_us),
            r.allocs,
            r.bytes,
        );
    }
    println!("\n### Acquire p50, busy runtime vs idle {gap:?} between cycles\n");
    println!("| client | back to back | after {gap:?} idle |");
    println!("|---|---|---|");
    for (name, hot, idle) in paced {
        println!(
            "| {name} | {} | {} ({:.2}×) |",
            fmt_dur(hot),
            fmt_dur(idle),
            idle.as_secs_f64() / hot.as_secs_f64()
        );
    }
    drop(masters);
    rt.shutdown_timeout(Duration::from_millis(100));
}
