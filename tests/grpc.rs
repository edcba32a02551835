//! gRPC answers with a real tonic server and client over real masters: `RedlockLayer` on
//! `tonic::transport::Server::builder().layer(..)`, keyed by the `idempotency-key` metadata and
//! scoped by the gRPC method. A held key is `ABORTED` with a retry hint, an unreachable quorum
//! `UNAVAILABLE`, a bad key `INVALID_ARGUMENT`; a plain HTTP request to the same layer still
//! gets problem+json; another service of the server (a health check) passes through unlocked
//! with a key extractor that gives it no key; replay on gRPC; and actix-web answers a gRPC
//! request as tower does. Every test name contains `grpc`.

use tower_redlock_testkit as support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use support::apps::{assert_held, assert_released, masters_and_client};
use support::http::within;
use tokio::sync::{Notify, Semaphore};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::codegen::{http, BoxFuture, Context, Poll, Service, StdError};
use tonic::metadata::MetadataValue;
use tonic::server::{NamedService, UnaryService};
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_prost::ProstCodec;
use tower_redlock::http::{
    key_fn, IdempotencyKey, KeyExtractor, KeyExtractorExt, LockPolicy, LockPolicyBuilder, Replay,
    SimpleRequest,
};
use tower_redlock::{LeaseHandle, Redlock, RedlockLayer};

const TTL: Duration = Duration::from_secs(10);
const PAY: &str = "/shop.Payments/Pay";
const REFUND: &str = "/shop.Payments/Refund";
const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";

#[derive(Clone, PartialEq, prost::Message)]
struct PayRequest {
    #[prost(uint64, tag = "1")]
    amount_cents: u64,
    /// Wait at the gate before answering.
    #[prost(bool, tag = "2")]
    hold: bool,
    /// Fail with this gRPC code (0: succeed).
    #[prost(int32, tag = "3")]
    fail: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
struct PayReply {
    #[prost(string, tag = "1")]
    payment_id: String,
}

/// `grpc.health.v1.HealthCheckRequest`.
#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckRequest {
    #[prost(string, tag = "1")]
    service: String,
}

/// `grpc.health.v1.HealthCheckResponse` (`status` 1: `SERVING`).
#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckResponse {
    #[prost(int32, tag = "1")]
    status: i32,
}

/// What the handlers did; held calls wait for a permit.
struct Gate {
    started: AtomicUsize,
    changed: Notify,
    release: Semaphore,
    /// Whether a `Pay` or `Refund` call ran holding a lease.
    call_locked: AtomicBool,
    /// Health checks answered, and whether one ran holding a lease.
    checks: AtomicUsize,
    check_locked: AtomicBool,
}

impl Gate {
    fn new() -> Self {
        Self {
            started: AtomicUsize::new(0),
            changed: Notify::new(),
            release: Semaphore::new(0),
            call_locked: AtomicBool::new(false),
            checks: AtomicUsize::new(0),
            check_locked: AtomicBool::new(false),
        }
    }

    /// Waits until `n` calls have started.
    async fn until_started(&self, n: usize) {
        within(format!("{n} started calls"), async {
            loop {
                let changed = self.changed.notified();
                if self.started.load(Ordering::SeqCst) >= n {
                    return;
                }
                changed.await;
            }
        })
        .await;
    }

    fn started(&self) -> usize {
        self.started.load(Ordering::SeqCst)
    }
}

/// `shop.Payments` with `Pay` and `Refund`, written as tonic's codegen would write it.
#[derive(Clone)]
struct PaymentsServer {
    gate: Arc<Gate>,
}

impl NamedService for PaymentsServer {
    const NAME: &'static str = "shop.Payments";
}

struct Handler(Arc<Gate>);

impl UnaryService<PayRequest> for Handler {
    type Response = PayReply;
    type Future = BoxFuture<tonic::Response<PayReply>, Status>;

    fn call(&mut self, request: tonic::Request<PayRequest>) -> Self::Future {
        let gate = Arc::clone(&self.0);
        Box::pin(async move {
            if request.extensions().get::<LeaseHandle>().is_some() {
                gate.call_locked.store(true, Ordering::SeqCst);
            }
            let n = gate.started.fetch_add(1, Ordering::SeqCst) + 1;
            gate.changed.notify_waiters();
            let req = request.into_inner();
            if req.hold {
                gate.release
                    .acquire()
                    .await
                    .expect("the gate is never closed")
                    .forget();
            }
            if req.fail != 0 {
                return Err(Status::new(Code::from_i32(req.fail), "the handler failed"));
            }
            Ok(tonic::Response::new(PayReply {
                payment_id: format!("pay_{}_{n}", req.amount_cents),
            }))
        })
    }
}

impl<B> Service<http::Request<B>> for PaymentsServer
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let gate = Arc::clone(&self.gate);
        match req.uri().path() {
            PAY | REFUND => Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(ProstCodec::default());
                Ok(grpc.unary(Handler(gate), req).await)
            }),
            _ => Box::pin(async { Ok(Status::unimplemented("no such method").into_http()) }),
        }
    }
}

/// `grpc.health.v1.Health` with `Check` only, by hand: it records whether it ran locked.
#[derive(Clone)]
struct HealthServer {
    gate: Arc<Gate>,
}

impl NamedService for HealthServer {
    const NAME: &'static str = "grpc.health.v1.Health";
}

struct Check(Arc<Gate>);

impl UnaryService<HealthCheckRequest> for Check {
    type Response = HealthCheckResponse;
    type Future = BoxFuture<tonic::Response<HealthCheckResponse>, Status>;

    fn call(&mut self, request: tonic::Request<HealthCheckRequest>) -> Self::Future {
        let gate = Arc::clone(&self.0);
        Box::pin(async move {
            // The layer puts the lease into the extensions of a locked call.
            if request.extensions().get::<LeaseHandle>().is_some() {
                gate.check_locked.store(true, Ordering::SeqCst);
            }
            gate.checks.fetch_add(1, Ordering::SeqCst);
            Ok(tonic::Response::new(HealthCheckResponse { status: 1 }))
        })
    }
}

impl<B> Service<http::Request<B>> for HealthServer
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let gate = Arc::clone(&self.gate);
        match req.uri().path() {
            HEALTH_CHECK => Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(ProstCodec::default());
                Ok(grpc.unary(Check(gate), req).await)
            }),
            _ => Box::pin(async { Ok(Status::unimplemented("no such method").into_http()) }),
        }
    }
}

/// Where the lock layer goes.
#[derive(Clone, Copy, PartialEq)]
enum Layout {
    /// `Server::builder().layer(..)`: on every service of the server.
    WholeServer,
    /// `RedlockLayer::named_layer(PaymentsServer)`: on `shop.Payments` only.
    PaymentsOnly,
}

/// A tonic server on 127.0.0.1:0 behind `RedlockLayer` with `policy`, serving
/// `shop.Payments` and `grpc.health.v1.Health`.
struct Server {
    addr: SocketAddr,
    gate: Arc<Gate>,
    channel: Channel,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Server {
    async fn serve(policy: LockPolicy) -> Self {
        Self::serve_as(policy, Layout::WholeServer).await
    }

    async fn serve_as(policy: LockPolicy, layout: Layout) -> Self {
        use tonic::service::LayerExt;

        let gate = Arc::new(Gate::new());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("a local address");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let stopped = async {
            let _ = stopped.await;
        };
        let payments = PaymentsServer {
            gate: Arc::clone(&gate),
        };
        let health = HealthServer {
            gate: Arc::clone(&gate),
        };
        let layer = RedlockLayer::with_policy(policy);
        let task = match layout {
            Layout::WholeServer => tokio::spawn(
                tonic::transport::Server::builder()
                    .layer(layer)
                    .add_service(payments)
                    .add_service(health)
                    .serve_with_incoming_shutdown(incoming, stopped),
            ),
            Layout::PaymentsOnly => tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(layer.named_layer(payments))
                    .add_service(health)
                    .serve_with_incoming_shutdown(incoming, stopped),
            ),
        };
        let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("a valid endpoint");
        let channel = within("the gRPC connection", endpoint.connect())
            .await
            .expect("connect to the test server");
        Self {
            addr,
            gate,
            channel,
            stop,
            task,
        }
    }

    /// A call of `method` with this `idempotency-key` metadata (`None`: without).
    fn call(
        &self,
        method: &'static str,
        key: Option<&str>,
        message: PayRequest,
    ) -> impl std::future::Future<Output = Result<tonic::Response<PayReply>, Status>> + 'static
    {
        let mut client = tonic::client::Grpc::new(self.channel.clone());
        let key = key.map(|k| MetadataValue::try_from(k).expect("a valid metadata value"));
        async move {
            within("the gRPC client", client.ready())
                .await
                .expect("the channel is ready");
            let mut request = tonic::Request::new(message);
            if let Some(key) = key {
                request.metadata_mut().insert("idempotency-key", key);
            }
            let call = client.unary(
                request,
                PathAndQuery::from_static(method),
                ProstCodec::default(),
            );
            within(format!("the answer of {method}"), call).await
        }
    }

    /// `Pay` with `key`: held at the gate when `hold`.
    fn pay(
        &self,
        key: Option<&str>,
        hold: bool,
    ) -> impl std::future::Future<Output = Result<tonic::Response<PayReply>, Status>> + 'static
    {
        self.call(
            PAY,
            key,
            PayRequest {
                amount_cents: 1250,
                hold,
                fail: 0,
            },
        )
    }

    /// A health check, without any key.
    fn health_check(
        &self,
    ) -> impl std::future::Future<Output = Result<tonic::Response<HealthCheckResponse>, Status>> + 'static
    {
        let mut client = tonic::client::Grpc::new(self.channel.clone());
        async move {
            within("the gRPC client", client.ready())
                .await
                .expect("the channel is ready");
            let call = client.unary(
                tonic::Request::new(HealthCheckRequest::default()),
                PathAndQuery::from_static(HEALTH_CHECK),
                ProstCodec::default(),
            );
            within("the answer of the health check", call).await
        }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        within("the server's shutdown", self.task)
            .await
            .expect("the server task")
            .expect("the server ran");
    }
}

/// The policy of these tests: `idempotency-key` metadata, scoped by method.
fn policy_of(redlock: &Redlock) -> LockPolicyBuilder {
    LockPolicy::builder(
        redlock.clone(),
        IdempotencyKey::required().scoped_by_grpc_method(),
    )
    .ttl(TTL)
}

/// The Redis key of a call of `method` with `key`: the `idempotency-key` header, as the
/// metadata arrives.
fn redis_key(method: &str, key: &str) -> String {
    let req = SimpleRequest::new("POST", method)
        .header("content-type", "application/grpc")
        .header("idempotency-key", key);
    IdempotencyKey::required()
        .scoped_by_grpc_method()
        .extract(&req)
        .expect("a valid key")
        .expect("a key")
        .as_str()
        .to_owned()
}

/// The status of a call that must fail.
fn refused(result: Result<tonic::Response<PayReply>, Status>) -> Status {
    match result {
        Err(status) => status,
        Ok(reply) => panic!("expected a refusal, got {:?}", reply.get_ref()),
    }
}

fn meta<'a>(status: &'a Status, name: &str) -> Option<&'a str> {
    status.metadata().get(name).and_then(|v| v.to_str().ok())
}

/// `retry-after` (s) and `grpc-retry-pushback-ms`: present, the same delay (seconds rounded
/// up, milliseconds rounded up), at most `max`.
fn assert_retry_hint(status: &Status, max: Duration) {
    let secs: u64 = meta(status, "retry-after")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no retry-after: {status:?}"));
    let ms: u64 = meta(status, "grpc-retry-pushback-ms")
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no grpc-retry-pushback-ms: {status:?}"));
    assert!((1..=max.as_secs()).contains(&secs), "retry-after {secs}");
    assert!(
        ms > 0 && ms <= secs * 1000 && ms > (secs - 1) * 1000,
        "pushback {ms} ms, retry-after {secs} s: {status:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn grpc_duplicate_in_flight_is_aborted_with_a_retry_hint() {
    const KEY: &str = "order-grpc-1";
    let (m, redlock) = masters_and_client().await;
    let server = Server::serve(policy_of(&redlock).build().unwrap()).await;

    let first = tokio::spawn(server.pay(Some(KEY), true));
    server.gate.until_started(1).await;
    // The metadata is the `idempotency-key` header: its lock is on every master.
    assert_held(&m, &redis_key(PAY, KEY)).await;

    let status = refused(server.pay(Some(KEY), false).await);
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert_retry_hint(&status, TTL);
    assert!(status.message().contains("same key"), "{status:?}");
    assert!(
        !status.message().contains(KEY),
        "the key leaked: {status:?}"
    );
    assert_eq!(server.gate.started(), 1, "the duplicate ran");

    server.gate.release.add_permits(1);
    let reply = within("the first call", first).await.unwrap().unwrap();
    assert!(reply.get_ref().payment_id.starts_with("pay_1250"));
    assert_released(&m, &redis_key(PAY, KEY)).await;
    // Free again: the next call with the key runs (no replay here).
    server.pay(Some(KEY), false).await.unwrap();
    assert_eq!(server.gate.started(), 2);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn grpc_distinct_keys_and_methods_run_side_by_side() {
    let (_m, redlock) = masters_and_client().await;
    let server = Server::serve(policy_of(&redlock).build().unwrap()).await;
    let hold = PayRequest {
        amount_cents: 1,
        hold: true,
        fail: 0,
    };
    let calls = [
        tokio::spawn(server.pay(Some("order-grpc-a"), true)),
        tokio::spawn(server.pay(Some("order-grpc-b"), true)),
        // The same key on another method: scoped by method, another lock.
        tokio::spawn(server.call(REFUND, Some("order-grpc-a"), hold)),
    ];
    server.gate.until_started(3).await;
    server.gate.release.add_permits(3);
    for call in calls {
        within("a held call", call).await.unwrap().unwrap();
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn grpc_masters_down_is_unavailable_with_a_retry_hint() {
    let (m, redlock) = masters_and_client().await;
    let server = Server::serve(policy_of(&redlock).build().unwrap()).await;
    m[1].stop();
    m[2].stop();
    let status = refused(server.pay(Some("order-grpc-down"), false).await);
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_retry_hint(&status, Duration::from_secs(1));
    assert_eq!(server.gate.started(), 0, "ran without a lock");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn grpc_missing_or_too_long_key_is_invalid_argument() {
    let (_m, redlock) = masters_and_client().await;
    let server = Server::serve(policy_of(&redlock).build().unwrap()).await;
    let long = format!("zebra{}", "z".repeat(251));
    for key in [None, Some(long.as_str()), Some("\"zebra")] {
        let status = refused(server.pay(key, false).await);
        assert_eq!(status.code(), Code::InvalidArgument, "{key:?}: {status:?}");
        assert!(status.message().contains("idempotency-key"), "{status:?}");
        assert!(
            !status.message().contains("zebra"),
            "the key leaked: {status:?}"
        );
        assert_eq!(meta(&status, "retry-after"), None, "{status:?}");
    }
    assert_eq!(server.gate.started(), 0);
    server.stop().await;
}

/// The key extractor of a server whose every service is behind the layer: the
/// `idempotency-key` metadata scoped by method on `shop.Payments`, no key elsewhere.
fn payments_key() -> impl KeyExtractor {
    let keyed = IdempotencyKey::required().scoped_by_grpc_method();
    key_fn(move |req| {
        if req.path().starts_with("/shop.Payments/") {
            keyed.extract(req)
        } else {
            Ok(None)
        }
    })
}

/// `Server::builder().layer(..)` locks every service of the server: with
/// `IdempotencyKey::required()` a health check (a Kubernetes gRPC probe) is refused with
/// `INVALID_ARGUMENT`. A key extractor that gives other services no key lets them through
/// unlocked — as does the layer on one service (`named_layer`) —, while `Pay` still needs
/// its key.
#[tokio::test(flavor = "multi_thread")]
async fn grpc_other_services_pass_through_unlocked_without_a_key() {
    let (_m, redlock) = masters_and_client().await;

    // The problem: every call needs a key.
    let server = Server::serve(policy_of(&redlock).build().unwrap()).await;
    let status = match server.health_check().await {
        Err(status) => status,
        Ok(reply) => panic!("expected a refusal, got {:?}", reply.get_ref()),
    };
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(server.gate.checks.load(Ordering::SeqCst), 0);
    server.stop().await;

    // The fix, in the key extractor or in the layout.
    let policy = || {
        LockPolicy::builder(redlock.clone(), payments_key())
            .ttl(TTL)
            .build()
            .unwrap()
    };
    let plain = LockPolicy::builder(redlock.clone(), IdempotencyKey::required())
        .ttl(TTL)
        .build()
        .unwrap();
    for (policy, layout) in [
        (policy(), Layout::WholeServer),
        (plain, Layout::PaymentsOnly),
    ] {
        let server = Server::serve_as(policy, layout).await;
        // While a `Pay` call holds its lock, and twice: nothing is locked for the check.
        let first = tokio::spawn(server.pay(Some("order-grpc-health"), true));
        server.gate.until_started(1).await;
        for _ in 0..2 {
            let reply = server.health_check().await.expect("a health check passes");
            assert_eq!(reply.get_ref().status, 1);
        }
        assert_eq!(server.gate.checks.load(Ordering::SeqCst), 2);
        // The lease reaches a locked handler's extensions; not the health check's.
        assert!(server.gate.call_locked.load(Ordering::SeqCst));
        assert!(
            !server.gate.check_locked.load(Ordering::SeqCst),
            "a health check ran under a lock"
        );
        // `Pay` still needs its key.
        let status = refused(server.pay(None, false).await);
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        server.gate.release.add_permits(1);
        within("the first call", first).await.unwrap().unwrap();
        assert_eq!(server.gate.started(), 1);
        server.stop().await;
    }
}

/// The same layer answers a plain HTTP request (HTTP/2, `application/json`) with
/// problem+json, and a gRPC call with a status, for the same lock.
#[tokio::test(flavor = "multi_thread")]
async fn grpc_and_plain_http_on_one_layer_get_their_own_answers() {
    const KEY: &str = "order-grpc-http";
    let (_m, redlock) = masters_and_client().await;
    let server = Server::serve(policy_of(&redlock).build().unwrap()).await;
    let http = reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let url = format!("http://{}{PAY}", server.addr);
    let post = |key: Option<&str>| {
        let req = http
            .post(&url)
            .header("content-type", "application/json")
            .body("{}");
        let req = match key {
            Some(key) => req.header("idempotency-key", key),
            None => req,
        };
        support::http::reply(req)
    };

    let missing = post(None).await;
    assert_eq!(missing.status, 400);
    assert_eq!(
        missing.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(missing.json()["type"], "/problems/lock-key-missing");
    assert_eq!(missing.header("grpc-status"), None);

    let first = tokio::spawn(server.pay(Some(KEY), true));
    server.gate.until_started(1).await;
    let held = post(Some(KEY)).await;
    assert_eq!(held.status, 409);
    assert_eq!(held.json()["type"], "/problems/lock-contended");
    assert!(held.retry_after() >= 1);
    server.gate.release.add_permits(1);
    within("the first call", first).await.unwrap().unwrap();
    server.stop().await;
}

/// Replay on gRPC: the duplicate in flight is `ABORTED`; a success (its status comes in
/// trailers, which are not stored) marks the key completed, so later duplicates get
/// `ALREADY_EXISTS` and never run; a trailers-only failure is stored and replayed when it is
/// a client error (`NOT_FOUND`) — with its gRPC headers, though the policy drops them —, not
/// stored when it is a server error or a code that invites a retry (`UNAVAILABLE`,
/// `ABORTED`, `RESOURCE_EXHAUSTED`, `CANCELLED`, `DEADLINE_EXCEEDED`).
#[tokio::test(flavor = "multi_thread")]
async fn grpc_replay_aborts_in_flight_and_answers_already_exists_after() {
    let (_m, redlock) = masters_and_client().await;
    let replay = Replay::new()
        .drop_header("grpc-status")
        .drop_header("grpc-message")
        .drop_header("content-type");
    let policy = policy_of(&redlock).replay(replay).build().unwrap();
    let server = Server::serve(policy).await;

    let first = tokio::spawn(server.pay(Some("order-grpc-r1"), true));
    server.gate.until_started(1).await;
    let status = refused(server.pay(Some("order-grpc-r1"), true).await);
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert_retry_hint(&status, TTL);
    server.gate.release.add_permits(1);
    within("the first call", first).await.unwrap().unwrap();
    let status = refused(server.pay(Some("order-grpc-r1"), true).await);
    assert_eq!(status.code(), Code::AlreadyExists, "{status:?}");
    assert_eq!(meta(&status, "retry-after"), None);
    assert_eq!(server.gate.started(), 1, "a completed key ran again");

    let failing = |fail: Code| PayRequest {
        amount_cents: 7,
        hold: false,
        fail: fail as i32,
    };
    // A client error, trailers-only: stored, replayed with the marker.
    let status = refused(
        server
            .call(PAY, Some("order-grpc-r2"), failing(Code::NotFound))
            .await,
    );
    assert_eq!(status.code(), Code::NotFound);
    let replayed = refused(
        server
            .call(PAY, Some("order-grpc-r2"), failing(Code::NotFound))
            .await,
    );
    assert_eq!(
        (replayed.code(), replayed.message()),
        (Code::NotFound, "the handler failed")
    );
    assert_eq!(meta(&replayed, "idempotency-replayed"), Some("true"));
    assert_eq!(server.gate.started(), 2, "a stored failure ran again");
    // A server error, or a code that invites a retry: not stored, the retry runs again.
    let retried = [
        Code::Unavailable,
        Code::Internal,
        Code::Aborted,
        Code::ResourceExhausted,
        Code::Cancelled,
        Code::DeadlineExceeded,
    ];
    for code in retried {
        let key = format!("order-grpc-r3-{}", code as i32);
        for _ in 0..2 {
            let status = refused(server.call(PAY, Some(key.as_str()), failing(code)).await);
            assert_eq!(status.code(), code, "{status:?}");
            assert_eq!(meta(&status, "idempotency-replayed"), None, "{code:?}");
        }
    }
    assert_eq!(server.gate.started(), 2 + 2 * retried.len());
    server.stop().await;
}

/// The rejections of a gRPC request, as (status, header name, value) for the headers that
/// make a gRPC answer, and the body's length.
#[cfg(feature = "actix")]
type Answer = (u16, Vec<(String, String)>, usize);

/// The gRPC answer's headers out of any header map.
#[cfg(feature = "actix")]
fn grpc_headers<'a>(headers: impl Iterator<Item = (&'a str, &'a [u8])>) -> Vec<(String, String)> {
    const NAMES: [&str; 5] = [
        "content-type",
        "grpc-status",
        "grpc-message",
        "retry-after",
        "grpc-retry-pushback-ms",
    ];
    let mut out: Vec<_> = headers
        .filter(|(n, _)| NAMES.contains(n))
        .map(|(n, v)| (n.to_owned(), String::from_utf8_lossy(v).into_owned()))
        .collect();
    out.sort();
    out
}

/// A request of the tower/actix-web comparison.
#[cfg(feature = "actix")]
struct Ask {
    /// `PAY` (no replay) or `REFUND` (replay, body limit [`BODY_LIMIT`]).
    path: &'static str,
    content_type: &'static str,
    key: Option<String>,
    /// Sent with its `content-length`.
    body: &'static [u8],
}

/// The request body limit of the replay policy in the comparison.
#[cfg(feature = "actix")]
const BODY_LIMIT: usize = 16;

/// The same rejections from `RedlockLayer` and from `RedlockMiddleware`: a gRPC request over
/// HTTP/1.1 to actix-web gets the gRPC answer tower gives, header for header, without and
/// with replay, for gRPC and gRPC-Web.
#[cfg(feature = "actix")]
#[actix_web::test]
async fn grpc_answers_are_the_same_on_tower_and_actix() {
    use actix_web::{test, web, App, HttpResponse};
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use support::{apps::client_of, Masters};
    use tonic::codegen::Body as _;
    use tower::{Layer, ServiceExt};
    use tower_redlock::RedlockMiddleware;

    let m = Masters::start(3);
    let redlock = client_of(&m).await;
    let plain = policy_of(&redlock).build().unwrap();
    let replay = policy_of(&redlock)
        .replay(Replay::new().body_limit(BODY_LIMIT))
        .build()
        .unwrap();
    let actix = test::init_service(
        App::new()
            .service(
                web::resource(PAY).route(
                    web::post()
                        .to(HttpResponse::Ok)
                        .wrap(RedlockMiddleware::with_policy(plain.clone())),
                ),
            )
            .service(
                web::resource(REFUND).route(
                    web::post()
                        .to(HttpResponse::Ok)
                        .wrap(RedlockMiddleware::with_policy(replay.clone())),
                ),
            ),
    )
    .await;
    let inner = tower::service_fn(|_req: http::Request<_>| async {
        Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::new())))
    });
    let tower_plain = RedlockLayer::with_policy(plain).layer(inner);
    let tower_replay = RedlockLayer::with_policy(replay).layer(inner);

    let actix_answer = |ask: &Ask| {
        let mut req = test::TestRequest::post()
            .uri(ask.path)
            .insert_header(("content-type", ask.content_type))
            .set_payload(ask.body);
        if let Some(key) = &ask.key {
            req = req.insert_header(("idempotency-key", key.as_str()));
        }
        let req = req.to_request();
        async {
            let res = test::call_service(&actix, req).await;
            let status = res.status().as_u16();
            let headers = grpc_headers(
                res.headers()
                    .iter()
                    .map(|(n, v)| (n.as_str(), v.as_bytes())),
            );
            let body = test::read_body(res).await;
            (status, headers, body.len())
        }
    };
    let ask_both = |ask: Ask| {
        let (tower_plain, tower_replay) = (tower_plain.clone(), tower_replay.clone());
        let actix_answer = &actix_answer;
        async move {
            let from_actix: Answer = actix_answer(&ask).await;

            let mut req = http::Request::post(ask.path)
                .header("content-type", ask.content_type)
                .header("content-length", ask.body.len());
            if let Some(key) = &ask.key {
                req = req.header("idempotency-key", key.as_str());
            }
            let req = req.body(Full::new(Bytes::from_static(ask.body))).unwrap();
            let tower = if ask.path == PAY {
                tower_plain
            } else {
                tower_replay
            };
            let res = tower.oneshot(req).await.unwrap();
            let status = res.status().as_u16();
            let headers = grpc_headers(
                res.headers()
                    .iter()
                    .map(|(n, v)| (n.as_str(), v.as_bytes())),
            );
            // Trailers-only: the stream ends with the HEADERS frame.
            assert!(
                status != 200 || res.body().is_end_stream(),
                "a trailers-only answer with a body to poll"
            );
            let body = res.into_body().collect().await.unwrap().to_bytes();
            let from_tower: Answer = (status, headers, body.len());
            assert_eq!(from_actix, from_tower, "actix-web and tower differ");
            from_tower
        }
    };
    let grpc = |path, key: Option<&str>, body| Ask {
        path,
        content_type: "application/grpc",
        key: key.map(str::to_owned),
        body,
    };
    // (content-type, grpc-status, retry-after, grpc-retry-pushback-ms) of a trailers-only
    // answer.
    let code = |answer: &Answer| {
        let find = |name: &str| {
            answer
                .1
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(answer.0, 200, "{answer:?}");
        assert_eq!(answer.2, 0, "a body: {answer:?}");
        (
            find("content-type").expect("content-type"),
            find("grpc-status").expect("grpc-status"),
            find("retry-after"),
            find("grpc-retry-pushback-ms"),
        )
    };
    let grpc_code = |answer: &Answer| {
        let (content_type, status, retry, pushback) = code(answer);
        assert_eq!(content_type, "application/grpc", "{answer:?}");
        (status, retry, pushback)
    };

    assert_eq!(
        grpc_code(&ask_both(grpc(PAY, None, b"")).await),
        ("3".into(), None, None)
    );
    let long = "z".repeat(256);
    assert_eq!(
        grpc_code(&ask_both(grpc(PAY, Some(&long), b"")).await),
        ("3".into(), None, None)
    );
    // gRPC-Web: the answer has the request's gRPC-Web type, without its codec.
    for (sent, answered) in [
        ("application/grpc-web+proto", "application/grpc-web"),
        ("application/grpc-web-text", "application/grpc-web-text"),
    ] {
        let ask = Ask {
            content_type: sent,
            ..grpc(PAY, None, b"")
        };
        assert_eq!(
            code(&ask_both(ask).await),
            (answered.into(), "3".into(), None, None)
        );
    }

    // Replay: a body whose content-length is over the limit is RESOURCE_EXHAUSTED.
    let large = &[7u8; BODY_LIMIT + 1];
    let answer = ask_both(grpc(REFUND, Some("order-grpc-large"), large)).await;
    assert_eq!(grpc_code(&answer), ("8".into(), None, None));
    // A key reused with another payload is FAILED_PRECONDITION (stored by either framework:
    // the record is the same).
    const REUSED: &str = "order-grpc-reused";
    let first = actix_answer(&grpc(REFUND, Some(REUSED), b"amount=1")).await;
    assert_eq!(first.0, 200, "{first:?}");
    let answer = ask_both(grpc(REFUND, Some(REUSED), b"amount=2")).await;
    assert_eq!(grpc_code(&answer), ("9".into(), None, None));

    // Held by a holder without an expiry (a foreign plain SET): the hint is 1 s, on both.
    const KEY: &str = "order-grpc-actix";
    for master in m.iter() {
        assert!(master.set_nx(&redis_key(PAY, KEY), "foreign", None).await);
    }
    let held = ask_both(grpc(PAY, Some(KEY), b"")).await;
    assert_eq!(
        grpc_code(&held),
        ("10".into(), Some("1".into()), Some("1000".into()))
    );
    m[1].stop();
    m[2].stop();
    let down = ask_both(grpc(PAY, Some("order-grpc-down"), b"")).await;
    assert_eq!(
        grpc_code(&down),
        ("14".into(), Some("1".into()), Some("1000".into()))
    );
}
