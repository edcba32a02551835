//! The worker process: one Redlock client, a few tasks taking locks (or claiming keys) in a
//! loop, a log.

mod client;
mod durable;
mod lock;
#[cfg(feature = "middleware")]
mod lost;
mod replay;

use super::store::Writer;

use std::io::Read as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tower_redlock::Retry;

use super::log::{Answer, Counts, WorkerLog};
use super::settings::{Broken, Workload};

/// Runs one worker process from its environment (see [`run`](super::run())), writes its
/// log and returns. Panics on a broken environment.
pub fn worker_main() {
    let env = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| panic!("the worker needs {name} in its environment"))
    };
    let num = |name: &str| -> u64 {
        env(name)
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a whole number"))
    };
    let config = WorkerConfig {
        id: num("CHECKER_WORKER_ID") as usize,
        voters: client::parse_voters(&env("CHECKER_VOTERS")),
        workload: match env("CHECKER_WORKLOAD").as_str() {
            "replay" => Workload::Replay,
            _ => Workload::Lock,
        },
        resources: env("CHECKER_RESOURCE_NAMES")
            .split(',')
            .map(str::to_owned)
            .collect(),
        key_prefix: env("CHECKER_KEY_PREFIX"),
        epoch_ns: env("CHECKER_EPOCH_NS")
            .parse()
            .expect("CHECKER_EPOCH_NS is a number"),
        target: num("CHECKER_TARGET"),
        tasks: num("CHECKER_TASKS") as usize,
        ttl: Duration::from_millis(num("CHECKER_TTL_MS")),
        node_timeout: Duration::from_millis(num("CHECKER_NODE_TIMEOUT_MS")),
        work: Duration::from_micros(num("CHECKER_WORK_US")),
        handler: Duration::from_millis(num("CHECKER_HANDLER_MS")),
        retry: Retry::times(num("CHECKER_RETRIES") as u32)
            .delay(Duration::from_micros(num("CHECKER_RETRY_DELAY_US")))
            .jitter(Duration::from_micros(num("CHECKER_RETRY_JITTER_US"))),
        time_limit: Duration::from_millis(num("CHECKER_TIME_LIMIT_MS")),
        fencing: num("CHECKER_FENCING") != 0,
        broken: match env("CHECKER_BROKEN").as_str() {
            "quorum1" => Some(Broken::Quorum1),
            "block" => Some(Broken::Blocking),
            "unclaimed-read" => Some(Broken::UnclaimedRead),
            "row-outside-tx" => Some(Broken::RowOutsideTx),
            _ => None,
        },
        lost: num("CHECKER_LOST") != 0,
        seed: num("CHECKER_SEED"),
        hold: std::env::var_os("CHECKER_HOLD").map(PathBuf::from),
        store_url: std::env::var("CHECKER_STORE_URL")
            .ok()
            .filter(|u| !u.is_empty()),
        answers: std::env::var_os("CHECKER_ANSWERS").map(PathBuf::from),
        crash_one_in: std::env::var("CHECKER_CRASH_ONE_IN")
            .ok()
            .and_then(|n| n.parse().ok())
            .unwrap_or(0),
    };
    let log_path = PathBuf::from(env("CHECKER_LOG"));
    // The parent holds our stdin open: when it ends (the parent exited, even killed), so
    // does this worker, instead of fighting on alone until its time limit.
    std::thread::spawn(|| {
        let mut buf = [0u8; 64];
        while let Ok(n) = std::io::stdin().read(&mut buf) {
            if n == 0 {
                break;
            }
        }
        std::process::exit(3);
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("worker runtime");
    let log = rt.block_on(worker(config));
    log.write(&log_path)
        .unwrap_or_else(|e| panic!("write {log_path:?}: {e}"));
}

#[derive(Debug, Clone)]
struct WorkerConfig {
    id: usize,
    voters: Vec<client::Voter>,
    workload: Workload,
    /// The lock workload's resources.
    resources: Vec<String>,
    /// The replay workload's keys: this prefix and a number.
    key_prefix: String,
    /// The run's start on the shared clock (the replay workload's key windows count from it).
    epoch_ns: i64,
    target: u64,
    tasks: usize,
    ttl: Duration,
    node_timeout: Duration,
    work: Duration,
    /// The replay workload's handler sleeps up to this long after its busy work.
    handler: Duration,
    retry: Retry,
    time_limit: Duration,
    fencing: bool,
    broken: Option<Broken>,
    /// The parent's random number (the broken client's choice of master).
    seed: u64,
    /// While this file exists, the worker goes on past its target (the nemesis wants more).
    hold: Option<PathBuf>,
    /// The fenced store's URL (`--store`): each section also writes there.
    store_url: Option<String>,
    /// The replay workload's lost-lease mode (`--nemesis lost`, `lost.rs`).
    lost: bool,
    /// The durable mode's answers file (`durable.rs`).
    answers: Option<PathBuf>,
    /// The durable mode's fail points each kill the process once in this many passes (0:
    /// never).
    crash_one_in: u64,
}

/// What the tasks of one worker share.
#[derive(Default)]
struct Shared {
    /// Acquisitions (the replay workload: claims answered, runs and replays).
    done: AtomicU64,
    acquisitions: AtomicU64,
    contended: AtomicU64,
    unavailable: AtomicU64,
    other: AtomicU64,
    release_errors: AtomicU64,
    /// The parent's hold file still exists.
    held: AtomicBool,
    errors: std::sync::Mutex<Vec<String>>,
}

impl Shared {
    fn sample(&self, e: &dyn std::fmt::Display) {
        let mut errors = self.errors.lock().unwrap();
        if errors.len() < 5 {
            errors.push(e.to_string());
        }
    }

    /// Whether a task goes on: its share not reached (or the parent holds it), and time left.
    fn go_on(&self, target: u64, stop_at: Instant) -> bool {
        (self.done.load(Ordering::Relaxed) < target || self.held.load(Ordering::Relaxed))
            && Instant::now() < stop_at
    }

    fn count(&self, e: &tower_redlock::Error) {
        if e.is_contended() {
            self.contended.fetch_add(1, Ordering::Relaxed);
        } else if e.is_unavailable() {
            self.unavailable.fetch_add(1, Ordering::Relaxed);
        } else {
            self.other.fetch_add(1, Ordering::Relaxed);
            self.sample(e);
        }
    }
}

async fn worker(config: WorkerConfig) -> WorkerLog {
    let started = Instant::now();
    let stop_at = started + config.time_limit;
    let redlock = client::client(&config);

    // Warm up: connections made, and every fresh master past its protection window, so that
    // the count of errors below is about the faults, not the start.
    let warm_key = match config.workload {
        Workload::Lock => format!("{}:warm-up:{}", config.resources[0], config.id),
        Workload::Replay => format!("{}warm-up:{}", config.key_prefix, config.id),
    };
    loop {
        if let Ok(lease) = redlock.try_lock(&warm_key, config.ttl).await {
            let _ = lease.release().await;
            break;
        }
        assert!(
            Instant::now() < stop_at,
            "worker {} could not take a first lock within {:?}",
            config.id,
            config.time_limit
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let warm_up = started.elapsed();
    // The durable mode: the key rows in PostgreSQL (`durable.rs`).
    let durable = match (&config.store_url, config.workload) {
        (Some(url), Workload::Replay) => Some(Arc::new(
            durable::Durable::start(&redlock, &config, url).await,
        )),
        _ => None,
    };
    // The fenced store: a connection per task.
    let store = match (&config.store_url, config.workload) {
        (Some(url), Workload::Lock) => {
            let unclaimed = config.broken == Some(Broken::UnclaimedRead);
            Some(Arc::new(
                Writer::connect(url, config.tasks, unclaimed).await,
            ))
        }
        _ => None,
    };

    #[cfg(feature = "middleware")]
    let lost = config
        .lost
        .then(|| Arc::new(lost::Lost::start(&redlock, &config)));
    #[cfg(not(feature = "middleware"))]
    assert!(
        !config.lost,
        "the lost nemesis needs the testkit's `middleware` feature"
    );
    let shared = Arc::new(Shared::default());
    if let Some(hold) = config.hold.clone() {
        // The parent removes the file once the nemesis has done enough; looked at every
        // 100 ms rather than by every task.
        shared.held.store(hold.exists(), Ordering::Relaxed);
        let shared = Arc::downgrade(&shared);
        tokio::spawn(async move {
            while let Some(shared) = shared.upgrade() {
                shared.held.store(hold.exists(), Ordering::Relaxed);
                drop(shared);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
    }
    let config = Arc::new(config);
    let tasks: Vec<_> = (0..config.tasks)
        .map(|task| {
            let (redlock, shared, config) = (redlock.clone(), shared.clone(), config.clone());
            let (store, durable) = (store.clone(), durable.clone());
            #[cfg(feature = "middleware")]
            let lost = lost.clone();
            tokio::spawn(async move {
                if let Some(durable) = durable {
                    durable::claim_loop(&durable, &shared, &config, stop_at).await;
                    return (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                }
                #[cfg(feature = "middleware")]
                if let Some(lost) = lost {
                    let logged = lost::claim_loop(task, &lost, &shared, &config, stop_at).await;
                    return (Vec::new(), logged.runs, logged.replays, logged.answers);
                }
                match config.workload {
                    Workload::Lock => {
                        let sections = lock::lock_loop(
                            task,
                            &redlock,
                            &shared,
                            &config,
                            store.as_deref(),
                            stop_at,
                        )
                        .await;
                        (sections, Vec::new(), Vec::new(), Vec::<Answer>::new())
                    }
                    Workload::Replay => {
                        let (runs, replays) =
                            replay::claim_loop(task, &redlock, &shared, &config, stop_at).await;
                        (Vec::new(), runs, replays, Vec::new())
                    }
                }
            })
        })
        .collect();
    let mut log = WorkerLog::default();
    for t in tasks {
        let (sections, runs, replays, answers) = t.await.expect("a lock task panicked");
        log.sections.extend(sections);
        log.runs.extend(runs);
        log.replays.extend(replays);
        log.answers.extend(answers);
    }
    if let Some(store) = &store {
        log.store = store.counts();
    }
    log.errors = std::mem::take(&mut *shared.errors.lock().unwrap());
    log.counts = Counts {
        acquisitions: shared.acquisitions.load(Ordering::Relaxed),
        contended: shared.contended.load(Ordering::Relaxed),
        unavailable: shared.unavailable.load(Ordering::Relaxed),
        other: shared.other.load(Ordering::Relaxed),
        release_errors: shared.release_errors.load(Ordering::Relaxed),
        warm_up_ms: warm_up.as_millis() as u64,
        elapsed_ms: started.elapsed().as_millis() as u64,
    };
    log
}
