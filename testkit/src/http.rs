//! The client's side of the HTTP tests (axum and actix-web): a reqwest client, deadline-bounded
//! waits, and a response read to its end.

use std::fmt::Display;
use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use reqwest::header::HeaderMap;
use serde_json::Value;

/// The longest any single step of an HTTP test may take before it counts as a hang.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// Awaits `fut`, or panics naming `what` after [`DEADLINE`].
pub async fn within<T>(what: impl Display, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(DEADLINE, fut).await {
        Ok(out) => out,
        Err(_) => panic!("timed out after {DEADLINE:?} waiting for {what}"),
    }
}

/// A client for the test servers on 127.0.0.1 (never through a proxy).
pub fn http_client() -> reqwest::Client {
    reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("a reqwest client")
}

/// Sends a request and waits for the response head.
pub async fn send(request: reqwest::RequestBuilder) -> reqwest::Response {
    within("the response head", request.send())
        .await
        .expect("the request is answered")
}

/// Sends a request and reads its response to the end. The future owns what it needs, so it
/// can be spawned.
pub async fn reply(request: reqwest::RequestBuilder) -> Reply {
    Reply::read(send(request).await).await
}

/// A response read to its end.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub async fn read(response: reqwest::Response) -> Self {
        let status = response.status().as_u16();
        let headers = response.headers().clone();
        let body = within("the response body", response.bytes())
            .await
            .expect("the body is read");
        Self {
            status,
            headers,
            body,
        }
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().expect("ASCII"))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text()))
    }

    /// `Retry-After`, which must be there and be whole seconds.
    pub fn retry_after(&self) -> u64 {
        let value = self.header("retry-after").expect("a Retry-After header");
        value
            .parse()
            .unwrap_or_else(|e| panic!("Retry-After {value:?} is not whole seconds: {e}"))
    }

    /// The JSON of a 200 from a handler.
    #[track_caller]
    pub fn ok(&self) -> Value {
        assert_eq!(self.status, 200, "{}", self.text());
        self.json()
    }
}
