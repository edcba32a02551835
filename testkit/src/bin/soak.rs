//! A long local run of the mutual-exclusion checker ([`tower_redlock_testkit::checker`]):
//! by default 100,000 acquisitions over 4 worker processes, each of them this binary again
//! (`--worker`). Exits non-zero when mutual exclusion (or fencing, or run-once) did not
//! hold.
//!
//! ```text
//! cargo run --release -p tower-redlock-testkit --bin soak
//! cargo run --release -p tower-redlock-testkit --bin soak -- --acquisitions 1000000 --processes 4
//! cargo run --release -p tower-redlock-testkit --features cluster --bin soak -- \
//!     --nemesis classic,reply-reset,skew,sentinel,cluster
//! cargo run --release -p tower-redlock-testkit --bin soak -- --workload replay \
//!     --nemesis records,reply-reset,skew,classic --min-faults 40
//! cargo run --release -p tower-redlock-testkit --features middleware --bin soak -- \
//!     --workload replay --nemesis lost
//! cargo run --release -p tower-redlock-testkit --features durable --bin soak -- \
//!     --workload replay --store postgres --nemesis crash --min-faults 2
//! cargo run -p tower-redlock-testkit --bin soak -- --help
//! ```

#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::process::Command;

use tower_redlock_testkit::checker::{run, worker_main, Settings, Workload};

const USAGE: &str = "\
soak: the multi-process mutual-exclusion checker of tower-redlock, long run.

Starts 5 voters (redis-server must be on PATH) behind fault proxies, runs worker processes
that fight over a few resources (or claim idempotent work) while a nemesis hits a minority
of the voters, then checks that no two critical sections on one resource overlapped, that
every section left before its lease deadline, that (fencing on) the fencing tokens of one
resource strictly increased in the order of its sections, and (replay workload) that no key
ran twice and every replayed record names a run of its key.

Usage: soak [--SETTING VALUE]...

Settings, as flags or CHECKER_* environment variables (flags win), with the soak defaults:
  --acquisitions N   CHECKER_ACQUISITIONS   acquisitions (replay: claims answered) over all
                                            processes (100000)
  --processes N      CHECKER_PROCESSES      worker processes (4)
  --tasks N          CHECKER_TASKS          lock-taking tasks per process (8)
  --resources N      CHECKER_RESOURCES      shared resources, lock workload (3)
  --ttl-ms N         CHECKER_TTL_MS         lock ttl in ms (400; replay workload: 3000)
  --work-us N        CHECKER_WORK_US        busy work per critical section in us (200)
  --time-limit-s N   CHECKER_TIME_LIMIT_S   workers stop after this many seconds (1800)
  --fencing 0|1      CHECKER_FENCING        fencing tokens on and checked (1)
  --nemesis K1,K2    CHECKER_NEMESIS        the faults, mixed (classic):
      classic        bare masters frozen, partitioned, slowed, reset, restarted empty
      reply-reset    a connection reset after its command ran, before its reply (bare
                     masters; Cluster nodes too when the run has a Cluster voter)
      skew           bare masters' clocks really offset within +/- skew-percent of the ttl
                     (any two differ by at most twice that, below the ttl), restarted now
                     and then so their fencing counters restart from the skewed clock
      sentinel       one voter is a Sentinel group of 5 of which workers list 3: workers
                     cut from a majority of the group; SENTINEL FAILOVER while some
                     workers are cut off
      cluster        one voter is a 3-node Cluster behind proxies: replies reset after the
                     command ran, nodes partitioned (needs --features cluster)
      records        replay workload: completion records on a minority (masters frozen
                     around completions, thawed past their patience inside the ttl), then
                     the master that had the record paused while duplicates claim
      operator       lock workload: a forced release naming a holder, re-run after the
                     key changed hands (must delete nothing)
      evict          lock workload: a master made a cache at run time (CONFIG SET
                     maxmemory-policy, junk until it evicts), then set back
      lost           replay workload through RedlockLayer (needs --features middleware):
                     handlers overrun their lease, two masters cut off now and then;
                     every duplicate must get its key's first answer (ttl 1000 ms)
      crash          durable mode (--workload replay --store postgres, needs --features
                     durable): workers SIGKILLed by the parent and by fail points after
                     their commit and after the row's response; all masters FLUSHALLed,
                     two restarted empty
  --workload W       CHECKER_WORKLOAD       lock (critical sections) or replay
                                            (lock_unless_completed + complete) (lock)
  --handler-ms N     CHECKER_HANDLER_MS     replay: the handler waits up to N ms (60)
  --skew-percent N   CHECKER_SKEW_PERCENT   skew: max clock offset in % of the ttl, < 50 (45)
  --min-faults N     CHECKER_MIN_FAULTS     go on past the acquisitions until every kind
                                            injected N of each of its faults (0)
  --broken B         CHECKER_BROKEN         negative control, the run MUST fail (none):
      quorum1        each worker locks on ONE master
      block          each section blocks its runtime's thread past the deadline
      unclaimed-read with --store: a plain read, the token checked in the write only
      row-outside-tx durable mode: the work commits, then the key's row on its own
  --store postgres   CHECKER_STORE          lock workload: sections also make a
                                            read-modify-write in a PostgreSQL store (one
                                            throwaway server), the row claimed with the
                                            token first; every 100th write pauses past the
                                            ttl, before or after its read; its history
                                            checked for token order and lost writes (none);
                                            replay workload: the durable mode, claims
                                            through RedlockLayer with the key's row in
                                            PostgreSQL, a business row per run (needs
                                            --features durable); no key may have two
                                            business rows, every 2xx names the key's run
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
        "soak: {} {} over {} processes, nemesis {} (redis-server {}), time limit {:?}",
        settings.acquisitions,
        match settings.workload {
            Workload::Lock => "acquisitions",
            Workload::Replay => "claims",
        },
        settings.processes,
        settings.nemesis_names(),
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
    if settings.durable() {
        println!(
            "OK: no key ran twice (its business rows unique in PostgreSQL), every 2xx named \
             its key's run"
        );
        return;
    }
    let also = match settings.workload {
        Workload::Lock => "",
        Workload::Replay => ", no key ran twice",
    };
    if settings.fencing {
        println!("OK: mutual exclusion held, fencing tokens strictly increased{also}");
    } else {
        println!("OK: mutual exclusion held{also}");
    }
}

fn redis_version() -> String {
    tower_redlock_testkit::redis_server_version()
        .unwrap_or_else(|| "not found: install it (apt-get install -y redis-server)".into())
}
