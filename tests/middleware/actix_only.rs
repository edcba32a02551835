//! actix-web only: what its server does by default with a client that goes away, and a
//! policy locking every method on a route (`Route::wrap`).

use tower_redlock::policy::LockPolicy;

use crate::harness::app::{App, Handler, Route};
use crate::harness::keys::{default_policy, policy_of, redis_key};
use crate::harness::probe::Probe;
use crate::harness::{Actix, Framework};
use crate::support::apps::*;
use crate::support::eventually;
use crate::support::http::{http_client, reply, within};

/// With actix-web's default `h1_allow_half_closed(true)`, a client that gives up does not
/// cancel its request: the handler runs to its end, holding the lock (the same key is refused
/// meanwhile), and the lock goes when it returns. (`cancelled_request_releases_in_the_
/// background` is the scenario with `h1_allow_half_closed(false)`, where it is dropped.)
#[tokio::test(flavor = "multi_thread")]
async fn a_client_that_goes_away_does_not_cancel_by_default() {
    const KEY: &str = "order-half-closed";
    let (m, redlock) = masters_and_client().await;
    let probe = Probe::new();
    let app = Actix::serve(&App::gated(PATH, default_policy(&redlock), &probe)).await;
    let http = http_client();
    let key = redis_key(PATH, PATH, KEY);

    let request = tokio::spawn(post_key(&http, &app.url(PATH), KEY));
    probe.until_started(1).await;
    request.abort();
    assert!(within("the aborted request", request)
        .await
        .expect_err("aborted")
        .is_cancelled());
    assert_conflict(
        &post_key(&http, &app.url(PATH), KEY).await,
        LockPolicy::DEFAULT_TTL,
    );
    assert_held(&m, &key).await;

    probe.open();
    eventually(
        "the gone client's handler ends",
        RELEASED_WITHIN,
        || async { probe.completed() == 1 },
    )
    .await;
    assert_released(&m, &key).await;
    let v = post_key(&http, &app.url(PATH), KEY).await.ok();
    assert_eq!(v["locked"], true, "{v}");
    // The gone client's handler ran to its end; then the next one.
    assert_eq!(
        (probe.started(), probe.completed(), probe.cancelled()),
        (2, 2, 0)
    );
    assert_all_empty(&m).await;
    drop(http);
    app.stop().await;
}

/// With the middleware on each route (`web::post().to(h).wrap(mw)`, `Route::wrap`, as the docs
/// recommend) even a policy that locks every method leaves a method no route serves to
/// actix-web's 405, without a lock — `Resource::wrap` would lock it first, since it wraps the
/// resource's 405 too — and the served methods are locked under the route-scoped key.
#[tokio::test(flavor = "multi_thread")]
async fn any_method_still_answers_405_for_a_method_no_route_serves() {
    const KEY: &str = "order-route-wrap";
    let (m, redlock) = masters_and_client().await;
    let any = policy_of(&redlock)
        .any_method()
        .build()
        .expect("a valid policy");
    let probe = Probe::new();
    let app = App::new().route(Route::locked("/any", any).post(Handler::gated(&probe)));
    let app = Actix::serve(&app).await;
    let http = http_client();

    let holder = tokio::spawn(post_key(&http, &app.url("/any"), KEY));
    probe.until_started(1).await;
    assert_held(&m, &redis_key("/any", "/any", KEY)).await;
    assert_conflict(
        &post_key(&http, &app.url("/any"), KEY).await,
        LockPolicy::DEFAULT_TTL,
    );
    for keys in [&[KEY][..], &["order-other"], &[]] {
        let delete = reply(with_keys(http.delete(app.url("/any")), keys)).await;
        assert_eq!(delete.status, 405, "DELETE {keys:?}: {}", delete.text());
    }
    assert_eq!(
        m.dbsizes().await,
        vec![1; 3],
        "a refused method took a lock"
    );

    probe.open();
    let v = within("the holder", holder).await.expect("no panic").ok();
    assert_eq!(v["locked"], true, "{v}");
    assert_all_empty(&m).await;
    drop(http);
    app.stop().await;
}
