//! axum and actix-web side by side: replicas of one service in both frameworks take the same
//! lock for the same route and key, and answer every rejection alike.

use tower_redlock::policy::LockPolicy;

use crate::exclusion::burst_until_one_holds;
use crate::harness::app::{App, Handler, Route};
use crate::harness::keys::{default_policy, policy_of, redis_key};
use crate::harness::probe::Probe;
use crate::harness::{Actix, Axum, Framework};
use crate::responder::with_lock_state;
use crate::support::apps::*;
use crate::support::http::{http_client, send, Reply};
use crate::support::Masters;

/// An axum app and an actix-web app serving `POST route`, each with its own client of
/// `masters` and the same extractor (`Idempotency-Key` scoped by route); 48 concurrent requests
/// with `key`, split over both (to `paths[0]` on axum, `paths[1]` on actix-web): exactly one
/// runs, the others get a 409, and no two handlers overlap.
async fn one_lock_for_both_frameworks(
    masters: &Masters,
    route: &'static str,
    paths: [&str; 2],
    key: &str,
) {
    const REQUESTS: usize = 48;
    let probe = Probe::new();
    let axum_policy = default_policy(&client_of(masters).await);
    let actix_policy = default_policy(&client_of(masters).await);
    let axum_app = Axum::serve(&App::gated(route, axum_policy, &probe)).await;
    let actix_app = Actix::serve(&App::gated(route, actix_policy, &probe)).await;
    let urls = [axum_app.url(paths[0]), actix_app.url(paths[1])];
    let http = http_client();
    let redis_key = redis_key(route, paths[0], key);

    let mut replies = burst_until_one_holds(&http, &urls, key, REQUESTS, &probe, masters).await;
    assert_eq!(
        probe.started(),
        1,
        "{route}: exactly one request got the lock"
    );
    assert_held_on_quorum(masters, &redis_key).await;

    probe.open();
    let v = next_reply(&mut replies).await.ok();
    assert_eq!(v["resource"], redis_key, "{v}");
    assert_eq!(
        probe.max_inside(),
        1,
        "{route}: an axum and an actix-web handler overlapped"
    );
    assert_eq!((probe.started(), probe.completed()), (1, 1));
    assert_all_empty(masters).await;
    drop(http);
    axum_app.stop().await;
    actix_app.stop().await;
}

/// axum and actix-web replicas on the same masters derive the same lock key for the same
/// route and `Idempotency-Key`: on a plain route, and on a route with a parameter (the same
/// pattern, requested on different paths).
#[tokio::test(flavor = "multi_thread")]
async fn axum_and_actix_take_the_same_lock() {
    let m = Masters::start(3);
    one_lock_for_both_frameworks(&m, PATH, [PATH, PATH], "\"payment-mixed-1\"").await;
    one_lock_for_both_frameworks(
        &m,
        "/orders/{id}",
        ["/orders/1", "/orders/2"],
        "\"payment-mixed-2\"",
    )
    .await;
}

/// Sends the same request to both apps; returns (axum's reply, actix-web's reply).
async fn both(
    http: &reqwest::Client,
    axum_url: &str,
    actix_url: &str,
    keys: &[reqwest::header::HeaderValue],
) -> (Reply, Reply) {
    let axum = Reply::read(send(post_values(http, axum_url, keys)).await).await;
    let actix = Reply::read(send(post_values(http, actix_url, keys)).await).await;
    (axum, actix)
}

/// Same status, `Content-Type`, `Retry-After` and `x-lock-state`, and byte-identical bodies.
#[track_caller]
pub fn assert_same_answer(what: &str, axum: &Reply, actix: &Reply) {
    assert_eq!(axum.status, actix.status, "{what}");
    for header in ["content-type", "retry-after", "x-lock-state"] {
        assert_eq!(
            axum.header(header),
            actix.header(header),
            "{what}: {header}"
        );
    }
    assert_eq!(
        axum.text(),
        actix.text(),
        "{what}: axum and actix-web bodies differ"
    );
}

/// The actix-web middleware and the axum layer answer the same situations alike: the same
/// status, `Content-Type`, `Retry-After` and byte-identical problem+json bodies for every bad
/// key (400) and an unreachable quorum (503); for a held key (409) the same body up to the
/// `Retry-After` seconds, which follow the holder's remaining ttl — also with a custom
/// responder that adds a header.
#[tokio::test(flavor = "multi_thread")]
async fn axum_and_actix_answer_alike() {
    const KEY: &str = "order-5";
    const CUSTOM: &str = "/custom";
    let (m, redlock) = masters_and_client().await;
    let dead = Masters::start(1);
    let unreachable = client_of(&dead).await;
    dead[0].stop();
    let custom = policy_of(&redlock)
        .responder(with_lock_state)
        .build()
        .expect("a valid policy");
    let probe = Probe::open_gate();
    let app = App::new()
        .route(Route::locked(PATH, default_policy(&redlock)).post(Handler::gated(&probe)))
        .route(Route::locked("/down", default_policy(&unreachable)).post(Handler::gated(&probe)))
        .route(Route::locked(CUSTOM, custom).post(Handler::gated(&probe)));
    let axum_app = Axum::serve(&app).await;
    let actix_app = Actix::serve(&app).await;
    let http = http_client();
    let key = |k: &str| reqwest::header::HeaderValue::from_str(k).expect("a header value");

    for route in [PATH, CUSTOM] {
        for (what, keys, problem) in bad_keys() {
            let (axum, actix) =
                both(&http, &axum_app.url(route), &actix_app.url(route), &keys).await;
            assert_problem(&axum, 400, problem);
            assert_same_answer(what, &axum, &actix);
        }
    }

    let (axum, actix) = both(
        &http,
        &axum_app.url("/down"),
        &actix_app.url("/down"),
        &[key(KEY)],
    )
    .await;
    assert_problem(&axum, 503, "/problems/lock-unavailable");
    assert_same_answer("quorum unreachable", &axum, &actix);

    // Another process holds the keys both apps derive.
    let mut holders = Vec::new();
    for route in [PATH, CUSTOM] {
        let holder = redlock
            .try_lock(&redis_key(route, route, KEY), LockPolicy::DEFAULT_TTL)
            .await
            .expect("the test takes the key");
        holders.push(holder);
        let sent = std::time::Instant::now();
        let (axum, actix) = both(
            &http,
            &axum_app.url(route),
            &actix_app.url(route),
            &[key(KEY)],
        )
        .await;
        let apart = sent.elapsed();
        assert_conflict(&axum, LockPolicy::DEFAULT_TTL);
        assert_conflict(&actix, LockPolicy::DEFAULT_TTL);
        // Each is the holder's remaining ttl, rounded up, when that request looked. Both
        // looked within `apart` (sent together, on a loaded machine maybe not at once), so
        // the remaining ttls differ by at most that, and their round-ups by at most its
        // whole seconds plus one; everything else is the same.
        let (a, b) = (axum.retry_after(), actix.retry_after());
        assert!(
            a.abs_diff(b) <= apart.as_secs() + 1,
            "{route}: Retry-After {a} (axum) vs {b} (actix-web), looked within {apart:?}"
        );
        let same_after = |reply: &Reply, after: u64| {
            reply
                .text()
                .replace(&format!("retry after {after} s"), "retry after N s")
                .replace(&format!("\"retry_after\":{after}"), "\"retry_after\":N")
        };
        assert_eq!(same_after(&axum, a), same_after(&actix, b), "{route}");
        assert_eq!(
            axum.header("x-lock-state"),
            actix.header("x-lock-state"),
            "{route}"
        );
        let state = (route == CUSTOM).then_some("held");
        assert_eq!(axum.header("x-lock-state"), state, "{route}");
        assert_eq!(
            axum.header("content-type"),
            actix.header("content-type"),
            "{route}"
        );
    }
    assert_eq!(probe.started(), 0, "a handler ran");

    for holder in holders {
        holder.release().await.expect("release the test's lock");
    }
    let (axum, actix) = both(
        &http,
        &axum_app.url(PATH),
        &actix_app.url(PATH),
        &[key(KEY)],
    )
    .await;
    assert_eq!(axum.ok()["resource"], actix.ok()["resource"]);
    assert_all_empty(&m).await;
    drop(http);
    axum_app.stop().await;
    actix_app.stop().await;
}
