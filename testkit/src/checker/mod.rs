//! The mutual-exclusion checker: several OS processes fight over a few resources through
//! Redlock while a minority of the masters is frozen, partitioned, slowed, reset and
//! restarted; then every critical section of every process is checked against every other.
//!
//! `tests/checker.rs` (in the root crate) runs it at CI size; the `soak` binary of this crate
//! runs it long:
//!
//! ```text
//! cargo run --release -p tower-redlock-testkit --bin soak                  # 100,000 acquisitions
//! cargo run --release -p tower-redlock-testkit --bin soak -- --acquisitions 1000000 --processes 4
//! ```
//!
//! Settings, as flags or `CHECKER_*` environment variables (flags win):
//!
//! | flag | variable | soak default | test default |
//! | --- | --- | --- | --- |
//! | `--acquisitions N` | `CHECKER_ACQUISITIONS` | 100,000 | 10,000 |
//! | `--processes N` | `CHECKER_PROCESSES` | 4 | 3 |
//! | `--tasks N` (per process) | `CHECKER_TASKS` | 8 | 8 |
//! | `--resources N` | `CHECKER_RESOURCES` | 3 | 3 |
//! | `--ttl-ms N` | `CHECKER_TTL_MS` | 400 | 400 |
//! | `--work-us N` (busy work per section) | `CHECKER_WORK_US` | 200 | 200 |
//! | `--time-limit-s N` | `CHECKER_TIME_LIMIT_S` | 1800 | 240 |
//! | `--fencing 0\|1` (fencing tokens) | `CHECKER_FENCING` | 1 | 1 |
//!
//! It needs `redis-server` on `PATH` (`apt-get install -y redis-server`, `brew install
//! redis`, or `. scripts/ensure-redis.sh && ensure_redis`); it starts and stops its own five
//! masters on free loopback ports.
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
//! fault injected on the shared clock (`kind masters from_ns to_ns detail`). The report
//! names, for each overlap and out-of-order token, the faults around it.
//!
//! [`RedlockBuilder::fencing`]: tower_redlock::RedlockBuilder::fencing

mod clock;
mod faults;
mod log;
mod report;
mod run;
mod settings;
mod verdict;
mod worker;

pub use faults::{FaultCounts, FaultSpan};
pub use log::{Counts, Section, WorkerLog};
pub use report::Report;
pub use run::run;
pub use settings::Settings;
pub use verdict::{check, Verdict};
pub use worker::worker_main;

/// Set (to anything) in a worker process's environment.
pub const WORKER_ENV: &str = "CHECKER_WORKER";

/// How many masters; faults never touch more than [`MAX_AFFECTED`] of them at once.
pub const MASTERS: usize = 5;
/// A minority of [`MASTERS`].
pub const MAX_AFFECTED: usize = 2;
