#![cfg(all(feature = "actix", feature = "axum"))]
//! `RedlockMiddleware` in real actix-web servers on loopback ports, against real Redis
//! masters, driven by a reqwest client: exclusion across two app instances, concurrency
//! across keys, waiting, fail-closed and fail-open, bad keys, release at the response or at
//! the body's end, cancelled requests, the lease in the handler — and actix-web next to axum:
//! the same route and `Idempotency-Key` take the same lock in both frameworks, and both answer
//! rejections with the same bytes.
//!
//! No sleep synchronizes anything: handlers block on a gate the test opens once it has seen
//! what it needs, and every wait is bounded.

use tower_redlock_testkit as support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::dev::ServerHandle;
use actix_web::{web, App, HttpMessage, HttpRequest, HttpResponse, HttpServer};
use bytes::Bytes;
use serde_json::{json, Value};
use tokio::sync::{mpsc, watch, Semaphore};

use support::apps::*;
use support::http::{http_client, send, within, Reply, DEADLINE};
use support::{eventually, is_token, warm_up, HttpApp, Masters};
use tower_redlock::http::{
    IdempotencyKey, KeyExtractor, KeyExtractorExt, LockPolicy, LockPolicyBuilder, SimpleRequest,
    Unlocked, DEFAULT_TTL,
};
use tower_redlock::RedlockLayer;
use tower_redlock::RedlockMiddleware;
use tower_redlock::{LeaseHandle, Redlock};

// --- the handlers' side ------------------------------------------------------------------------

/// What the handlers report — how many started, how many run at once, how many finished —
/// and the gate that holds them inside their critical section until the test lets them out.
/// One probe may be shared by several apps, actix-web and axum alike.
struct Probe {
    started: watch::Sender<usize>,
    inside: AtomicUsize,
    max_inside: AtomicUsize,
    completed: AtomicUsize,
    /// Closed: every handler passes. Otherwise each permit lets one handler out.
    gate: Semaphore,
}

impl Probe {
    /// A probe with the gate shut.
    fn new() -> Arc<Self> {
        Arc::new(Self {
            started: watch::Sender::new(0),
            inside: AtomicUsize::new(0),
            max_inside: AtomicUsize::new(0),
            completed: AtomicUsize::new(0),
            gate: Semaphore::new(0),
        })
    }

    /// A probe whose handlers pass straight through.
    fn open_gate() -> Arc<Self> {
        let probe = Self::new();
        probe.open();
        probe
    }

    /// The critical section of a handler: enter, wait at the gate, leave. A handler dropped
    /// at the gate (its request was cancelled) leaves without completing.
    async fn pass(&self) {
        struct Inside<'a>(&'a Probe);
        impl Drop for Inside<'_> {
            fn drop(&mut self) {
                self.0.inside.fetch_sub(1, SeqCst);
            }
        }
        let now = self.inside.fetch_add(1, SeqCst) + 1;
        let inside = Inside(self);
        self.max_inside.fetch_max(now, SeqCst);
        self.started.send_modify(|n| *n += 1);
        if let Ok(permit) = self.gate.acquire().await {
            permit.forget();
        }
        drop(inside);
        self.completed.fetch_add(1, SeqCst);
    }

    /// Lets every handler, waiting or to come, through.
    fn open(&self) {
        self.gate.close();
    }

    /// Lets one handler through.
    fn let_one_out(&self) {
        self.gate.add_permits(1);
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

    fn inside(&self) -> usize {
        self.inside.load(SeqCst)
    }

    fn max_inside(&self) -> usize {
        self.max_inside.load(SeqCst)
    }

    fn completed(&self) -> usize {
        self.completed.load(SeqCst)
    }
}

/// What a handler saw of the lock, as JSON.
fn report(lease: Option<&LeaseHandle>, unlocked: bool) -> Value {
    json!({
        "locked": lease.is_some(),
        "unlocked": unlocked,
        "resource": lease.map(|l| l.resource().to_owned()),
        "validity_ms": lease.map(|l| l.validity().as_millis() as u64),
        "lost": lease.map(LeaseHandle::is_lost),
        "extensions": lease.map(LeaseHandle::extensions),
    })
}

/// The actix-web handler of most tests: the lease through the extractor (`None` without a
/// lock), the fail-open marker through the extensions, then [`Probe::pass`].
async fn actix_gated(
    probe: web::Data<Probe>,
    lease: Option<LeaseHandle>,
    req: HttpRequest,
) -> HttpResponse {
    let unlocked = req.extensions().get::<Unlocked>().is_some();
    probe.pass().await;
    HttpResponse::Ok()
        .content_type("application/json")
        .body(report(lease.as_ref(), unlocked).to_string())
}

/// The same handler on axum.
async fn axum_gated(
    axum::Extension(probe): axum::Extension<Arc<Probe>>,
    lease: Option<LeaseHandle>,
    unlocked: Option<axum::Extension<Unlocked>>,
) -> axum::Json<Value> {
    probe.pass().await;
    axum::Json(report(lease.as_ref(), unlocked.is_some()))
}

/// Adds `POST route` → [`actix_gated`] behind a [`RedlockMiddleware`] with `policy`.
fn add_gated(cfg: &mut web::ServiceConfig, route: &str, policy: &LockPolicy) {
    cfg.service(
        web::resource(route)
            .wrap(RedlockMiddleware::with_policy(policy.clone()))
            .route(web::post().to(actix_gated)),
    );
}

/// An actix-web app serving `POST` on each of `routes` → [`actix_gated`], each behind its
/// policy.
fn actix_gated_app(probe: &Arc<Probe>, routes: &[(&'static str, LockPolicy)]) -> ActixApp {
    let probe = web::Data::from(probe.clone());
    let routes = routes.to_vec();
    ActixApp::serve(move |cfg| {
        cfg.app_data(probe.clone());
        for (route, policy) in &routes {
            add_gated(cfg, route, policy);
        }
    })
}

/// The axum twin of [`actix_gated_app`]: the layer on each route, so it sees the matched
/// route.
async fn axum_gated_app(probe: &Arc<Probe>, routes: &[(&'static str, LockPolicy)]) -> HttpApp {
    let mut router = axum::Router::new();
    for (route, policy) in routes {
        let one = axum::Router::new()
            .route(route, axum::routing::post(axum_gated))
            .layer(RedlockLayer::with_policy(policy.clone()));
        router = router.merge(one);
    }
    HttpApp::serve(router.layer(axum::Extension(probe.clone()))).await
}

// --- the servers -------------------------------------------------------------------------------

/// An actix-web server with one worker on `127.0.0.1:0`, run on the test's Tokio runtime
/// (its worker gets a thread and a runtime of its own). Stopped by [`ActixApp::stop`], or at
/// once when dropped (a failed test).
struct ActixApp {
    addr: SocketAddr,
    handle: ServerHandle,
    server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl ActixApp {
    /// Serves `App::new().configure(configure)`.
    fn serve<F>(configure: F) -> Self
    where
        F: Fn(&mut web::ServiceConfig) + Clone + Send + 'static,
    {
        Self::serve_with(configure, true)
    }

    /// Serves `App::new().configure(configure)`; `half_closed` is actix-web's
    /// `h1_allow_half_closed` (default `true`: a client that closes its side of the connection
    /// does not cancel the request in progress).
    fn serve_with<F>(configure: F, half_closed: bool) -> Self
    where
        F: Fn(&mut web::ServiceConfig) + Clone + Send + 'static,
    {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let server = HttpServer::new(move || App::new().configure(configure.clone()))
            .workers(1)
            .disable_signals()
            .shutdown_timeout(5)
            .h1_allow_half_closed(half_closed)
            .listen(listener)
            .expect("listen on the bound socket")
            .run();
        let handle = server.handle();
        Self {
            addr,
            handle,
            server: Some(tokio::spawn(server)),
        }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// Stops the server gracefully and waits until it has stopped.
    async fn stop(mut self) {
        self.handle.stop(true).await;
        if let Some(server) = self.server.take() {
            within("the actix-web server to stop", server)
                .await
                .expect("the server task")
                .expect("the server");
        }
    }
}

impl Drop for ActixApp {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            // Sends the command at once; the server task carries it out.
            drop(self.handle.stop(false));
            drop(server);
        }
    }
}

// --- the client's side -------------------------------------------------------------------------

/// Sends bursts of `n` concurrent same-key requests over `urls` (handlers gated by `probe`)
/// until one request holds the lock at the gate while the `n - 1` others were answered `409`.
/// A burst whose first racers split the masters' votes three ways has no winner (Redlock's
/// split vote: everyone backs off and gives back what it took); it is rare, and another burst
/// is sent, a bounded number of times. Returns the receiver that gets the winner's reply.
async fn burst_until_one_holds(
    http: &reqwest::Client,
    urls: &[String],
    key: &str,
    n: usize,
    probe: &Probe,
    masters: &Masters,
) -> mpsc::UnboundedReceiver<Reply> {
    const MAX_BURSTS: usize = 5;
    let mut split_votes = 0;
    loop {
        let mut replies = burst(http, urls, key, n);
        for _ in 0..n - 1 {
            assert_conflict(&next_reply(&mut replies).await, DEFAULT_TTL);
        }
        tokio::select! {
            () = probe.until_started(1) => {
                if split_votes > 0 {
                    eprintln!("{split_votes} burst(s) without a winner (split votes)");
                }
                return replies;
            }
            last = next_reply(&mut replies) => {
                assert_conflict(&last, DEFAULT_TTL);
                assert_eq!(probe.started(), 0, "a handler ran, yet its request got a 409");
                split_votes += 1;
                assert!(split_votes < MAX_BURSTS, "{split_votes} bursts without a winner");
                assert_all_empty(masters).await;
            }
        }
    }
}

// --- Redis's side ------------------------------------------------------------------------------

/// The key extractor of every app here: `Idempotency-Key`, scoped by the matched route.
fn extractor() -> impl KeyExtractor + Clone {
    IdempotencyKey::required().scoped_by_route()
}

/// A policy builder with [`extractor`].
fn policy_of(redlock: &Redlock) -> LockPolicyBuilder {
    LockPolicy::builder(redlock.clone(), extractor())
}

/// The default policy with [`extractor`].
fn default_policy(redlock: &Redlock) -> LockPolicy {
    policy_of(redlock).build().expect("a valid policy")
}

/// The Redis key the middleware locks for `POST path` matched by `route` with
/// `Idempotency-Key: key` (default prefix; the test clients add no key prefix).
fn redis_key(route: &str, path: &str, key: &str) -> String {
    let req = SimpleRequest::new("POST", path)
        .route(route)
        .header(IDEMPOTENCY_KEY, key);
    extractor()
        .extract(&req)
        .expect("a valid key")
        .expect("a key")
        .into_string()
}

// --- 1. two instances, one key ---------------------------------------------------------------

/// 50 concurrent requests with one key over two actix-web instances, each with its own client
/// of the same three masters: exactly one runs, the 49 others get a 409 with `Retry-After`,
/// and the key is gone from every master once the winner answered.
#[tokio::test(flavor = "multi_thread")]
async fn one_key_across_two_instances_runs_exactly_once() {
    const REQUESTS: usize = 50;
    const KEY: &str = "\"payment-7\"";
    let m = Masters::start(3);
    let probe = Probe::new();
    let mut apps = Vec::new();
    for _ in 0..2 {
        let policy = default_policy(&client_of(&m).await);
        apps.push(actix_gated_app(&probe, &[(PATH, policy)]));
    }
    let urls = [apps[0].url(PATH), apps[1].url(PATH)];
    let http = http_client();

    let mut replies = burst_until_one_holds(&http, &urls, KEY, REQUESTS, &probe, &m).await;
    assert_eq!(probe.started(), 1, "exactly one request got the lock");
    assert_held_on_quorum(&m, &redis_key(PATH, PATH, KEY)).await;

    probe.open();
    let v = next_reply(&mut replies).await.ok();
    assert_eq!(v["locked"], true, "{v}");
    assert_eq!(v["resource"], redis_key(PATH, PATH, KEY), "{v}");
    assert_eq!(probe.max_inside(), 1, "two handlers overlapped");
    assert_eq!((probe.started(), probe.completed()), (1, 1));
    assert_all_empty(&m).await;
    drop(http);
    for app in apps {
        app.stop().await;
    }
}

// --- 2. different keys ------------------------------------------------------------------------

/// Requests with different keys hold their locks at the same time.
#[tokio::test(flavor = "multi_thread")]
async fn different_keys_run_concurrently() {
    const REQUESTS: usize = 6;
    let (m, redlock) = masters_and_client().await;
    let probe = Probe::new();
    let app = actix_gated_app(&probe, &[(PATH, default_policy(&redlock))]);
    let http = http_client();

    let requests: Vec<_> = (0..REQUESTS)
        .map(|i| tokio::spawn(post_key(&http, &app.url(PATH), &format!("order-{i}"))))
        .collect();
    // Only if the middleware lets them all in at once do all of them reach the gate.
    probe.until_started(REQUESTS).await;
    assert_eq!(probe.inside(), REQUESTS);
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
    assert_eq!(probe.max_inside(), REQUESTS);
    assert_all_empty(&m).await;
    drop(http);
    app.stop().await;
}

// --- 3. waiting -------------------------------------------------------------------------------

/// With waiting on, same-key requests all succeed, one at a time: the test lets each holder out
/// only once it is alone inside, and the next waiter takes over.
#[tokio::test(flavor = "multi_thread")]
async fn waiting_requests_take_turns() {
    const REQUESTS: usize = 5;
    const KEY: &str = "order-1";
    let (m, redlock) = masters_and_client().await;
    let policy = policy_of(&redlock)
        .wait(DEADLINE)
        .build()
        .expect("a valid policy");
    let probe = Probe::new();
    let app = actix_gated_app(&probe, &[(PATH, policy)]);
    let http = http_client();

    let requests: Vec<_> = (0..REQUESTS)
        .map(|_| tokio::spawn(post_key(&http, &app.url(PATH), KEY)))
        .collect();
    for turn in 1..=REQUESTS {
        probe.until_started(turn).await;
        assert_eq!(probe.inside(), 1, "turn {turn}: not alone inside");
        assert_eq!(probe.completed(), turn - 1);
        probe.let_one_out();
    }
    for request in requests {
        let v = within("a response", request).await.expect("no panic").ok();
        assert_eq!(v["locked"], true, "{v}");
    }
    assert_eq!(probe.max_inside(), 1, "two waiters overlapped");
    assert_eq!((probe.started(), probe.completed()), (REQUESTS, REQUESTS));
    assert_all_empty(&m).await;
    drop(http);
    app.stop().await;
}

/// A waiter whose deadline passes while the holder is still inside gets a 409 — after waiting
/// (not at once), and not much later than its deadline.
#[tokio::test(flavor = "multi_thread")]
async fn waiting_gives_up_at_its_deadline() {
    const MAX_WAIT: Duration = Duration::from_secs(2);
    /// What a loaded machine may add after the deadline.
    const SLACK: Duration = Duration::from_secs(5);
    const KEY: &str = "order-2";
    let (m, redlock) = masters_and_client().await;
    let policy = policy_of(&redlock)
        .wait(MAX_WAIT)
        .build()
        .expect("a valid policy");
    let probe = Probe::new();
    let app = actix_gated_app(&probe, &[(PATH, policy)]);
    let http = http_client();

    let holder = tokio::spawn(post_key(&http, &app.url(PATH), KEY));
    probe.until_started(1).await;
    let started = Instant::now();
    let waiter = post_key(&http, &app.url(PATH), KEY).await;
    let waited = started.elapsed();
    // Retries stop early when the next pause (50 ms plus up to 25 ms of jitter) and one more
    // try (up to two node timeouts) would overrun the deadline.
    let early = HTTP_NODE_TIMEOUT * 2 + Duration::from_millis(75);
    assert_conflict(&waiter, DEFAULT_TTL);
    assert!(
        waited >= MAX_WAIT - early,
        "a 409 after {waited:?}: it did not wait (max wait {MAX_WAIT:?})"
    );
    assert!(
        waited <= MAX_WAIT + SLACK,
        "a 409 after {waited:?}, long after the max wait of {MAX_WAIT:?}"
    );
    assert_eq!(probe.started(), 1, "the waiter's handler ran");

    probe.open();
    let v = within("the holder", holder).await.expect("no panic").ok();
    assert_eq!(v["locked"], true, "{v}");
    assert_all_empty(&m).await;
    drop(http);
    app.stop().await;
}

// --- 4. quorum unreachable --------------------------------------------------------------------

/// With two of three masters down: a fail-closed route answers 503 with `Retry-After` and never
/// runs the handler; a fail-open route runs it without a lock, marked `Unlocked`, and the
/// `Option<LeaseHandle>` extractor gives `None`.
#[tokio::test(flavor = "multi_thread")]
async fn majority_down_fails_closed_or_runs_unlocked() {
    const KEY: &str = "order-3";
    let (m, redlock) = masters_and_client().await;
    m[1].stop();
    m[2].stop();
    let closed = default_policy(&redlock);
    let open = policy_of(&redlock)
        .fail_open()
        .build()
        .expect("a valid policy");
    let probe = Probe::open_gate();
    let app = actix_gated_app(&probe, &[("/closed", closed), ("/open", open)]);
    let http = http_client();

    let reply = post_key(&http, &app.url("/closed"), KEY).await;
    let v = assert_problem(&reply, 503, "/problems/lock-unavailable");
    assert_eq!(reply.retry_after(), 1);
    assert_eq!(v["retry_after"], 1, "{v}");
    assert_eq!(probe.started(), 0, "the fail-closed handler ran");

    let v = post_key(&http, &app.url("/open"), KEY).await.ok();
    assert_eq!(probe.completed(), 1);
    assert_eq!(v["unlocked"], true, "no Unlocked marker: {v}");
    assert_eq!(v["locked"], false, "a lease without a quorum: {v}");
    // The failed tries gave back what they took on the one master that answers.
    eventually("the running master is empty", RELEASED_WITHIN, || async {
        m[0].dbsize().await == 0
    })
    .await;
    drop(http);
    app.stop().await;
}

// --- 5. bad keys ------------------------------------------------------------------------------

/// The malformed keys every framework must reject with 400, with the problem type each gets:
/// (what, the `Idempotency-Key` header lines, problem type).
fn bad_keys() -> Vec<(&'static str, Vec<String>, &'static str)> {
    vec![
        ("missing", vec![], "/problems/lock-key-missing"),
        ("empty", vec![String::new()], "/problems/lock-key-empty"),
        (
            "empty quoted",
            vec!["\"\"".into()],
            "/problems/lock-key-empty",
        ),
        (
            "256 characters",
            vec!["a".repeat(256)],
            "/problems/lock-key-too-long",
        ),
        (
            "256 characters, quoted",
            vec![format!("\"{}\"", "a".repeat(256))],
            "/problems/lock-key-too-long",
        ),
        (
            "unterminated quote",
            vec!["\"abc".into()],
            "/problems/lock-key-malformed",
        ),
        (
            "bare with a space",
            vec!["a b".into()],
            "/problems/lock-key-malformed",
        ),
        (
            "twice",
            vec!["order-1".into(), "order-2".into()],
            "/problems/lock-key-duplicate",
        ),
    ]
}

/// Bad keys get a 400 problem+json without `Retry-After`, before any lock is taken or the
/// handler runs.
#[tokio::test(flavor = "multi_thread")]
async fn bad_keys_are_rejected_before_locking() {
    let (m, redlock) = masters_and_client().await;
    let probe = Probe::open_gate();
    let app = actix_gated_app(&probe, &[(PATH, default_policy(&redlock))]);
    let http = http_client();

    for (what, keys, problem) in bad_keys() {
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let reply = Reply::read(send(post_with(&http, &app.url(PATH), &keys)).await).await;
        let v = assert_problem(&reply, 400, problem);
        assert_eq!(reply.header("retry-after"), None, "{what}");
        assert_eq!(v.get("retry_after"), None, "{what}: {v}");
        if let Some(raw) = keys.first().filter(|k| k.len() > 3) {
            assert!(
                !reply.text().contains(*raw),
                "{what}: the raw key is echoed"
            );
        }
    }
    assert_eq!(probe.started(), 0, "a handler ran for a bad key");
    assert_eq!(m.dbsizes().await, vec![0; 3], "a bad key reached Redis");

    // The same route with a good key works.
    assert_eq!(
        post_key(&http, &app.url(PATH), "ok").await.ok()["locked"],
        true
    );
    assert_all_empty(&m).await;
    drop(http);
    app.stop().await;
}

// --- 6. release at the body's end ---------------------------------------------------------------

/// Where the streaming handler takes its response body from: the receiving end of a channel
/// the test writes; without one it answers a fixed body.
#[derive(Default)]
struct Bodies(Mutex<Option<mpsc::Receiver<Bytes>>>);

impl Bodies {
    /// The writing end of the next streamed body: each `Bytes` is a chunk, dropping it ends
    /// the body.
    fn next(&self) -> mpsc::Sender<Bytes> {
        let (tx, rx) = mpsc::channel(1);
        *self.0.lock().unwrap() = Some(rx);
        tx
    }

    fn take(&self) -> Option<mpsc::Receiver<Bytes>> {
        self.0.lock().unwrap().take()
    }
}

async fn actix_streaming(bodies: web::Data<Bodies>) -> HttpResponse {
    match bodies.take() {
        Some(rx) => {
            HttpResponse::Ok().streaming(futures_util::stream::unfold(rx, |mut rx| async move {
                let chunk = rx.recv().await?;
                Some((Ok::<_, Infallible>(chunk), rx))
            }))
        }
        None => HttpResponse::Ok().body("not streamed"),
    }
}

/// `POST /payments` → [`actix_streaming`] behind `policy`.
fn streaming_app(policy: LockPolicy) -> (ActixApp, Arc<Bodies>) {
    let bodies = Arc::new(Bodies::default());
    let data = web::Data::from(bodies.clone());
    let app = ActixApp::serve(move |cfg| {
        cfg.app_data(data.clone()).service(
            web::resource(PATH)
                .wrap(RedlockMiddleware::with_policy(policy.clone()))
                .route(web::post().to(actix_streaming)),
        );
    });
    (app, bodies)
}

/// Sends `chunk` through the handler's body and reads it on the client's side.
async fn stream_through(body: &mpsc::Sender<Bytes>, response: &mut reqwest::Response, chunk: &str) {
    body.send(Bytes::copy_from_slice(chunk.as_bytes()))
        .await
        .expect("the body is streaming");
    let got = within("a chunk", response.chunk())
        .await
        .expect("the body is read")
        .expect("a chunk, not the end");
    assert_eq!(got, chunk.as_bytes());
}

/// Reads the rest of a body, whose writing end was dropped.
async fn read_to_end(response: &mut reqwest::Response) {
    let rest = within("the end of the body", response.chunk())
        .await
        .expect("the body ends cleanly");
    assert_eq!(rest, None, "more than the test sent");
}

/// With `release_on_body_end`, a streaming response holds the key until its last chunk has
/// been sent: meanwhile the same key gets a 409; after the end the key is gone and the same
/// key gets a 200.
#[tokio::test(flavor = "multi_thread")]
async fn release_on_body_end_holds_the_key_while_the_body_streams() {
    const KEY: &str = "stream-1";
    let (m, redlock) = masters_and_client().await;
    let (app, bodies) = streaming_app(
        policy_of(&redlock)
            .release_on_body_end()
            .build()
            .expect("a valid policy"),
    );
    let http = http_client();
    let key = redis_key(PATH, PATH, KEY);

    let body = bodies.next();
    let request = post_with(&http, &app.url(PATH), &[KEY]);
    let mut response = send(request).await;
    assert_eq!(response.status(), 200);
    stream_through(&body, &mut response, "first ").await;
    assert_held(&m, &key).await;
    assert_conflict(&post_key(&http, &app.url(PATH), KEY).await, DEFAULT_TTL);
    stream_through(&body, &mut response, "second").await;
    assert_held(&m, &key).await;

    drop(body);
    read_to_end(&mut response).await;
    // The end of the body is reported once the release has returned.
    assert_released_on_quorum(&m, &key).await;
    assert_released(&m, &key).await;
    let after = post_key(&http, &app.url(PATH), KEY).await;
    assert_eq!((after.status, after.text().as_str()), (200, "not streamed"));
    assert_all_empty(&m).await;
    drop(http);
    app.stop().await;
}

/// With the default (release at the response), the key is gone as soon as the response head
/// arrives, though its body still streams: the same key then gets a 200.
#[tokio::test(flavor = "multi_thread")]
async fn release_on_response_frees_the_key_while_the_body_streams() {
    const KEY: &str = "stream-2";
    let (m, redlock) = masters_and_client().await;
    let (app, bodies) = streaming_app(default_policy(&redlock));
    let http = http_client();
    let key = redis_key(PATH, PATH, KEY);

    let body = bodies.next();
    let mut response = send(post_with(&http, &app.url(PATH), &[KEY])).await;
    assert_eq!(response.status(), 200);
    // The middleware released before it handed the response on: no waiting for a quorum
    // (the last master may follow in the background).
    assert_released_on_quorum(&m, &key).await;
    assert_released(&m, &key).await;
    stream_through(&body, &mut response, "first ").await;
    let again = post_key(&http, &app.url(PATH), KEY).await;
    assert_eq!((again.status, again.text().as_str()), (200, "not streamed"));
    stream_through(&body, &mut response, "second").await;
    drop(body);
    read_to_end(&mut response).await;
    assert_all_empty(&m).await;
    drop(http);
    app.stop().await;
}

/// A client of `masters` with a node timeout short enough for the short ttls of the
/// keep-alive tests.
async fn quick_client_of(masters: &Masters) -> Redlock {
    let redlock = masters
        .builder()
        .node_timeout(Duration::from_millis(100))
        .build()
        .expect("a valid client");
    warm_up(&redlock, masters).await;
    redlock
}

/// The keep-alive ttl: the tests let it run out twice over.
const SHORT_TTL: Duration = Duration::from_millis(400);

/// A handler running past its lock's ttl keeps the lock: it is extended (from ttl/3 on), the
/// same key is refused meanwhile, and the handler's lease is valid at its end.
#[tokio::test(flavor = "multi_thread")]
async fn keep_alive_holds_the_key_past_its_ttl() {
    const KEY: &str = "order-9";
    let m = Masters::start(3);
    let redlock = quick_client_of(&m).await;
    let probe = Probe::new();
    let policy = policy_of(&redlock)
        .ttl(SHORT_TTL)
        .build()
        .expect("a valid policy");
    let app = actix_gated_app(&probe, &[(PATH, policy)]);
    let (http, url, key) = (http_client(), app.url(PATH), redis_key(PATH, PATH, KEY));

    let holder = tokio::spawn(post_key(&http, &url, KEY));
    probe.until_started(1).await;
    // Let the original ttl run out twice over: the passing of time is what is tested here.
    tokio::time::sleep(2 * SHORT_TTL).await;
    assert_conflict(&post_key(&http, &url, KEY).await, SHORT_TTL);
    assert!(held_on(&m, &key).await >= 2, "still held past its ttl");

    probe.open();
    let v = within("the holder", holder).await.expect("no panic").ok();
    assert_eq!(v["lost"], false, "the lease was kept: {v}");
    assert!(v["extensions"].as_u64().expect("extensions") >= 1, "{v}");
    assert!(v["validity_ms"].as_u64().expect("a validity") > 0, "{v}");
    assert_eq!(probe.started(), 1);
    assert_released(&m, &key).await;
    drop(http);
    app.stop().await;
}

/// With release at the body's end, the lock is kept alive while the body streams past its
/// ttl (the handler itself returned at once).
#[tokio::test(flavor = "multi_thread")]
async fn keep_alive_holds_the_key_while_a_long_body_streams() {
    const KEY: &str = "stream-3";
    let m = Masters::start(3);
    let redlock = quick_client_of(&m).await;
    let (app, bodies) = streaming_app(
        policy_of(&redlock)
            .ttl(SHORT_TTL)
            .release_on_body_end()
            .build()
            .expect("a valid policy"),
    );
    let http = http_client();
    let key = redis_key(PATH, PATH, KEY);

    let body = bodies.next();
    let mut response = send(post_with(&http, &app.url(PATH), &[KEY])).await;
    assert_eq!(response.status(), 200);
    stream_through(&body, &mut response, "first ").await;
    // Let the original ttl run out twice over: the passing of time is what is tested here.
    tokio::time::sleep(2 * SHORT_TTL).await;
    stream_through(&body, &mut response, "second").await;
    assert!(held_on(&m, &key).await >= 2, "still held past its ttl");
    assert_conflict(&post_key(&http, &app.url(PATH), KEY).await, SHORT_TTL);

    drop(body);
    read_to_end(&mut response).await;
    assert_released(&m, &key).await;
    drop(http);
    app.stop().await;
}

// --- 7. cancelled requests --------------------------------------------------------------------

/// A client that gives up while the handler holds the lock: actix-web drops the handler (with
/// `h1_allow_half_closed(false)`, so the client's closing cancels the request), and the lock is
/// released in the background — long before its 30 s ttl — so the same key gets a 200.
#[tokio::test(flavor = "multi_thread")]
async fn cancelled_request_releases_in_the_background() {
    const KEY: &str = "order-4";
    let (m, redlock) = masters_and_client().await;
    let probe = Probe::new();
    let data = web::Data::from(probe.clone());
    let policy = default_policy(&redlock);
    let app = ActixApp::serve_with(
        move |cfg| {
            cfg.app_data(data.clone());
            add_gated(cfg, PATH, &policy);
        },
        false,
    );
    let http = http_client();
    let key = redis_key(PATH, PATH, KEY);

    // The client gives up once the handler holds the lock (dropping the request future
    // closes its connection).
    let request = tokio::spawn(post_with(&http, &app.url(PATH), &[KEY]).send());
    probe.until_started(1).await;
    assert_held(&m, &key).await;
    request.abort();
    assert!(within("the aborted request", request)
        .await
        .unwrap_err()
        .is_cancelled());

    eventually("the handler is dropped", RELEASED_WITHIN, || async {
        probe.inside() == 0
    })
    .await;
    let started = Instant::now();
    assert_released(&m, &key).await;
    eprintln!(
        "released {:?} after the handler was dropped",
        started.elapsed()
    );
    assert_eq!(probe.completed(), 0, "the cancelled handler ran to its end");

    probe.open();
    let v = post_key(&http, &app.url(PATH), KEY).await.ok();
    assert_eq!(v["locked"], true, "{v}");
    assert_all_empty(&m).await;
    drop(http);
    app.stop().await;
}

// --- 8. the lease in the handler ----------------------------------------------------------------

/// The `LeaseHandle` extractor gives the handler its lock: its resource is the hashed,
/// `tower-redlock:`-prefixed key the masters hold (scoped by the route *pattern*, so another
/// path of the same route contends for it), never the raw key, and it is valid.
#[tokio::test(flavor = "multi_thread")]
async fn the_handler_sees_its_lease() {
    const ROUTE: &str = "/orders/{id}";
    const KEY: &str = "\"lease-key-0123456789\"";
    const RAW: &str = "lease-key-0123456789";
    let (m, redlock) = masters_and_client().await;
    let probe = Probe::new();
    let app = actix_gated_app(&probe, &[(ROUTE, default_policy(&redlock))]);
    let http = http_client();
    let key = redis_key(ROUTE, "/orders/7", KEY);
    assert!(
        key.starts_with("tower-redlock:") && !key.contains(RAW),
        "{key}"
    );

    let request = tokio::spawn(post_key(&http, &app.url("/orders/7"), KEY));
    probe.until_started(1).await;
    assert_held(&m, &key).await;
    let other_path = post_key(&http, &app.url("/orders/8"), KEY).await;
    assert_conflict(&other_path, DEFAULT_TTL);

    probe.open();
    let v = within("the response", request)
        .await
        .expect("no panic")
        .ok();
    assert_eq!(v["locked"], true, "{v}");
    assert_eq!(v["resource"], key.as_str(), "{v}");
    let resource = v["resource"].as_str().expect("a resource");
    let digest = resource.strip_prefix("tower-redlock:").expect("the prefix");
    assert!(is_token(digest), "{resource}: not 32 lowercase hex digits");
    assert!(!resource.contains(RAW), "{resource}");
    let validity = v["validity_ms"].as_u64().expect("a validity");
    assert!(
        validity > 0 && validity <= DEFAULT_TTL.as_millis() as u64,
        "{v}"
    );
    assert_all_empty(&m).await;
    drop(http);
    app.stop().await;
}

// --- 9. actix-web and axum on the same masters ----------------------------------------------------

/// An axum app and an actix-web app serving `POST route`, each with its own client of
/// `masters` and the same extractor (`Idempotency-Key` scoped by route); 48 concurrent requests
/// with `key`, split over both (to `paths[0]` on axum, `paths[1]` on actix-web): exactly one
/// runs, the others get a 409, and no two handlers overlap.
async fn one_lock_for_both_frameworks(
    masters: &Masters,
    route: &'static str,
    paths: [&str; 2],
    key: &str,
) {
    const REQUESTS: usize = 48;
    let probe = Probe::new();
    let axum_policy = default_policy(&client_of(masters).await);
    let actix_policy = default_policy(&client_of(masters).await);
    let axum_app = axum_gated_app(&probe, &[(route, axum_policy)]).await;
    let actix_app = actix_gated_app(&probe, &[(route, actix_policy)]);
    let urls = [axum_app.url(paths[0]), actix_app.url(paths[1])];
    let http = http_client();
    let redis_key = redis_key(route, paths[0], key);

    let mut replies = burst_until_one_holds(&http, &urls, key, REQUESTS, &probe, masters).await;
    assert_eq!(
        probe.started(),
        1,
        "{route}: exactly one request got the lock"
    );
    assert_held_on_quorum(masters, &redis_key).await;

    probe.open();
    let v = next_reply(&mut replies).await.ok();
    assert_eq!(v["resource"], redis_key, "{v}");
    assert_eq!(
        probe.max_inside(),
        1,
        "{route}: an axum and an actix-web handler overlapped"
    );
    assert_eq!((probe.started(), probe.completed()), (1, 1));
    assert_all_empty(masters).await;
    drop(http);
    actix_app.stop().await;
}

/// axum and actix-web replicas on the same masters derive the same lock key for the same
/// route and `Idempotency-Key`: on a plain route, and on a route with a parameter (the same
/// pattern, requested on different paths).
#[tokio::test(flavor = "multi_thread")]
async fn axum_and_actix_take_the_same_lock() {
    let m = Masters::start(3);
    one_lock_for_both_frameworks(&m, PATH, [PATH, PATH], "\"payment-mixed-1\"").await;
    one_lock_for_both_frameworks(
        &m,
        "/orders/{id}",
        ["/orders/1", "/orders/2"],
        "\"payment-mixed-2\"",
    )
    .await;
}

// --- 10. the same answers from both frameworks ------------------------------------------------------

/// Sends the same request to both apps; returns (axum's reply, actix-web's reply).
async fn both(
    http: &reqwest::Client,
    axum_url: &str,
    actix_url: &str,
    keys: &[&str],
) -> (Reply, Reply) {
    let axum = Reply::read(send(post_with(http, axum_url, keys)).await).await;
    let actix = Reply::read(send(post_with(http, actix_url, keys)).await).await;
    (axum, actix)
}

/// Same status, `Content-Type` and `Retry-After`, and byte-identical bodies.
#[track_caller]
fn assert_same_answer(what: &str, axum: &Reply, actix: &Reply) {
    assert_eq!(axum.status, actix.status, "{what}");
    assert_eq!(
        axum.header("content-type"),
        actix.header("content-type"),
        "{what}"
    );
    assert_eq!(
        axum.header("retry-after"),
        actix.header("retry-after"),
        "{what}"
    );
    assert_eq!(
        axum.text(),
        actix.text(),
        "{what}: axum and actix-web bodies differ"
    );
}

/// The actix-web middleware and the axum layer answer the same situations alike: the same
/// status, `Content-Type`, `Retry-After` and byte-identical problem+json bodies for every bad
/// key (400) and an unreachable quorum (503); for a held key (409) the same body up to the
/// `Retry-After` seconds, which follow the holder's remaining ttl.
#[tokio::test(flavor = "multi_thread")]
async fn axum_and_actix_answer_alike() {
    const KEY: &str = "order-5";
    let (m, redlock) = masters_and_client().await;
    let dead = Masters::start(1);
    let unreachable = client_of(&dead).await;
    dead[0].stop();
    let routes = [
        (PATH, default_policy(&redlock)),
        ("/down", default_policy(&unreachable)),
    ];
    let probe = Probe::open_gate();
    let axum_app = axum_gated_app(&probe, &routes).await;
    let actix_app = actix_gated_app(&probe, &routes);
    let http = http_client();

    for (what, keys, problem) in bad_keys() {
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let (axum, actix) = both(&http, &axum_app.url(PATH), &actix_app.url(PATH), &keys).await;
        assert_problem(&axum, 400, problem);
        assert_same_answer(what, &axum, &actix);
    }

    let (axum, actix) = both(
        &http,
        &axum_app.url("/down"),
        &actix_app.url("/down"),
        &[KEY],
    )
    .await;
    assert_problem(&axum, 503, "/problems/lock-unavailable");
    assert_same_answer("quorum unreachable", &axum, &actix);

    // Another process holds the key both apps derive.
    let holder = redlock
        .try_lock(&redis_key(PATH, PATH, KEY), DEFAULT_TTL)
        .await
        .expect("the test takes the key");
    let (axum, actix) = both(&http, &axum_app.url(PATH), &actix_app.url(PATH), &[KEY]).await;
    assert_conflict(&axum, DEFAULT_TTL);
    assert_conflict(&actix, DEFAULT_TTL);
    // Each is the holder's remaining ttl, rounded up, when that request looked: at most a
    // second apart, and everything else is the same.
    let (a, b) = (axum.retry_after(), actix.retry_after());
    assert!(
        a.abs_diff(b) <= 1,
        "Retry-After {a} (axum) vs {b} (actix-web)"
    );
    let same_after = |reply: &Reply, after: u64| {
        reply
            .text()
            .replace(&format!("retry after {after} s"), "retry after N s")
            .replace(&format!("\"retry_after\":{after}"), "\"retry_after\":N")
    };
    assert_eq!(same_after(&axum, a), same_after(&actix, b));
    assert_eq!(probe.started(), 0, "a handler ran");

    holder.release().await.expect("release the test's lock");
    let (axum, actix) = both(&http, &axum_app.url(PATH), &actix_app.url(PATH), &[KEY]).await;
    assert_eq!(axum.ok()["resource"], actix.ok()["resource"]);
    assert_all_empty(&m).await;
    drop(http);
    actix_app.stop().await;
}
