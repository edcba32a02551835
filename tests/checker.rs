//! Safety under faults: mutual exclusion and fencing tokens across OS processes while a
//! minority of the masters is frozen, partitioned, slowed, reset and restarted.
//!
//! The checker itself lives in the testkit (`tower_redlock_testkit::checker`, also behind its
//! long-running `soak` binary); this test runs it at CI size. The workers are this test
//! binary, re-run with `--exact worker_entry` and [`soak::WORKER_ENV`] set.
//!
//! Size: `CHECKER_ACQUISITIONS` (default 10,000), `CHECKER_PROCESSES` (default 3), and the
//! other `CHECKER_*` variables described in `testkit/src/checker/mod.rs`.

#![cfg(all(
    any(target_os = "linux", target_os = "macos"),
    target_pointer_width = "64"
))]

use tower_redlock_testkit::checker as soak;

use std::process::Command;

use soak::{check, Section};

/// A worker process: does nothing unless started by the checker.
#[test]
fn worker_entry() {
    if std::env::var_os(soak::WORKER_ENV).is_some() {
        soak::worker_main();
    }
}

#[test]
fn mutual_exclusion_and_fencing_hold_across_processes_under_faults() {
    let settings = soak::Settings::ci().with_overrides(&[]);
    let exe = std::env::current_exe().expect("the path of this test binary");
    let report = soak::run(&settings, || {
        let mut c = Command::new(&exe);
        c.args(["--exact", "worker_entry", "--nocapture", "--test-threads=1"]);
        c
    });
    println!("{}", report.summary());
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

fn section(resource: usize, enter_ns: i64, leave_ns: i64, worker: usize) -> Section {
    Section {
        resource,
        enter_ns,
        leave_ns,
        deadline_ns: leave_ns + 1_000,
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

    let mut late = section(0, 0, 100, 0);
    late.deadline_ns = 100;
    let mut invalid = section(0, 200, 300, 1);
    invalid.valid = false;
    let v = check(vec![late, invalid]);
    assert_eq!(v.late.len(), 2);
    assert_eq!(v.overlaps.len(), 0);
    assert_eq!(v.violations(), 2);
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
