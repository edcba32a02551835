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
//! time; the verdict checks that every duplicate of a key got the key's first answer. (The
//! library before the copy of rule-5 answers, `890a05b`, fails it: 52 differing answers in
//! 20,000 claims.)

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Extension;
use axum::http::Request;
use axum::routing::post;
use axum::Router;
use tower::ServiceExt as _;
use tower_redlock::key::IdempotencyKey;
use tower_redlock::policy::{LockPolicy, OnLost};
use tower_redlock::replay::Replay as ReplayPolicy;
use tower_redlock::{LeaseHandle, Redlock, RedlockLayer};

use super::super::clock::{self, shared_ns};
use super::super::log::{Answer, Completion, Replay, Run, Section};
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

/// The lost-lease mode of one worker process: its app and its overrun keys.
pub(super) struct Lost {
    app: Router,
    hot: Hot,
}

impl Lost {
    pub(super) fn start(redlock: &Redlock, config: &WorkerConfig) -> Self {
        Self {
            app: app(redlock, config),
            hot: Hot::default(),
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
        RedlockLayer::new(policy)
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
