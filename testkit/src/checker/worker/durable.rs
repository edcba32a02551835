//! The durable mode's task (`--workload replay --store postgres`, see `checker/durable/`):
//! claims through the worker's app — `RedlockLayer`, durable replay, the key's row in
//! PostgreSQL — every claim noted in the worker's answers file as it starts (`c <key>`) and
//! its answer as it comes.
//!
//! A worker started again after a kill is also the clients of the claims its killed self had
//! in flight: it reads its answers file and retries each claim that has no answer, a ttl
//! after it starts (its dead self's locks gone by then) and again every 0.3–0.8 s until it is
//! answered for good (up to [`RETRIES`] times) — as a client whose request died with its
//! server retries. A worker killed right after its commit is thus always retried: with the
//! key's row in the work's transaction the retry gets the run (replayed, rebuilt from the
//! business row); with the row outside it (`--broken row-outside-tx`) the work runs again.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::Request;
use axum::Router;
use tower::ServiceExt as _;
use tower_redlock::replay::Replay as ReplayPolicy;
use tower_redlock::Redlock;

use super::super::durable::{registered_app, Answers, AppConfig, Crash, DurableAnswer, Outcome};
use super::replay::pick_key;
use super::{Shared, WorkerConfig};

/// How many times a claim left without an answer by a killed worker is retried.
const RETRIES: u32 = 6;

/// The durable mode of one worker process: its app, its answers file, and the claims its
/// killed predecessors left without an answer, with when to retry each and how many tries
/// are left.
pub(super) struct Durable {
    app: Router,
    answers: Answers,
    retries: Mutex<Vec<(u64, Instant, u32)>>,
}

impl Durable {
    /// A retry whose time has come.
    fn take_retry(&self) -> Option<(u64, u32)> {
        let mut retries = self.retries.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let i = retries.iter().position(|&(_, at, _)| at <= now)?;
        let (key, _, left) = retries.swap_remove(i);
        Some((key, left))
    }

    fn retry_later(&self, key: u64, left: u32, rng: &mut fastrand::Rng) {
        if left > 0 {
            let at = Instant::now() + Duration::from_millis(rng.u64(300..=800));
            let mut retries = self.retries.lock().unwrap_or_else(|p| p.into_inner());
            retries.push((key, at, left - 1));
        }
    }

    /// When the next retry is due, if any is left.
    fn next_retry(&self) -> Option<Instant> {
        let retries = self.retries.lock().unwrap_or_else(|p| p.into_inner());
        retries.iter().map(|&(_, at, _)| at).min()
    }
}

/// The claims in the answers file at `path` without an answer: the keys its killed writers
/// had in flight.
fn unanswered(path: &std::path::Path) -> Vec<u64> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut open: HashMap<u64, i64> = HashMap::new();
    for line in text.lines() {
        let mut f = line.split(' ');
        let (Some(tag), Some(Ok(key))) = (f.next(), f.next().map(str::parse::<u64>)) else {
            continue;
        };
        match tag {
            "c" => *open.entry(key).or_default() += 1,
            "a" => *open.entry(key).or_default() -= 1,
            _ => {}
        }
    }
    open.into_iter()
        .filter(|&(_, n)| n > 0)
        .map(|(key, _)| key)
        .collect()
}

impl Durable {
    pub(super) async fn start(redlock: &Redlock, config: &WorkerConfig, url: &str) -> Self {
        let factory = registered_app().unwrap_or_else(|| {
            panic!(
                "the durable mode needs its app: build the testkit with --features durable, or \
                 call checker::durable::register_app before worker_main"
            )
        });
        let path = config
            .answers
            .as_ref()
            .expect("the durable mode's worker needs CHECKER_ANSWERS");
        // A ttl (and the clock drift allowance) after this start, the dead worker's locks
        // have expired.
        let at = Instant::now() + config.ttl + Duration::from_millis(200);
        let retries = unanswered(path)
            .into_iter()
            .map(|key| (key, at, RETRIES))
            .collect();
        let answers = Answers::open(path);
        let app = factory(AppConfig {
            redlock: redlock.clone(),
            store_url: url.to_owned(),
            connections: u32::try_from(config.tasks).unwrap_or(64) + 4,
            worker: config.id,
            ttl: config.ttl,
            retention: config.time_limit + Duration::from_secs(600),
            handler: config.handler,
            row_outside_tx: config.broken == Some(super::Broken::RowOutsideTx),
            crash: Crash::new(answers.clone(), config.crash_one_in),
        })
        .await;
        Self {
            app,
            answers,
            retries: Mutex::new(retries),
        }
    }
}

/// One task: claim keys until the parent lets go (or the process's share is reached, or the
/// time is up).
pub(super) async fn claim_loop(
    durable: &Durable,
    shared: &Shared,
    config: &WorkerConfig,
    stop_at: Instant,
) {
    let mut rng = fastrand::Rng::new();
    // Past its share, a worker still retries what its killed self left unanswered.
    loop {
        let go_on = shared.go_on(config.target, stop_at);
        let retry = durable.take_retry();
        if retry.is_none() && !go_on {
            match durable.next_retry() {
                Some(at) if at < stop_at => {
                    tokio::time::sleep_until(at.into()).await;
                    continue;
                }
                _ => break,
            }
        }
        let key = retry.map_or_else(|| pick_key(&mut rng, config.epoch_ns), |(key, _)| key);
        durable.answers.write(&format!("c {key}\n"));
        let request = Request::post("/work")
            .header("idempotency-key", format!("{}{key}", config.key_prefix))
            .body(Body::from(key.to_string()))
            .expect("a valid request");
        let response = match durable.app.clone().oneshot(request).await {
            Ok(r) => r,
            Err(never) => match never {},
        };
        let status = response.status().as_u16();
        let replayed = response
            .headers()
            .contains_key(ReplayPolicy::REPLAYED_HEADER);
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&body);
        let run_id = parse_run(&text, key);
        let outcome = match status {
            200..=299 if run_id.is_none() => Outcome::Other,
            200..=299 if replayed => Outcome::Replay,
            200..=299 => Outcome::Run,
            409 if text.contains("completed-not-stored") => Outcome::NotStored,
            409 => Outcome::Busy,
            503 => Outcome::Unavailable,
            _ => Outcome::Other,
        };
        durable.answers.write(
            &DurableAnswer {
                key: i64::try_from(key).unwrap_or(i64::MAX),
                worker: config.id,
                status,
                outcome,
                run_id,
            }
            .line(),
        );
        if let (Some((_, left)), false) = (retry, outcome.answered()) {
            durable.retry_later(key, left, &mut rng);
        }
        match outcome {
            Outcome::Run | Outcome::Replay | Outcome::NotStored => {
                shared.done.fetch_add(1, Ordering::Relaxed);
            }
            Outcome::Busy => {
                shared.contended.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(rng.u64(2..=10))).await;
            }
            Outcome::Unavailable => {
                shared.unavailable.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(rng.u64(2..=10))).await;
            }
            Outcome::Other => {
                shared.other.fetch_add(1, Ordering::Relaxed);
                shared.sample(&format!("key {key}: {status} {text}"));
            }
        }
    }
}

/// `run <key> <run id>`, the body of a run of `key`: the run id.
fn parse_run(text: &str, key: u64) -> Option<i64> {
    let mut f = text.strip_prefix("run ")?.split(' ');
    let named: u64 = f.next()?.parse().ok()?;
    let run = f.next()?.parse().ok()?;
    (named == key && f.next().is_none()).then_some(run)
}
