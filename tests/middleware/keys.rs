//! The request's key: bad keys are rejected before anything is locked, a route parameter that
//! is not UTF-8 is malformed, and the handler sees its lock under the hashed key.

use tower_redlock::key::RouteParamKey;
use tower_redlock::policy::LockPolicy;
use tower_redlock::Redlock;

use crate::harness::app::{App, Handler, Route};
use crate::harness::keys::{default_policy, redis_key};
use crate::harness::probe::Probe;
use crate::harness::Framework;
use crate::support::apps::*;
use crate::support::http::{http_client, send, within, Reply};
use crate::support::{eventually, is_token};

/// Bad keys get a 400 problem+json without `Retry-After`, which never echoes the raw key,
/// before any lock is taken or the handler runs; a key of 255 bytes (the bound) locks.
pub async fn bad_keys_are_rejected_before_locking<F: Framework>() {
    let (m, redlock) = masters_and_client().await;
    let probe = Probe::open_gate();
    let app = F::serve(&App::gated(PATH, default_policy(&redlock), &probe)).await;
    let http = http_client();

    for (what, values, problem) in bad_keys() {
        let reply = Reply::read(send(post_values(&http, &app.url(PATH), &values)).await).await;
        let v = assert_problem(&reply, 400, problem);
        assert_eq!(reply.header("retry-after"), None, "{what}");
        assert_eq!(v.get("retry_after"), None, "{what}: {v}");
        assert!(
            !reply.text().contains("zebra"),
            "{what}: the raw key is echoed: {}",
            reply.text()
        );
    }
    assert_eq!(probe.started(), 0, "a handler ran for a bad key");
    assert_eq!(m.dbsizes().await, vec![0; 3], "a bad key reached Redis");

    // The bound is 255 bytes: one less than the rejected key passes, as does a short one.
    for key in ["z".repeat(255), "ok".to_owned()] {
        let v = post_key(&http, &app.url(PATH), &key).await.ok();
        assert_eq!(v["locked"], true, "{v}");
    }
    assert_all_empty(&m).await;
    drop(http);
    app.stop().await;
}

/// A route parameter that is not UTF-8 once percent-decoded is a malformed key (400), not a
/// "missing parameter" blamed on the server's setup; a valid one locks.
pub async fn a_route_param_that_is_not_utf8_is_malformed<F: Framework>() {
    let policy = LockPolicy::builder(Redlock::in_memory(), RouteParamKey::new("id"))
        .build()
        .expect("a valid policy");
    let app = App::new().route(Route::locked("/accounts/{id}", policy).post(Handler::Report));
    let app = F::serve(&app).await;
    let http = http_client();

    let reply = Reply::read(send(http.post(app.url("/accounts/%FF"))).await).await;
    assert_problem(&reply, 400, "/problems/lock-key-malformed");
    let v = Reply::read(send(http.post(app.url("/accounts/7"))).await)
        .await
        .ok();
    assert_eq!(v["locked"], true, "{v}");
    drop(http);
    app.stop().await;
}

/// The `LeaseHandle` extractor gives the handler its lock: its resource is the hashed,
/// `tower-redlock:`-prefixed key the masters hold — each master holds exactly that key, with
/// a lock token — scoped by the route *pattern* (so another path of the same route contends
/// for it), never the raw key; it is valid and not lost.
pub async fn the_handler_sees_its_lease<F: Framework>() {
    const ROUTE: &str = "/orders/{id}";
    const KEY: &str = "\"secret-zebra-4242\"";
    const RAW: &str = "secret-zebra-4242";
    let (m, redlock) = masters_and_client().await;
    let probe = Probe::new();
    let app = F::serve(&App::gated(ROUTE, default_policy(&redlock), &probe)).await;
    let http = http_client();
    let key = redis_key(ROUTE, "/orders/7", KEY);
    assert!(
        key.starts_with("tower-redlock:") && !key.contains(RAW),
        "{key}"
    );

    let request = tokio::spawn(post_key(&http, &app.url("/orders/7"), KEY));
    probe.until_started(1).await;
    assert_held(&m, &key).await;
    // While the handler runs, each master holds exactly that key, with a lock token.
    eventually(
        "every master holds the one key",
        RELEASED_WITHIN,
        || async {
            let mut all = true;
            for master in m.iter() {
                let keys: Vec<String> = master.query(redis::cmd("KEYS").arg("*")).await;
                all &= keys == [key.clone()];
            }
            all
        },
    )
    .await;
    for value in m.values(&key).await {
        assert!(is_token(value.as_deref().expect("held")), "{value:?}");
    }
    let other_path = post_key(&http, &app.url("/orders/8"), KEY).await;
    assert_conflict(&other_path, LockPolicy::DEFAULT_TTL);

    probe.open();
    let v = within("the response", request)
        .await
        .expect("no panic")
        .ok();
    assert_eq!(v["locked"], true, "{v}");
    assert_eq!(v["resource"], key.as_str(), "{v}");
    let resource = v["resource"].as_str().expect("a resource");
    let digest = resource.strip_prefix("tower-redlock:").expect("the prefix");
    assert!(is_token(digest), "{resource}: not 32 lowercase hex digits");
    assert!(
        !resource.contains("zebra") && !resource.contains("4242"),
        "{resource}"
    );
    let validity = v["validity_ms"].as_u64().expect("a validity");
    assert!(
        validity > 0 && validity <= LockPolicy::DEFAULT_TTL.as_millis() as u64,
        "{v}"
    );
    assert_eq!(v["lost"], false, "{v}");
    assert_all_empty(&m).await;
    drop(http);
    app.stop().await;
}
