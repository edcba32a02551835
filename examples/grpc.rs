//! A tonic gRPC service behind `RedlockLayer`: the lock's answers are gRPC statuses.
//!
//! The server serves `shop.Payments/Pay` and a health check, `grpc.health.v1.Health/Check`
//! (messages with `prost`'s derive, the services written by hand — no `protoc`, no build
//! script) behind `Server::builder().layer(RedlockLayer)`. A layer on the server wraps
//! *every* service, so the key extractor reads the `idempotency-key` metadata, scoped by the
//! gRPC method, on `shop.Payments` only and gives no key elsewhere: the health check (like
//! reflection, or a Kubernetes gRPC probe) passes through unlocked without a key instead of
//! getting `INVALID_ARGUMENT`. The demo sends two concurrent calls with the same key: the
//! first runs, the second is refused with `ABORTED` and a retry hint
//! (`grpc-retry-pushback-ms`, `retry-after`) while the first holds the lock; a `Pay` call
//! without the key gets `INVALID_ARGUMENT`, a health check without one `SERVING`. It exits
//! with 0 when every answer is the expected one.
//!
//! Environment:
//! - `REDLOCK_URLS`: comma-separated voter URLs (`redis://host:port,...`, Sentinel groups,
//!   Clusters with the `cluster` feature); unset → the in-memory node (this process only);
//! - `RUST_LOG`: log filter (e.g. `tower_redlock=debug`).
//!
//! ```text
//! cargo run --features tower --example grpc
//! REDLOCK_URLS=redis://127.0.0.1:7777,redis://127.0.0.1:7778,redis://127.0.0.1:7779 \
//!     cargo run --features tower --example grpc
//! ```

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::codegen::{http, BoxFuture, Context, Poll, Service, StdError};
use tonic::metadata::MetadataValue;
use tonic::server::{NamedService, UnaryService};
use tonic::{Code, Status};
use tonic_prost::ProstCodec;
use tower_redlock::key::{IdempotencyKey, KeyExtractor, KeyExtractorExt};
use tower_redlock::policy::LockPolicy;
use tower_redlock::{Redlock, RedlockLayer};

/// How long a single answer may take before the demo gives up (a safety bound, not a wait).
const ANSWER_WITHIN: Duration = Duration::from_secs(10);
/// The method the demo calls.
const PAY: &str = "/shop.Payments/Pay";
/// The standard health check's method, served without a lock.
const HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";

#[derive(Clone, PartialEq, prost::Message)]
struct PayRequest {
    #[prost(uint64, tag = "1")]
    amount_cents: u64,
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

/// `grpc.health.v1.HealthCheckResponse`; `status` 1 is `SERVING`.
#[derive(Clone, PartialEq, prost::Message)]
struct HealthCheckResponse {
    #[prost(int32, tag = "1")]
    status: i32,
}

/// The handler's state: it reports when a call has started and waits for `release` before
/// answering, so the demo can send its duplicate while the first call holds the lock.
#[derive(Default)]
struct Gate {
    started: Notify,
    release: Notify,
}

/// The `shop.Payments` service, written as tonic's codegen would write it.
#[derive(Clone)]
struct PaymentsServer {
    gate: Arc<Gate>,
}

impl NamedService for PaymentsServer {
    const NAME: &'static str = "shop.Payments";
}

/// `Pay`: one unary method.
struct PaySvc(Arc<Gate>);

impl UnaryService<PayRequest> for PaySvc {
    type Response = PayReply;
    type Future = BoxFuture<tonic::Response<PayReply>, Status>;

    fn call(&mut self, request: tonic::Request<PayRequest>) -> Self::Future {
        let gate = Arc::clone(&self.0);
        Box::pin(async move {
            gate.started.notify_one();
            gate.release.notified().await;
            let amount = request.into_inner().amount_cents;
            Ok(tonic::Response::new(PayReply {
                payment_id: format!("pay_{amount}"),
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
            PAY => Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(ProstCodec::default());
                Ok(grpc.unary(PaySvc(gate), req).await)
            }),
            _ => Box::pin(async { Ok(Status::unimplemented("no such method").into_http()) }),
        }
    }
}

/// `grpc.health.v1.Health` with `Check` only, written as tonic's codegen would write it
/// (`tonic-health` serves the full one).
#[derive(Clone)]
struct HealthServer;

impl NamedService for HealthServer {
    const NAME: &'static str = "grpc.health.v1.Health";
}

/// `Check`: always `SERVING`.
struct CheckSvc;

impl UnaryService<HealthCheckRequest> for CheckSvc {
    type Response = HealthCheckResponse;
    type Future = BoxFuture<tonic::Response<HealthCheckResponse>, Status>;

    fn call(&mut self, _request: tonic::Request<HealthCheckRequest>) -> Self::Future {
        Box::pin(async { Ok(tonic::Response::new(HealthCheckResponse { status: 1 })) })
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
        match req.uri().path() {
            HEALTH_CHECK => Box::pin(async move {
                let mut grpc = tonic::server::Grpc::new(ProstCodec::default());
                Ok(grpc.unary(CheckSvc, req).await)
            }),
            _ => Box::pin(async { Ok(Status::unimplemented("no such method").into_http()) }),
        }
    }
}

/// The lock's key: the `idempotency-key` metadata (an HTTP/2 header), one key space per
/// method, on `shop.Payments` only. A layer on the server sees the calls of every service:
/// a call of any other one (health checks, reflection) gets no key and passes through
/// unlocked, where `IdempotencyKey::required()` alone would refuse it.
fn payments_key() -> impl KeyExtractor {
    IdempotencyKey::required()
        .scoped_by_grpc_method()
        .only_grpc_service("shop.Payments")
}

/// A `Pay` call with this `idempotency-key` metadata (none: `None`).
async fn pay(
    channel: tonic::transport::Channel,
    key: Option<&'static str>,
) -> Result<tonic::Response<PayReply>, Status> {
    let mut client = tonic::client::Grpc::new(channel);
    client
        .ready()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    let mut request = tonic::Request::new(PayRequest { amount_cents: 1250 });
    if let Some(key) = key {
        request
            .metadata_mut()
            .insert("idempotency-key", MetadataValue::from_static(key));
    }
    let call = client.unary(
        request,
        PathAndQuery::from_static(PAY),
        ProstCodec::default(),
    );
    tokio::time::timeout(ANSWER_WITHIN, call)
        .await
        .unwrap_or_else(|_| Err(Status::deadline_exceeded("no answer in time")))
}

/// A health check, without any key.
async fn health_check(
    channel: tonic::transport::Channel,
) -> Result<tonic::Response<HealthCheckResponse>, Status> {
    let mut client = tonic::client::Grpc::new(channel);
    client
        .ready()
        .await
        .map_err(|e| Status::unavailable(e.to_string()))?;
    let call = client.unary(
        tonic::Request::new(HealthCheckRequest::default()),
        PathAndQuery::from_static(HEALTH_CHECK),
        ProstCodec::default(),
    );
    tokio::time::timeout(ANSWER_WITHIN, call)
        .await
        .unwrap_or_else(|_| Err(Status::deadline_exceeded("no answer in time")))
}

/// A metadata value as text, for printing.
fn meta<'a>(status: &'a Status, name: &str) -> Option<&'a str> {
    status.metadata().get(name).and_then(|v| v.to_str().ok())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()))
        .init();

    let redlock = match std::env::var("REDLOCK_URLS") {
        Ok(urls) if !urls.trim().is_empty() => {
            // Commas separate voters; a Sentinel's or a Cluster's hosts stay together.
            let urls = tower_redlock::node::split_urls(&urls);
            println!("locking on {} Redis voters", urls.len());
            Redlock::new(urls)?
        }
        _ => {
            println!("REDLOCK_URLS unset: locking on the in-memory node");
            Redlock::in_memory()
        }
    };
    // The key is the `idempotency-key` metadata of `shop.Payments` calls (see
    // `payments_key`). Rejections of gRPC calls are gRPC statuses by default.
    let policy = LockPolicy::builder(redlock, payments_key())
        .ttl(Duration::from_secs(10))
        .build()?;

    let gate = Arc::new(Gate::default());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .layer(RedlockLayer::new(policy))
            .add_service(PaymentsServer {
                gate: Arc::clone(&gate),
            })
            .add_service(HealthServer)
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener),
                async {
                    let _ = stopped.await;
                },
            ),
    );
    println!("gRPC server on {addr}");
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .connect()
        .await?;

    let mut ok = true;
    let mut expect = |what: &str, good: bool| {
        println!("  {} {what}", if good { "ok  " } else { "FAIL" });
        ok &= good;
    };

    // 1. The first call takes the lock and runs; its handler waits at the gate.
    let first = tokio::spawn(pay(channel.clone(), Some("order-1")));
    tokio::time::timeout(ANSWER_WITHIN, gate.started.notified()).await?;
    println!("call 1 (idempotency-key: order-1) is running under the lock");

    // 2. The same key while it runs: ABORTED, with the retry hint.
    match pay(channel.clone(), Some("order-1")).await {
        Err(status) => {
            println!(
                "call 2 (idempotency-key: order-1) -> {:?}: {:?}; grpc-retry-pushback-ms: {:?}, retry-after: {:?}",
                status.code(),
                status.message(),
                meta(&status, "grpc-retry-pushback-ms"),
                meta(&status, "retry-after"),
            );
            expect("the duplicate is ABORTED", status.code() == Code::Aborted);
            expect(
                "it carries grpc-retry-pushback-ms and retry-after",
                meta(&status, "grpc-retry-pushback-ms").is_some()
                    && meta(&status, "retry-after").is_some(),
            );
            expect(
                "the message never shows the key",
                !status.message().contains("order-1"),
            );
        }
        Ok(reply) => {
            println!("call 2 -> OK {:?}", reply.get_ref());
            expect("the duplicate is ABORTED", false);
        }
    }

    // 3. No key at all: INVALID_ARGUMENT.
    match pay(channel.clone(), None).await {
        Err(status) => {
            println!(
                "call 3 (no idempotency-key) -> {:?}: {:?}",
                status.code(),
                status.message()
            );
            expect(
                "a call without a key is INVALID_ARGUMENT",
                status.code() == Code::InvalidArgument,
            );
        }
        Ok(_) => expect("a call without a key is INVALID_ARGUMENT", false),
    }

    // 4. A health check, without a key, while call 1 holds its lock: not locked, SERVING.
    match health_check(channel.clone()).await {
        Ok(reply) => {
            println!(
                "health check (no idempotency-key) -> OK, status {}",
                reply.get_ref().status
            );
            expect(
                "a health check passes without a key",
                reply.get_ref().status == 1,
            );
        }
        Err(status) => {
            println!(
                "health check -> {:?}: {:?}",
                status.code(),
                status.message()
            );
            expect("a health check passes without a key", false);
        }
    }

    // 5. The first call finishes: OK.
    gate.release.notify_one();
    match first.await? {
        Ok(reply) => {
            println!("call 1 -> OK, payment {}", reply.get_ref().payment_id);
            expect("the first call succeeds", true);
        }
        Err(status) => {
            println!("call 1 -> {:?}: {:?}", status.code(), status.message());
            expect("the first call succeeds", false);
        }
    }

    let _ = stop.send(());
    server.await??;
    if ok {
        println!("every answer is the expected one");
        Ok(())
    } else {
        Err("unexpected answers (see above)".into())
    }
}
