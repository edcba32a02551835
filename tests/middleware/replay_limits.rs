//! Replay and bodies: a response too large to store or streamed is sent intact and its key
//! marked completed (duplicates `409`, the handler runs once); a request body over the
//! fingerprint limit is `413` before anything is locked, whether its length is declared or
//! it is chunked; a fingerprinted body reaches the handler unchanged, however it was framed.

use bytes::Bytes;
use tower_redlock::replay::Replay;

use crate::harness::app::{large_body, App, Handler, Payment, Route};
use crate::harness::keys::redis_key;
use crate::harness::probe::{Probe, Streams};
use crate::harness::{raw, Framework};
use crate::replay::{
    assert_not_stored, assert_ran, assert_replay_of, pay, records_on, replay_policy, BODY,
};
use crate::support::apps::*;
use crate::support::http::{http_client, reply, within};

/// With the default response limit (64 KiB): a 60 KiB response is stored and replayed byte
/// for byte; a 100 KiB one and a streamed one (length unknown) are sent intact, their keys are
/// marked completed on the masters (the lock ended), and duplicates get `409`
/// `/problems/idempotency-completed-not-stored` without `Retry-After`: each handler ran once.
pub async fn replay_a_response_too_large_or_streamed_is_not_stored<F: Framework>() {
    const KEY: &str = "\"export-1\"";
    const FITS: usize = 60 << 10;
    const TOO_LARGE: usize = 100 << 10;
    const SMALL: &str = "/exports/small";
    const LARGE: &str = "/exports/large";
    const STREAM: &str = "/exports/stream";
    let (m, redlock) = masters_and_client().await;
    let (small, large) = (Probe::open_gate(), Probe::open_gate());
    let streams = Streams::new();
    let route = |path| Route::locked(path, replay_policy(&redlock, Replay::new()));
    let app = App::new()
        .route(route(SMALL).post(Handler::Payment(small.clone(), Payment::Large(FITS))))
        .route(route(LARGE).post(Handler::Payment(large.clone(), Payment::Large(TOO_LARGE))))
        .route(route(STREAM).post(Handler::streaming(&streams)));
    let app = F::serve(&app).await;
    let http = http_client();

    let first = reply(post_with(&http, &app.url(SMALL), &[KEY])).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.body, large_body(FITS), "the response body changed");
    let duplicate = reply(post_with(&http, &app.url(SMALL), &[KEY])).await;
    assert_replay_of(&first, &duplicate);
    assert_eq!(small.started(), 1);

    let first = reply(post_with(&http, &app.url(LARGE), &[KEY])).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.header(Replay::REPLAYED_HEADER), None);
    assert_eq!(
        first.body,
        large_body(TOO_LARGE),
        "the response body changed"
    );
    let lock = redis_key(LARGE, LARGE, KEY);
    assert!(
        records_on(&m, &lock, 0..3).await >= 2,
        "not marked completed"
    );
    for _ in 0..2 {
        assert_not_stored(&reply(post_with(&http, &app.url(LARGE), &[KEY])).await);
    }
    assert_eq!(large.started(), 1, "a duplicate ran the handler");
    assert_released(&m, &lock).await;

    let chunks = ["alpha-", "beta-", "gamma"];
    let body = streams.next();
    let writer = tokio::spawn(async move {
        for chunk in chunks {
            body.send(Bytes::from_static(chunk.as_bytes()))
                .await
                .expect("the handler streams");
        }
    });
    let first = reply(post_with(&http, &app.url(STREAM), &[KEY])).await;
    within("the stream writer", writer).await.expect("no panic");
    assert_eq!(first.status, 200);
    assert_eq!(first.header(Replay::REPLAYED_HEADER), None);
    assert_eq!(first.text(), chunks.concat());
    for _ in 0..2 {
        assert_not_stored(&reply(post_with(&http, &app.url(STREAM), &[KEY])).await);
    }
    assert_eq!(streams.served(), 1, "a duplicate ran the handler");
    assert_released(&m, &redis_key(STREAM, STREAM, KEY)).await;
    drop(http);
    app.stop().await;
}

/// `Replay::body_limit(1024)`: a request declaring 1025 bytes (none sent) and a chunked one
/// whose chunks pass 1024 bytes (never ended) are `413` `/problems/request-body-too-large`;
/// the handler does not run and no master holds anything. Then the same key with a body of
/// exactly 1024 bytes, declared and chunked, runs: the `413`s recorded and locked nothing.
pub async fn replay_a_body_over_the_limit_is_413<F: Framework>() {
    const KEY: &str = "\"upload-1\"";
    const CHUNKED_KEY: &str = "\"upload-2\"";
    const LIMIT: usize = 1024;
    let (m, redlock) = masters_and_client().await;
    let probe = Probe::open_gate();
    let policy = replay_policy(&redlock, Replay::new().body_limit(LIMIT));
    let app =
        F::serve(&App::new().route(Route::locked(PATH, policy).post(Handler::payment(&probe))))
            .await;
    let http = http_client();
    let headers = [
        ("idempotency-key", KEY),
        ("content-type", "application/json"),
    ];

    let declared = raw::post_declared(app.addr(), PATH, &headers, LIMIT + 1, b"").await;
    assert_problem(&declared, 413, "/problems/request-body-too-large");
    let over = [&[b'a'; 600][..], &[b'b'; 600][..]];
    let chunked = raw::post_chunked(app.addr(), PATH, &headers, &over, false).await;
    assert_problem(&chunked, 413, "/problems/request-body-too-large");
    for rejected in [&declared, &chunked] {
        assert_eq!(rejected.header("retry-after"), None);
    }
    assert_eq!(
        probe.started(),
        0,
        "a handler ran for a body over the limit"
    );
    assert_eq!(m.dbsizes().await, [0, 0, 0], "a 413 locked or recorded");

    let fits = "x".repeat(LIMIT);
    let ran = reply(pay(&http, &app.url(PATH), KEY, &fits)).await;
    assert_ran(&ran);
    assert_eq!(ran.json()["body_len"], LIMIT);
    let headers = [
        ("idempotency-key", CHUNKED_KEY),
        ("content-type", "application/json"),
    ];
    let halves = [&fits.as_bytes()[..LIMIT / 2], &fits.as_bytes()[LIMIT / 2..]];
    let ran = raw::post_chunked(app.addr(), PATH, &headers, &halves, true).await;
    assert_ran(&ran);
    assert_eq!(ran.json()["body_len"], LIMIT);
    assert_eq!(probe.started(), 2);
    drop(http);
    app.stop().await;
}

/// The fingerprinted body reaches the handler unchanged: a 20 KiB multi-byte UTF-8 body sent
/// with a length, and another sent in uneven chunks, are echoed byte for byte; and since the
/// fingerprint is over the bytes, not their framing, the chunked request sent again with a
/// `Content-Length` is replayed.
pub async fn replay_the_handler_gets_the_body_unchanged<F: Framework>() {
    const KEY: &str = "\"order-echo\"";
    const CHUNKED_KEY: &str = "\"order-echo-chunked\"";
    let (_m, redlock) = masters_and_client().await;
    let probe = Probe::open_gate();
    let policy = replay_policy(&redlock, Replay::new());
    let app =
        F::serve(&App::new().route(Route::locked(PATH, policy).post(Handler::payment(&probe))))
            .await;
    let http = http_client();

    let body: String = (0..1400)
        .map(|i| format!("zahlung-{}-€✓;", i % 7))
        .collect();
    assert!(body.len() > 20 << 10);
    let first = reply(pay(&http, &app.url(PATH), KEY, &body)).await;
    assert_ran(&first);
    let v = first.json();
    assert_eq!(v["body"], body.as_str(), "the handler got another body");
    assert_eq!(v["body_len"], body.len());

    // Chunk boundaries inside multi-byte characters.
    let bytes = BODY.repeat(40).replace("EUR", "€UR");
    let bytes = bytes.as_bytes();
    let chunks = [&bytes[..1], &bytes[1..17], &bytes[17..700], &bytes[700..]];
    let headers = [
        ("idempotency-key", CHUNKED_KEY),
        ("content-type", "application/json"),
    ];
    let chunked = raw::post_chunked(app.addr(), PATH, &headers, &chunks, true).await;
    assert_ran(&chunked);
    assert_eq!(
        chunked.json()["body"].as_str().map(str::as_bytes),
        Some(bytes)
    );
    let again = reply(pay(
        &http,
        &app.url(PATH),
        CHUNKED_KEY,
        std::str::from_utf8(bytes).unwrap(),
    ))
    .await;
    assert_replay_of(&chunked, &again);
    assert_eq!(probe.started(), 2);
    drop(http);
    app.stop().await;
}
