//! The comparison runner: this crate side by side with the raw limit and the peer crates, in
//! one process, on masters it starts itself. Prints one markdown table per subject (the lock
//! clients, the HTTP layer) with ratios, and the issue's targets as met / not met.
//!
//! ```text
//! cargo bench -p tower-redlock-bench --bench compare
//! REDLOCK_BENCH_SCALE=3 REDLOCK_BENCH_ROUNDS=5 cargo bench -p tower-redlock-bench --bench compare   # longer, steadier
//! ```
//!
//! Settings (environment):
//! - `REDLOCK_BENCH_SCALE` (1.0): multiplies every duration and cycle count.
//! - `REDLOCK_BENCH_ROUNDS` (3): rounds; in each round every client runs every workload once,
//!   in a rotated order, so that a noisy moment hits all clients alike. Rates are the median
//!   of the rounds; latencies are pooled.
//! - `REDLOCK_BENCH_N` (`3,5`): the numbers of masters (`0`: skip the lock clients).
//! - `REDLOCK_BENCH_NODE_TIMEOUT_MS` (50): the per-node timeout of the limit and this crate.
//! - `REDLOCK_BENCH_PEERS` (`rslock,redlock`): the peer crates to run (empty: none).
//! - `REDLOCK_BENCH_LAYER` (1): 0 skips the HTTP layer section.
//! - `REDLOCK_BENCH_STALL` (1): 0 skips the stall workload (3 of 5 masters paused 300 ms
//!   under contention; the limit and this crate only, on 5 masters; see
//!   `bench/src/stall.rs`). Skipped too when `REDLOCK_BENCH_N` is `0`.
//! - `REDLOCK_BENCH_REPLAY` (1): 0 skips the replay workloads (idempotent work, one task at a
//!   time, on each N). Client level: this crate's lock cycle, a replay hit with
//!   `lock_unless_completed`, a first execution with `lock_unless_completed` +
//!   `Lease::complete` (see `bench/src/replay.rs`). HTTP level, when `REDLOCK_BENCH_LAYER` is
//!   on too: one axum app over real HTTP with a plain locked route and an idempotent (replay)
//!   route; a replay hit, a first execution and a plain locked request (see
//!   `bench/src/http_replay.rs`).
//! - `REDLOCK_BENCH_OUT`: also write the report (markdown) to this file.
//!
//! This file is the runner's top level (the settings, the order of the sections, the report's
//! layout); each section's workload, table and targets are in the bench library
//! (`bench/src/`: `lock_clients`, `replay`, `http_replay`, `stall`, `http_layer`).
//!
//! Run only by `cargo bench` (it does nothing without the `--bench` argument cargo passes),
//! never as a test.

use tower_redlock_bench as common;
use tower_redlock_testkit as support;

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::http_layer::{self, LayerRow};
use common::http_replay::{self, HttpReplayRow};
use common::lock_clients::{self, Peers, Table, Who};
use common::replay::{self, ReplayRow};
use common::report::{machine, p};
use common::stall::{Plan, Stall, MASTERS as STALL_MASTERS};
use common::{Extras, Limit, Locker, Params};
use support::Masters;

#[derive(Debug, Clone)]
struct Settings {
    params: Params,
    ns: Vec<usize>,
    peers: Peers,
    layer: bool,
    stall: bool,
    replay: bool,
    out: Option<String>,
}

impl Settings {
    fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let peers =
            std::env::var("REDLOCK_BENCH_PEERS").unwrap_or_else(|_| "rslock,redlock".into());
        Self {
            params: Params {
                scale: var("REDLOCK_BENCH_SCALE")
                    .map_or(1.0, |v| v.parse().expect("REDLOCK_BENCH_SCALE: a number")),
                rounds: var("REDLOCK_BENCH_ROUNDS")
                    .map_or(3, |v| v.parse().expect("REDLOCK_BENCH_ROUNDS: an integer")),
                node_timeout: Duration::from_millis(
                    var("REDLOCK_BENCH_NODE_TIMEOUT_MS").map_or(50, |v| {
                        v.parse().expect("REDLOCK_BENCH_NODE_TIMEOUT_MS: ms")
                    }),
                ),
            },
            ns: var("REDLOCK_BENCH_N").map_or(vec![3, 5], |v| {
                v.split(',')
                    .map(|n| n.trim().parse().expect("REDLOCK_BENCH_N: e.g. 3,5"))
                    .filter(|&n| n > 0)
                    .collect()
            }),
            peers: Peers {
                rslock: peers.split(',').any(|p| p.trim() == "rslock"),
                redlock_rs: peers.split(',').any(|p| p.trim() == "redlock"),
            },
            layer: var("REDLOCK_BENCH_LAYER").is_none_or(|v| v != "0"),
            stall: var("REDLOCK_BENCH_STALL").is_none_or(|v| v != "0"),
            replay: var("REDLOCK_BENCH_REPLAY").is_none_or(|v| v != "0"),
            out: var("REDLOCK_BENCH_OUT"),
        }
    }
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("the comparison runner runs only under `cargo bench -p tower-redlock-bench --bench compare`");
        return;
    }
    if std::process::Command::new("redis-server")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!(
            "the comparison needs `redis-server` (7.x) on PATH; install it with \
             `apt-get update && apt-get install -y redis-server` (Debian/Ubuntu) or \
             `brew install redis` (macOS), then run `cargo bench -p tower-redlock-bench --bench compare` again"
        );
        std::process::exit(1);
    }
    let s = Settings::from_env();
    let started = Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    // The fault proxies run on their own thread, out of the measured runtime's way.
    let proxy_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("fault-proxy")
        .enable_all()
        .build()
        .expect("proxy runtime");
    let stall_on = s.stall && !s.ns.is_empty();
    let mut max_n = s.ns.iter().copied().max().unwrap_or(3).max(3);
    if stall_on {
        max_n = max_n.max(STALL_MASTERS);
    }
    eprintln!("starting {max_n} redis-server masters …");
    let masters = Masters::start(max_n);

    let mut table = Table::new();
    for &n in &s.ns {
        eprintln!("N = {n}: healthy masters …");
        for (who, row) in rt.block_on(lock_clients::healthy(&s.params, s.peers, &masters, n)) {
            table.insert((n, who), row);
        }
        eprintln!("N = {n}: one master slowed, then black-holed …");
        let faults = lock_clients::faults(&s.params, s.peers, &rt, &proxy_rt, &masters, n);
        for (who, (slowed, black)) in faults {
            let row = table.entry((n, who)).or_default();
            row.slowed = slowed;
            row.black = black;
        }
        // Background releases (bounded by the node timeout) settle, then count what is left.
        std::thread::sleep(s.params.node_timeout * 4 + Duration::from_millis(300));
        for (&(rn, who), row) in table.iter_mut() {
            if rn == n {
                row.keys_left = rt.block_on(lock_clients::keys_left(&masters, n, who.prefix()));
            }
        }
        rt.block_on(flush_all(&masters));
    }

    let mut replays = Vec::new();
    let mut http_replays = Vec::new();
    if s.replay {
        for &n in &s.ns {
            eprintln!("N = {n}: replay (idempotent work, one task) …");
            replays.push((n, rt.block_on(replay::run(&s.params, &masters, n))));
            rt.block_on(flush_all(&masters));
            if s.layer {
                eprintln!("N = {n}: replay over HTTP (idempotent endpoint, one connection) …");
                http_replays.push((n, rt.block_on(http_replay::run(&s.params, &masters, n))));
                rt.block_on(flush_all(&masters));
            }
        }
    }

    let stall = if stall_on {
        eprintln!("stall: 3 of {STALL_MASTERS} masters paused …");
        stall(&s, &rt, &masters)
    } else {
        Vec::new()
    };

    let layer = if s.layer {
        eprintln!("HTTP layer …");
        Some(rt.block_on(http_layer::run(&s.params, &masters)))
    } else {
        None
    };

    let report = report(
        &s,
        &table,
        &replays,
        &http_replays,
        &stall,
        layer.as_deref(),
        started.elapsed(),
    );
    println!("{report}");
    if let Some(path) = &s.out {
        std::fs::write(path, &report).expect("write REDLOCK_BENCH_OUT");
    }
    drop(masters);
    // The proxies' and the runtimes' leftover tasks end with the process.
    rt.shutdown_timeout(Duration::from_millis(100));
    proxy_rt.shutdown_timeout(Duration::from_millis(100));
}

/// `FLUSHALL` on every master.
async fn flush_all(masters: &Masters) {
    for m in masters.iter() {
        let _: () = m.query(&redis::cmd("FLUSHALL")).await;
    }
}

fn stall_plan(s: &Settings) -> Plan {
    Plan::standard(s.params.dur(1.0), s.params.dur(4.0), s.params.node_timeout)
}

/// The stall workload ([`common::stall`]) for the limit and this crate (no peers).
fn stall(s: &Settings, rt: &tokio::runtime::Runtime, masters: &Masters) -> Vec<(Who, Stall)> {
    let urls = &masters.urls()[..STALL_MASTERS];
    let plan = stall_plan(s);
    let node_timeout = s.params.node_timeout;
    let mut out = Vec::new();
    for who in [Who::Limit, Who::Ours] {
        let l = rt.block_on(async {
            match who {
                Who::Ours => Locker::Ours(common::ours(urls, node_timeout)),
                _ => Locker::Limit(Arc::new(
                    Limit::connect(urls, node_timeout, Extras::default()).await,
                )),
            }
        });
        let prefix = format!("{}:stall", who.prefix());
        out.push((who, common::stall::measure(rt, &l, &prefix, masters, &plan)));
    }
    out
}

/// The report: the sections' tables, then their targets, then the machine.
fn report(
    s: &Settings,
    table: &Table,
    replays: &[(usize, ReplayRow)],
    http_replays: &[(usize, HttpReplayRow)],
    stall: &[(Who, Stall)],
    layer: Option<&[(&'static str, LayerRow)]>,
    took: Duration,
) -> String {
    let node_timeout = s.params.node_timeout;
    let mut o = String::new();
    lock_clients::table(&mut o, node_timeout, table);

    if !replays.is_empty() {
        replay::table(&mut o, node_timeout, replays);
    }

    if !http_replays.is_empty() {
        http_replay::table(&mut o, node_timeout, http_replays);
    }

    if !stall.is_empty() {
        let rows: Vec<_> = stall.iter().map(|(w, r)| (w.name(), r)).collect();
        common::stall::table(&mut o, &stall_plan(s), node_timeout, &rows);
    }

    if let Some(layer) = layer {
        http_layer::table(&mut o, layer);
    }

    let _ = writeln!(o, "\n### Targets\n");
    lock_clients::targets(&mut o, &s.ns, table);
    let stalled = |w: Who| stall.iter().find(|(x, _)| *x == w).map(|(_, r)| r);
    if let Some(us) = stalled(Who::Ours) {
        let _ = writeln!(o, "{}", common::stall::target(us, stalled(Who::Limit)));
    }
    let cycle3 = table
        .get(&(3, Who::Ours))
        .and_then(|us3| p(&us3.healthy.cycle, 50.0));
    if let (Some(layer), Some(cycle)) = (layer, cycle3) {
        http_layer::targets(&mut o, layer, cycle);
    }
    for (n, row) in replays {
        replay::targets(&mut o, *n, row);
    }
    for (n, row) in http_replays {
        http_replay::targets(&mut o, *n, row);
    }
    let _ = writeln!(
        o,
        "\n{}; scale {}, {} rounds; took {:.0} s.",
        machine(),
        s.params.scale,
        s.params.rounds,
        took.as_secs_f64()
    );
    o
}
