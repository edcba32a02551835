//! The worker process: one Redlock client, a few tasks taking locks in a loop, a log.

use std::io::Read as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tower_redlock::node::RedisNodeOptions;
use tower_redlock::{Redlock, Retry};

use super::clock::{self, shared_ns};
use super::log::{Counts, Section, WorkerLog};

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
        urls: env("CHECKER_URLS").split(',').map(str::to_owned).collect(),
        resources: env("CHECKER_RESOURCE_NAMES")
            .split(',')
            .map(str::to_owned)
            .collect(),
        target: num("CHECKER_TARGET"),
        tasks: num("CHECKER_TASKS") as usize,
        ttl: Duration::from_millis(num("CHECKER_TTL_MS")),
        node_timeout: Duration::from_millis(num("CHECKER_NODE_TIMEOUT_MS")),
        work: Duration::from_micros(num("CHECKER_WORK_US")),
        retry: Retry::times(num("CHECKER_RETRIES") as u32)
            .delay(Duration::from_micros(num("CHECKER_RETRY_DELAY_US")))
            .jitter(Duration::from_micros(num("CHECKER_RETRY_JITTER_US"))),
        time_limit: Duration::from_millis(num("CHECKER_TIME_LIMIT_MS")),
        fencing: num("CHECKER_FENCING") != 0,
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
    urls: Vec<String>,
    resources: Vec<String>,
    target: u64,
    tasks: usize,
    ttl: Duration,
    node_timeout: Duration,
    work: Duration,
    retry: Retry,
    time_limit: Duration,
    fencing: bool,
}

#[derive(Default)]
struct Shared {
    acquisitions: AtomicU64,
    contended: AtomicU64,
    unavailable: AtomicU64,
    other: AtomicU64,
    release_errors: AtomicU64,
    errors: std::sync::Mutex<Vec<String>>,
}

impl Shared {
    fn sample(&self, e: &tower_redlock::Error) {
        let mut errors = self.errors.lock().unwrap();
        if errors.len() < 5 {
            errors.push(e.to_string());
        }
    }
}

async fn worker(config: WorkerConfig) -> WorkerLog {
    let started = Instant::now();
    let stop_at = started + config.time_limit;
    // Delayed-restart protection keeps restarts safe: a master restarted empty abstains
    // until its uptime exceeds the longest ttl (ours), so a lock it forgot can no longer be
    // valid when it votes again. Without it, a restart inside a lock's bare quorum is the
    // known Redlock hole, which this checker can then (rightly) report as an overlap.
    let node = RedisNodeOptions::new()
        .restart_protection(config.ttl)
        .connect_timeout(config.node_timeout * 2)
        .response_timeout(config.node_timeout * 2);
    let redlock = config
        .urls
        .iter()
        .fold(Redlock::builder(), |b, url| b.redis_with(url, &node))
        .node_timeout(config.node_timeout)
        .retry(config.retry)
        .fencing(config.fencing)
        .build()
        .expect("a valid worker client");

    // Warm up: connections made, and every fresh master past its protection window, so that
    // the count of errors below is about the faults, not the start.
    let warm_key = format!("{}:warm-up:{}", config.resources[0], config.id);
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

    let shared = Arc::new(Shared::default());
    let config = Arc::new(config);
    let tasks: Vec<_> = (0..config.tasks)
        .map(|task| {
            let (redlock, shared, config) = (redlock.clone(), shared.clone(), config.clone());
            tokio::spawn(async move { lock_loop(task, &redlock, &shared, &config, stop_at).await })
        })
        .collect();
    let mut sections = Vec::new();
    for t in tasks {
        sections.extend(t.await.expect("a lock task panicked"));
    }
    let errors = std::mem::take(&mut *shared.errors.lock().unwrap());
    WorkerLog {
        counts: Counts {
            acquisitions: shared.acquisitions.load(Ordering::Relaxed),
            contended: shared.contended.load(Ordering::Relaxed),
            unavailable: shared.unavailable.load(Ordering::Relaxed),
            other: shared.other.load(Ordering::Relaxed),
            release_errors: shared.release_errors.load(Ordering::Relaxed),
            warm_up_ms: warm_up.as_millis() as u64,
            elapsed_ms: started.elapsed().as_millis() as u64,
        },
        sections,
        errors,
    }
}

/// One task: lock a random resource, record the section, release; until the process's share
/// of acquisitions is reached or the time is up.
async fn lock_loop(
    task: usize,
    redlock: &Redlock,
    shared: &Shared,
    config: &WorkerConfig,
    stop_at: Instant,
) -> Vec<Section> {
    let mut sections = Vec::new();
    let mut rng = fastrand::Rng::new();
    while shared.acquisitions.load(Ordering::Relaxed) < config.target && Instant::now() < stop_at {
        let resource = rng.usize(..config.resources.len());
        match redlock
            .lock_with(&config.resources[resource], config.ttl, config.retry)
            .await
        {
            Ok(lease) => {
                let enter_ns = clock::now_ns();
                let deadline_ns = shared_ns(lease.deadline());
                let token = lease.fencing_token();
                // The "work": give the other tasks a turn, spin a little, once more.
                tokio::task::yield_now().await;
                let until = Instant::now() + config.work;
                while Instant::now() < until {
                    std::hint::spin_loop();
                }
                tokio::task::yield_now().await;
                let leave_ns = clock::now_ns();
                let valid = lease.is_valid();
                sections.push(Section {
                    resource,
                    enter_ns,
                    leave_ns,
                    deadline_ns,
                    valid,
                    worker: config.id,
                    task,
                    token,
                });
                shared.acquisitions.fetch_add(1, Ordering::Relaxed);
                if lease.release().await.is_err() {
                    shared.release_errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e) if e.is_contended() => {
                shared.contended.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) if e.is_unavailable() => {
                shared.unavailable.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                shared.other.fetch_add(1, Ordering::Relaxed);
                shared.sample(&e);
            }
        }
    }
    sections
}
