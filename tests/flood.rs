#![cfg(all(feature = "axum", feature = "actix"))]
//! Issue 10: a flood of distinct `Idempotency-Key`s, over HTTP, against a replica confined to
//! one CPU, with the crate's default client settings (50 ms node timeout, suspension after 3
//! timeouts in a row) and the default policy (30 s ttl, 503 when the quorum is unreachable).
//!
//! While every master is healthy, the flood must leave no key in Redis, suspend no master,
//! and get at most 0.1 % of `503`s; distinct keys never contend, so every answer is a `200`
//! or a `503`, nothing else.
//!
//! "Confined to one CPU": the axum replica runs on an OS thread of its own with a Tokio
//! current-thread runtime; the actix-web replica is an `HttpServer` with one worker. Each
//! replica builds its own client on that thread and warms it up there (through a route of its
//! own), so its Redis connections are driven by the replica's one thread too — as in a
//! process limited to one CPU. The flood comes from the test's multi-thread runtime, which
//! competes with the replica for the machine's cores.
//!
//! The two tests take turns (a process-wide lock): two floods at once would leave each
//! replica far less than one CPU, which is not the scenario.
//!
//! No sleep synchronizes anything; the flood is bounded by a count and by a deadline.

use tower_redlock_testkit as support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use actix_web::dev::ServerHandle;
use actix_web::{web, App, HttpServer};
use tokio::sync::oneshot;

use support::apps::{post_with, IDEMPOTENCY_KEY, PATH};
use support::http::{http_client, send, within};
use support::{eventually, warm_up, Masters};
use tower_redlock::http::{IdempotencyKey, KeyExtractor, KeyExtractorExt, SimpleRequest};
use tower_redlock::RedlockLayer;
use tower_redlock::RedlockMiddleware;
use tower_redlock::{LeaseHandle, NodeStatus, Redlock};

/// How many requests, each with a key of its own (enough that 0.1 % is a few answers, not a
/// fraction of one).
const REQUESTS: usize = 8_000;
/// How many of them are in flight at once (over as many keep-alive connections).
const IN_FLIGHT: usize = 128;
/// No new request is sent after this much time (the flood usually ends well before).
const FLOOD_DEADLINE: Duration = Duration::from_secs(40);
/// A flood cut short by [`FLOOD_DEADLINE`] must still have had this many answers to count.
const MIN_ANSWERS: usize = REQUESTS / 4;
/// The longest one request may wait for its answer before it counts as unanswered.
const ANSWER_WITHIN: Duration = Duration::from_secs(30);
/// At most this many answers in a thousand may be `503`s (0.1 %).
const MAX_503_PER_MILLE: usize = 1;
/// How long the masters may take to be empty after the flood: far below the default ttl
/// (30 s), so a key that is gone in time was released, not expired.
const EMPTY_WITHIN: Duration = Duration::from_secs(10);
/// The route that warms a replica's client up on the replica's own thread.
const WARM_UP: &str = "/warm-up";

/// Held for the whole of each test: one flood at a time, so that each replica has its CPU.
static ONE_FLOOD_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

// --- the tests -------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn flood_of_distinct_keys_axum() {
    let _turn = ONE_FLOOD_AT_A_TIME.lock().await;
    let masters = fresh_masters().await;
    let replica = AxumReplica::start(&masters).await;
    flood_of_distinct_keys("axum", &masters, &replica.url(PATH), &replica.redlock).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn flood_of_distinct_keys_actix() {
    let _turn = ONE_FLOOD_AT_A_TIME.lock().await;
    let masters = fresh_masters().await;
    let replica = ActixReplica::start(&masters).await;
    flood_of_distinct_keys("actix", &masters, &replica.url(PATH), &replica.redlock).await;
}

// --- the replicas' side ----------------------------------------------------------------------

/// The client of a replica: the crate's defaults (`Redlock::new`: 50 ms node timeout,
/// suspension after 3 timeouts in a row). Built on the replica's thread.
fn replica_client(urls: &[String]) -> Redlock {
    Redlock::new(urls).expect("a valid client")
}

/// The key extractor of the examples: `Idempotency-Key`, scoped by the matched route.
fn extractor() -> impl KeyExtractor + Clone {
    IdempotencyKey::required().scoped_by_route()
}

/// `GET /warm-up`: warms the replica's client up on the replica's own runtime, so that its
/// lazily made Redis connections are driven there. The replica holds the masters weakly: a
/// replica that outlives its test keeps no `redis-server` alive.
async fn warm_up_here(redlock: Redlock, masters: Weak<Masters>) -> &'static str {
    let masters = masters.upgrade().expect("the test still holds the masters");
    warm_up(&redlock, &masters).await;
    "warm"
}

/// An axum replica on an OS thread of its own, with a current-thread Tokio runtime that
/// serves the app and drives the replica's Redis connections. Stopped (runtime dropped,
/// thread joined) on drop.
struct AxumReplica {
    addr: SocketAddr,
    redlock: Redlock,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl AxumReplica {
    async fn start(masters: &Arc<Masters>) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let addr = listener.local_addr().expect("local addr");
        let urls = masters.urls();
        let weak = Arc::downgrade(masters);
        let (client_tx, client_rx) = oneshot::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("axum-replica".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a current-thread runtime");
                runtime.block_on(async move {
                    let redlock = replica_client(&urls);
                    let _ = client_tx.send(redlock.clone());
                    let warm = redlock.clone();
                    let payments = axum::Router::new()
                        .route(PATH, axum::routing::post(axum_pay))
                        .layer(RedlockLayer::new(redlock, extractor()).unwrap());
                    let app = axum::Router::new()
                        .route(
                            WARM_UP,
                            axum::routing::get(move || warm_up_here(warm.clone(), weak.clone())),
                        )
                        .merge(payments);
                    let listener =
                        tokio::net::TcpListener::from_std(listener).expect("a Tokio listener");
                    tokio::select! {
                        served = axum::serve(listener, app) => served.expect("axum::serve"),
                        _ = stopped => {}
                    }
                });
            })
            .expect("spawn the replica's thread");
        let redlock = within("the axum replica's client", client_rx)
            .await
            .expect("the replica's thread started");
        let replica = Self {
            addr,
            redlock,
            stop: Some(stop),
            thread: Some(thread),
        };
        warm_up_over_http(&replica.url(WARM_UP)).await;
        replica
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for AxumReplica {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            // Quick: dropping a current-thread runtime cancels its tasks at once.
            let joined = thread.join();
            if joined.is_err() && !std::thread::panicking() {
                panic!("the axum replica's thread panicked");
            }
        }
    }
}

/// The axum handler: trivial, a little async work, under the lock (the `LeaseHandle` is
/// there only if the layer took one).
async fn axum_pay(_lease: LeaseHandle) -> &'static str {
    tokio::task::yield_now().await;
    "ok"
}

/// An actix-web replica with one worker (one thread: at most one CPU), which builds the
/// replica's client and drives its Redis connections. Stopped on drop.
struct ActixReplica {
    addr: SocketAddr,
    redlock: Redlock,
    handle: ServerHandle,
    server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl ActixReplica {
    async fn start(masters: &Arc<Masters>) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let urls = masters.urls();
        let weak = Arc::downgrade(masters);
        // The app factory runs on the worker's thread: the client is built there.
        let client: Arc<OnceLock<Redlock>> = Arc::default();
        let slot = client.clone();
        let server = HttpServer::new(move || {
            let redlock = slot.get_or_init(|| replica_client(&urls)).clone();
            let warm = (redlock.clone(), weak.clone());
            App::new()
                .route(
                    WARM_UP,
                    web::get().to(move || warm_up_here(warm.0.clone(), warm.1.clone())),
                )
                .service(
                    web::resource(PATH).route(
                        web::post()
                            .to(actix_pay)
                            .wrap(RedlockMiddleware::new(redlock, extractor()).unwrap()),
                    ),
                )
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(5)
        .listen(listener)
        .expect("listen on the bound socket")
        .run();
        let handle = server.handle();
        let server = Some(tokio::spawn(server));
        warm_up_over_http(&format!("http://{addr}{WARM_UP}")).await;
        let redlock = client.get().expect("the worker built the client").clone();
        Self {
            addr,
            redlock,
            handle,
            server,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for ActixReplica {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            // Sends the command at once; the server task carries it out.
            drop(self.handle.stop(false));
            drop(server);
        }
    }
}

/// The actix-web twin of [`axum_pay`].
async fn actix_pay(_lease: LeaseHandle) -> &'static str {
    tokio::task::yield_now().await;
    "ok"
}

// --- the test's side -------------------------------------------------------------------------

/// Three empty masters. Their raw connections (for the assertions) are made here, on the
/// test's runtime, before any replica uses them.
async fn fresh_masters() -> Arc<Masters> {
    let masters = Arc::new(Masters::start(3));
    assert_eq!(
        masters.dbsizes().await,
        [0, 0, 0],
        "fresh masters are empty"
    );
    masters
}

/// Asks a replica to warm its client up, and waits until it has.
async fn warm_up_over_http(url: &str) {
    let response = send(http_client().get(url)).await;
    assert_eq!(response.status().as_u16(), 200, "GET {url}");
}

/// What the flood's answers were.
#[derive(Debug, Default)]
struct Tally {
    ok: usize,
    unavailable: usize,
    /// A description of every answer that was neither a 200 nor a 503.
    others: Vec<String>,
    /// The body of one 503, to show why.
    a_503: Option<String>,
    latencies: Vec<Duration>,
    /// Each request's number and the status it was answered with (0: no answer).
    answered: Vec<(usize, u16)>,
    /// Answers after which the replica's client showed a suspended master.
    seen_suspended: usize,
    /// The most timeouts in a row the client showed for any master.
    max_timeouts_in_a_row: u32,
}

impl Tally {
    fn answers(&self) -> usize {
        self.ok + self.unavailable + self.others.len()
    }

    fn observe(&mut self, status: &[NodeStatus]) {
        if status.iter().any(NodeStatus::is_suspended) {
            self.seen_suspended += 1;
        }
        let most = status.iter().map(NodeStatus::consecutive_timeouts).max();
        self.max_timeouts_in_a_row = self.max_timeouts_in_a_row.max(most.unwrap_or(0));
    }

    fn merge(&mut self, other: Self) {
        self.ok += other.ok;
        self.unavailable += other.unavailable;
        self.others.extend(other.others);
        self.a_503 = self.a_503.take().or(other.a_503);
        self.latencies.extend(other.latencies);
        self.answered.extend(other.answered);
        self.seen_suspended += other.seen_suspended;
        self.max_timeouts_in_a_row = self.max_timeouts_in_a_row.max(other.max_timeouts_in_a_row);
    }

    /// The `q` quantile of the answers' latencies (`latencies` sorted).
    fn latency(&self, q: f64) -> Duration {
        let n = self.latencies.len();
        if n == 0 {
            return Duration::ZERO;
        }
        let i = ((n as f64 * q).ceil() as usize).clamp(1, n) - 1;
        self.latencies[i]
    }
}

/// The `Idempotency-Key` of request `i`.
fn flood_key(label: &str, i: usize) -> String {
    format!("flood-{label}-{i}")
}

/// The Redis key the replicas lock for `POST PATH` with `Idempotency-Key: key`.
fn redis_key(key: &str) -> String {
    let req = SimpleRequest::new("POST", PATH)
        .route(PATH)
        .header(IDEMPOTENCY_KEY, key);
    extractor()
        .extract(&req)
        .expect("a valid key")
        .expect("a key")
        .into_string()
}

/// Which requests the keys still on the masters belong to, and what they were answered:
/// `status (count)` per answer, and a few of the keys with their `PTTL` on each master.
async fn describe_leftovers(label: &str, masters: &Masters, tally: &Tally) -> String {
    let status_of: HashMap<String, u16> = tally
        .answered
        .iter()
        .map(|(i, status)| (redis_key(&flood_key(label, *i)), *status))
        .collect();
    let mut keys: Vec<String> = Vec::new();
    for master in masters.iter() {
        let on_master: Vec<String> = master.query(redis::cmd("KEYS").arg("*")).await;
        keys.extend(on_master);
    }
    keys.sort_unstable();
    keys.dedup();
    let mut by_answer: HashMap<u16, usize> = HashMap::new();
    for key in &keys {
        *by_answer
            .entry(status_of.get(key).copied().unwrap_or(0))
            .or_default() += 1;
    }
    let mut by_answer: Vec<_> = by_answer.into_iter().collect();
    by_answer.sort_unstable();
    let mut examples = Vec::new();
    for key in keys.iter().take(3) {
        examples.push(format!(
            "{} PTTL {:?} ms",
            status_of.get(key).copied().unwrap_or(0),
            masters.pttls(key).await
        ));
    }
    format!(
        "{} distinct keys, by their request's answer (status, keys): {by_answer:?}; e.g. {examples:?}",
        keys.len()
    )
}

/// One of the [`IN_FLIGHT`] senders: takes the next request number until [`REQUESTS`] were
/// taken or the deadline passed; one request at a time, over the shared keep-alive pool.
async fn sender(
    http: reqwest::Client,
    url: String,
    label: &'static str,
    next: Arc<AtomicUsize>,
    deadline: Instant,
    redlock: Redlock,
) -> Tally {
    let mut tally = Tally::default();
    loop {
        let i = next.fetch_add(1, SeqCst);
        if i >= REQUESTS || Instant::now() >= deadline {
            return tally;
        }
        let key = flood_key(label, i);
        let sent = Instant::now();
        let answer = tokio::time::timeout(ANSWER_WITHIN, async {
            let response = post_with(&http, &url, &[&key]).send().await?;
            let status = response.status().as_u16();
            let body = response.bytes().await?;
            Ok::<_, reqwest::Error>((status, String::from_utf8_lossy(&body).into_owned()))
        })
        .await;
        tally.latencies.push(sent.elapsed());
        let status = match &answer {
            Ok(Ok((status, _))) => *status,
            _ => 0,
        };
        tally.answered.push((i, status));
        match answer {
            Ok(Ok((200, _))) => tally.ok += 1,
            Ok(Ok((503, body))) => {
                tally.unavailable += 1;
                tally.a_503.get_or_insert(body);
            }
            Ok(Ok((status, body))) => tally.others.push(format!("{key}: {status} {body}")),
            Ok(Err(e)) => tally.others.push(format!("{key}: {e}")),
            Err(_) => tally
                .others
                .push(format!("{key}: no answer within {ANSWER_WITHIN:?}")),
        }
        tally.observe(&redlock.node_status());
    }
}

/// Floods `url` (`POST` behind the lock, served by a replica whose client is `redlock`) with
/// [`REQUESTS`] distinct keys, [`IN_FLIGHT`] at a time, and checks issue 10's promise.
async fn flood_of_distinct_keys(
    label: &'static str,
    masters: &Masters,
    url: &str,
    redlock: &Redlock,
) {
    assert_eq!(masters.dbsizes().await, [0, 0, 0], "empty before the flood");
    assert!(
        redlock.node_status().iter().all(|s| !s.is_suspended()),
        "a master is suspended before the flood: {:?}",
        redlock.node_status()
    );

    // --- the flood
    let http = http_client();
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let deadline = started + FLOOD_DEADLINE;
    let senders: Vec<_> = (0..IN_FLIGHT)
        .map(|_| {
            tokio::spawn(sender(
                http.clone(),
                url.to_owned(),
                label,
                next.clone(),
                deadline,
                redlock.clone(),
            ))
        })
        .collect();
    let mut tally = Tally::default();
    for s in senders {
        tally.merge(s.await.expect("a sender panicked"));
    }
    let elapsed = started.elapsed();

    // --- right after the flood, before anything could restore a master or release a key
    let status = redlock.node_status();
    let left = masters.dbsizes().await;

    tally.latencies.sort_unstable();
    let answers = tally.answers();
    println!(
        "[{label}] {answers} answers to {REQUESTS} requests ({IN_FLIGHT} in flight) in {:.2} s \
         ({:.0} requests/s): 200: {}, 503: {} ({:.3} %), other: {}; latency p50 {:?}, \
         p99 {:?}, max {:?}",
        elapsed.as_secs_f64(),
        answers as f64 / elapsed.as_secs_f64(),
        tally.ok,
        tally.unavailable,
        100.0 * tally.unavailable as f64 / answers.max(1) as f64,
        tally.others.len(),
        tally.latency(0.5),
        tally.latency(0.99),
        tally.latency(1.0),
    );
    println!(
        "[{label}] right after the flood: keys on each master {left:?}; masters {:?}; \
         answers after which a master was suspended: {}; most timeouts in a row seen: {}",
        status
            .iter()
            .map(|s| format!(
                "{} {} ({} timeouts in a row)",
                s.name(),
                if s.is_suspended() { "SUSPENDED" } else { "ok" },
                s.consecutive_timeouts()
            ))
            .collect::<Vec<_>>(),
        tally.seen_suspended,
        tally.max_timeouts_in_a_row,
    );
    if let Some(body) = &tally.a_503 {
        println!("[{label}] a 503: {body}");
    }
    if left.iter().any(|n| *n > 0) {
        println!(
            "[{label}] keys left right after the flood: {}",
            describe_leftovers(label, masters, &tally).await
        );
    }

    // --- every key is released (well within the ttl: released, not expired)
    let emptied = eventually(
        format_args!("every master is empty after the {label} flood"),
        EMPTY_WITHIN,
        || async { masters.dbsizes().await.iter().all(|n| *n == 0) },
    )
    .await;
    println!("[{label}] every master empty {emptied:?} after the flood");

    // --- the promise
    assert!(
        answers >= MIN_ANSWERS,
        "only {answers} answers before the {FLOOD_DEADLINE:?} deadline"
    );
    assert!(
        tally.others.is_empty(),
        "{} answers were neither 200 nor 503 (distinct keys never contend), e.g. {:?}",
        tally.others.len(),
        &tally.others[..tally.others.len().min(5)]
    );
    assert!(
        !status.iter().any(NodeStatus::is_suspended),
        "a healthy master was suspended by the flood: {status:?}"
    );
    assert_eq!(
        tally.seen_suspended, 0,
        "a healthy master was suspended during the flood ({} answers saw it)",
        tally.seen_suspended
    );
    assert!(
        tally.unavailable * 1000 <= answers * MAX_503_PER_MILLE,
        "{} of {answers} answers were 503 ({:.3} %; at most 0.1 % allowed)",
        tally.unavailable,
        100.0 * tally.unavailable as f64 / answers as f64
    );
}
