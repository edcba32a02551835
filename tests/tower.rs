//! `RedlockLayer` in a real axum server on a loopback port, against real Redis masters, driven
//! by a reqwest client: exclusion across two app instances, concurrency across keys, waiting,
//! fail-closed and fail-open, bad keys, release at the response or at the body's end,
//! cancelled requests, the lease in the handler and keep-alive; then the in-process lifecycle
//! of the service, its future and its body (after call, after the response, after the body's
//! end, after a drop), as tower-http's in-flight-requests test checks it.
//!
//! No sleep synchronizes anything: handlers block on a gate the test opens once it has seen
//! what it needs, and every wait is bounded.

use tower_redlock_testkit as support;

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, Response};
use axum::routing::{post, MethodRouter};
use axum::{Extension, Json, Router};
use bytes::Bytes;
use futures_util::{stream, FutureExt, StreamExt};
use http_body::Frame;
use http_body_util::{BodyExt, Empty, StreamBody};
use reqwest::header::HeaderValue;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch};
use tower::util::BoxCloneService;
use tower::{Layer, Service, ServiceExt};

use support::apps::*;
use support::http::{http_client, send, within, Reply};
use support::{eventually, is_token, warm_up, HttpApp, Masters};
use tower_redlock::http::{
    IdempotencyKey, KeyExtractor, LockPolicy, RouteParamKey, SimpleRequest, Unlocked, DEFAULT_TTL,
};
use tower_redlock::RedlockLayer;
use tower_redlock::{LeaseHandle, Redlock};

// --- the handlers' side ------------------------------------------------------------------------

/// What the handlers report — how many started, how many run at once, how many finished or
/// were dropped — and the gate that holds them inside their critical section until the test
/// opens it.
struct Probe {
    in_flight: AtomicUsize,
    max_in_flight: AtomicUsize,
    started: watch::Sender<usize>,
    completed: AtomicUsize,
    ended: AtomicUsize,
    gate: watch::Sender<bool>,
}

impl Probe {
    /// A probe with the gate closed.
    fn new() -> Arc<Self> {
        Arc::new(Self {
            in_flight: AtomicUsize::new(0),
            max_in_flight: AtomicUsize::new(0),
            started: watch::Sender::new(0),
            completed: AtomicUsize::new(0),
            ended: AtomicUsize::new(0),
            gate: watch::Sender::new(false),
        })
    }

    /// A probe whose handlers pass straight through.
    fn open_gate() -> Arc<Self> {
        let probe = Self::new();
        probe.open();
        probe
    }

    /// A handler starts; it counts as running until the guard is dropped.
    fn enter(self: &Arc<Self>) -> Running {
        let now = self.in_flight.fetch_add(1, SeqCst) + 1;
        self.max_in_flight.fetch_max(now, SeqCst);
        self.started.send_modify(|n| *n += 1);
        Running(self.clone())
    }

    /// Lets every handler, waiting or to come, through.
    fn open(&self) {
        self.gate.send_replace(true);
    }

    async fn wait_for_gate(&self) {
        let mut gate = self.gate.subscribe();
        gate.wait_for(|open| *open).await.expect("the probe lives");
    }

    /// Waits until `n` handlers have started.
    async fn until_started(&self, n: usize) {
        let mut started = self.started.subscribe();
        within(
            format!("{n} handler(s) to start"),
            started.wait_for(|s| *s >= n),
        )
        .await
        .expect("the probe lives");
    }

    fn started(&self) -> usize {
        *self.started.borrow()
    }

    fn in_flight(&self) -> usize {
        self.in_flight.load(SeqCst)
    }

    fn max_in_flight(&self) -> usize {
        self.max_in_flight.load(SeqCst)
    }

    fn completed(&self) -> usize {
        self.completed.load(SeqCst)
    }

    /// Handlers dropped before they finished (their request was cancelled).
    fn cancelled(&self) -> usize {
        self.ended.load(SeqCst) - self.completed()
    }
}

/// A running handler; dropping it (finished or cancelled) ends it.
struct Running(Arc<Probe>);

impl Running {
    fn complete(self) {
        self.0.completed.fetch_add(1, SeqCst);
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, SeqCst);
        self.0.ended.fetch_add(1, SeqCst);
    }
}

/// The handler of most tests: runs inside the lock until the gate opens (then does `work`),
/// and answers with what it saw of the lock.
async fn gated(
    probe: Arc<Probe>,
    work: Duration,
    lease: Option<LeaseHandle>,
    unlocked: Option<Extension<Unlocked>>,
) -> Json<Value> {
    let running = probe.enter();
    probe.wait_for_gate().await;
    if !work.is_zero() {
        // Simulated work, not synchronization.
        tokio::time::sleep(work).await;
    }
    let report = json!({
        "locked": lease.is_some(),
        "unlocked": unlocked.is_some(),
        "resource": lease.as_ref().map(|l| l.resource().to_owned()),
        "validity_ms": lease.as_ref().map(|l| l.validity().as_millis() as u64),
        "lost": lease.as_ref().map(LeaseHandle::is_lost),
        "extensions": lease.as_ref().map(LeaseHandle::extensions),
    });
    running.complete();
    Json(report)
}

fn gated_route(probe: &Arc<Probe>, work: Duration) -> MethodRouter {
    let probe = probe.clone();
    post(
        move |lease: Option<LeaseHandle>, unlocked: Option<Extension<Unlocked>>| {
            gated(probe.clone(), work, lease, unlocked)
        },
    )
}

/// `POST /payments` → [`gated`], behind `layer`.
fn gated_app(layer: RedlockLayer, probe: &Arc<Probe>) -> Router {
    Router::new()
        .route(PATH, gated_route(probe, Duration::ZERO))
        .layer(layer)
}

/// A response body the test writes: each `Bytes` sent is one data frame, and dropping the
/// sender ends the body.
type TestBody = StreamBody<stream::BoxStream<'static, Result<Frame<Bytes>, Infallible>>>;

fn test_body() -> (mpsc::Sender<Bytes>, TestBody) {
    let (tx, rx) = mpsc::channel::<Bytes>(1);
    let frames = stream::unfold(rx, |mut rx| async move {
        let chunk = rx.recv().await?;
        Some((Ok(Frame::data(chunk)), rx))
    });
    (tx, StreamBody::new(frames.boxed()))
}

/// Where a streaming handler hands the test the writing end of its response body.
type Bodies = mpsc::UnboundedSender<mpsc::Sender<Bytes>>;

/// `POST /payments` answering with a [`test_body`], behind `layer`.
fn streaming_app(layer: RedlockLayer, bodies: Bodies) -> Router {
    let handler = move || {
        let (tx, body) = test_body();
        bodies.send(tx).expect("the test is listening");
        async move { Body::new(body) }
    };
    Router::new().route(PATH, post(handler)).layer(layer)
}

// --- Redis's side ------------------------------------------------------------------------------

/// The Redis key the layer locks for `Idempotency-Key: key` (no scope, default prefix; the
/// test clients add no key prefix).
fn redis_key(key: &str) -> String {
    let req = SimpleRequest::new("POST", PATH).header(IDEMPOTENCY_KEY, key);
    IdempotencyKey::required()
        .extract(&req)
        .expect("a valid key")
        .expect("a key")
        .as_str()
        .to_owned()
}

// --- 1. two instances, one key ---------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn one_key_across_two_instances_runs_exactly_once() {
    const REQUESTS: usize = 50;
    /// Bursts in which the first racers split the masters' votes three ways get no winner
    /// (Redlock's split vote: everyone backs off); it is rare, and a new burst is sent.
    const MAX_BURSTS: usize = 5;
    const KEY: &str = "\"payment-7\"";
    let m = Masters::start(3);
    let probe = Probe::new();
    let mut apps = Vec::new();
    for _ in 0..2 {
        // Each instance has its own client, as two processes would.
        let redlock = client_of(&m).await;
        let layer = RedlockLayer::new(redlock, IdempotencyKey::required()).unwrap();
        apps.push(HttpApp::serve(gated_app(layer, &probe)).await);
    }
    let urls = [apps[0].url(PATH), apps[1].url(PATH)];
    let http = http_client();

    let mut split_votes = 0;
    let mut replies = loop {
        let mut replies = burst(&http, &urls, KEY, REQUESTS);
        // A holder is stuck at the gate: every other request is answered meanwhile.
        for _ in 0..REQUESTS - 1 {
            assert_conflict(&next_reply(&mut replies).await, DEFAULT_TTL);
        }
        tokio::select! {
            () = probe.until_started(1) => break replies,
            last = next_reply(&mut replies) => {
                assert_conflict(&last, DEFAULT_TTL);
                assert_eq!(probe.started(), 0);
                split_votes += 1;
                assert!(split_votes < MAX_BURSTS, "{split_votes} bursts without a winner");
                // Every racer gave back what it took.
                assert_all_empty(&m).await;
            }
        }
    };
    assert_eq!(probe.started(), 1, "exactly one request got the lock");
    assert_eq!(probe.in_flight(), 1);
    assert!(held_on(&m, &redis_key(KEY)).await >= 2, "held on a quorum");

    probe.open();
    let v = next_reply(&mut replies).await.ok();
    assert_eq!(v["locked"], true, "{v}");
    assert_eq!(v["resource"], redis_key(KEY), "{v}");
    assert_eq!(probe.max_in_flight(), 1);
    assert_eq!((probe.started(), probe.completed()), (1, 1));
    assert_all_empty(&m).await;
    if split_votes > 0 {
        eprintln!("{split_votes} burst(s) without a winner (split votes)");
    }
}

// --- 2. different keys ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn different_keys_run_concurrently() {
    const REQUESTS: usize = 6;
    let (m, redlock) = masters_and_client().await;
    let probe = Probe::new();
    let app = HttpApp::serve(gated_app(
        RedlockLayer::new(redlock, IdempotencyKey::required()).unwrap(),
        &probe,
    ))
    .await;

    let http = http_client();
    let requests: Vec<_> = (0..REQUESTS)
        .map(|i| tokio::spawn(post_key(&http, &app.url(PATH), &format!("order-{i}"))))
        .collect();
    // Only if the layer lets them all in at once do all of them reach the gate.
    probe.until_started(REQUESTS).await;
    assert_eq!(probe.in_flight(), REQUESTS);
    eventually("every master holds every key", RELEASED_WITHIN, || async {
        m.dbsizes().await.iter().all(|n| *n == REQUESTS as u64)
    })
    .await;

    probe.open();
    let mut resources = std::collections::HashSet::new();
    for request in requests {
        let v = within("a response", request).await.expect("no panic").ok();
        assert_eq!(v["locked"], true, "{v}");
        resources.insert(v["resource"].as_str().expect("a resource").to_owned());
    }
    assert_eq!(resources.len(), REQUESTS, "one lock per key");
    assert_eq!(probe.max_in_flight(), REQUESTS);
    assert_all_empty(&m).await;
}

// --- 3. waiting -------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn waiting_requests_take_turns() {
    const REQUESTS: usize = 8;
    const KEY: &str = "order-1";
    let (m, redlock) = masters_and_client().await;
    let policy = LockPolicy::builder(redlock, IdempotencyKey::required())
        .wait(Duration::from_secs(10))
        .build()
        .expect("a valid policy");
    let probe = Probe::open_gate();
    let router = Router::new()
        .route(PATH, gated_route(&probe, Duration::from_millis(30)))
        .layer(RedlockLayer::with_policy(policy));
    let app = HttpApp::serve(router).await;

    let http = http_client();
    let requests: Vec<_> = (0..REQUESTS)
        .map(|_| tokio::spawn(post_key(&http, &app.url(PATH), KEY)))
        .collect();
    for request in requests {
        let v = within("a response", request).await.expect("no panic").ok();
        assert_eq!(v["locked"], true, "{v}");
    }
    assert_eq!(probe.completed(), REQUESTS, "every request ran");
    assert_eq!(probe.max_in_flight(), 1, "one at a time");
    assert_released(&m, &redis_key(KEY)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn waiting_gives_up_at_its_deadline() {
    const MAX_WAIT: Duration = Duration::from_secs(2);
    const KEY: &str = "order-1";
    let m = Masters::start(3);
    // The harness's client (200 ms node timeout): the waiter stops before a try that could
    // not end by the deadline, and a try is bounded by the node timeout.
    let redlock = m.client();
    warm_up(&redlock, &m).await;
    let policy = LockPolicy::builder(redlock, IdempotencyKey::required())
        .wait(MAX_WAIT)
        .build()
        .expect("a valid policy");
    let probe = Probe::new();
    let app = HttpApp::serve(gated_app(RedlockLayer::with_policy(policy), &probe)).await;

    let http = http_client();
    let holder = tokio::spawn(post_key(&http, &app.url(PATH), KEY));
    probe.until_started(1).await;

    let started = Instant::now();
    let waiter = post_key(&http, &app.url(PATH), KEY).await;
    let waited = started.elapsed();
    assert_conflict(&waiter, DEFAULT_TTL);
    // It waited (a 409 at once takes milliseconds), stopping early only by the length of a
    // try or two (a few node timeouts), and it gave up by the deadline (plus slack for a
    // loaded machine).
    assert!(waited >= MAX_WAIT / 2, "gave up after only {waited:?}");
    assert!(
        waited < MAX_WAIT + Duration::from_secs(3),
        "waited {waited:?}"
    );
    assert_eq!(probe.started(), 1, "the waiter never ran");

    probe.open();
    let v = within("the holder", holder).await.expect("no panic").ok();
    assert_eq!(v["locked"], true, "{v}");
    assert_released(&m, &redis_key(KEY)).await;
}

// --- 4. a majority of masters down ------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn majority_down_fails_closed_or_runs_unlocked() {
    let (m, redlock) = masters_and_client().await;
    let (closed, open) = (Probe::open_gate(), Probe::open_gate());
    let fail_open = LockPolicy::builder(redlock.clone(), IdempotencyKey::required())
        .fail_open()
        .build()
        .expect("a valid policy");
    let router = Router::new()
        .route(
            "/closed",
            gated_route(&closed, Duration::ZERO)
                .layer(RedlockLayer::new(redlock, IdempotencyKey::required()).unwrap()),
        )
        .route(
            "/open",
            gated_route(&open, Duration::ZERO).layer(RedlockLayer::with_policy(fail_open)),
        );
    let app = HttpApp::serve(router).await;
    m[1].stop();
    m[2].stop();

    let http = http_client();
    let reply = post_key(&http, &app.url("/closed"), "order-1").await;
    assert_problem(&reply, 503, "/problems/lock-unavailable");
    assert!(reply.retry_after() >= 1);
    assert_eq!(closed.started(), 0, "fail-closed never runs the handler");
    // What the failed try took on the live master was given back.
    eventually("the live master is empty", RELEASED_WITHIN, || async {
        m[0].dbsize().await == 0
    })
    .await;

    let v = post_key(&http, &app.url("/open"), "order-2").await.ok();
    assert_eq!(
        v["unlocked"], true,
        "the handler sees the Unlocked marker: {v}"
    );
    assert_eq!(v["locked"], false, "and no lease: {v}");
    assert_eq!(open.completed(), 1);
}

// --- 5. bad keys ------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn bad_keys_are_rejected_before_locking() {
    let (m, redlock) = masters_and_client().await;
    let probe = Probe::open_gate();
    let app = HttpApp::serve(gated_app(
        RedlockLayer::new(redlock, IdempotencyKey::required()).unwrap(),
        &probe,
    ))
    .await;
    let http = http_client();
    let value = |v: &[u8]| HeaderValue::from_bytes(v).expect("a valid header value");

    // The raw values carry "zebra" so that we can check no rejection echoes them.
    let long = "zebra".repeat(52); // 260 bytes
    let cases: Vec<(&str, Vec<HeaderValue>, &str)> = vec![
        ("missing", vec![], "missing"),
        ("quoted empty", vec![value(b"\"\"")], "empty"),
        ("bare empty", vec![value(b"")], "empty"),
        ("blank", vec![value(b"   ")], "empty"),
        ("256 bytes", vec![value(&[b'z'; 256])], "too-long"),
        (
            "long, quoted",
            vec![value(format!("\"{long}\"").as_bytes())],
            "too-long",
        ),
        ("unterminated", vec![value(b"\"zebra")], "malformed"),
        ("space", vec![value(b"zebra 1")], "malformed"),
        ("non-ASCII", vec![value(b"zebra-\xff\xfe")], "malformed"),
        ("after the quote", vec![value(b"\"zebra\" x")], "malformed"),
        (
            "duplicate",
            vec![value(b"zebra-1"), value(b"zebra-2")],
            "duplicate",
        ),
    ];
    for (case, values, problem) in cases {
        let mut request = http.post(app.url(PATH));
        for v in values {
            request = request.header(IDEMPOTENCY_KEY, v);
        }
        let reply = Reply::read(send(request).await).await;
        assert_problem(&reply, 400, &format!("/problems/lock-key-{problem}"));
        assert!(reply.header("retry-after").is_none(), "{case}");
        assert!(!reply.text().contains("zebra"), "{case}: {}", reply.text());
    }
    assert_eq!(probe.started(), 0, "no handler ran");
    assert_eq!(m.dbsizes().await, vec![0; 3], "nothing was locked");

    // The bound is 255 bytes: one less than the rejected key passes.
    let v = post_key(&http, &app.url(PATH), &"z".repeat(255)).await.ok();
    assert_eq!(v["locked"], true, "{v}");
    assert_all_empty(&m).await;
}

/// A route parameter that is not UTF-8 once percent-decoded is a malformed key (400), not a
/// "missing parameter" blamed on the server's setup; a valid one locks.
#[tokio::test(flavor = "current_thread")]
async fn a_route_param_that_is_not_utf8_is_malformed() {
    let app = Router::new()
        .route("/accounts/{id}", post(|| async { "ok" }))
        .layer(RedlockLayer::new(Redlock::in_memory(), RouteParamKey::new("id")).unwrap());
    let call = |path: &'static str| {
        let app = app.clone();
        async move {
            let req = Request::post(path).body(Body::empty()).expect("a request");
            let res = within("the response", app.oneshot(req))
                .await
                .expect("infallible");
            let status = res.status().as_u16();
            let body = res.into_body().collect().await.expect("a body").to_bytes();
            (status, String::from_utf8_lossy(&body).into_owned())
        }
    };
    let (status, body) = call("/accounts/%FF").await;
    assert_eq!(status, 400, "{body}");
    let v: Value = serde_json::from_str(&body).expect("problem+json");
    assert_eq!(v["type"], "/problems/lock-key-malformed", "{v}");
    assert_eq!(call("/accounts/7").await.0, 200);
}

// --- 6. release at body end vs. at the response -----------------------------------------------

/// Reads the rest of a streaming response.
async fn rest_of(mut response: reqwest::Response) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(chunk) = within("a chunk", response.chunk()).await.expect("a chunk") {
        out.extend_from_slice(&chunk);
    }
    out
}

/// Writes `chunk` into a response body and reads it on the client side.
async fn stream_through(body: &mpsc::Sender<Bytes>, response: &mut reqwest::Response, chunk: &str) {
    body.send(Bytes::copy_from_slice(chunk.as_bytes()))
        .await
        .expect("the body is still read");
    let read = within("a chunk", response.chunk()).await.expect("a chunk");
    assert_eq!(read.as_deref(), Some(chunk.as_bytes()));
}

/// A streaming request whose body the test ends at once; its status.
async fn quick_stream(
    http: &reqwest::Client,
    url: &str,
    key: &str,
    bodies: &mut mpsc::UnboundedReceiver<mpsc::Sender<Bytes>>,
) -> u16 {
    let response = send(http.post(url).header(IDEMPOTENCY_KEY, key)).await;
    if response.status() == 200 {
        drop(within("the handler's body", bodies.recv()).await);
    }
    let status = response.status().as_u16();
    let _ = rest_of(response).await;
    status
}

#[tokio::test(flavor = "multi_thread")]
async fn release_on_body_end_holds_the_key_while_the_body_streams() {
    const KEY: &str = "report-1";
    let (m, redlock) = masters_and_client().await;
    let policy = LockPolicy::builder(redlock, IdempotencyKey::required())
        .release_on_body_end()
        .build()
        .expect("a valid policy");
    let (bodies_tx, mut bodies) = mpsc::unbounded_channel();
    let app = HttpApp::serve(streaming_app(RedlockLayer::with_policy(policy), bodies_tx)).await;
    let (http, url, key) = (http_client(), app.url(PATH), redis_key(KEY));

    let mut first = send(http.post(&url).header(IDEMPOTENCY_KEY, KEY)).await;
    assert_eq!(first.status(), 200);
    let body = within("the handler", bodies.recv()).await.expect("a body");
    stream_through(&body, &mut first, "first").await;

    // Streaming: the key is still held, and the same key is refused.
    assert_held(&m, &key).await;
    let second = post_key(&http, &url, KEY).await;
    assert_conflict(&second, DEFAULT_TTL);
    assert!(bodies.try_recv().is_err(), "the refused request never ran");

    body.send(Bytes::from_static(b"last")).await.expect("read");
    drop(body);
    assert_eq!(rest_of(first).await, b"last");
    // The end of the body is reported once the lock is released: the key is free at once.
    assert_eq!(quick_stream(&http, &url, KEY, &mut bodies).await, 200);
    assert_released(&m, &key).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn release_on_response_frees_the_key_while_the_body_streams() {
    const KEY: &str = "report-1";
    let (m, redlock) = masters_and_client().await;
    let (bodies_tx, mut bodies) = mpsc::unbounded_channel();
    let layer = RedlockLayer::new(redlock, IdempotencyKey::required()).unwrap();
    let app = HttpApp::serve(streaming_app(layer, bodies_tx)).await;
    let (http, url, key) = (http_client(), app.url(PATH), redis_key(KEY));

    let mut first = send(http.post(&url).header(IDEMPOTENCY_KEY, KEY)).await;
    assert_eq!(first.status(), 200);
    let body = within("the handler", bodies.recv()).await.expect("a body");
    stream_through(&body, &mut first, "first").await;

    // The body still streams, but the lock went with the response head.
    assert_released(&m, &key).await;
    assert_eq!(quick_stream(&http, &url, KEY, &mut bodies).await, 200);

    body.send(Bytes::from_static(b"last")).await.expect("read");
    drop(body);
    assert_eq!(rest_of(first).await, b"last");
    assert_all_empty(&m).await;
}

// --- 7. a cancelled request -------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn cancelled_request_releases_in_the_background() {
    const KEY: &str = "order-1";
    let (m, redlock) = masters_and_client().await;
    let probe = Probe::new();
    let app = HttpApp::serve(gated_app(
        RedlockLayer::new(redlock, IdempotencyKey::required()).unwrap(),
        &probe,
    ))
    .await;
    let (http, url, key) = (http_client(), app.url(PATH), redis_key(KEY));

    let request = tokio::spawn(post_key(&http, &url, KEY));
    probe.until_started(1).await;
    assert_held(&m, &key).await;

    // The client gives up: its request and connection are dropped.
    request.abort();
    assert!(request.await.expect_err("aborted").is_cancelled());
    eventually(
        "the server drops the handler of the closed connection",
        RELEASED_WITHIN,
        || async { probe.cancelled() == 1 },
    )
    .await;
    // Released in the background, long before the 30 s ttl.
    assert_released(&m, &key).await;

    probe.open();
    let v = post_key(&http, &url, KEY).await.ok();
    assert_eq!(v["locked"], true, "{v}");
    assert_eq!((probe.started(), probe.completed()), (2, 1));
    assert_all_empty(&m).await;
}

// --- 8. the lifecycle, in process -------------------------------------------------------------

type InnerService = BoxCloneService<Request<Empty<Bytes>>, Response<TestBody>, Infallible>;

/// An inner service that passes the probe's gate, then answers with a [`test_body`] whose
/// writing end it hands to the test.
fn body_service(probe: &Arc<Probe>, bodies: Bodies) -> InnerService {
    let probe = probe.clone();
    BoxCloneService::new(tower::service_fn(move |_req: Request<Empty<Bytes>>| {
        let (probe, bodies) = (probe.clone(), bodies.clone());
        async move {
            let running = probe.enter();
            probe.wait_for_gate().await;
            running.complete();
            let (tx, body) = test_body();
            bodies.send(tx).expect("the test is listening");
            Ok(Response::new(body))
        }
    }))
}

fn request(key: &str) -> Request<Empty<Bytes>> {
    Request::post(PATH)
        .header(IDEMPOTENCY_KEY, key)
        .body(Empty::new())
        .expect("a valid request")
}

/// What an in-process lifecycle test needs.
struct Lifecycle {
    masters: Masters,
    policy: LockPolicy,
    service: tower_redlock::tower::RedlockService<InnerService>,
    probe: Arc<Probe>,
    bodies: mpsc::UnboundedReceiver<mpsc::Sender<Bytes>>,
}

async fn lifecycle(policy: impl FnOnce(Redlock) -> LockPolicy) -> Lifecycle {
    let (masters, redlock) = masters_and_client().await;
    let probe = Probe::open_gate();
    let (bodies_tx, bodies) = mpsc::unbounded_channel();
    let policy = policy(redlock);
    let service = RedlockLayer::with_policy(policy.clone()).layer(body_service(&probe, bodies_tx));
    Lifecycle {
        masters,
        policy,
        service,
        probe,
        bodies,
    }
}

async fn next_data<B>(body: &mut B) -> Option<Bytes>
where
    B: http_body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Debug,
{
    let frame = within("a body frame", body.frame()).await?;
    Some(
        frame
            .expect("no body error")
            .into_data()
            .expect("a data frame"),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn lifecycle_with_release_on_body_end() {
    const KEY: &str = "order-1";
    let mut t = lifecycle(|redlock| {
        LockPolicy::builder(redlock, IdempotencyKey::required())
            .release_on_body_end()
            .build()
            .expect("a valid policy")
    })
    .await;
    let key = redis_key(KEY);

    let future = t.service.ready().await.expect("ready").call(request(KEY));
    assert_eq!(
        t.masters.dbsizes().await,
        vec![0; 3],
        "call alone locks nothing"
    );
    let response = within("the response", future).await.expect("infallible");
    assert_eq!(response.status(), 200);
    assert!(response.body().holds_lock());
    assert_held(&t.masters, &key).await;

    let mut body = response.into_body();
    let writer = within("the handler", t.bodies.recv())
        .await
        .expect("a body");
    writer
        .send(Bytes::from_static(b"chunk"))
        .await
        .expect("read");
    assert_eq!(next_data(&mut body).await.as_deref(), Some(&b"chunk"[..]));
    assert!(body.holds_lock());
    assert_eq!(
        held_on(&t.masters, &key).await,
        3,
        "held while the body streams"
    );

    drop(writer);
    assert_eq!(next_data(&mut body).await, None);
    assert!(!body.holds_lock());
    // The end is reported after the release has completed.
    // Released on a quorum when the end was reported; the last master may follow in the
    // background (a release returns at quorum).
    assert_released_on_quorum(&t.masters, &key).await;
    assert_released(&t.masters, &key).await;
    assert_eq!(t.probe.completed(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn lifecycle_with_release_on_response() {
    const KEY: &str = "order-1";
    let mut t = lifecycle(|redlock| {
        LockPolicy::builder(redlock, IdempotencyKey::required())
            .build()
            .expect("a valid policy")
    })
    .await;
    let key = redis_key(KEY);

    let future = t.service.ready().await.expect("ready").call(request(KEY));
    assert_eq!(
        t.masters.dbsizes().await,
        vec![0; 3],
        "call alone locks nothing"
    );
    let response = within("the response", future).await.expect("infallible");
    assert_eq!(response.status(), 200);
    // Released before the response was handed out.
    assert!(!response.body().holds_lock());
    // On a quorum at once; the last master may follow in the background.
    assert_released_on_quorum(&t.masters, &key).await;
    assert_released(&t.masters, &key).await;

    let mut body = response.into_body();
    let writer = within("the handler", t.bodies.recv())
        .await
        .expect("a body");
    writer
        .send(Bytes::from_static(b"chunk"))
        .await
        .expect("read");
    assert_eq!(next_data(&mut body).await.as_deref(), Some(&b"chunk"[..]));
    drop(writer);
    assert_eq!(next_data(&mut body).await, None);
    assert_eq!(t.masters.dbsizes().await, vec![0; 3]);
}

/// The lifecycle fixture releasing at the body's end.
async fn lifecycle_at_body_end() -> Lifecycle {
    lifecycle(|redlock| {
        LockPolicy::builder(redlock, IdempotencyKey::required())
            .release_on_body_end()
            .build()
            .expect("a valid policy")
    })
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn lifecycle_future_dropped_mid_acquire_releases() {
    const KEY: &str = "order-1";
    let mut t = lifecycle_at_body_end().await;
    let key = redis_key(KEY);

    // Two masters hang, so the acquisition cannot decide while they do. Polled once, the
    // future has sent its SETs; the live master takes its SET; then the future is dropped
    // (a client that goes away while the layer is still acquiring, e.g. while it waits for a
    // slow master or for a contended key), and the hung masters take theirs late.
    t.masters[1].freeze();
    t.masters[2].freeze();
    let future = t.service.ready().await.expect("ready").call(request(KEY));
    let mut future = Box::pin(future);
    assert!(future.as_mut().now_or_never().is_none(), "still acquiring");
    assert!(format!("{future:?}").contains("acquiring"), "{future:?}");
    eventually("the live master takes the SET", RELEASED_WITHIN, || async {
        t.masters[0].get(&key).await.is_some()
    })
    .await;
    drop(future);
    t.masters[1].thaw();
    t.masters[2].thaw();
    assert_released(&t.masters, &key).await;
    assert_eq!(t.probe.started(), 0, "the inner service never ran");
}

#[tokio::test(flavor = "multi_thread")]
async fn lifecycle_future_dropped_mid_call_releases() {
    const KEY: &str = "order-1";
    let t = lifecycle_at_body_end().await;
    let key = redis_key(KEY);
    // An inner service that stays at its (closed) gate.
    let probe = Probe::new();
    let (bodies_tx, _bodies) = mpsc::unbounded_channel();
    let mut service =
        RedlockLayer::with_policy(t.policy.clone()).layer(body_service(&probe, bodies_tx));

    let future = service.ready().await.expect("ready").call(request(KEY));
    let call = tokio::spawn(future);
    probe.until_started(1).await;
    assert_held(&t.masters, &key).await;
    call.abort();
    assert!(call.await.expect_err("aborted").is_cancelled());
    assert_eq!(probe.cancelled(), 1, "the inner future was dropped");
    assert_released(&t.masters, &key).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn lifecycle_body_dropped_before_its_end_releases() {
    const KEY: &str = "order-1";
    let mut t = lifecycle_at_body_end().await;
    let key = redis_key(KEY);

    let future = t.service.ready().await.expect("ready").call(request(KEY));
    let response = within("the response", future).await.expect("infallible");
    let writer = within("the handler", t.bodies.recv())
        .await
        .expect("a body");
    let mut body = response.into_body();
    writer
        .send(Bytes::from_static(b"chunk"))
        .await
        .expect("read");
    assert_eq!(next_data(&mut body).await.as_deref(), Some(&b"chunk"[..]));
    assert!(body.holds_lock());
    assert_held(&t.masters, &key).await;

    drop(body);
    assert_released(&t.masters, &key).await;
    assert!(writer.is_closed(), "the inner body was dropped too");
}

// --- 9. the handler sees the lease ------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn handler_sees_the_lease_of_the_hashed_key() {
    const RAW: &str = "\"secret-zebra-4242\"";
    let (m, redlock) = masters_and_client().await;
    let probe = Probe::new();
    let app = HttpApp::serve(gated_app(
        RedlockLayer::new(redlock, IdempotencyKey::required()).unwrap(),
        &probe,
    ))
    .await;
    let key = redis_key(RAW);
    assert!(key.starts_with("tower-redlock:"), "{key}");

    let request = tokio::spawn(post_key(&http_client(), &app.url(PATH), RAW));
    probe.until_started(1).await;
    // While the handler runs, each master holds exactly that key, with a lock token.
    eventually(
        "every master holds the one key",
        RELEASED_WITHIN,
        || async {
            let mut all = true;
            for master in m.iter() {
                let keys: Vec<String> = master.query(redis::cmd("KEYS").arg("*")).await;
                all &= keys == [key.clone()];
            }
            all
        },
    )
    .await;
    for value in m.values(&key).await {
        assert!(is_token(value.as_deref().expect("held")), "{value:?}");
    }

    probe.open();
    let v = within("the response", request)
        .await
        .expect("no panic")
        .ok();
    assert_eq!(v["resource"], key, "{v}");
    let validity = v["validity_ms"].as_u64().expect("a validity");
    assert!(
        validity > 0 && validity <= DEFAULT_TTL.as_millis() as u64,
        "{v}"
    );
    assert_eq!(v["lost"], false, "{v}");
    assert!(!key.contains("zebra") && !key.contains("4242"), "{key}");
    assert_all_empty(&m).await;
}

// --- 10. keep-alive ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn keep_alive_holds_the_key_past_its_ttl() {
    const TTL: Duration = Duration::from_millis(300);
    const KEY: &str = "order-1";
    let m = Masters::start(3);
    // The harness's client: its 200 ms node timeout fits in the 300 ms ttl.
    let redlock = m.client();
    warm_up(&redlock, &m).await;
    let policy = LockPolicy::builder(redlock, IdempotencyKey::required())
        .ttl(TTL)
        .build()
        .expect("a valid policy");
    let probe = Probe::new();
    let app = HttpApp::serve(gated_app(RedlockLayer::with_policy(policy), &probe)).await;
    let (http, url, key) = (http_client(), app.url(PATH), redis_key(KEY));

    let holder = tokio::spawn(post_key(&http, &url, KEY));
    probe.until_started(1).await;
    // Let the original ttl run out twice over: the passing of time is what is tested here.
    tokio::time::sleep(2 * TTL).await;
    let second = post_key(&http, &url, KEY).await;
    assert_conflict(&second, TTL);
    assert!(held_on(&m, &key).await >= 2, "still held past its ttl");

    probe.open();
    let v = within("the holder", holder).await.expect("no panic").ok();
    assert_eq!(v["lost"], false, "the lease was kept: {v}");
    assert!(v["extensions"].as_u64().expect("extensions") >= 1, "{v}");
    assert!(v["validity_ms"].as_u64().expect("a validity") > 0, "{v}");
    assert_eq!(probe.started(), 1);
    assert_released(&m, &key).await;
}

/// With release at the body's end, the lock is kept alive while the body streams, past its
/// ttl (the handler itself returned at once).
#[tokio::test(flavor = "multi_thread")]
async fn keep_alive_holds_the_key_while_a_long_body_streams() {
    const TTL: Duration = Duration::from_millis(300);
    const KEY: &str = "report-2";
    let m = Masters::start(3);
    // The harness's client: its 200 ms node timeout fits in the 300 ms ttl.
    let redlock = m.client();
    warm_up(&redlock, &m).await;
    let policy = LockPolicy::builder(redlock, IdempotencyKey::required())
        .ttl(TTL)
        .release_on_body_end()
        .build()
        .expect("a valid policy");
    let (bodies_tx, mut bodies) = mpsc::unbounded_channel();
    let app = HttpApp::serve(streaming_app(RedlockLayer::with_policy(policy), bodies_tx)).await;
    let (http, url, key) = (http_client(), app.url(PATH), redis_key(KEY));

    let mut first = send(http.post(&url).header(IDEMPOTENCY_KEY, KEY)).await;
    assert_eq!(first.status(), 200);
    let body = within("the handler", bodies.recv()).await.expect("a body");
    stream_through(&body, &mut first, "first").await;
    // Let the original ttl run out twice over: the passing of time is what is tested here.
    tokio::time::sleep(2 * TTL).await;
    stream_through(&body, &mut first, "second").await;
    assert!(held_on(&m, &key).await >= 2, "still held past its ttl");
    assert_conflict(&post_key(&http, &url, KEY).await, TTL);

    drop(body);
    assert_eq!(rest_of(first).await, b"");
    assert_released(&m, &key).await;
}

/// A handler that finishes before ttl/3 costs no keep-alive task: none is alive while it runs,
/// though it yields (so the response future is pending and its timer armed). Handlers that
/// outlive ttl/3 are kept alive (the tests above).
#[tokio::test(flavor = "current_thread")]
async fn quick_handlers_spawn_no_keep_alive_task() {
    let app = Router::new()
        .route(
            PATH,
            post(|lease: LeaseHandle| async move {
                tokio::task::yield_now().await;
                let alive = tokio::runtime::Handle::current()
                    .metrics()
                    .num_alive_tasks();
                Json(json!({ "alive": alive, "lost": lease.is_lost() }))
            }),
        )
        .layer(RedlockLayer::new(Redlock::in_memory(), IdempotencyKey::required()).unwrap());
    for i in 0..3 {
        let response = within(
            "the response",
            app.clone().oneshot(request(&format!("k-{i}"))),
        )
        .await
        .expect("infallible");
        assert_eq!(response.status(), 200);
        let body = response.into_body().collect().await.expect("a body");
        let v: Value = serde_json::from_slice(&body.to_bytes()).expect("json");
        assert_eq!(v, json!({ "alive": 0, "lost": false }));
    }
}

/// A body of known length: a server stops polling once it has the last byte, so with
/// release at body end the release must be done before the last frame is handed over —
/// and an empty body, which is never polled, is released before the response.
#[tokio::test(flavor = "multi_thread")]
async fn lifecycle_with_release_on_body_end_and_sized_bodies() {
    const KEY: &str = "sized-1";
    let (masters, redlock) = masters_and_client().await;
    let policy = LockPolicy::builder(redlock, IdempotencyKey::required())
        .release_on_body_end()
        .build()
        .expect("a valid policy");
    let key = redis_key(KEY);

    let sized = RedlockLayer::with_policy(policy.clone()).layer(tower::service_fn(
        |_req: Request<Empty<Bytes>>| async {
            Ok::<_, Infallible>(Response::new(http_body_util::Full::new(
                Bytes::from_static(b"done"),
            )))
        },
    ));
    let response = within("the response", sized.oneshot(request(KEY)))
        .await
        .expect("infallible");
    let mut body = response.into_body();
    assert!(body.holds_lock());
    assert_held(&masters, &key).await;
    let frame = within("the only frame", body.frame()).await;
    assert_eq!(
        frame.expect("a frame").expect("no error").into_data().ok(),
        Some(Bytes::from_static(b"done"))
    );
    // Released before the last (only) frame was handed over.
    assert!(!body.holds_lock());
    assert!(http_body::Body::is_end_stream(&body));
    assert!(
        held_on(&masters, &key).await < 2,
        "the last frame came before the release"
    );

    let empty = RedlockLayer::with_policy(policy).layer(tower::service_fn(
        |_req: Request<Empty<Bytes>>| async {
            Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
        },
    ));
    let response = within("the response", empty.oneshot(request(KEY)))
        .await
        .expect("infallible");
    assert!(
        !response.body().holds_lock(),
        "an empty body is released with the response"
    );
    assert!(held_on(&masters, &key).await < 2);
}
