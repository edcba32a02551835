//! The tonic side: the prost messages, the [`Gate`] the handlers report to, and two services
//! written by hand as tonic's codegen would write them — `shop.Payments` ([`PaymentsServer`],
//! `Pay` and `Refund`) and `grpc.health.v1.Health` ([`HealthServer`], `Check` only) — whose
//! routing is written once, in `grpc_service!`.

use std::convert::Infallible;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::sync::{Notify, Semaphore};
use tonic::codegen::{http, BoxFuture, Context, Poll, Service, StdError};
use tonic::server::{NamedService, UnaryService};
use tonic::{Code, Status};
use tonic_prost::ProstCodec;
use tower_redlock::LeaseHandle;

use super::support::http::within;
use super::{HEALTH_CHECK, PAY, REFUND};

#[derive(Clone, PartialEq, prost::Message)]
pub struct PayRequest {
    #[prost(uint64, tag = "1")]
    pub amount_cents: u64,
    /// Wait at the gate before answering.
    #[prost(bool, tag = "2")]
    pub hold: bool,
    /// Fail with this gRPC code (0: succeed).
    #[prost(int32, tag = "3")]
    pub fail: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct PayReply {
    #[prost(string, tag = "1")]
    pub payment_id: String,
}

/// `grpc.health.v1.HealthCheckRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthCheckRequest {
    #[prost(string, tag = "1")]
    pub service: String,
}

/// `grpc.health.v1.HealthCheckResponse` (`status` 1: `SERVING`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct HealthCheckResponse {
    #[prost(int32, tag = "1")]
    pub status: i32,
}

/// What the handlers did; held calls wait for a permit.
pub struct Gate {
    started: AtomicUsize,
    changed: Notify,
    pub release: Semaphore,
    /// Whether a `Pay` or `Refund` call ran holding a lease.
    pub call_locked: AtomicBool,
    /// Health checks answered, and whether one ran holding a lease.
    pub checks: AtomicUsize,
    pub check_locked: AtomicBool,
}

impl Gate {
    pub fn new() -> Self {
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
    pub async fn until_started(&self, n: usize) {
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

    pub fn started(&self) -> usize {
        self.started.load(Ordering::SeqCst)
    }
}

/// A unary method of a service: `handle(gate, request)`, boxed as tonic's codegen boxes a
/// method of the service trait.
struct Unary<F> {
    gate: Arc<Gate>,
    handle: F,
}

impl<M, R, F, Fut> UnaryService<M> for Unary<F>
where
    F: Fn(Arc<Gate>, tonic::Request<M>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<R>, Status>> + Send + 'static,
{
    type Response = R;
    type Future = BoxFuture<tonic::Response<R>, Status>;

    fn call(&mut self, request: tonic::Request<M>) -> Self::Future {
        Box::pin((self.handle)(Arc::clone(&self.gate), request))
    }
}

/// A tonic service named `$name` (a struct holding the [`Gate`]), with the
/// `Service<http::Request<B>>` routing tonic's codegen writes: a call of a `$path` goes to
/// its unary method `$method`, any other path is `UNIMPLEMENTED`.
macro_rules! grpc_service {
    (
        $(#[$attr:meta])*
        $server:ident = $name:literal { $($path:pat => $method:expr),+ $(,)? }
    ) => {
        $(#[$attr])*
        #[derive(Clone)]
        pub struct $server {
            pub gate: Arc<Gate>,
        }

        impl NamedService for $server {
            const NAME: &'static str = $name;
        }

        impl<B> Service<http::Request<B>> for $server
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
                    $($path => Box::pin(async move {
                        let method = Unary { gate, handle: $method };
                        let mut grpc = tonic::server::Grpc::new(ProstCodec::default());
                        Ok(grpc.unary(method, req).await)
                    }),)+
                    _ => Box::pin(async { Ok(Status::unimplemented("no such method").into_http()) }),
                }
            }
        }
    };
}

grpc_service! {
    /// `shop.Payments` with `Pay` and `Refund`, written as tonic's codegen would write it.
    PaymentsServer = "shop.Payments" { PAY | REFUND => pay }
}

grpc_service! {
    /// `grpc.health.v1.Health` with `Check` only, by hand: it records whether it ran locked.
    HealthServer = "grpc.health.v1.Health" { HEALTH_CHECK => check }
}

/// `Pay` and `Refund`: held at the gate when asked, failing with the code asked.
async fn pay(
    gate: Arc<Gate>,
    request: tonic::Request<PayRequest>,
) -> Result<tonic::Response<PayReply>, Status> {
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
}

/// `Check`: always `SERVING`.
async fn check(
    gate: Arc<Gate>,
    request: tonic::Request<HealthCheckRequest>,
) -> Result<tonic::Response<HealthCheckResponse>, Status> {
    // The layer puts the lease into the extensions of a locked call.
    if request.extensions().get::<LeaseHandle>().is_some() {
        gate.check_locked.store(true, Ordering::SeqCst);
    }
    gate.checks.fetch_add(1, Ordering::SeqCst);
    Ok(tonic::Response::new(HealthCheckResponse { status: 1 }))
}
