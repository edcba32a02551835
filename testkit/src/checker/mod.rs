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
//!     --nemesis classic,reply-reset,skew,sentinel,cluster --acquisitions 100000
//! cargo run --release -p tower-redlock-testkit --bin soak -- \
//!     --workload replay --nemesis records,reply-reset,skew,classic --min-faults 40
//! cargo run --release -p tower-redlock-testkit --features middleware --bin soak -- \
//!     --workload replay --nemesis lost                                      # lost leases
//! cargo run --release -p tower-redlock-testkit --features durable --bin soak -- \
//!     --workload replay --store postgres --nemesis crash --min-faults 2     # durable rows
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
//! | `--time-limit-s N` | `CHECKER_TIME_LIMIT_S` | 1800 | 600 |
//! | `--fencing 0\|1` (fencing tokens) | `CHECKER_FENCING` | 1 | 1 |
//! | `--nemesis K1,K2` (see below) | `CHECKER_NEMESIS` | `classic` | `classic` |
//! | `--workload lock\|replay` | `CHECKER_WORKLOAD` | `lock` | `lock` |
//! | `--handler-ms N` (replay: the handler waits up to N ms) | `CHECKER_HANDLER_MS` | 60 | 60 |
//! | `--skew-percent N` (`skew`: clock offsets within ±N % of the ttl, N < 50) | `CHECKER_SKEW_PERCENT` | 45 | 45 |
//! | `--min-faults N` (go on until each kind injected N of each of its faults) | `CHECKER_MIN_FAULTS` | 0 | 0 |
//! | `--broken quorum1` (the negative control: must fail; also `block`, `unclaimed-read` with `--store postgres`, `row-outside-tx` in the durable mode) | `CHECKER_BROKEN` | none | none |
//! | `--store postgres` (lock workload, fencing on: sections also make a claimed read-modify-write in a PostgreSQL store, a few writers paused past their ttl; replay workload: its **durable mode**, the key rows and business rows there, testkit feature `durable`; see below) | `CHECKER_STORE` | none | none |
//!
//! The nemesis kinds, mixed freely: each is a lane (a thread, `nemesis/`), and the lanes
//! share one budget, so never more than two of the five voters are affected at once (but
//! by the `records` scenario, which holds all five and takes four out for a moment);
//! lanes waiting for room take turns.
//!
//! | kind | what it does | faults counted |
//! | --- | --- | --- |
//! | `classic` | one bare master frozen, partitioned (black hole), slowed, reset or restarted empty (then abstaining under delayed-restart protection), or two at once frozen / frozen + partitioned, for 150–450 ms | `freeze`, `freeze-two`, `partition`, `freeze+partition`, `latency`, `reset`, `restart` |
//! | `reply-reset` | the proxy of a random bare master (or Cluster node, when the run has a Cluster voter) resets the connection that carries the next reply, after its command ran | `reply-reset` |
//! | `skew` | every bare master runs with its wall clock really offset (one by `+skew-percent` of the ttl, one by `−skew-percent`, the others between: any two differ by at most twice that, below the ttl); one of them restarted empty now and then, so its fencing counters start again from its skewed clock | `skew` (one per offset master), `skew-restart` |
//! | `sentinel` | one voter is a Sentinel group (master, replica, 5 sentinels of which each worker lists 3 and learns the other 2 from the group; the workers' voters refresh every 200 ms, a 400 ms majority window, tenure protection of the ttl), each worker reaching its listed sentinels through proxies of its own and every sentinel as an ACL user of its own: some workers cut from a majority (or all) of the group's sentinels for 0.3–1.5 s (their user switched off there, their proxies black-holed or reset); or a `SENTINEL FAILOVER` while some workers — never all — are cut off, cut before it or the moment the first sentinel names the new master, healed 0.3–1.5 s after it | `sentinel-cut`, `sentinel-failover` |
//! | `cluster` | one voter is a 3-node Cluster, each node behind a proxy it announces: a node's next reply reset after its command ran, or the node partitioned for 100–400 ms | `cluster-reply-reset`, `cluster-partition` |
//! | `records` | (replay workload) records on a minority, then expiry: after a quiet ttl, two masters reset while claims lock on the other three, then two of those frozen too, past a completion's patience (records land on the fifth alone), and thawed at least 1 s inside the ttl, then the fifth paused past the ttl while duplicates claim | `records` |
//! | `operator` | (lock workload) an operator's forced release re-run after the key changed hands: the parent inspects a held resource through its own client of the bare masters, waits until another holder has it, then force-releases naming the first holder — which may delete that holder's leftovers on a minority, never locks on a quorum (the lane stops the run if it did; an overlap is the checker's verdict) | `operator-rerun` |
//! | `lost` | (replay workload, testkit feature `middleware`) the lost-lease mode: claims go through `RedlockLayer` (replay, keep-alive off, `OnLost::Finish` on even keys, `OnLost::Abort` on odd ones; ttl 1 s unless set) and one run in six sleeps 0.2–1.5 s past its lease's deadline, its key claimed again just after the deadline and 8 times more; two bare masters cut off (proxies reset) for 0.3–1.2 s, 0.2–0.8 s apart — so a lost lease's "if free" record often lands beside a later holder's. Every duplicate's answer is logged: each must be the key's first (`worker/lost.rs`) | `lost-cut` |
//! | `crash` | (durable mode: `--workload replay --store postgres`) the parent SIGKILLs a random worker every 0.3–1.5 s and starts it again; each worker SIGKILLs itself, once in 150 passes, right after `row.commit(tx)` returned `Ok` (before the row's response and the Redis record) or right after the row's response was stored (before the Redis record); every bare master FLUSHALLed at once (all voters held), or two restarted empty (their records gone), 0.3–1.2 s apart (`nemesis/crash.rs`, `durable/`) | `kill`, `kill-after-commit`, `kill-after-row`, `flushall`, `redis-restart` |
//! | `evict` | (lock workload) a bare master made a cache at run time: `CONFIG SET maxmemory-policy` (an `allkeys-*` or `volatile-*` policy) and a `maxmemory` just above its use on a live master its voters found `noeviction`, junk written until it evicts, for 150–450 ms, then set back; its voters' scripts must refuse every vote there meanwhile. A lease granted before the change may lose its key there (the residual docs/safety.md states): `evicted-keys` counts what it dropped | `evict` |
//!
//! The replay workload never restarts a master nor fails one over (`classic` leaves out
//! `restart`, `skew` its restarts, `sentinel` its failovers): the masters here keep their
//! completion records in memory only, and a master that forgets one may let its key run
//! again — which the library documents (keep record masters persistent), not prevents.
//! Its durable mode does (with `crash` or `classic`): there the key's row is the truth.
//!
//! `--broken quorum1` gives each worker a client over ONE bare master (a different one per
//! worker): the checker must then report violations (`tests/checker.rs` asserts it does).
//! The `cluster` kind needs Cluster voters: the root crate's tests with `--all-features`,
//! the soak binary with `--features cluster`.
//!
//! It needs `redis-server` on `PATH` (`apt-get install -y redis-server`, `brew install
//! redis`, or `. scripts/ensure-redis.sh && ensure_redis`; `skew` also a C compiler); it
//! starts and stops its own five voters on free loopback ports. `--store postgres` also needs
//! PostgreSQL's `initdb` and `postgres` (`apt-get install -y postgresql`; see the testkit's
//! `PostgresServer`).
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
//! - every section left before its lease deadline (and `Lease::is_valid` agreed; a section
//!   works only with 50 ms of validity left, see `worker/lock.rs`),
//! - every section carries a fencing token, and
//! - per resource, the tokens strictly increase in the order the sections happened (sorted
//!   by entry, as for the overlaps: each token is above every earlier section's token).
//!
//! With `--store postgres` the parent also starts one PostgreSQL server (the testkit's
//! [`PostgresServer`](crate::PostgresServer)) with a row per resource, and every section
//! makes a read-modify-write of its row before it leaves: the row claimed with the lease's
//! token (the library's `FencedTable` claim, which returns the row), its write count read
//! from there and written back plus one, a `fenced_history` row with the value read, in
//! one transaction (`store/`). Every 100th write of a process pauses past its lease's
//! expiry, alternately before its read (1.5 ttls, then reads and writes with the old token)
//! and between its read and its write (its transaction open past the lease's deadline,
//! alternately 1.5 ttls and up to a thirty-second of a ttl, then writes): the section, as
//! the lock covered it, is recorded as left when the
//! pause began (the lock promises nothing after its deadline; the late write is fencing's
//! to handle — `worker/lock.rs`). After the run, per resource in commit order:
//!
//! - no committed fence is below an earlier one, and a fence grows strictly whenever the
//!   writer (process, task) changed;
//! - no write is lost: each committed write read what the one before it wrote, and the
//!   history, the rows' write counts and the workers' own counts agree; and
//! - some writes committed and some paused writer's write was refused (else the run could
//!   not have failed).
//!
//! `--broken unclaimed-read` (with `--store postgres`) is that store's negative control: a
//! plain read, the token checked only in the write (`UPDATE … WHERE fence <= $token`) —
//! the checker must report lost writes.
//!
//! The replay workload records runs of the handler instead (a claim that locked, with how
//! its completion ended) and replays (a claim answered with a record, which names its run);
//! its runs are checked as sections (a key for a resource), and also:
//!
//! - no key ran twice (**double runs**: two runs of one key, whenever they happened), and
//! - every replay's record names a run of its key that some worker logged.
//!
//! The durable mode (`--workload replay --store postgres`, `durable/`) checks PostgreSQL
//! instead: each worker claims through `RedlockLayer` with durable replay (the sqlx
//! adapter), its handler records the key's row first in its transaction, then a business
//! row (key, worker, a random run id; no unique constraint on the key), and answers that
//! run id; every answer is appended to the worker's answers file as it comes (killed
//! workers keep theirs). The run goes on until `--acquisitions` claims were answered (runs,
//! replays, `409` completed-not-stored; other `409`s and `503`s are fine but not counted)
//! and, with `--min-faults`, every fault above happened that often. After the run:
//!
//! - no key has two business rows (**double runs**), and
//! - every `2xx` answer names one of its key's business runs (else a **phantom answer**).
//!
//! `--broken row-outside-tx` is its negative control: the work commits first and the key's
//! row after it, in a transaction of its own — the checker must report double runs.
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
pub mod durable;
mod faults;
mod log;
mod nemesis;
mod report;
mod run;
mod settings;
mod store;
mod topology;
mod verdict;
mod worker;
mod workers;

pub use clock::Starvation;
pub use faults::{FaultCounts, FaultSpan};
pub use log::{Answer, Completion, Counts, Replay, Run, Section, StoreCounts, WorkerLog};
pub use nemesis::Kind;
pub use report::Report;
pub use run::run;
pub use settings::{Broken, Settings, Store, Workload};
pub use store::{check_history, HistoryRow, StoreVerdict, CLAIM_SQL};
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
