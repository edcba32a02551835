//! The shared side of the axum and actix-web tests: the apps' client settings, requests with
//! an `Idempotency-Key`, problem+json checks, and what the masters must show.

use std::future::Future;
use std::time::{Duration, Instant};

use reqwest::header::HeaderValue;
use serde_json::Value;
use tokio::sync::mpsc;
use tower_redlock::Redlock;

use super::http::{send, within, Reply};
use super::{eventually, is_token, warm_up, Masters};

/// How long a release may take to show on every master: far below the ttls used, so a key
/// that is gone in time was released, not expired.
pub const RELEASED_WITHIN: Duration = Duration::from_secs(5);
/// The per-node timeout of the apps' clients: generous, so that a loaded machine does not
/// turn a slow answer into a 503 (no app test is about node timeouts; `super::NODE_TIMEOUT`
/// is the 200 ms of the lock tests).
pub const HTTP_NODE_TIMEOUT: Duration = Duration::from_millis(500);
/// The route most apps serve.
pub const PATH: &str = "/payments";
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// `POST url` with these `Idempotency-Key` values (none, one, or several header lines).
pub fn post_with(http: &reqwest::Client, url: &str, keys: &[&str]) -> reqwest::RequestBuilder {
    with_keys(http.post(url), keys)
}

/// `request` with these `Idempotency-Key` values (none, one, or several header lines).
pub fn with_keys(request: reqwest::RequestBuilder, keys: &[&str]) -> reqwest::RequestBuilder {
    keys.iter()
        .fold(request, |r, key| r.header(IDEMPOTENCY_KEY, *key))
}

/// `POST url` with these raw `Idempotency-Key` header values (any bytes a header may carry).
pub fn post_values(
    http: &reqwest::Client,
    url: &str,
    values: &[HeaderValue],
) -> reqwest::RequestBuilder {
    values
        .iter()
        .fold(http.post(url), |r, v| r.header(IDEMPOTENCY_KEY, v.clone()))
}

/// The `Idempotency-Key`s every framework must reject with `400`: (what, the header lines,
/// problem type). Every raw value carries "zebra", so that a check can find an echo of it.
pub fn bad_keys() -> Vec<(&'static str, Vec<HeaderValue>, &'static str)> {
    let value = |v: &[u8]| HeaderValue::from_bytes(v).expect("a valid header value");
    // 256 and 260 bytes: over the bound of 255.
    let (z256, long) = (format!("zebra{}", "z".repeat(251)), "zebra".repeat(52));
    vec![
        ("missing", vec![], "/problems/lock-key-missing"),
        ("bare empty", vec![value(b"")], "/problems/lock-key-empty"),
        (
            "quoted empty",
            vec![value(b"\"\"")],
            "/problems/lock-key-empty",
        ),
        ("blank", vec![value(b"   ")], "/problems/lock-key-empty"),
        (
            "256 bytes",
            vec![value(z256.as_bytes())],
            "/problems/lock-key-too-long",
        ),
        (
            "256 bytes, quoted",
            vec![value(format!("\"{z256}\"").as_bytes())],
            "/problems/lock-key-too-long",
        ),
        (
            "260 bytes, quoted",
            vec![value(format!("\"{long}\"").as_bytes())],
            "/problems/lock-key-too-long",
        ),
        (
            "unterminated quote",
            vec![value(b"\"zebra")],
            "/problems/lock-key-malformed",
        ),
        (
            "bare with a space",
            vec![value(b"zebra 1")],
            "/problems/lock-key-malformed",
        ),
        (
            "non-ASCII",
            vec![value(b"zebra-\xff\xfe")],
            "/problems/lock-key-malformed",
        ),
        (
            "after the quote",
            vec![value(b"\"zebra\" x")],
            "/problems/lock-key-malformed",
        ),
        (
            "twice",
            vec![value(b"zebra-1"), value(b"zebra-2")],
            "/problems/lock-key-duplicate",
        ),
    ]
}

/// `POST url` with `Idempotency-Key: key`, read to the end. The future owns what it needs, so
/// it can be spawned.
pub fn post_key(
    http: &reqwest::Client,
    url: &str,
    key: &str,
) -> impl Future<Output = Reply> + Send + 'static {
    let request = post_with(http, url, &[key]);
    async move { Reply::read(send(request).await).await }
}

/// A problem+json rejection with this status and problem type; returns the JSON.
#[track_caller]
pub fn assert_problem(reply: &Reply, status: u16, problem: &str) -> Value {
    assert_eq!(reply.status, status, "{}", reply.text());
    assert_eq!(
        reply.header("content-type"),
        Some("application/problem+json")
    );
    let v = reply.json();
    assert_eq!(v["status"], status, "{v}");
    assert_eq!(v["type"], problem, "{v}");
    assert!(v["title"].is_string() && v["detail"].is_string(), "{v}");
    v
}

/// A 409 whose `Retry-After` is the holder's remaining ttl in whole seconds, rounded up:
/// `1..=ceil(ttl)`, also in the body.
#[track_caller]
pub fn assert_conflict(reply: &Reply, ttl: Duration) {
    let v = assert_problem(reply, 409, "/problems/lock-contended");
    let after = reply.retry_after();
    let ceil = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    assert!(
        (1..=ceil).contains(&after),
        "Retry-After {after} for a ttl of {ttl:?}"
    );
    assert_eq!(v["retry_after"], after, "{v}");
}

/// A warmed-up client of `masters` with a [`HTTP_NODE_TIMEOUT`] per node and no retries. Each app
/// instance gets its own, as separate processes would.
pub async fn client_of(masters: &Masters) -> Redlock {
    let redlock = masters
        .builder()
        .node_timeout(HTTP_NODE_TIMEOUT)
        .build()
        .expect("a valid client");
    warm_up(&redlock, masters).await;
    redlock
}

/// Three masters and a warmed-up client of them.
pub async fn masters_and_client() -> (Masters, Redlock) {
    let masters = Masters::start(3);
    let redlock = client_of(&masters).await;
    (masters, redlock)
}

/// On how many masters `key` exists.
pub async fn held_on(masters: &Masters, key: &str) -> usize {
    masters.values(key).await.iter().flatten().count()
}

/// The lock on `key` is taken: a quorum of masters hold one lock token. (After a race, the
/// other masters may hold nothing — a master a loser took first is freed later, and not
/// re-taken — or, for a moment, a loser's token that is being released in the background.)
pub async fn assert_held_on_quorum(masters: &Masters, key: &str) {
    let values = masters.values(key).await;
    let quorum = values
        .iter()
        .flatten()
        .find(|v| values.iter().filter(|w| w.as_ref() == Some(*v)).count() >= 2);
    let Some(token) = quorum else {
        panic!("{key} is held on no quorum: {values:?}");
    };
    assert!(is_token(token), "{key} = {token:?} is not a lock token");
}

/// The uncontended lock on `key` is taken: on a quorum at once, on every master soon.
pub async fn assert_held(masters: &Masters, key: &str) {
    assert_held_on_quorum(masters, key).await;
    eventually(
        format_args!("every master holds {key}"),
        RELEASED_WITHIN,
        || async { held_on(masters, key).await == masters.len() },
    )
    .await;
    let values: Vec<String> = masters.values(key).await.into_iter().flatten().collect();
    assert!(values.iter().all(|v| *v == values[0]), "{key}: {values:?}");
}

/// A release has returned for `key`: it is gone from a quorum of masters now (the last one
/// may follow in the background).
pub async fn assert_released_on_quorum(masters: &Masters, key: &str) {
    let held = held_on(masters, key).await;
    assert!(held <= 1, "{key} is still held on {held} of 3 masters");
}

/// `key` is released on every master well before its ttl could expire it.
pub async fn assert_released(masters: &Masters, key: &str) {
    let started = Instant::now();
    while !masters.absent_everywhere(key).await {
        if started.elapsed() > RELEASED_WITHIN {
            panic!(
                "{key} is still held {RELEASED_WITHIN:?} later (PTTL on each master: {:?} ms)",
                masters.pttls(key).await
            );
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// No master holds any key.
pub async fn assert_all_empty(masters: &Masters) {
    eventually("every master is empty", RELEASED_WITHIN, || async {
        masters.dbsizes().await.iter().all(|n| *n == 0)
    })
    .await;
}

/// Sends `n` concurrent `POST`s with `key`, spread over `urls`; their replies arrive on the
/// receiver as they complete.
pub fn burst(
    http: &reqwest::Client,
    urls: &[String],
    key: &str,
    n: usize,
) -> mpsc::UnboundedReceiver<Reply> {
    let (replies_tx, replies) = mpsc::unbounded_channel();
    for i in 0..n {
        let request = post_key(http, &urls[i % urls.len()], key);
        let replies_tx = replies_tx.clone();
        tokio::spawn(async move {
            let _ = replies_tx.send(request.await);
        });
    }
    replies
}

pub async fn next_reply(replies: &mut mpsc::UnboundedReceiver<Reply>) -> Reply {
    within("a reply", replies.recv())
        .await
        .expect("a request task panicked")
}
