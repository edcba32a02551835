//! The server of the tonic tests: [`PaymentsServer`] and [`HealthServer`] on 127.0.0.1:0
//! behind `RedlockLayer`, laid out as [`Layout`] says, and a client channel to it.

use std::net::SocketAddr;
use std::sync::Arc;

use tonic::codegen::http::uri::PathAndQuery;
use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use tonic::Status;
use tonic_prost::ProstCodec;
use tower_redlock::policy::LockPolicy;
use tower_redlock::RedlockLayer;

use super::service::{
    Gate, HealthCheckRequest, HealthCheckResponse, HealthServer, PayReply, PayRequest,
    PaymentsServer,
};
use super::support::http::within;
use super::{HEALTH_CHECK, PAY};

/// Where the lock layer goes.
#[derive(Clone, Copy, PartialEq)]
pub enum Layout {
    /// `Server::builder().layer(..)`: on every service of the server.
    WholeServer,
    /// `RedlockLayer::named_layer(PaymentsServer)`: on `shop.Payments` only.
    PaymentsOnly,
}

/// A tonic server on 127.0.0.1:0 behind `RedlockLayer` with `policy`, serving
/// `shop.Payments` and `grpc.health.v1.Health`.
pub struct Server {
    pub addr: SocketAddr,
    pub gate: Arc<Gate>,
    channel: Channel,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl Server {
    pub async fn serve(policy: LockPolicy) -> Self {
        Self::serve_as(policy, Layout::WholeServer).await
    }

    pub async fn serve_as(policy: LockPolicy, layout: Layout) -> Self {
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
        let layer = RedlockLayer::new(policy);
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
    pub fn call(
        &self,
        method: &'static str,
        key: Option<&str>,
        message: PayRequest,
    ) -> impl std::future::Future<Output = Result<tonic::Response<PayReply>, Status>> + 'static
    {
        self.call_within(method, key, message, None)
    }

    /// As [`Server::call`], with the caller's deadline `timeout` (the `grpc-timeout` header).
    pub fn call_within(
        &self,
        method: &'static str,
        key: Option<&str>,
        message: PayRequest,
        timeout: Option<std::time::Duration>,
    ) -> impl std::future::Future<Output = Result<tonic::Response<PayReply>, Status>> + 'static
    {
        let mut client = tonic::client::Grpc::new(self.channel.clone());
        let key = key.map(|k| MetadataValue::try_from(k).expect("a valid metadata value"));
        async move {
            within("the gRPC client", client.ready())
                .await
                .expect("the channel is ready");
            let mut request = tonic::Request::new(message);
            if let Some(timeout) = timeout {
                request.set_timeout(timeout);
            }
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
    pub fn pay(
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
    pub fn health_check(
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

    pub async fn stop(self) {
        let _ = self.stop.send(());
        within("the server's shutdown", self.task)
            .await
            .expect("the server task")
            .expect("the server ran");
    }
}
