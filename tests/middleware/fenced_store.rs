//! Fencing through the middleware, where the data lives: the handler writes through a fenced
//! store (data in a Redis of its own) with the token of its `LeaseHandle`. The Kleppmann
//! scenario: a handler pauses past its lease, another request takes the key and writes, and
//! the paused handler's late write is refused — its client gets `409`
//! `/problems/fencing-token-stale`, not a `200`.

use std::sync::Arc;
use std::time::Duration;

use tower_redlock::fenced::StaleToken;
use tower_redlock::policy::LOCK_LOST_HEADER;
use tower_redlock::Redlock;

use crate::harness::app::{App, FencedWrite, Handler, Route};
use crate::harness::keys::{policy_of, redis_key};
use crate::harness::probe::Probe;
use crate::harness::Framework;
use crate::support::apps::*;
use crate::support::http::{http_client, within};
use crate::support::{eventually, warm_up, Masters, RedisServer};

/// The lock's ttl: the paused handler outlives it.
const TTL: Duration = Duration::from_millis(900);
/// The data's key in the data Redis.
const DATA: &str = "{ledger:1}";

/// A fenced `SET` of [`DATA`] on `server`.
fn fenced_store(server: &RedisServer) -> FencedWrite {
    let url = server.url();
    Arc::new(move |token, value| {
        let url = url.clone();
        Box::pin(async move {
            let client = redis::Client::open(url).expect("a redis url");
            let conn = client
                .get_multiplexed_async_connection()
                .await
                .expect("the data redis");
            let mut store = tower_redlock::fenced::FencedRedis::new(conn);
            store
                .set(DATA, value.as_bytes(), token)
                .await
                .expect("the data redis answers")
        })
    })
}

/// A paused handler's late write is refused by the store; the request that wrote meanwhile
/// keeps its value; the late request's client gets `409` `/problems/fencing-token-stale`,
/// the same bytes on axum and actix-web (and `Lock-Lost: true`: it finished without its
/// lock).
pub async fn fenced_store_refuses_a_paused_handlers_late_write<F: Framework>() {
    const KEY: &str = "ledger-1";
    let m = Masters::start(3);
    let data = RedisServer::start();
    let redlock: Redlock = m
        .builder()
        .node_timeout(HTTP_NODE_TIMEOUT)
        .fencing(true)
        .build()
        .expect("a valid client");
    warm_up(&redlock, &m).await;
    let policy = policy_of(&redlock)
        .ttl(TTL)
        .keep_alive(false)
        .build()
        .expect("a valid policy");
    let probe = Probe::new();
    let app = App::new().route(
        Route::locked(PATH, policy).post(Handler::Fenced(probe.clone(), fenced_store(&data))),
    );
    let app = F::serve(&app).await;
    let (http, key) = (http_client(), redis_key(PATH, PATH, KEY));

    // The first request pauses before its write, past its lease.
    let paused = tokio::spawn(post_key(&http, &app.url("/payments?pause=1"), KEY));
    probe.until_started(1).await;
    eventually(
        "the lock expires on every master",
        Duration::from_secs(10),
        || m.absent_everywhere(&key),
    )
    .await;
    // Another request takes the key and writes.
    let newer = post_key(&http, &app.url(PATH), KEY).await;
    let newer_token = newer.ok()["written"].as_u64().expect("a token");
    assert_eq!(data.get(DATA).await.as_deref(), Some(PATH));

    // The paused one wakes and writes: refused.
    probe.open();
    let late = within("the late request", paused).await.expect("no panic");
    let v = assert_problem(&late, 409, StaleToken::PROBLEM_TYPE);
    assert_eq!(late.header("retry-after"), None, "{v}");
    // Byte for byte the crate's answer, on either framework (its body names no token).
    let expected = StaleToken::new(0, 0).to_problem_json();
    assert_eq!(late.body, expected.body(), "{v}");
    assert_eq!(late.header(LOCK_LOST_HEADER), Some("true"));
    assert_eq!(
        data.get(DATA).await.as_deref(),
        Some(PATH),
        "the late write landed"
    );
    assert!(newer_token > 0);
    drop(http);
    app.stop().await;
}
