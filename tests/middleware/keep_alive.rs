//! The keep-alive: a lock outlives its ttl while its handler runs, or while its body streams
//! (with release at the body's end).

use std::time::Duration;
use tower_redlock::policy::ReleaseOn;

use tower_redlock::Redlock;

use crate::harness::app::App;
use crate::harness::keys::{policy_of, redis_key};
use crate::harness::probe::{Probe, Streams};
use crate::harness::Framework;
use crate::release::{rest_of, stream_through, streaming_app};
use crate::support::apps::*;
use crate::support::http::{http_client, send, within};
use crate::support::Masters;

/// The keep-alive ttl: the tests let it run out twice over. The keep-alive extends from
/// ttl/3 on, every ttl/3, and an extension may take up to two node timeouts (2 × 500 ms of
/// [`HTTP_NODE_TIMEOUT`]); a lease is lost only if no extension lands within the ttl. With
/// 3 s, an extension due at 1 s may start up to 2 s − 1 s − drift ≈ 0.95 s late (a stalled
/// runtime, a starved master) and still land in time — the slack a loaded machine gets. (At
/// 400 ms with 200 ms node timeouts, a stall of ~70 ms lost the lease: machine speed, not
/// the promise.)
const SHORT_TTL: Duration = Duration::from_secs(3);

/// The apps' client ([`HTTP_NODE_TIMEOUT`] per node, which fits in [`SHORT_TTL`]), warmed up.
async fn quick_client_of(masters: &Masters) -> Redlock {
    client_of(masters).await
}

/// A handler running past its lock's ttl keeps the lock: it is extended (from ttl/3 on), the
/// same key is refused meanwhile, and the handler's lease is valid at its end.
pub async fn keep_alive_holds_the_key_past_its_ttl<F: Framework>() {
    const KEY: &str = "order-9";
    let m = Masters::start(3);
    let redlock = quick_client_of(&m).await;
    let policy = policy_of(&redlock)
        .ttl(SHORT_TTL)
        .build()
        .expect("a valid policy");
    let probe = Probe::new();
    let app = F::serve(&App::gated(PATH, policy, &probe)).await;
    let (http, url, key) = (http_client(), app.url(PATH), redis_key(PATH, PATH, KEY));

    let holder = tokio::spawn(post_key(&http, &url, KEY));
    probe.until_started(1).await;
    // Let the original ttl run out twice over: the passing of time is what is tested here.
    tokio::time::sleep(2 * SHORT_TTL).await;
    assert_conflict(&post_key(&http, &url, KEY).await, SHORT_TTL);
    assert!(held_on(&m, &key).await >= 2, "still held past its ttl");

    probe.open();
    let v = within("the holder", holder).await.expect("no panic").ok();
    assert_eq!(v["lost"], false, "the lease was kept: {v}");
    // Valid 2 ttls after it was taken: one extension before the first ttl ran out, and one
    // after it (an extension lands only on a valid lease).
    assert!(v["extensions"].as_u64().expect("extensions") >= 2, "{v}");
    assert!(v["validity_ms"].as_u64().expect("a validity") > 0, "{v}");
    assert_eq!(probe.started(), 1);
    assert_released(&m, &key).await;
    drop(http);
    app.stop().await;
}

/// With release at the body's end, the lock is kept alive while the body streams past its
/// ttl (the handler itself returned at once).
pub async fn keep_alive_holds_the_key_while_a_long_body_streams<F: Framework>() {
    const KEY: &str = "stream-3";
    let m = Masters::start(3);
    let redlock = quick_client_of(&m).await;
    let policy = policy_of(&redlock)
        .ttl(SHORT_TTL)
        .release_on(ReleaseOn::BodyEnd)
        .build()
        .expect("a valid policy");
    let streams = Streams::new();
    let app = F::serve(&streaming_app(policy, &streams)).await;
    let (http, url, key) = (http_client(), app.url(PATH), redis_key(PATH, PATH, KEY));

    let body = streams.next();
    let mut response = send(post_with(&http, &url, &[KEY])).await;
    assert_eq!(response.status(), 200);
    stream_through(&body, &mut response, "first ").await;
    // Let the original ttl run out twice over: the passing of time is what is tested here.
    tokio::time::sleep(2 * SHORT_TTL).await;
    stream_through(&body, &mut response, "second").await;
    assert!(held_on(&m, &key).await >= 2, "still held past its ttl");
    assert_conflict(&post_key(&http, &url, KEY).await, SHORT_TTL);

    drop(body);
    assert_eq!(rest_of(response).await, b"");
    assert_released(&m, &key).await;
    drop(http);
    app.stop().await;
}
