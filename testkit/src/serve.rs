//! An axum app served in the background on a free loopback port ([`HttpApp`]).

use std::net::SocketAddr;

/// An axum app served on a free loopback port (`127.0.0.1:0`); the accept loop is aborted
/// on drop (connections still open end with the test's runtime).
#[derive(Debug)]
pub struct HttpApp {
    addr: SocketAddr,
    server: tokio::task::JoinHandle<()>,
}

impl HttpApp {
    /// Binds `127.0.0.1:0` and serves `router` in the background, with the client's address
    /// as a `ConnectInfo<SocketAddr>` extension (what `RequestView::peer_addr` reads).
    pub async fn serve(router: axum::Router) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let server = tokio::spawn(async move {
            let router = router.into_make_service_with_connect_info::<SocketAddr>();
            axum::serve(listener, router).await.expect("axum::serve");
        });
        Self { addr, server }
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for HttpApp {
    fn drop(&mut self) {
        self.server.abort();
    }
}
