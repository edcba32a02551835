//! One description of an app, served alike by either framework: routes, each behind its own
//! lock policy (or none), with handlers per method, and an authentication layer outside the
//! lock that turns an `x-user` header into a [`Principal`] request extension.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tower_redlock::fenced::StaleToken;
use tower_redlock::policy::LockPolicy;
use tower_redlock::LeaseHandle;

use super::probe::{Probe, Streams, NOT_STREAMED};

/// The header the authentication layer reads the principal's tenant from.
pub const USER_HEADER: &str = "x-user";

/// The request header the fencing scenarios pass the lease's fencing token in.
pub const FENCING_HEADER: &str = "fencing-token";

/// The authenticated principal: what the authentication layer puts into the request's
/// extensions when it has an [`USER_HEADER`].
#[derive(Clone, Debug)]
pub struct Principal {
    pub tenant: String,
}

/// An app: its routes, and how its server treats a client that goes away.
#[derive(Clone, Default)]
pub struct App {
    pub routes: Vec<Route>,
    /// Whether the server drops the handler of a request whose client closed the connection.
    pub cancel_on_close: bool,
}

impl App {
    pub fn new() -> Self {
        Self::default()
    }

    /// The app of most scenarios: `POST path` → [`Handler::Gated`] by `probe`, behind `policy`.
    pub fn gated(path: &'static str, policy: LockPolicy, probe: &Arc<Probe>) -> Self {
        Self::new().route(Route::locked(path, policy).post(Handler::gated(probe)))
    }

    pub fn route(mut self, route: Route) -> Self {
        self.routes.push(route);
        self
    }

    /// Makes the server drop the handler of a request whose client closed its connection:
    /// axum does it always; actix-web only with `h1_allow_half_closed(false)`, which this
    /// sets (its default keeps running the handler).
    pub fn cancel_on_close(mut self) -> Self {
        self.cancel_on_close = true;
        self
    }
}

/// The methods the apps serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Post,
    Put,
    Patch,
    Delete,
}

/// One route pattern (`/orders/{id}`, in both frameworks' syntax), its lock policy, and a
/// handler per method. A method without a handler answers 405.
#[derive(Clone)]
pub struct Route {
    pub path: &'static str,
    /// The lock middleware around the route's handlers (axum: `route_layer` on the method
    /// router; actix-web: `Route::wrap`), or
    /// none.
    pub policy: Option<LockPolicy>,
    pub handlers: Vec<(Method, Handler)>,
}

impl Route {
    /// A route behind the lock middleware with `policy`.
    pub fn locked(path: &'static str, policy: LockPolicy) -> Self {
        Self {
            path,
            policy: Some(policy),
            handlers: Vec::new(),
        }
    }

    pub fn on(mut self, method: Method, handler: Handler) -> Self {
        self.handlers.push((method, handler));
        self
    }

    pub fn post(self, handler: Handler) -> Self {
        self.on(Method::Post, handler)
    }

    pub fn get(self, handler: Handler) -> Self {
        self.on(Method::Get, handler)
    }

    pub fn put(self, handler: Handler) -> Self {
        self.on(Method::Put, handler)
    }
}

/// What a handler does.
#[derive(Clone)]
pub enum Handler {
    /// Passes the probe's gate, then answers with what it saw ([`Seen::report`]).
    Gated(Arc<Probe>),
    /// Answers at once with what it saw.
    Report,
    /// Streams the body the test writes through [`Streams::next`], or answers
    /// [`NOT_STREAMED`].
    Streaming(Arc<Streams>),
    /// Passes the probe's gate (whose `started` counts the runs), reads the request body and
    /// makes a payment: a fresh `payment_id` per run, answered as [`Payment`] says.
    Payment(Arc<Probe>, Payment),
    /// Writes its request's path through a fenced store with the lease's fencing token, after
    /// passing the probe's gate when the query says `pause`: `200` `{"written": token}`, or
    /// the store's [`StaleToken`] as the framework renders it (`409`).
    Fenced(Arc<Probe>, FencedWrite),
}

/// A fenced store's write, `(token, value)`: refused with [`StaleToken`] when the data was
/// written with a newer token.
pub type FencedWrite = Arc<
    dyn Fn(u64, String) -> Pin<Box<dyn Future<Output = Result<(), StaleToken>> + Send>>
        + Send
        + Sync,
>;

/// How a [`Handler::Payment`] answers.
#[derive(Clone)]
pub enum Payment {
    /// `201`, the payment as JSON ([`Payment::json`]) with the request body echoed, and the
    /// headers of [`Payment::headers`].
    Created,
    /// `500` (`{"error": .., "payment_id": ..}`) while the counter is above zero (counting it
    /// down), then as [`Payment::Created`].
    FailingFirst(Arc<AtomicUsize>),
    /// `200`, `application/octet-stream`, a body of [`large_body`]`(n)` (its length known).
    Large(usize),
}

/// The `n`-byte body of a [`Payment::Large`] answer: a pattern that shows any byte out of
/// place.
pub fn large_body(n: usize) -> Bytes {
    (0..n).map(|i| (i % 251) as u8).collect::<Vec<u8>>().into()
}

/// A payment id unique in this test process.
fn new_payment_id() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(1);
    format!("pay_{}", NEXT.fetch_add(1, SeqCst))
}

impl Payment {
    /// The response headers of a created payment: some stored (a repeated one among them),
    /// and a `Set-Cookie`, which is not stored by default.
    pub fn headers(id: &str) -> Vec<(&'static str, String)> {
        vec![
            ("content-type", "application/json".into()),
            ("location", format!("/payments/{id}")),
            ("x-payment-id", id.into()),
            ("x-ledger-tag", "first".into()),
            ("x-ledger-tag", "second".into()),
            ("cache-control", "no-store".into()),
            ("set-cookie", format!("session={id}; Path=/; HttpOnly")),
        ]
    }

    /// The payment's JSON: its id, what the handler saw, and the request body as text.
    pub fn json(id: &str, seen: &Seen) -> Value {
        let body = seen.body.as_deref().unwrap_or_default();
        json!({
            "payment_id": id,
            "method": seen.method,
            "path": seen.path,
            "tenant": seen.principal.as_ref().map(|p| p.tenant.clone()),
            "locked": seen.lease.is_some(),
            "resource": seen.lease.as_ref().map(|l| l.resource().to_owned()),
            "body": String::from_utf8_lossy(body),
            "body_len": body.len(),
        })
    }

    fn answer(&self, seen: &Seen) -> Answer {
        let id = new_payment_id();
        if let Self::FailingFirst(left) = self {
            if left
                .fetch_update(SeqCst, SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                let body = json!({"error": "the ledger is down", "payment_id": id});
                return Answer::Full {
                    status: 500,
                    headers: vec![("content-type", "application/json".into())],
                    body: body.to_string().into(),
                };
            }
        }
        match self {
            Self::Created | Self::FailingFirst(_) => Answer::Full {
                status: 201,
                headers: Self::headers(&id),
                body: Self::json(&id, seen).to_string().into(),
            },
            Self::Large(n) => Answer::Full {
                status: 200,
                headers: vec![
                    ("content-type", "application/octet-stream".into()),
                    ("x-payment-id", id),
                ],
                body: large_body(*n),
            },
        }
    }
}

impl Handler {
    pub fn gated(probe: &Arc<Probe>) -> Self {
        Self::Gated(probe.clone())
    }

    pub fn streaming(streams: &Arc<Streams>) -> Self {
        Self::Streaming(streams.clone())
    }

    /// [`Handler::Payment`] answering [`Payment::Created`].
    pub fn payment(probe: &Arc<Probe>) -> Self {
        Self::Payment(probe.clone(), Payment::Created)
    }

    /// Whether the glue reads the request body into [`Seen::body`] for this handler.
    pub fn reads_body(&self) -> bool {
        matches!(self, Self::Payment(..))
    }

    /// Runs the handler on what the framework glue saw of the request.
    pub async fn answer(&self, seen: Seen) -> Answer {
        match self {
            Self::Gated(probe) => {
                probe.pass().await;
                Answer::Json(seen.report())
            }
            Self::Report => Answer::Json(seen.report()),
            Self::Streaming(streams) => match streams.take() {
                Some(body) => Answer::Stream(body),
                None => Answer::Text(NOT_STREAMED),
            },
            Self::Payment(probe, payment) => {
                probe.pass().await;
                payment.answer(&seen)
            }
            Self::Fenced(probe, write) => {
                if seen.path.contains("pause") {
                    probe.pass().await;
                }
                let token = seen.lease.as_ref().and_then(LeaseHandle::fencing_token);
                let token = token.expect("a fenced handler runs under a fencing client");
                match write(token, seen.path.clone()).await {
                    Ok(()) => Answer::Json(json!({ "written": token })),
                    Err(stale) => Answer::Stale(stale),
                }
            }
        }
    }
}

/// What a handler saw of its request, through each framework's own extractors.
pub struct Seen {
    pub method: String,
    /// The path and, if there is one, `?` and the query.
    pub path: String,
    /// The request body, read when the handler [reads it](Handler::reads_body).
    pub body: Option<Bytes>,
    /// The `LeaseHandle` extractor, as `Option<LeaseHandle>`.
    pub lease: Option<LeaseHandle>,
    /// Whether the `Unlocked` (fail-open) marker is in the request's extensions.
    pub unlocked: bool,
    pub principal: Option<Principal>,
    /// The request's [`FENCING_HEADER`], as the handler got it.
    pub fencing_header: Option<String>,
}

impl Seen {
    /// What the handler saw, as JSON.
    pub fn report(&self) -> Value {
        let lease = self.lease.as_ref();
        json!({
            "method": self.method,
            "locked": lease.is_some(),
            "unlocked": self.unlocked,
            "resource": lease.map(|l| l.resource().to_owned()),
            "validity_ms": lease.map(|l| l.validity().as_millis() as u64),
            "lost": lease.map(LeaseHandle::is_lost),
            "extensions": lease.map(LeaseHandle::extension_count),
            "tenant": self.principal.as_ref().map(|p| p.tenant.clone()),
            "fencing_token": lease.and_then(LeaseHandle::fencing_token),
            "fencing_header": self.fencing_header,
        })
    }
}

/// A handler's answer, which the glue turns into its framework's response: `200` with a JSON
/// body, a text body, or a body streamed from the channel (ended when the test drops the
/// sender); or any status, headers (appended in this order) and a body of known length.
pub enum Answer {
    Json(Value),
    /// A fenced write refused: rendered by the framework's own impl (`IntoResponse`,
    /// `ResponseError`).
    Stale(StaleToken),
    Text(&'static str),
    Stream(mpsc::Receiver<Bytes>),
    Full {
        status: u16,
        headers: Vec<(&'static str, String)>,
        body: Bytes,
    },
}

/// The chunks of a streamed answer, for either framework's streaming body.
pub fn chunks(
    body: mpsc::Receiver<Bytes>,
) -> impl futures_util::Stream<Item = Result<Bytes, std::convert::Infallible>> {
    futures_util::stream::unfold(body, |mut rx| async move {
        let chunk = rx.recv().await?;
        Some((Ok(chunk), rx))
    })
}
