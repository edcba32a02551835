//! The tower service in process, no server (axum's `RedlockLayer` only): the lifecycle of the
//! service, its future and its body — after call, after the response, after the body's end,
//! after a drop — as tower-http's in-flight-requests test checks it; bodies of known length;
//! and the keep-alive timer that costs no task for a quick handler.

use std::convert::Infallible;
use std::sync::Arc;

use axum::http::{Request, Response};
use axum::routing::post;
use axum::{Json, Router};
use bytes::Bytes;
use futures_util::{stream, FutureExt, StreamExt};
use http_body::Frame;
use http_body_util::{BodyExt, Empty, StreamBody};
use serde_json::{json, Value};
use tokio::sync::mpsc;
use tower::util::BoxCloneService;
use tower::{Layer, Service, ServiceExt};
use tower_redlock::key::{IdempotencyKey, KeyExtractor, SimpleRequest};
use tower_redlock::policy::{LockPolicy, ReleaseOn};
use tower_redlock::tower::RequestBody;
use tower_redlock::{LeaseHandle, Redlock, RedlockLayer};

use crate::harness::probe::Probe;
use crate::support::apps::*;
use crate::support::http::within;
use crate::support::{eventually, Masters};

/// A response body the test writes: each `Bytes` sent is one data frame, and dropping the
/// sender ends the body.
pub type TestBody = StreamBody<stream::BoxStream<'static, Result<Frame<Bytes>, Infallible>>>;

fn test_body() -> (mpsc::Sender<Bytes>, TestBody) {
    let (tx, rx) = mpsc::channel::<Bytes>(1);
    let frames = stream::unfold(rx, |mut rx| async move {
        let chunk = rx.recv().await?;
        Some((Ok(Frame::data(chunk)), rx))
    });
    (tx, StreamBody::new(frames.boxed()))
}

/// Where the inner service hands the test the writing end of its response body.
type Bodies = mpsc::UnboundedSender<mpsc::Sender<Bytes>>;

/// The Redis key the layer locks for `Idempotency-Key: key` (no scope, default prefix; the
/// test clients add no key prefix).
pub fn redis_key(key: &str) -> String {
    let req = SimpleRequest::new("POST", PATH).header(IDEMPOTENCY_KEY, key);
    IdempotencyKey::required()
        .extract(&req)
        .expect("a valid key")
        .expect("a key")
        .as_str()
        .to_owned()
}

pub type InnerService =
    BoxCloneService<Request<RequestBody<Empty<Bytes>>>, Response<TestBody>, Infallible>;

/// An inner service that passes the probe's gate, then answers with a [`test_body`] whose
/// writing end it hands to the test.
fn body_service(probe: &Arc<Probe>, bodies: Bodies) -> InnerService {
    let probe = probe.clone();
    BoxCloneService::new(tower::service_fn(
        move |_req: Request<RequestBody<Empty<Bytes>>>| {
            let (probe, bodies) = (probe.clone(), bodies.clone());
            async move {
                probe.pass().await;
                let (tx, body) = test_body();
                bodies.send(tx).expect("the test is listening");
                Ok(Response::new(body))
            }
        },
    ))
}

pub fn request(key: &str) -> Request<Empty<Bytes>> {
    Request::post(PATH)
        .header(IDEMPOTENCY_KEY, key)
        .body(Empty::new())
        .expect("a valid request")
}

/// What an in-process lifecycle test needs.
pub struct Lifecycle {
    pub masters: Masters,
    pub policy: LockPolicy,
    pub service: tower_redlock::tower::RedlockService<InnerService>,
    pub probe: Arc<Probe>,
    pub bodies: mpsc::UnboundedReceiver<mpsc::Sender<Bytes>>,
}

pub async fn lifecycle(policy: impl FnOnce(Redlock) -> LockPolicy) -> Lifecycle {
    let (masters, redlock) = masters_and_client().await;
    let probe = Probe::open_gate();
    let (bodies_tx, bodies) = mpsc::unbounded_channel();
    let policy = policy(redlock);
    let service = RedlockLayer::new(policy.clone()).layer(body_service(&probe, bodies_tx));
    Lifecycle {
        masters,
        policy,
        service,
        probe,
        bodies,
    }
}

pub async fn next_data<B>(body: &mut B) -> Option<Bytes>
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
            .release_on(ReleaseOn::BodyEnd)
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
    assert_all_empty(&t.masters).await;
}

/// The lifecycle fixture releasing at the body's end.
async fn lifecycle_at_body_end() -> Lifecycle {
    lifecycle(|redlock| {
        LockPolicy::builder(redlock, IdempotencyKey::required())
            .release_on(ReleaseOn::BodyEnd)
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
    // Still in the acquisition: the handler has not started.
    assert_eq!(t.probe.started(), 0, "{future:?}");
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
    let mut service = RedlockLayer::new(t.policy.clone()).layer(body_service(&probe, bodies_tx));

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

/// A handler that finishes before ttl/3 costs no keep-alive task: none is alive while it runs,
/// though it yields (so the response future is pending and its timer armed). Handlers that
/// outlive ttl/3 are kept alive (the `keep_alive` scenarios).
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
        .layer(RedlockLayer::new(
            LockPolicy::builder(Redlock::in_memory(), IdempotencyKey::required())
                .build()
                .unwrap(),
        ));
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
        .release_on(ReleaseOn::BodyEnd)
        .build()
        .expect("a valid policy");
    let key = redis_key(KEY);

    let sized = RedlockLayer::new(policy.clone()).layer(tower::service_fn(
        |_req: Request<RequestBody<Empty<Bytes>>>| async {
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

    let empty = RedlockLayer::new(policy).layer(tower::service_fn(
        |_req: Request<RequestBody<Empty<Bytes>>>| async {
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

/// A body that says it has 10 bytes, sends 4 and fails.
struct BrokenBody(bool);

impl http_body::Body for BrokenBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let sent = std::mem::replace(&mut self.0, true);
        std::task::Poll::Ready(Some(if sent {
            Err(std::io::Error::other("the body broke"))
        } else {
            Ok(Frame::data(Bytes::from_static(b"half")))
        }))
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(10)
    }
}

/// Replay on, and the handler's response body (of known length, so it is read to be stored)
/// fails: the client gets a `500`, and the key is marked completed — the handler ran, so a
/// retry gets `409` completed-not-stored instead of running it again. A handler error (the
/// inner service's `Err`) is marked completed the same way.
#[tokio::test(flavor = "multi_thread")]
async fn replay_a_broken_body_or_an_error_marks_the_key_completed() {
    let (masters, redlock) = masters_and_client().await;
    let policy = LockPolicy::builder(redlock, IdempotencyKey::required())
        .replay(tower_redlock::replay::Replay::new())
        .build()
        .expect("a valid policy");
    let runs = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = runs.clone();
    let service = RedlockLayer::new(policy).layer(tower::service_fn(
        move |req: Request<RequestBody<Empty<Bytes>>>| {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            async move {
                if req.uri().query() == Some("fail") {
                    return Err(std::io::Error::other("the handler failed"));
                }
                Ok(Response::new(BrokenBody(false)))
            }
        },
    ));
    let completed_not_stored = |res: Response<_>| {
        assert_eq!(res.status(), 409);
        assert_eq!(res.headers().get("retry-after"), None);
    };

    let res = within(
        "the broken response",
        service.clone().oneshot(request("broken-1")),
    )
    .await
    .expect("an answer, not an error");
    assert_eq!(res.status(), 500, "a body that broke while read for replay");
    eventually("the key is marked completed", RELEASED_WITHIN, || async {
        masters.absent_everywhere(&redis_key("broken-1")).await
    })
    .await;
    let again = within("the retry", service.clone().oneshot(request("broken-1")))
        .await
        .expect("an answer");
    completed_not_stored(again);

    let mut failing = request("broken-2");
    *failing.uri_mut() = format!("{PATH}?fail").parse().expect("a uri");
    let err = within("the failing call", service.clone().oneshot(failing))
        .await
        .expect_err("the inner error");
    assert_eq!(err.to_string(), "the handler failed");
    let mut retry = request("broken-2");
    *retry.uri_mut() = format!("{PATH}?fail").parse().expect("a uri");
    let again = within("the retry", service.clone().oneshot(retry))
        .await
        .expect("an answer");
    completed_not_stored(again);
    assert_eq!(
        runs.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "a handler ran twice"
    );
}

/// Inside a router nested under a prefix, the path a key (or a replay fingerprint) is made of
/// is the whole path the client sent — as actix-web reports it — not the one axum strips.
#[tokio::test(flavor = "multi_thread")]
async fn a_nested_router_keys_by_the_whole_path() {
    use tower_redlock::key::PathKey;
    let policy = LockPolicy::builder(Redlock::in_memory(), PathKey)
        .build()
        .expect("a valid policy");
    let inner = Router::new()
        .route(
            "/pay",
            post(|lease: LeaseHandle| async move { lease.resource().to_owned() }),
        )
        .route_layer(RedlockLayer::new(policy));
    let app = Router::new().nest("/api", inner);
    let res = app
        .oneshot(
            Request::post("/api/pay")
                .body(axum::body::Body::empty())
                .expect("a request"),
        )
        .await
        .expect("infallible");
    let body = res.into_body().collect().await.expect("a body").to_bytes();
    let expected = PathKey
        .extract(&SimpleRequest::new("POST", "/api/pay"))
        .expect("a key")
        .expect("a key");
    assert_eq!(
        std::str::from_utf8(&body).expect("utf-8"),
        expected.as_str()
    );
}
