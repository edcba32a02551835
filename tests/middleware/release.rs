//! When the lock goes: at the response (the default), at the body's end
//! (`release_on_body_end`), and in the background when the client cancels the request.

use std::time::Instant;

use bytes::Bytes;
use tokio::sync::mpsc;
use tower_redlock::policy::{LockPolicy, ReleaseOn};

use crate::harness::app::{App, Handler, Route};
use crate::harness::keys::{default_policy, policy_of, redis_key};
use crate::harness::probe::{Probe, Streams, NOT_STREAMED};
use crate::harness::Framework;
use crate::support::apps::*;
use crate::support::http::{http_client, send, within};

/// `POST /payments` → [`Handler::Streaming`] from `streams`, behind `policy`.
pub fn streaming_app(
    policy: tower_redlock::policy::LockPolicy,
    streams: &std::sync::Arc<Streams>,
) -> App {
    App::new().route(Route::locked(PATH, policy).post(Handler::streaming(streams)))
}

/// Sends `chunk` through the handler's body and reads it on the client's side.
pub async fn stream_through(
    body: &mpsc::Sender<Bytes>,
    response: &mut reqwest::Response,
    chunk: &str,
) {
    body.send(Bytes::copy_from_slice(chunk.as_bytes()))
        .await
        .expect("the body is streaming");
    let got = within("a chunk", response.chunk())
        .await
        .expect("the body is read")
        .expect("a chunk, not the end");
    assert_eq!(got, chunk.as_bytes());
}

/// Reads the rest of a streaming response, to its clean end.
pub async fn rest_of(mut response: reqwest::Response) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(chunk) = within("a chunk", response.chunk())
        .await
        .expect("the body ends cleanly")
    {
        out.extend_from_slice(&chunk);
    }
    out
}

/// With `release_on_body_end`, a streaming response holds the key until its last chunk has
/// been sent: meanwhile the same key gets a 409 (and its handler never runs); the end of the
/// body is reported once the release has returned, so the same key then gets a 200 at once.
pub async fn release_on_body_end_holds_the_key_while_the_body_streams<F: Framework>() {
    const KEY: &str = "stream-1";
    let (m, redlock) = masters_and_client().await;
    let policy = policy_of(&redlock)
        .release_on(ReleaseOn::BodyEnd)
        .build()
        .expect("a valid policy");
    let streams = Streams::new();
    let app = F::serve(&streaming_app(policy, &streams)).await;
    let http = http_client();
    let key = redis_key(PATH, PATH, KEY);

    let body = streams.next();
    let mut response = send(post_with(&http, &app.url(PATH), &[KEY])).await;
    assert_eq!(response.status(), 200);
    stream_through(&body, &mut response, "first ").await;
    // Streaming: the key is still held, and the same key is refused.
    assert_held(&m, &key).await;
    assert_conflict(
        &post_key(&http, &app.url(PATH), KEY).await,
        LockPolicy::DEFAULT_TTL,
    );
    assert_eq!(streams.served(), 1, "the refused request ran");
    stream_through(&body, &mut response, "second").await;
    assert_held(&m, &key).await;

    body.send(Bytes::from_static(b"last")).await.expect("read");
    drop(body);
    assert_eq!(rest_of(response).await, b"last");
    // Released on a quorum when the end was reported; the last master may follow in the
    // background (a release returns at quorum).
    assert_released_on_quorum(&m, &key).await;
    let after = post_key(&http, &app.url(PATH), KEY).await;
    assert_eq!((after.status, after.text().as_str()), (200, NOT_STREAMED));
    assert_released(&m, &key).await;
    assert_all_empty(&m).await;
    drop(http);
    app.stop().await;
}

/// With the default (release at the response), the key is gone as soon as the response head
/// arrives, though its body still streams: the same key then gets a 200.
pub async fn release_on_response_frees_the_key_while_the_body_streams<F: Framework>() {
    const KEY: &str = "stream-2";
    let (m, redlock) = masters_and_client().await;
    let streams = Streams::new();
    let app = F::serve(&streaming_app(default_policy(&redlock), &streams)).await;
    let http = http_client();
    let key = redis_key(PATH, PATH, KEY);

    let body = streams.next();
    let mut response = send(post_with(&http, &app.url(PATH), &[KEY])).await;
    assert_eq!(response.status(), 200);
    // The middleware released before it handed the response on: no waiting for a quorum
    // (the last master may follow in the background).
    assert_released_on_quorum(&m, &key).await;
    assert_released(&m, &key).await;
    stream_through(&body, &mut response, "first ").await;
    let again = post_key(&http, &app.url(PATH), KEY).await;
    assert_eq!((again.status, again.text().as_str()), (200, NOT_STREAMED));
    stream_through(&body, &mut response, "second").await;
    body.send(Bytes::from_static(b"last")).await.expect("read");
    drop(body);
    assert_eq!(rest_of(response).await, b"last");
    assert_all_empty(&m).await;
    drop(http);
    app.stop().await;
}

/// A client that gives up while the handler holds the lock: the server drops the handler
/// (actix-web only with `h1_allow_half_closed(false)`: see [`App::cancel_on_close`]), and the
/// lock is released in the background — long before its 30 s ttl — so the same key gets a 200.
pub async fn cancelled_request_releases_in_the_background<F: Framework>() {
    const KEY: &str = "order-4";
    let (m, redlock) = masters_and_client().await;
    let probe = Probe::new();
    let app = App::gated(PATH, default_policy(&redlock), &probe).cancel_on_close();
    let app = F::serve(&app).await;
    let http = http_client();
    let key = redis_key(PATH, PATH, KEY);

    let request = tokio::spawn(post_key(&http, &app.url(PATH), KEY));
    probe.until_started(1).await;
    assert_held(&m, &key).await;
    // The client gives up: its request and connection are dropped.
    probe.client_gives_up(request, 1).await;
    assert_eq!(probe.inside(), 0);
    let started = Instant::now();
    assert_released(&m, &key).await;
    eprintln!(
        "{}: released {:?} after the handler was dropped",
        F::NAME,
        started.elapsed()
    );
    assert_eq!(probe.completed(), 0, "the cancelled handler ran to its end");

    probe.open();
    let v = post_key(&http, &app.url(PATH), KEY).await.ok();
    assert_eq!(v["locked"], true, "{v}");
    assert_eq!((probe.started(), probe.completed()), (2, 1));
    assert_all_empty(&m).await;
    drop(http);
    app.stop().await;
}
