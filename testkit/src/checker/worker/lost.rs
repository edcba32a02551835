//! The replay workload's lost-lease mode (`--nemesis lost`): claims go through the
//! middleware, as a service's would — an in-process axum app, `RedlockLayer` with replay,
//! keep-alive off, `OnLost::Finish` on `/finish` (even keys) and `OnLost::Abort` on `/abort`
//! (odd keys) — and one run in [`OVERRUN_ONE_IN`] sleeps past its lease's deadline, so that
//! its lease is lost while it runs and the middleware stores its response (or its "outcome
//! unknown" mark) "if free". With the `lost` nemesis cutting two masters off at a time, such
//! a record often lands beside another holder's record stored under a valid lease: records
//! that differ from master to master.
//!
//! Every duplicate's answer is logged (a replayed record, or `409` outcome-unknown) with its
//! time; the verdict checks that every duplicate of a key got the key's first answer. The
//! negative control (`--broken first-record`) answers duplicates the way the library did
//! before issue 41: the first record found, asking the masters in a random order.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Extension;
use axum::http::Request;
use axum::routing::post;
use axum::Router;
use tower::ServiceExt as _;
use tower_redlock::key::{IdempotencyKey, KeyExtractor, SimpleRequest};
use tower_redlock::policy::{LockPolicy, OnLost};
use tower_redlock::replay::Replay as ReplayPolicy;
use tower_redlock::{LeaseHandle, Redlock, RedlockLayer};

use super::super::clock::{self, shared_ns};
use super::super::log::{Answer, Completion, Replay, Run, Section};
use super::client::Voter;
use super::lock::{spin, WORK_MARGIN};
use super::replay::pick_key;
use super::{Shared, WorkerConfig};

/// One run in this many overruns its lease on purpose.
pub(super) const OVERRUN_ONE_IN: u64 = 6;
/// How long after an overrun lease's deadline its key is claimed again: the masters' keys
/// outlive the deadline by the clock drift allowance and the acquisition's time.
const HOT_AFTER: Duration = Duration::from_millis(50);
/// The header the keys come in.
const KEY_HEADER: &str = "idempotency-key";

/// What the worker tells its handler about one request (a request extension).
#[derive(Clone)]
struct Call {
    key: u64,
    worker: usize,
    task: usize,
    /// Sleep past the lease's deadline by `wait`.
    overrun: bool,
    wait: Duration,
    work: Duration,
    /// Where the handler leaves its run (also when it is stopped midway).
    slot: Arc<Mutex<Option<Section>>>,
    /// Where an overrunning handler names its key and deadline.
    hot: Hot,
}

/// Keys whose lease is being overrun, with when to claim them next and how many more
/// times: the process's tasks claim each just after the lease's deadline, as a client
/// retrying would — so that the lease's record, stored "if free" after it, often meets
/// another holder's — and then [`DUPLICATES`] times more, a few hundred ms apart, so that
/// such a key's records are read again and again.
type Hot = Arc<Mutex<Vec<(u64, Instant, u32)>>>;
/// How many duplicates claim an overrun key after the first one.
const DUPLICATES: u32 = 8;

/// The lost-lease mode of one worker process: its app, its overrun keys, and the
/// negative control's reader.
pub(super) struct Lost {
    app: Router,
    hot: Hot,
    first_record: Option<FirstRecord>,
}

impl Lost {
    pub(super) async fn start(
        redlock: &Redlock,
        config: &WorkerConfig,
        first_record: bool,
    ) -> Self {
        let first_record = match first_record {
            true => Some(FirstRecord::connect(config).await),
            false => None,
        };
        Self {
            app: app(redlock, config),
            hot: Hot::default(),
            first_record,
        }
    }

    /// An overrun key whose time to be claimed has come (put back for later while it has
    /// duplicates left).
    fn take_hot(&self, rng: &mut fastrand::Rng) -> Option<u64> {
        let mut hot = self.hot.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let i = hot.iter().position(|&(_, at, _)| at <= now)?;
        let (key, _, left) = hot.swap_remove(i);
        if left > 0 {
            let next = now + Duration::from_millis(rng.u64(150..=400));
            hot.push((key, next, left - 1));
        }
        Some(key)
    }
}

/// The app: one handler on `/finish` and `/abort`, each behind its policy.
fn app(redlock: &Redlock, config: &WorkerConfig) -> Router {
    let retention = config.time_limit + Duration::from_secs(600);
    let layer = |on: OnLost| {
        let policy = LockPolicy::builder(redlock.clone(), IdempotencyKey::required())
            .ttl(config.ttl)
            .keep_alive(false)
            .on_lost(on)
            .replay(ReplayPolicy::new().retention(retention))
            .build()
            .expect("a valid policy");
        RedlockLayer::with_policy(policy)
    };
    Router::new()
        .route("/finish", post(handler))
        .route_layer(layer(OnLost::Finish))
        .merge(
            Router::new()
                .route("/abort", post(handler))
                .route_layer(layer(OnLost::Abort)),
        )
}

/// The run of one request, written to its slot when the handler ends — or is stopped.
struct RunGuard {
    slot: Arc<Mutex<Option<Section>>>,
    section: Section,
    lease: LeaseHandle,
}

impl RunGuard {
    fn leave(&mut self) {
        // Validity first: a run not valid at its exit left at or after its deadline.
        self.section.valid = !self.lease.is_lost() && Instant::now() < self.lease.deadline();
        self.section.leave_ns = clock::now_ns();
        *self.slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(self.section);
    }
}

impl Drop for RunGuard {
    fn drop(&mut self) {
        let written = self
            .slot
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some();
        if !written {
            // Stopped midway (`OnLost::Abort`): the work may have happened.
            self.leave();
        }
    }
}

/// The handler: the work (a run, logged), then a body naming the run.
async fn handler(
    Extension(lease): Extension<LeaseHandle>,
    Extension(call): Extension<Call>,
) -> String {
    let enter_ns = clock::now_ns();
    let deadline = lease.deadline();
    let mut guard = RunGuard {
        slot: call.slot.clone(),
        section: Section {
            resource: call.key as usize,
            enter_ns,
            leave_ns: enter_ns,
            deadline_ns: shared_ns(deadline),
            plan_ns: enter_ns,
            starved_ns: -1,
            valid: false,
            worker: call.worker,
            task: call.task,
            token: lease.fencing_token(),
        },
        lease: lease.clone(),
    };
    if call.overrun {
        call.hot.lock().unwrap_or_else(|p| p.into_inner()).push((
            call.key,
            deadline + HOT_AFTER,
            DUPLICATES,
        ));
        // Past the deadline: the lock expires on the masters while the work goes on.
        tokio::time::sleep_until((deadline + call.wait).into()).await;
    } else {
        let planned = call.work + call.wait + WORK_MARGIN;
        let checked = Instant::now();
        if deadline.saturating_duration_since(checked) >= planned {
            guard.section.plan_ns = shared_ns(checked + planned);
            tokio::task::yield_now().await;
            spin(call.work);
            tokio::time::sleep(call.wait).await;
        }
    }
    guard.leave();
    format!("run {} {} {} {enter_ns}", call.key, call.worker, call.task)
}

/// `run key worker task enter_ns` anywhere in `bytes` (a response body, or a record that
/// holds one): the key and the run.
fn parse_run(bytes: &[u8]) -> Option<(u64, (usize, usize, i64))> {
    let at = bytes.windows(4).rposition(|w| w == b"run ")?;
    let text = std::str::from_utf8(&bytes[at + 4..]).ok()?;
    let mut f = text.split(' ');
    let key = f.next()?.parse().ok()?;
    let run = (
        f.next()?.parse().ok()?,
        f.next()?.parse().ok()?,
        f.next()?.parse().ok()?,
    );
    f.next().is_none().then_some((key, run))
}

/// The negative control's reader: a connection to every bare master.
struct FirstRecord {
    masters: Vec<redis::aio::MultiplexedConnection>,
    timeout: Duration,
}

impl FirstRecord {
    async fn connect(config: &WorkerConfig) -> Self {
        let timeout = config.node_timeout * 2;
        let mut masters = Vec::new();
        for voter in &config.voters {
            let Voter::Master(url) = voter else { continue };
            let client = redis::Client::open(url.as_str()).expect("a master's URL");
            let config = redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(timeout))
                .set_response_timeout(Some(timeout));
            let deadline = Instant::now() + Duration::from_secs(30);
            let conn = loop {
                match client
                    .get_multiplexed_async_connection_with_config(&config)
                    .await
                {
                    Ok(c) => break c,
                    Err(e) => {
                        assert!(Instant::now() < deadline, "connect {url}: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            };
            masters.push(conn);
        }
        Self { masters, timeout }
    }

    /// The first record of `lock` found, asking the masters in a random order: its answer
    /// (`None` in it: outcome unknown), or `None` where no master that answered has one.
    /// `Some(Err(what))`: a record that names no run and is no "unknown" mark.
    async fn read(
        &self,
        rng: &mut fastrand::Rng,
        lock: &str,
    ) -> Option<Result<Option<(u64, (usize, usize, i64))>, String>> {
        let mut order: Vec<usize> = (0..self.masters.len()).collect();
        rng.shuffle(&mut order);
        let key = format!("{lock}:record");
        for i in order {
            let mut conn = self.masters[i].clone();
            let mut cmd = redis::cmd("GET");
            cmd.arg(&key);
            let get = cmd.query_async::<Option<Vec<u8>>>(&mut conn);
            let Ok(Ok(Some(record))) = tokio::time::timeout(self.timeout, get).await else {
                continue;
            };
            // The node's tag `TRR1\n`, then the middleware's record: `TRH1`, a 32-byte
            // fingerprint, then the kind — 3 is "aborted" (outcome unknown).
            let record = record.strip_prefix(b"TRR1\n").unwrap_or(&record);
            if record.get(36) == Some(&3) {
                return Some(Ok(None));
            }
            return Some(parse_run(record).map(Some).ok_or_else(|| {
                format!(
                    "an unreadable record: kind {:?}, {} bytes, ends {:?}",
                    record.get(36),
                    record.len(),
                    String::from_utf8_lossy(&record[record.len().saturating_sub(40)..])
                )
            }));
        }
        None
    }
}

/// What one task logged.
#[derive(Default)]
pub(super) struct Logged {
    pub(super) runs: Vec<Run>,
    pub(super) replays: Vec<Replay>,
    pub(super) answers: Vec<Answer>,
}

impl Logged {
    fn answer(&mut self, key: u64, worker: usize, run: Option<(usize, usize, i64)>) {
        let at_ns = clock::now_ns();
        let key = key as usize;
        if let Some((run_worker, run_task, run_enter_ns)) = run {
            self.replays.push(Replay {
                key,
                worker,
                run_worker,
                run_task,
                run_enter_ns,
            });
        }
        self.answers.push(Answer {
            key,
            worker,
            at_ns,
            run,
        });
    }
}

/// One task: claim keys through the app until the process's share of claims is reached
/// (and the parent does not hold it) or the time is up.
pub(super) async fn claim_loop(
    task: usize,
    lost: &Lost,
    shared: &Shared,
    config: &WorkerConfig,
    stop_at: Instant,
) -> Logged {
    let mut logged = Logged::default();
    let mut rng = fastrand::Rng::new();
    let worker = config.id;
    while shared.go_on(config.target, stop_at) {
        let key = lost
            .take_hot(&mut rng)
            .unwrap_or_else(|| pick_key(&mut rng, config.epoch_ns));
        let route = if key.is_multiple_of(2) {
            "/finish"
        } else {
            "/abort"
        };
        let idempotency_key = format!("{}{key}", config.key_prefix);
        if let Some(reader) = &lost.first_record {
            let request = SimpleRequest::new("POST", route).header(KEY_HEADER, &idempotency_key);
            let lock = IdempotencyKey::required()
                .extract(&request)
                .expect("a valid key")
                .expect("a key")
                .into_string();
            match reader.read(&mut rng, &lock).await {
                Some(Ok(Some((named, run)))) if named == key => {
                    logged.answer(key, worker, Some(run));
                    shared.done.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                Some(Ok(None)) => {
                    logged.answer(key, worker, None);
                    shared.done.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                Some(Ok(Some((named, _)))) => {
                    shared.other.fetch_add(1, Ordering::Relaxed);
                    shared.sample(&format!("{lock}: the record of key {named}"));
                    continue;
                }
                Some(Err(what)) => {
                    shared.other.fetch_add(1, Ordering::Relaxed);
                    shared.sample(&format!("{lock}: {what}"));
                    continue;
                }
                None => {}
            }
        }
        let slot = Arc::new(Mutex::new(None));
        let overrun = rng.u64(0..OVERRUN_ONE_IN) == 0;
        let wait = if overrun {
            Duration::from_millis(rng.u64(200..=1500))
        } else {
            Duration::from_millis(rng.u64(0..=config.handler.as_millis() as u64))
        };
        let call = Call {
            key,
            worker,
            task,
            overrun,
            wait,
            work: config.work,
            slot: slot.clone(),
            hot: lost.hot.clone(),
        };
        let request = Request::post(route)
            .header(KEY_HEADER, &idempotency_key)
            .extension(call)
            .body(Body::from(key.to_string()))
            .expect("a valid request");
        let response = match lost.app.clone().oneshot(request).await {
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
        let ran = slot.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(section) = ran {
            // The middleware answers once the record is stored (or given up on): an answer
            // before the deadline means the record was stored under a valid lease.
            let completion = if section.valid && clock::now_ns() < section.deadline_ns {
                Completion::Stored
            } else {
                Completion::Lost
            };
            logged.runs.push(Run {
                section,
                completion,
            });
            shared.acquisitions.fetch_add(1, Ordering::Relaxed);
            shared.done.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let text = String::from_utf8_lossy(&body);
        match status {
            200 if replayed => match parse_run(&body) {
                Some((named, run)) if named == key => {
                    logged.answer(key, worker, Some(run));
                    shared.done.fetch_add(1, Ordering::Relaxed);
                }
                _ => {
                    shared.other.fetch_add(1, Ordering::Relaxed);
                    shared.sample(&format!("{idempotency_key}: a replay of {text:?}"));
                }
            },
            409 if text.contains("idempotency-outcome-unknown") => {
                logged.answer(key, worker, None);
                shared.done.fetch_add(1, Ordering::Relaxed);
            }
            // Refused at once by the middleware (no wait configured): a short pause before
            // the next claim, as the library's retry would.
            409 => {
                shared.contended.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(rng.u64(2..=10))).await;
            }
            503 => {
                shared.unavailable.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(rng.u64(2..=10))).await;
            }
            _ => {
                shared.other.fetch_add(1, Ordering::Relaxed);
                shared.sample(&format!("{idempotency_key}: {status} {text}"));
            }
        }
    }
    logged
}
