//! The mutual-exclusion checker: several OS processes fight over a few resources through
//! Redlock (or claim idempotent work) while a nemesis hits a minority of the voters —
//! freezes, partitions, slows, resets and restarts them, resets replies after their
//! command ran, skews their clocks, fails a Sentinel group over under a partition, stores
//! completion records on a minority; then every critical section of every process is
//! checked against every other.
//!
//! `tests/checker.rs` (in the root crate) runs it at CI size; the `soak` binary of this crate
//! runs it long:
//!
//! ```text
//! cargo run --release -p tower-redlock-testkit --bin soak                  # 100,000 acquisitions
//! cargo run --release -p tower-redlock-testkit --bin soak -- --acquisitions 1000000 --processes 4
//! cargo run --release -p tower-redlock-testkit --features cluster --bin soak -- \
//!     --nemesis reply-reset,skew,sentinel,cluster --acquisitions 100000
//! cargo run --release -p tower-redlock-testkit --bin soak -- \
//!     --workload replay --nemesis records,reply-reset,skew --acquisitions 20000
//! ```
//!
//! Settings, as flags or `CHECKER_*` environment variables (flags win):
//!
//! | flag | variable | soak default | test default |
//! | --- | --- | --- | --- |
//! | `--acquisitions N` (replay: claims answered) | `CHECKER_ACQUISITIONS` | 100,000 | 10,000 |
//! | `--processes N` | `CHECKER_PROCESSES` | 4 | 3 |
//! | `--tasks N` (per process) | `CHECKER_TASKS` | 8 | 8 |
//! | `--resources N` (lock workload) | `CHECKER_RESOURCES` | 3 | 3 |
//! | `--ttl-ms N` | `CHECKER_TTL_MS` | 400 (replay: 3000) | 400 (replay: 3000) |
//! | `--work-us N` (busy work per section) | `CHECKER_WORK_US` | 200 | 200 |
//! | `--time-limit-s N` | `CHECKER_TIME_LIMIT_S` | 1800 | 240 |
//! | `--fencing 0\|1` (fencing tokens) | `CHECKER_FENCING` | 1 | 1 |
//! | `--nemesis K1,K2` (see below) | `CHECKER_NEMESIS` | `classic` | `classic` |
//! | `--workload lock\|replay` | `CHECKER_WORKLOAD` | `lock` | `lock` |
//! | `--handler-ms N` (replay: the handler waits up to N ms) | `CHECKER_HANDLER_MS` | 60 | 60 |
//! | `--skew-percent N` (`skew`: clock offsets within ±N % of the ttl, N < 50) | `CHECKER_SKEW_PERCENT` | 45 | 45 |
//! | `--min-faults N` (go on until each kind injected N of each of its faults) | `CHECKER_MIN_FAULTS` | 0 | 0 |
//! | `--broken quorum1` (the negative control: must fail) | `CHECKER_BROKEN` | none | none |
//!
//! The nemesis kinds (`nemesis/mod.rs` says exactly what each does), mixed freely; never
//! more than two of the five voters are affected at once (but by the `records` scenario):
//!
//! | kind | faults |
//! | --- | --- |
//! | `classic` | bare masters frozen, partitioned, slowed, reset, restarted empty (behind delayed-restart protection) |
//! | `reply-reset` | a connection reset after its command ran and before its reply (bare masters, and Cluster nodes when the run has a Cluster voter) |
//! | `skew` | bare masters' wall clocks really offset (±`skew-percent` of the ttl: any two differ by at most twice that, below the ttl), and restarted now and then (their fencing counters then start again from their skewed clocks) |
//! | `sentinel` | one voter is a Sentinel group: workers cut from a majority of their sentinels; a failover while some workers are cut off |
//! | `cluster` | one voter is a 3-node Cluster behind proxies: replies reset after the command ran, nodes partitioned |
//! | `records` | (replay workload) completion records on a minority, then expiry: masters frozen around completions and thawed past the completion's patience, at least 1 s inside the ttl, then the master that had the record paused (this scenario holds all five voters, four of them out for a moment) |
//!
//! `--broken quorum1` gives each worker a client over ONE bare master (a different one per
//! worker): the checker must then report violations (`tests/checker.rs` asserts it does).
//! The `cluster` kind needs Cluster voters: the root crate's tests with `--all-features`,
//! the soak binary with `--features cluster`.
//!
//! It needs `redis-server` on `PATH` (`apt-get install -y redis-server`, `brew install
//! redis`, or `. scripts/ensure-redis.sh && ensure_redis`; `skew` also a C compiler); it
//! starts and stops its own five voters on free loopback ports.
//!
//! # What is checked
//!
//! Every worker process records, for each critical section, the resource, the moment it
//! entered and left and the lease's validity deadline — all on the system-wide monotonic
//! clock (`CLOCK_MONOTONIC`, shared by every process of the machine) — and the lease's
//! fencing token (the workers' clients have [`RedlockBuilder::fencing`] on). After the run:
//!
//! - no two sections on one resource overlap (sorted by entry, each entry is at or after
//!   every earlier section's exit),
//! - every section left before its lease deadline (and `Lease::is_valid` agreed),
//! - every section carries a fencing token, and
//! - per resource, the tokens strictly increase in the order the sections happened (sorted
//!   by entry, as for the overlaps: each token is above every earlier section's token).
//!
//! The replay workload records runs of the handler instead (a claim that locked, with how
//! its completion ended) and replays (a claim answered with a record, which names its run);
//! its runs are checked as sections (a key for a resource), and also:
//!
//! - no key ran twice (**double runs**: two runs of one key, whenever they happened), and
//! - every replay's record names a run of its key that some worker logged.
//!
//! The order is causal, not just clock-close: a section's exit is read before its release
//! is sent, and the next holder's entry after its lock was granted, which needs that release
//! (or the expiry) on a quorum first.
//!
//! The tokens can be expected to grow only as long as the library's assumptions hold (see
//! `src/lock/fencing.rs`), and the fault schedule keeps them: the masters keep their
//! counters — freezes, partitions, latency and resets lose nothing; a restarted master
//! comes back empty, but abstains under delayed-restart protection until every lock it
//! forgot has expired, and its counter then starts again from its clock, above every token
//! it gave — and the masters' clocks differ by less than the ttl (here they are one
//! machine's clock: tokens then mostly follow it, in µs, and the counters' `+ 1` and the
//! release's raise rarely decide; `min token step` in the summary shows which did).
//!
//! A failed run keeps its logs (the report says where): one per worker (`worker-N.log`, the
//! format in `log.rs`; `worker-N.out`, what the worker printed) and `faults.log`, every
//! fault injected on the shared clock (`kind voters from_ns to_ns detail`). The report
//! names, for each overlap, out-of-order token and double run, the faults around it.
//!
//! [`RedlockBuilder::fencing`]: tower_redlock::RedlockBuilder::fencing

mod clock;
mod faults;
mod log;
mod nemesis;
mod report;
mod run;
mod settings;
mod topology;
mod verdict;
mod worker;

pub use faults::{FaultCounts, FaultSpan};
pub use log::{Completion, Counts, Replay, Run, Section, WorkerLog};
pub use nemesis::Kind;
pub use report::Report;
pub use run::run;
pub use settings::{Broken, Settings, Workload};
pub use verdict::{check, check_runs, Verdict};
pub use worker::worker_main;

/// Set (to anything) in a worker process's environment.
pub const WORKER_ENV: &str = "CHECKER_WORKER";

/// How many voters (bare masters, and under the `sentinel` and `cluster` nemesis a Sentinel
/// group and a Cluster in place of one each); faults never touch more than
/// [`MAX_AFFECTED`] of them at once.
pub const MASTERS: usize = 5;
/// A minority of [`MASTERS`].
pub const MAX_AFFECTED: usize = 2;
