//! Safety under faults: mutual exclusion across OS processes while a minority of the masters
//! is frozen, partitioned, slowed, reset and restarted.
//!
//! The checker itself lives in the testkit (`tower_redlock_testkit::checker`, also behind its
//! long-running `soak` binary); this test runs it at CI size. The workers are this test
//! binary, re-run with `--exact worker_entry` and [`soak::WORKER_ENV`] set.
//!
//! Size: `CHECKER_ACQUISITIONS` (default 10,000), `CHECKER_PROCESSES` (default 3), and the
//! other `CHECKER_*` variables described in `testkit/src/checker.rs`.

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
fn mutual_exclusion_holds_across_processes_under_faults() {
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
