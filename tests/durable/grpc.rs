//! Durable replay for gRPC: a tonic service behind `RedlockLayer` whose `Pay` takes the
//! [`KeyRow`] from its request's extensions and does `work.rs`'s work; a tonic client reads
//! each case as a gRPC status.

use std::convert::Infallible;
use std::time::Duration;

use tonic::codegen::http::uri::PathAndQuery;
use tonic::codegen::{http, BoxFuture, Context, Poll, Service, StdError};
use tonic::metadata::MetadataValue;
use tonic::server::{NamedService, UnaryService};
use tonic::{Code, Status};
use tonic_prost::ProstCodec;
use tower_redlock::durable::{KeyRow, RowErrorKind};
use tower_redlock::RedlockLayer;

use super::app::{self, Hooks};
use super::work::{handle, Driver, DriverKind};
use super::{flush_and_restart, support};

use support::http::within;
use support::Masters;

const PAY: &str = "/shop.Payments/Pay";

#[derive(Clone, PartialEq, prost::Message)]
struct PayRequest {
    #[prost(string, tag = "1")]
    amount: String,
}

#[derive(Clone, PartialEq, prost::Message)]
struct PayReply {
    #[prost(string, tag = "1")]
    payment_id: String,
}

/// `shop.Payments` with `Pay`, written by hand as tonic's codegen writes a service.
#[derive(Clone)]
struct Payments {
    driver: Driver,
    hooks: Hooks,
}

impl NamedService for Payments {
    const NAME: &'static str = "shop.Payments";
}

impl UnaryService<PayRequest> for Payments {
    type Response = PayReply;
    type Future = BoxFuture<tonic::Response<PayReply>, Status>;

    fn call(&mut self, request: tonic::Request<PayRequest>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let row = request.extensions().get::<KeyRow>().cloned();
            let row = row.ok_or_else(|| Status::internal("no key row"))?;
            let body = request.into_inner().amount;
            // A declined payment rolls back and answers a client error.
            let mode = if body == "declined" {
                "rollback-402"
            } else {
                "ok"
            };
            match handle(&this.driver, &this.hooks, row, mode, &body).await {
                Ok((402, _)) => Err(Status::invalid_argument("declined")),
                Ok((_, payment)) => Ok(tonic::Response::new(PayReply {
                    payment_id: payment,
                })),
                // Answered by the middleware in its place (from the row, or ABORTED).
                Err(e) if e.kind() != RowErrorKind::Database => Err(Status::aborted(e.to_string())),
                Err(e) => Err(Status::internal(e.to_string())),
            }
        })
    }
}

impl<B> Service<http::Request<B>> for Payments
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
        let method = self.clone();
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(ProstCodec::default());
            Ok(grpc.unary(method, req).await)
        })
    }
}

/// `Pay` of `amount` with `key`, on a fresh client of `addr`.
async fn pay(
    addr: std::net::SocketAddr,
    key: &str,
    amount: &str,
) -> Result<tonic::Response<PayReply>, Status> {
    let endpoint = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap();
    let channel = within("the gRPC connection", endpoint.connect())
        .await
        .expect("connect");
    let mut client = tonic::client::Grpc::new(channel);
    within("the gRPC client", client.ready()).await.unwrap();
    let mut request = tonic::Request::new(PayRequest {
        amount: amount.to_owned(),
    });
    let key = MetadataValue::try_from(format!("\"{key}\"")).unwrap();
    request.metadata_mut().insert("idempotency-key", key);
    let call = client.unary(
        request,
        PathAndQuery::from_static(PAY),
        ProstCodec::default(),
    );
    within("the answer of Pay", call).await
}

/// Every durable case as a gRPC status, with tokio-postgres. A success (its status comes in
/// trailers, never stored) marks its key completed: `ALREADY_EXISTS` from Redis, and after
/// every voter was flushed, from the row — `ABORTED` with a retry hint while the row is young
/// enough for its response to be on its way, then `ALREADY_EXISTS`. A trailers-only failure
/// (a declined payment, rolled back) is stored in a row of its own and replayed from it after
/// the flush; another payload under its key is `FAILED_PRECONDITION`. The work ran once.
#[tokio::test]
async fn durable_grpc_calls_get_a_status_for_every_case() {
    let pg = app::server().await;
    let (masters, db) = (Masters::start(3), app::Db::create(&pg).await);
    let kind = DriverKind::TokioPostgres;
    let policy = app::policy(kind, masters.client(), &db.url, Duration::from_secs(5));
    let (hooks, _reached) = Hooks::new();
    let service = Payments {
        driver: Driver::lazy(kind, &db.url),
        hooks,
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .layer(RedlockLayer::new(policy))
            .add_service(service)
            .serve_with_incoming(incoming),
    );
    let code = |result: Result<tonic::Response<PayReply>, Status>| result.unwrap_err();

    let first = pay(addr, "k-1", "10 EUR")
        .await
        .expect("the first call runs");
    assert!(first.get_ref().payment_id.starts_with("payment "));
    let again = code(pay(addr, "k-1", "10 EUR").await);
    assert_eq!(again.code(), Code::AlreadyExists, "{again:?}");
    let declined = code(pay(addr, "k-d", "declined").await);
    assert_eq!(declined.code(), Code::InvalidArgument, "{declined:?}");
    assert_eq!(
        db.key_rows().await,
        (2, 1),
        "k-1 without its response, k-d with"
    );

    flush_and_restart(&masters);
    let replayed = code(pay(addr, "k-d", "declined").await);
    assert_eq!(replayed.code(), Code::InvalidArgument, "{replayed:?}");
    assert_eq!(replayed.message(), "declined");
    let marker = replayed.metadata().get("idempotency-replayed");
    assert_eq!(marker.and_then(|v| v.to_str().ok()), Some("true"));
    let other = code(pay(addr, "k-d", "99 EUR").await);
    assert_eq!(other.code(), Code::FailedPrecondition, "{other:?}");
    let in_flight = code(pay(addr, "k-1", "10 EUR").await);
    assert_eq!(in_flight.code(), Code::Aborted, "{in_flight:?}");
    assert!(in_flight.metadata().get("grpc-retry-pushback-ms").is_some());
    // The row's response can no longer be on its way.
    let age = "UPDATE tower_redlock_keys SET created_at = now() - interval '1 hour' \
               WHERE record IS NULL";
    sqlx::query(age).execute(&db.pool).await.unwrap();
    let completed = code(pay(addr, "k-1", "10 EUR").await);
    assert_eq!(completed.code(), Code::AlreadyExists, "{completed:?}");
    assert_eq!(db.payments().await, 1, "k-1's work once, k-d's never");
    server.abort();
}
