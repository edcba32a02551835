//! The durable mode of the replay workload (`--workload replay --store postgres`): the key's
//! row in PostgreSQL (`tower_redlock::durable`), proven under crashes.
//!
//! Each worker process serves claims through an in-process app (`app.rs`, the testkit's
//! feature `durable`; or one registered with [`register_app`]): `RedlockLayer` with durable replay
//! over the sqlx adapter, whose handler records the key's row as the first statement of its
//! transaction, inserts a **business row** (`checker_runs`: key, worker, a random run id —
//! no unique constraint on the key, so that a second run shows), waits a little inside the
//! transaction (claims straddle the faults), commits with `row.commit(tx)` and answers
//! `201 run <key> <run id>`. Every answer a worker gets is appended to its answers file
//! ([`Line`]) as it comes, so that a worker killed later keeps what it saw; a worker started
//! again retries the claims its killed self left without an answer, as their clients would
//! (`worker/durable.rs`).
//!
//! The faults, besides whatever `--nemesis` kinds the run mixes in (the `crash` kind is
//! this mode's own, `nemesis/crash.rs`): the parent SIGKILLs a worker at random moments and
//! starts it again; a worker kills itself (SIGKILL) right after `row.commit(tx)` returned
//! `Ok` — before the middleware stored the response in the row and on the Redis voters — or
//! right after the row's response was stored, before the Redis record; every Redis master
//! is FLUSHALLed at once, or two of them restarted empty.
//!
//! After the run, from PostgreSQL: a key with more than one business row ran twice (a
//! **double run**), and every `2xx` answer must name the key's one business run (else a
//! **phantom**: an answer for work that did not commit, or another run's). `409` and `503`
//! are fine. The negative control (`--broken row-outside-tx`) commits the work first and the
//! key's row in a transaction of its own after it: the same checker must see double runs.

#[cfg(feature = "durable")]
pub mod app;

use std::collections::BTreeMap;
use std::future::Future;
use std::io::Write as _;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tower_redlock::Redlock;

/// The business table: one row per run of the work, none unique per key.
pub const BUSINESS_SQL: &str = "CREATE TABLE checker_runs (id bigserial PRIMARY KEY, \
     key bigint NOT NULL, key_hash text NOT NULL, worker int NOT NULL, run_id bigint NOT NULL)";

/// What a worker gives the app it builds.
#[derive(Debug, Clone)]
pub struct AppConfig {
    pub redlock: Redlock,
    /// The PostgreSQL server's URL.
    pub store_url: String,
    /// The pool's size.
    pub connections: u32,
    pub worker: usize,
    pub ttl: Duration,
    /// How long completed keys are replayed.
    pub retention: Duration,
    /// The handler waits up to this long inside its transaction.
    pub handler: Duration,
    /// The negative control: the work committed first, the key's row after it in a
    /// transaction of its own.
    pub row_outside_tx: bool,
    pub crash: Crash,
}

/// Builds the app of a worker (see the module docs): `POST /work`, the key in the
/// `idempotency-key` header, the key's number as the body.
pub type AppFactory = fn(AppConfig) -> Pin<Box<dyn Future<Output = axum::Router> + Send>>;

static APP: OnceLock<AppFactory> = OnceLock::new();

/// Registers the app the workers of this process build in the durable mode, before
/// [`worker_main`](super::worker_main), in place of the testkit's own (feature `durable`).
pub fn register_app(factory: AppFactory) {
    let _ = APP.set(factory);
}

/// The registered app, else the testkit's own (feature `durable`), else none.
pub(super) fn registered_app() -> Option<AppFactory> {
    #[cfg(feature = "durable")]
    let builtin: Option<AppFactory> = Some(app::app);
    #[cfg(not(feature = "durable"))]
    let builtin: Option<AppFactory> = None;
    APP.get().copied().or(builtin)
}

/// A worker's fail points: with probability `1 / one_in` each, the worker notes the point
/// in its answers file and SIGKILLs itself.
#[derive(Debug, Clone)]
pub struct Crash {
    answers: Answers,
    one_in: u64,
}

impl Crash {
    pub(super) fn new(answers: Answers, one_in: u64) -> Self {
        Self { answers, one_in }
    }

    /// Maybe dies here: `point` is `commit` (after `row.commit(tx)` returned `Ok`) or `row`
    /// (after the row's response was stored, before the Redis record).
    pub fn maybe(&self, point: &'static str) {
        if self.one_in == 0 || fastrand::u64(0..self.one_in) != 0 {
            return;
        }
        self.answers.write(&format!("kill {point}\n"));
        kill_self();
    }
}

/// SIGKILL, to this process.
fn kill_self() -> ! {
    #[cfg(all(
        any(target_os = "linux", target_os = "macos"),
        target_pointer_width = "64"
    ))]
    let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
    #[cfg(not(all(
        any(target_os = "linux", target_os = "macos"),
        target_pointer_width = "64"
    )))]
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &std::process::id().to_string()])
        .status();
    unreachable!("SIGKILL is not caught");
}

/// A worker's answers file, appended to by every run of the worker (one `write` a line).
#[derive(Debug, Clone)]
pub struct Answers(Arc<Mutex<std::fs::File>>);

impl Answers {
    pub(super) fn open(path: &Path) -> Self {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap_or_else(|e| panic!("open {path:?}: {e}"));
        Self(Arc::new(Mutex::new(file)))
    }

    pub(super) fn write(&self, line: &str) {
        let mut file = self.0.lock().unwrap_or_else(|p| p.into_inner());
        file.write_all(line.as_bytes())
            .unwrap_or_else(|e| panic!("append to the answers file: {e}"));
    }
}

/// What a claim got, as its line in the answers file says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    /// `2xx`, the handler ran (a first run).
    Run,
    /// `2xx` with `Idempotency-Replayed` (from Redis, the row, or rebuilt from the business
    /// row).
    Replay,
    /// `409` completed-not-stored: the row committed without its response.
    NotStored,
    /// `409` otherwise: held by another request, or a row in flight or busy.
    Busy,
    /// `503`.
    Unavailable,
    /// Anything else (a `500`: a statement failed).
    Other,
}

impl Outcome {
    pub const ALL: [Outcome; 6] = [
        Outcome::Run,
        Outcome::Replay,
        Outcome::NotStored,
        Outcome::Busy,
        Outcome::Unavailable,
        Outcome::Other,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Outcome::Run => "run",
            Outcome::Replay => "replay",
            Outcome::NotStored => "not-stored",
            Outcome::Busy => "busy",
            Outcome::Unavailable => "unavailable",
            Outcome::Other => "other",
        }
    }

    /// A claim answered for good: a run, a replay, completed-not-stored.
    pub fn answered(self) -> bool {
        matches!(self, Outcome::Run | Outcome::Replay | Outcome::NotStored)
    }
}

/// One line of an answers file:
///
/// ```text
/// c <key>
/// a <key> <status> <outcome> <run id, or ->
/// kill <commit|row>
/// ```
///
/// `c` starts a claim (read by the worker started again after a kill, which retries the
/// claims without an `a`; not returned here), `a` is its answer, `kill` a fail point's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line {
    Answer(DurableAnswer),
    /// The worker killed itself at a fail point.
    Killed(&'static str),
}

/// A claim's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurableAnswer {
    pub key: i64,
    pub worker: usize,
    pub status: u16,
    pub outcome: Outcome,
    /// The business run a `2xx` names.
    pub run_id: Option<i64>,
}

impl DurableAnswer {
    pub(super) fn line(&self) -> String {
        let run = self.run_id.map_or("-".to_owned(), |r| r.to_string());
        format!(
            "a {} {} {} {run}\n",
            self.key,
            self.status,
            self.outcome.name()
        )
    }
}

impl Line {
    /// A line of worker `worker`'s file; `None` for a torn or unknown one.
    pub fn parse(line: &str, worker: usize) -> Option<Line> {
        let mut f = line.split(' ');
        match f.next()? {
            "a" => {
                let key = f.next()?.parse().ok()?;
                let status = f.next()?.parse().ok()?;
                let name = f.next()?;
                let outcome = *Outcome::ALL.iter().find(|o| o.name() == name)?;
                let run_id = match f.next()? {
                    "-" => None,
                    r => Some(r.parse().ok()?),
                };
                f.next().is_none().then_some(Line::Answer(DurableAnswer {
                    key,
                    worker,
                    status,
                    outcome,
                    run_id,
                }))
            }
            "kill" => match f.next()? {
                "commit" => Some(Line::Killed("commit")),
                "row" => Some(Line::Killed("row")),
                _ => None,
            },
            _ => None,
        }
    }
}

/// Reads the answers files as they grow: what each new complete line says.
#[derive(Debug, Default)]
pub(super) struct Tail {
    /// Per worker: bytes read, and the unfinished last line.
    read: BTreeMap<usize, (u64, String)>,
}

impl Tail {
    /// The new complete lines of worker `worker`'s file at `path`.
    pub(super) fn poll(&mut self, worker: usize, path: &Path) -> Vec<Line> {
        use std::io::{Read as _, Seek as _};
        let (offset, partial) = self.read.entry(worker).or_default();
        let Ok(mut file) = std::fs::File::open(path) else {
            return Vec::new();
        };
        let mut buf = String::new();
        if file.seek(std::io::SeekFrom::Start(*offset)).is_err()
            || file.read_to_string(&mut buf).is_err()
        {
            return Vec::new();
        }
        *offset += buf.len() as u64;
        partial.push_str(&buf);
        let Some(end) = partial.rfind('\n') else {
            return Vec::new();
        };
        let complete: String = partial.drain(..=end).collect();
        complete
            .lines()
            .filter_map(|l| Line::parse(l, worker))
            .collect()
    }
}

mod parent;
mod verdict;

pub(super) use parent::{answers_path, Killer, Progress};
pub use verdict::{check_durable, BusinessRow, DurableVerdict};
pub(super) use verdict::{read_business, setup};
