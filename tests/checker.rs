//! Safety under faults: mutual exclusion, fencing tokens and run-once across OS processes
//! while a nemesis hits a minority of the voters — the classic faults (freezes,
//! partitions, latency, resets, restarts), and the `nemesis_*` runs: replies reset after
//! their command ran, really skewed clocks, a Sentinel failover under a partition, a
//! Cluster voter's replies reset, completion records on a minority then expiry — and a
//! negative control, a broken client the checker must catch.
//!
//! The checker itself lives in the testkit (`tower_redlock_testkit::checker`, also behind its
//! long-running `soak` binary); these tests run it at CI size. The workers are this test
//! binary, re-run with `--exact worker_entry` and [`soak::WORKER_ENV`] set.
//!
//! Size: `CHECKER_ACQUISITIONS` (default 10,000 for the classic run; the `nemesis_*` runs
//! set theirs), `CHECKER_PROCESSES` (default 3), and the other `CHECKER_*` variables
//! described in `testkit/src/checker/mod.rs`.

#![cfg(all(
    any(target_os = "linux", target_os = "macos"),
    target_pointer_width = "64"
))]

use tower_redlock_testkit::checker as soak;

use std::process::Command;
use std::sync::{Condvar, Mutex};

use soak::{check, Section};

/// A worker process: does nothing unless started by the checker.
#[test]
fn worker_entry() {
    if std::env::var_os(soak::WORKER_ENV).is_some() {
        soak::worker_main();
    }
}

/// How many checker runs go at once in this process, whatever the test threads: a run is
/// several worker processes and a nemesis, sized for two at a time on two cores (the test
/// command may run more tests at once for the binaries that mostly wait on I/O).
const RUNS_AT_ONCE: usize = 2;

/// A place among the [`RUNS_AT_ONCE`] checker runs, held until dropped.
struct Slot;

static SLOTS: (Mutex<usize>, Condvar) = (Mutex::new(0), Condvar::new());

impl Slot {
    fn take() -> Self {
        let (taken, freed) = &SLOTS;
        let mut taken = taken.lock().unwrap_or_else(|e| e.into_inner());
        while *taken >= RUNS_AT_ONCE {
            taken = freed.wait(taken).unwrap_or_else(|e| e.into_inner());
        }
        *taken += 1;
        Slot
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let (taken, freed) = &SLOTS;
        *taken.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
        freed.notify_one();
    }
}

/// Runs the checker with `args` over the CI settings (flags win over `CHECKER_*`), in one of
/// the [`RUNS_AT_ONCE`] slots.
fn run_checker(args: &[&str]) -> soak::Report {
    let _slot = Slot::take();
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let settings = soak::Settings::ci().with_overrides(&args);
    let exe = std::env::current_exe().expect("the path of this test binary");
    let report = soak::run(&settings, || {
        let mut c = Command::new(&exe);
        c.args(["--exact", "worker_entry", "--nocapture", "--test-threads=1"]);
        c
    });
    println!("{}", report.summary());
    report
}

/// No problem at all (every kind injected `--min-faults` of each of its faults, too), no
/// violation, and every section fenced.
fn assert_held(report: &soak::Report) {
    let problems = report.problems();
    assert!(
        problems.is_empty(),
        "the checker failed (logs kept in {:?}):\n{}",
        report.dir,
        problems.join("\n")
    );
    let v = &report.verdict;
    assert_eq!(v.violations(), 0);
    assert!(v.overlaps.is_empty() && v.late.is_empty() && v.fencing.is_empty());
    assert!(v.double_runs.is_empty() && v.phantom_replays.is_empty());
    assert_eq!(v.fenced, v.sections, "every section carries a token");
}

/// How many faults of `kind` the run injected.
fn injected(report: &soak::Report, kind: &str) -> u64 {
    report.faults.count_of(&[kind])
}

#[test]
fn mutual_exclusion_and_fencing_hold_across_processes_under_faults() {
    let settings = soak::Settings::ci().with_overrides(&[]);
    let report = run_checker(&[]);
    let problems = report.problems();
    assert!(
        problems.is_empty(),
        "the checker failed (logs kept in {:?}):\n{}",
        report.dir,
        problems.join("\n")
    );
    assert_eq!(report.verdict.violations(), 0);
    // Every section had a token, and on each resource they grew strictly.
    assert!(
        settings.fencing,
        "this test checks fencing tokens: CHECKER_FENCING=0 is not for it"
    );
    assert!(
        report.verdict.fenced as u64 >= settings.acquisitions,
        "only {} fenced sections of {} acquisitions",
        report.verdict.fenced,
        settings.acquisitions
    );
    assert!(
        report.verdict.fencing.is_empty(),
        "{:?}",
        report.verdict.fencing
    );
}

/// Replies reset after their command ran (on the bare masters) while every master's clock
/// is really offset by up to 45 % of the ttl (one ahead by that much, one behind) and the
/// skewed masters are restarted empty now and then, and an operator re-runs forced
/// releases naming a holder after the key changed hands: exclusion holds, the fencing
/// tokens still increase (a restarted master's counters start again from its skewed
/// clock), and no re-run deletes locks on a quorum (only the named holder's leftovers).
#[test]
fn nemesis_reply_resets_and_skewed_clocks_hold() {
    let report = run_checker(&[
        "--nemesis",
        "reply-reset,skew,operator",
        "--acquisitions",
        "3000",
        "--min-faults",
        "2",
    ]);
    assert_held(&report);
    assert!(injected(&report, "reply-reset") >= 2);
    assert_eq!(injected(&report, "skew"), 5, "every bare master offset");
    assert!(injected(&report, "skew-restart") >= 2);
    assert!(injected(&report, "operator-rerun") >= 2);
    assert!(report.voters.iter().any(|v| v.contains("clock +")));
    assert!(report.voters.iter().any(|v| v.contains("clock -")));
}

/// One voter is a Sentinel group of five sentinels, of which each worker lists three;
/// workers are cut from a majority of the group's sentinels (listed or learned), and
/// a failover runs while some of them are cut off (still knowing the old master, which
/// stays writable for seconds): they abstain within their window, and the promoted master
/// waits out its tenure protection. Exclusion and fencing hold.
#[test]
fn nemesis_sentinel_failover_under_a_partition_holds() {
    let report = run_checker(&[
        "--nemesis",
        "sentinel",
        "--acquisitions",
        "2000",
        "--min-faults",
        "1",
    ]);
    assert_held(&report);
    assert!(injected(&report, "sentinel-cut") >= 1);
    assert!(injected(&report, "sentinel-failover") >= 1);
    assert!(report.voters.iter().any(|v| v.contains("Sentinel group")));
}

/// One voter is a 3-node Cluster behind proxies; a node's reply is reset after its command
/// ran (redis-rs sends it again, and the second send finds the voter's own token) or the
/// node is partitioned briefly; the bare masters' replies are reset too. Exclusion and
/// fencing hold.
#[cfg(feature = "cluster")]
#[test]
fn nemesis_cluster_reply_resets_hold() {
    let report = run_checker(&[
        "--nemesis",
        "cluster,reply-reset",
        "--acquisitions",
        "2000",
        "--min-faults",
        "2",
    ]);
    assert_held(&report);
    assert!(injected(&report, "cluster-reply-reset") >= 2);
    assert!(injected(&report, "cluster-partition") >= 2);
    assert!(report
        .voters
        .iter()
        .any(|v| v.contains("Cluster of 3 nodes")));
}

/// Idempotent work claimed with `lock_unless_completed` by every process at once, while
/// completion records land on a minority (two masters reset, then two of the three holding
/// the lock frozen past the completion's patience and thawed inside the ttl), and then the
/// one master that had the record is paused while duplicates claim: no key runs twice, and
/// every replay answers with the record of a run of its key.
#[test]
fn nemesis_records_on_a_minority_never_run_twice() {
    let report = run_checker(&[
        "--workload",
        "replay",
        "--nemesis",
        "records",
        "--acquisitions",
        "2000",
        "--min-faults",
        "2",
    ]);
    assert_held(&report);
    let v = &report.verdict;
    assert!(injected(&report, "records") >= 2);
    assert!(
        v.runs > 0 && v.replays > 0,
        "{} runs, {} replays",
        v.runs,
        v.replays
    );
    let minority = v
        .completions
        .get(&soak::Completion::Minority)
        .copied()
        .unwrap_or(0);
    assert!(
        minority > 0,
        "some completions missed their quorum (the records landed on a minority): {:?}",
        v.completions
    );
}

/// The negative control: each worker's client locks on ONE master (a different one per
/// worker) — a quorum of 1 of 5. The same checker must report it: overlapping sections in
/// the lock workload, keys run twice in the replay workload.
#[test]
fn nemesis_negative_control_sees_violations() {
    let lock = run_checker(&["--broken", "quorum1", "--acquisitions", "600"]);
    assert!(
        !lock.verdict.overlaps.is_empty(),
        "a quorum of one must let sections overlap"
    );
    assert!(lock.verdict.violations() > 0);
    assert!(lock.problems().iter().any(|p| p.starts_with("OVERLAP")));
    assert!(lock.summary().contains("BROKEN CLIENT quorum1"));

    let replay = run_checker(&[
        "--workload",
        "replay",
        "--broken",
        "quorum1",
        "--acquisitions",
        "600",
    ]);
    assert!(
        !replay.verdict.double_runs.is_empty(),
        "a quorum of one must let keys run twice"
    );
    assert!(replay
        .problems()
        .iter()
        .any(|p| p.starts_with("DOUBLE RUN")));
    // The runs kept their logs for inspection; the test removes them.
    for dir in [&lock.dir, &replay.dir] {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// The durable mode: claims through `RedlockLayer` with durable replay, the key's row first
/// in the handler's PostgreSQL transaction with a business row, while workers are SIGKILLed
/// by the parent and by themselves right after their commit (before the row's response
/// and the Redis record) or right after the row's response (before the Redis record), and
/// every master is flushed at once or two restarted empty: no key has two business rows,
/// and every `2xx` names its key's one run.
#[test]
fn durable_rows_never_run_twice_under_crashes_and_flushes() {
    let report = run_checker(&[
        "--workload",
        "replay",
        "--store",
        "postgres",
        "--nemesis",
        "crash",
        "--acquisitions",
        "1500",
        "--min-faults",
        "2",
    ]);
    assert_held(&report);
    for kind in [
        "kill",
        "kill-after-commit",
        "kill-after-row",
        "flushall",
        "redis-restart",
    ] {
        assert!(injected(&report, kind) >= 2, "{kind}: {:?}", report.faults);
    }
    let d = report
        .verdict
        .durable
        .as_ref()
        .expect("the durable verdict");
    assert!(d.double_runs.is_empty() && d.phantoms.is_empty());
    assert!(d.answered() >= 1500, "{:?}", d.outcomes);
    assert!(
        d.count(soak::durable::Outcome::Run) > 0 && d.count(soak::durable::Outcome::Replay) > 0,
        "{:?}",
        d.outcomes
    );
}

/// The durable mode's negative control: the work commits first and the key's row after it,
/// in a transaction of its own. The same checker must find keys with two business rows
/// (each worker killed right after its commit — one at least — is retried once started
/// again, and that retry runs the work a second time).
#[test]
fn durable_negative_control_row_outside_the_transaction_runs_twice() {
    let report = run_checker(&[
        "--workload",
        "replay",
        "--store",
        "postgres",
        "--nemesis",
        "crash",
        "--broken",
        "row-outside-tx",
        "--acquisitions",
        "600",
        "--min-faults",
        "1",
    ]);
    let d = report
        .verdict
        .durable
        .as_ref()
        .expect("the durable verdict");
    assert!(!d.double_runs.is_empty(), "{d:?}");
    assert!(report
        .problems()
        .iter()
        .any(|p| p.starts_with("DOUBLE RUN")));
    assert!(report.summary().contains("BROKEN CLIENT row-outside-tx"));
    let _ = std::fs::remove_dir_all(&report.dir);
}

/// The negative control of late exits: every section blocks its runtime's thread (a
/// blocking call in async code) until half a ttl past its deadline. Its thread is not
/// runnable meanwhile, so it shows no wait for a CPU: the checker reports late exits, never
/// paused sections, however loaded the machine.
#[test]
fn nemesis_negative_control_blocking_sections_are_late_not_paused() {
    let report = run_checker(&["--broken", "block", "--acquisitions", "30"]);
    let v = &report.verdict;
    assert!(!v.late.is_empty(), "blocked sections must be late: {v:?}");
    assert!(
        v.paused.is_empty(),
        "a blocked section taken for a paused one: {:?}",
        v.paused
    );
    assert!(report.problems().iter().any(|p| p.starts_with("LATE")));
    assert!(report.summary().contains("BROKEN CLIENT block"));
    let _ = std::fs::remove_dir_all(&report.dir);
}

fn section(resource: usize, enter_ns: i64, leave_ns: i64, worker: usize) -> Section {
    Section {
        resource,
        enter_ns,
        leave_ns,
        deadline_ns: leave_ns + 1_000,
        plan_ns: leave_ns,
        starved_ns: 0,
        valid: true,
        worker,
        task: 0,
        token: None,
    }
}

fn fenced(resource: usize, enter_ns: i64, worker: usize, token: u64) -> Section {
    Section {
        token: Some(token),
        ..section(resource, enter_ns, enter_ns + 10, worker)
    }
}

/// The checker's evidence of a starved section (`soak::Starvation`, Linux's run-queue wait
/// of the section's thread): a thread that spins while more threads than cores spin beside
/// it waits for a CPU — tens of milliseconds of 300 — and a thread whose own code sleeps
/// shows no evidence at all (a voluntary switch before `own_code_done`: the kernel's count
/// sometimes takes a sleep for a wait, so the wait is not read). Without the first, no
/// starved section could ever be counted as paused; without the second, a blocking call
/// would pass for one.
#[cfg(target_os = "linux")]
#[test]
fn a_starved_thread_shows_a_wait_for_a_cpu_and_a_sleeping_one_does_not() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::{Duration, Instant};
    let stop = Arc::new(AtomicBool::new(false));
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let busy: Vec<_> = (0..2 * cores)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let spun = soak::Starvation::begin();
    let until = Instant::now() + Duration::from_millis(300);
    while Instant::now() < until {
        std::hint::spin_loop();
    }
    let spun = soak::Starvation::end(spun);
    let mut slept = soak::Starvation::begin();
    std::thread::sleep(Duration::from_millis(300));
    soak::Starvation::own_code_done(&mut slept);
    let slept = soak::Starvation::end(slept);
    stop.store(true, Ordering::Relaxed);
    for b in busy {
        b.join().unwrap();
    }
    assert!(
        spun >= 10_000_000,
        "a spinning thread among busier ones waited {spun} ns"
    );
    assert_eq!(slept, 0, "a sleeping thread showed evidence of starvation");
}

/// The checker itself must be able to fail: overlaps (also one nested in a long section
/// and not adjacent to it after sorting) and late exits are caught; handovers that merely
/// touch, and overlaps across different resources, are not violations.
#[test]
fn the_checker_catches_overlaps_and_late_exits() {
    let clean = check(vec![
        section(0, 0, 100, 0),
        section(0, 100, 200, 1), // enters exactly when the other left
        section(1, 50, 150, 2),  // another resource
    ]);
    assert_eq!(clean.violations(), 0, "{clean:?}");
    assert_eq!(clean.min_handover_ns, Some(0));

    let overlap = check(vec![section(0, 0, 100, 0), section(0, 99, 200, 1)]);
    assert_eq!(overlap.overlaps.len(), 1);
    assert_eq!(overlap.overlaps[0].1.worker, 1);

    // [0, 1000] contains [10, 20] and [30, 40]: both overlap the long one.
    let nested = check(vec![
        section(2, 0, 1000, 0),
        section(2, 10, 20, 1),
        section(2, 30, 40, 2),
    ]);
    assert_eq!(nested.overlaps.len(), 2, "{nested:?}");

    // Late: left at (or after) its deadline as it planned to; not valid when it left,
    // before its deadline (the lease said it was gone early); overran its plan with its
    // own code (no time waiting for a CPU: a blocking call).
    let mut late = section(0, 0, 100, 0);
    late.deadline_ns = 100;
    let mut invalid = section(0, 200, 300, 1);
    invalid.valid = false;
    let blocked = Section {
        plan_ns: 450,
        deadline_ns: 500,
        starved_ns: 50,
        ..section(0, 400, 700, 2)
    };
    let v = check(vec![late, invalid, blocked]);
    assert_eq!(v.late.len(), 3, "{v:?}");
    assert!(v.paused.is_empty());
    assert_eq!(v.overlaps.len(), 0);
    assert_eq!(v.violations(), 3);
}

/// A section that planned to leave well before its deadline and whose thread waited for a
/// CPU at least as long as it overran (a starved worker: a paused process) is counted as
/// paused, not late; the part before its deadline is still checked — a holder entering
/// before that deadline overlaps it, one entering after it does not (the lock promises
/// nothing after its deadline). With less starvation than its overrun it is late. A section
/// that reached its entry after its deadline and left at once is expired on arrival — not a
/// violation, checked as covering nothing — and late if it planned work.
#[test]
fn the_checker_counts_a_starved_section_as_paused_and_checks_it_until_its_deadline() {
    let starved = |worker| Section {
        plan_ns: 50,
        deadline_ns: 100,
        starved_ns: 600,
        valid: false,
        ..section(0, 0, 700, worker)
    };
    let not_starved_enough = Section {
        starved_ns: 599,
        ..starved(0)
    };
    let v = check(vec![not_starved_enough]);
    assert_eq!((v.late.len(), v.paused.len()), (1, 0), "{v:?}");
    let unknown = Section {
        starved_ns: -1,
        ..starved(0)
    };
    assert_eq!(check(vec![unknown]).late.len(), 1);

    let after = check(vec![starved(0), section(0, 100, 200, 1)]);
    assert_eq!(after.paused.len(), 1, "{after:?}");
    assert_eq!(
        after.paused[0].leave_ns, 700,
        "the paused section as it was logged"
    );
    assert!(
        after.late.is_empty() && after.overlaps.is_empty(),
        "{after:?}"
    );
    assert_eq!(after.violations(), 0);

    let before = check(vec![starved(0), section(0, 99, 200, 1)]);
    assert_eq!(before.paused.len(), 1);
    assert_eq!(
        before.overlaps.len(),
        1,
        "entered before the paused one's deadline"
    );
    assert_eq!(before.violations(), 1);

    // Reaching its section after its deadline (its thread descheduled between the
    // library's check and the entry), it left at once, doing nothing: expired on arrival,
    // whatever the evidence of starvation — and late if it planned work.
    let reached_late = Section {
        plan_ns: 150,
        deadline_ns: 100,
        starved_ns: 0,
        valid: false,
        ..section(0, 150, 160, 0)
    };
    let v = check(vec![reached_late]);
    assert_eq!(
        (v.expired_on_arrival.len(), v.violations()),
        (1, 0),
        "{v:?}"
    );
    let worked = Section {
        plan_ns: 155,
        ..reached_late
    };
    assert_eq!(check(vec![worked]).late.len(), 1);
    // What it covered is nothing: a holder that came after its deadline (and before its
    // entry), with a newer token, neither overlaps it nor comes out of token order; one
    // that came before its deadline is checked against the sections as ever.
    let next = Section {
        token: Some(6),
        ..section(0, 120, 130, 1)
    };
    let v = check(vec![
        Section {
            token: Some(5),
            ..reached_late
        },
        next,
    ]);
    assert_eq!(
        (v.expired_on_arrival.len(), v.violations()),
        (1, 0),
        "{v:?}"
    );

    // A paused section's token still orders it.
    let mut early = starved(0);
    early.token = Some(20);
    let mut next = section(0, 150, 200, 1);
    next.token = Some(10);
    assert_eq!(check(vec![early, next]).fencing.len(), 1);
}

/// The fencing check must be able to fail too: on one resource, a token equal to or below
/// an earlier one is caught — in the order the sections were entered, whatever order the
/// logs list them in, and against the largest earlier token, not just the previous one —
/// while tokens going down across different resources are fine. A section without a token
/// is listed, and a run with fencing on reports it.
#[test]
fn the_checker_catches_fencing_tokens_out_of_order() {
    let clean = check(vec![
        fenced(0, 200, 1, 30),
        fenced(0, 0, 0, 10),
        fenced(0, 100, 2, 20),
        fenced(1, 300, 0, 5), // below resource 0's tokens: another resource
        fenced(1, 400, 1, 6),
    ]);
    assert_eq!(clean.violations(), 0, "{clean:?}");
    assert_eq!(clean.fenced, 5);
    assert_eq!(clean.min_token_step, Some(1));
    assert!(clean.unfenced.is_empty());

    let equal = check(vec![fenced(0, 0, 0, 10), fenced(0, 100, 1, 10)]);
    assert_eq!(equal.fencing.len(), 1, "{equal:?}");
    assert_eq!(equal.violations(), 1);
    let (a, b) = equal.fencing[0];
    assert_eq!((a.worker, b.worker), (0, 1));

    // 10, 30, 20, 25: 20 and 25 both come after 30.
    let down = check(vec![
        fenced(2, 0, 0, 10),
        fenced(2, 100, 1, 30),
        fenced(2, 200, 2, 20),
        fenced(2, 300, 0, 25),
    ]);
    assert_eq!(down.fencing.len(), 2, "{down:?}");
    assert!(down.fencing.iter().all(|(a, _)| a.token == Some(30)));
    assert_eq!(down.fencing[0].1.token, Some(20));
    assert_eq!(down.fencing[1].1.token, Some(25));
    assert_eq!(down.overlaps.len(), 0);
    assert_eq!(down.violations(), 2);

    // A section without a token: listed, skipped by the order check, reported with fencing
    // on (and not without).
    let missing = check(vec![
        fenced(0, 0, 0, 10),
        section(0, 100, 110, 1),
        fenced(0, 200, 2, 11),
    ]);
    assert_eq!(missing.fenced, 2);
    assert_eq!(missing.unfenced.len(), 1);
    assert_eq!(missing.unfenced[0].worker, 1);
    assert!(missing.fencing.is_empty(), "{missing:?}");
    let report = |fencing: bool| soak::Report {
        settings: soak::Settings {
            fencing,
            ..soak::Settings::ci()
        },
        voters: Vec::new(),
        logs: Vec::new(),
        failed_workers: Vec::new(),
        faults: soak::FaultCounts::default(),
        verdict: missing.clone(),
        elapsed: std::time::Duration::from_secs(1),
        dir: std::env::temp_dir(),
    };
    let no_token = |fencing: bool| {
        report(fencing)
            .problems()
            .into_iter()
            .filter(|p| p.contains("no fencing token"))
            .count()
    };
    assert_eq!(no_token(true), 1);
    assert_eq!(no_token(false), 0);
    assert!(report(true).summary().contains("fenced sections"));

    // An out-of-order pair is named in the report, with its tokens.
    let problems = soak::Report {
        verdict: equal,
        ..report(true)
    }
    .problems();
    assert!(
        problems
            .iter()
            .any(|p| p.contains("FENCING TOKEN OUT OF ORDER") && p.contains("token 10")),
        "{problems:?}"
    );
}

/// Writers make read-modify-writes through a fenced PostgreSQL store (one real server),
/// each claiming its row with its token before it reads, while the classic nemesis hits the
/// masters, and now and then a writer pauses past its lease's ttl — before its read, or
/// between its read and its write: in the table's history every committed write carries a
/// fence at least the previous one's, and a larger one whenever the writer changed — 0 out
/// of token order — every committed write is in the final value's lineage — 0 lost — and
/// the paused writers whose key was claimed meanwhile were refused. The read and the write
/// sit inside the critical section, and a PostgreSQL round trip on a loaded 2-core machine
/// may take tens of milliseconds: a ttl of 1 s leaves it room within the lease.
#[test]
fn fenced_store_checker_postgres_writes_in_token_order_under_faults() {
    let report = run_checker(&[
        "--store",
        "postgres",
        "--acquisitions",
        "2000",
        "--ttl-ms",
        "1000",
    ]);
    assert_held(&report);
    let store = report
        .verdict
        .store
        .as_ref()
        .expect("a run with --store has a store verdict");
    let c = store.counts;
    assert_eq!(store.out_of_order.len(), 0, "{:?}", store.out_of_order);
    assert_eq!(store.not_increased.len(), 0, "{:?}", store.not_increased);
    assert_eq!(store.lost.len(), 0, "{:?}", store.lost);
    assert!(c.committed > 0, "{c:?}");
    assert_eq!(store.history as u64, c.committed);
    assert_eq!(store.row_writes, store.history as i64);
    assert!(c.paused >= 3, "a few writers paused past their ttl: {c:?}");
    assert!(c.paused_refused > 0, "{c:?}");
    // Both pauses happened: before a read, and between a read and its write (the report
    // fails the run otherwise too).
    assert!(
        0 < c.paused_after_read && c.paused_after_read < c.paused,
        "{c:?}"
    );
    // A writer paused after its read held its row while the next holders came: some claim
    // found it busy (else the pause after the read was never contended).
    assert!(
        c.busy > 0,
        "could not set up the scenario: no claim met a paused holder's row: {c:?}"
    );
    // A writer inside its lease is never refused as stale: only the paused ones were (one
    // may find the row busy: a paused writer's claim holds it).
    assert_eq!(c.refused, c.paused_refused, "{c:?}");
    assert!(report.faults.total() > 0);
    assert!(report.summary().contains("paused writes"));
}
