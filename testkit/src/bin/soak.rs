//! A long local run of the mutual-exclusion checker ([`tower_redlock_testkit::checker`]):
//! by default 100,000 acquisitions over 4 worker processes, each of them this binary again
//! (`--worker`). Exits non-zero when mutual exclusion (or fencing) did not hold.
//!
//! ```text
//! cargo run --release -p tower-redlock-testkit --bin soak
//! cargo run --release -p tower-redlock-testkit --bin soak -- --acquisitions 1000000 --processes 4
//! cargo run -p tower-redlock-testkit --bin soak -- --help
//! ```

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::Command;

use tower_redlock_testkit::checker::{run, worker_main, Settings};

const USAGE: &str = "\
soak: the multi-process mutual-exclusion checker of tower-redlock, long run.

Starts 5 redis-server masters (redis-server must be on PATH) behind fault proxies, runs
worker processes that fight over a few resources while a minority of the masters is frozen,
partitioned, slowed, reset and restarted, then checks that no two critical sections on one
resource overlapped, that every section left before its lease deadline, and (fencing on)
that the fencing tokens of one resource strictly increased in the order of its sections.

Usage: soak [--SETTING N]...

Settings, as flags or CHECKER_* environment variables (flags win), with the soak defaults:
  --acquisitions N   CHECKER_ACQUISITIONS   successful acquisitions over all processes (100000)
  --processes N      CHECKER_PROCESSES      worker processes (4)
  --tasks N          CHECKER_TASKS          lock-taking tasks per process (8)
  --resources N      CHECKER_RESOURCES      shared resources (3)
  --ttl-ms N         CHECKER_TTL_MS         lock ttl in ms (400)
  --work-us N        CHECKER_WORK_US        busy work per critical section in us (200)
  --time-limit-s N   CHECKER_TIME_LIMIT_S   workers stop after this many seconds (1800)
  --fencing 0|1      CHECKER_FENCING        fencing tokens on and checked (1)
";

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--worker") {
        worker_main();
        return;
    }
    if args.iter().any(|a| a == "--help" || a == "-h") {
        print!("{USAGE}");
        return;
    }
    let settings = Settings::soak().with_overrides(&args);
    let exe = std::env::current_exe().expect("the path of this binary");
    println!(
        "soak: {} acquisitions over {} processes (redis-server {}), time limit {:?}",
        settings.acquisitions,
        settings.processes,
        redis_version(),
        settings.time_limit
    );
    let report = run(&settings, || {
        let mut c = Command::new(&exe);
        c.arg("--worker");
        c
    });
    print!("{}", report.summary());
    let problems = report.problems();
    if !problems.is_empty() {
        for p in &problems {
            eprintln!("FAIL: {p}");
        }
        eprintln!("logs kept in {:?}", report.dir);
        std::process::exit(1);
    }
    if settings.fencing {
        println!("OK: mutual exclusion held, fencing tokens strictly increased");
    } else {
        println!("OK: mutual exclusion held");
    }
}

fn redis_version() -> String {
    tower_redlock_testkit::redis_server_version()
        .unwrap_or_else(|| "not found: install it (apt-get install -y redis-server)".into())
}
