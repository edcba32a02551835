//! The method filter: by default only `POST`, `PUT`, `PATCH` and `DELETE` are locked; other
//! methods pass through untouched, and the router's own answers (405, 404) are never turned
//! into a 400 or a 409. `LockPolicyBuilder::methods` and `any_method` change the set.

use tower_redlock::policy::LockPolicy;

use crate::harness::app::{App, Handler, Method, Route};
use crate::harness::keys::{default_policy, policy_of, redis_key};
use crate::harness::probe::Probe;
use crate::harness::Framework;
use crate::support::apps::*;
use crate::support::http::{http_client, reply, within};

/// While a `POST` holds key K, `POST`, `PUT`, `PATCH` and `DELETE` with K on the same path are
/// refused (409) and without a key rejected (400), but a `GET` with K passes through to its
/// handler (200, no lock), as does a keyless `GET`; on a route with only `POST`, a `GET` answers 405
/// with or without a key; an unknown path answers 404 — never a 400 or a 409.
pub async fn unlocked_methods_pass_through_a_held_key<F: Framework>() {
    const KEY: &str = "order-get";
    const POST_ONLY: &str = "/post-only";
    let (m, redlock) = masters_and_client().await;
    let probe = Probe::new();
    let app = App::new()
        .route(
            Route::locked(PATH, default_policy(&redlock))
                .post(Handler::gated(&probe))
                .get(Handler::Report)
                .put(Handler::Report)
                .on(Method::Patch, Handler::Report)
                .on(Method::Delete, Handler::Report),
        )
        .route(Route::locked(POST_ONLY, default_policy(&redlock)).post(Handler::gated(&probe)));
    let app = F::serve(&app).await;
    let http = http_client();
    let (key, post_only_key) = (
        redis_key(PATH, PATH, KEY),
        redis_key(POST_ONLY, POST_ONLY, KEY),
    );

    let holders = [
        tokio::spawn(post_key(&http, &app.url(PATH), KEY)),
        tokio::spawn(post_key(&http, &app.url(POST_ONLY), KEY)),
    ];
    probe.until_started(2).await;
    assert_held(&m, &key).await;
    assert_held(&m, &post_only_key).await;
    // The other unsafe methods are locked too: refused with the held key, 400 without one.
    for method in [
        reqwest::Method::POST,
        reqwest::Method::PUT,
        reqwest::Method::PATCH,
        reqwest::Method::DELETE,
    ] {
        let held = reply(with_keys(
            http.request(method.clone(), app.url(PATH)),
            &[KEY],
        ))
        .await;
        assert_conflict(&held, LockPolicy::DEFAULT_TTL);
        let keyless = reply(http.request(method.clone(), app.url(PATH))).await;
        assert_problem(&keyless, 400, "/problems/lock-key-missing");
    }

    for keys in [&[KEY][..], &[]] {
        let v = reply(with_keys(http.get(app.url(PATH)), keys)).await.ok();
        assert_eq!(v["method"], "GET", "{v}");
        assert_eq!(v["locked"], false, "{keys:?}: {v}");
        let wrong_method = reply(with_keys(http.get(app.url(POST_ONLY)), keys)).await;
        assert_eq!(
            wrong_method.status,
            405,
            "{keys:?}: {}",
            wrong_method.text()
        );
        for nowhere in [
            http.get(app.url("/nowhere")),
            http.post(app.url("/nowhere")),
        ] {
            let unknown = reply(with_keys(nowhere, keys)).await;
            assert_eq!(unknown.status, 404, "{keys:?}: {}", unknown.text());
        }
    }
    assert_eq!(
        probe.started(),
        2,
        "a gated handler ran for a request it does not serve"
    );

    probe.open();
    for holder in holders {
        let v = within("a holder", holder).await.expect("no panic").ok();
        assert_eq!(
            (v["method"].as_str(), v["locked"].as_bool()),
            (Some("POST"), Some(true))
        );
    }
    assert_all_empty(&m).await;
    drop(http);
    app.stop().await;
}

/// `methods(["PUT"])`: a `POST` is not locked (two with one key run at once, one without a
/// key is not rejected), a `PUT` is (the same key is refused, a missing key is a 400).
/// `any_method()`: a `GET` is locked too (refused while a `POST` holds its key, 400 without a
/// key, and it holds a lock of its own).
pub async fn the_method_filter_is_configurable<F: Framework>() {
    const KEY: &str = "order-methods";
    let (m, redlock) = masters_and_client().await;
    let put_only = policy_of(&redlock)
        .methods(["PUT"])
        .build()
        .expect("a valid policy");
    let any = policy_of(&redlock)
        .any_method()
        .build()
        .expect("a valid policy");
    let (posts, puts, anys) = (Probe::new(), Probe::new(), Probe::new());
    let app = App::new()
        .route(
            Route::locked("/puts", put_only)
                .post(Handler::gated(&posts))
                .put(Handler::gated(&puts)),
        )
        .route(
            Route::locked("/any", any)
                .post(Handler::gated(&anys))
                .get(Handler::Report),
        );
    let app = F::serve(&app).await;
    let http = http_client();

    // methods(["PUT"]): POSTs pass through.
    let unlocked: Vec<_> = [&[KEY][..], &[KEY], &[]]
        .into_iter()
        .map(|keys| tokio::spawn(reply(post_with(&http, &app.url("/puts"), keys))))
        .collect();
    posts.until_started(3).await;
    assert_eq!(posts.inside(), 3, "POSTs were locked");
    assert_eq!(m.dbsizes().await, vec![0; 3], "a POST took a lock");
    posts.open();
    for request in unlocked {
        let v = within("a POST", request).await.expect("no panic").ok();
        assert_eq!(v["locked"], false, "{v}");
    }
    // ... and PUTs are locked.
    let put = tokio::spawn(reply(with_keys(http.put(app.url("/puts")), &[KEY])));
    puts.until_started(1).await;
    assert_held(&m, &redis_key("/puts", "/puts", KEY)).await;
    let again = reply(with_keys(http.put(app.url("/puts")), &[KEY])).await;
    assert_conflict(&again, LockPolicy::DEFAULT_TTL);
    let keyless = reply(http.put(app.url("/puts"))).await;
    assert_problem(&keyless, 400, "/problems/lock-key-missing");
    puts.open();
    let v = within("the PUT", put).await.expect("no panic").ok();
    assert_eq!(
        (v["method"].as_str(), v["locked"].as_bool()),
        (Some("PUT"), Some(true))
    );
    assert_eq!(puts.started(), 1);

    // any_method(): a GET is locked like a POST.
    let post = tokio::spawn(post_key(&http, &app.url("/any"), KEY));
    anys.until_started(1).await;
    assert_held(&m, &redis_key("/any", "/any", KEY)).await;
    let get = reply(with_keys(http.get(app.url("/any")), &[KEY])).await;
    assert_conflict(&get, LockPolicy::DEFAULT_TTL);
    let keyless = reply(http.get(app.url("/any"))).await;
    assert_problem(&keyless, 400, "/problems/lock-key-missing");
    let v = reply(with_keys(http.get(app.url("/any")), &["order-other"]))
        .await
        .ok();
    assert_eq!(
        (v["method"].as_str(), v["locked"].as_bool()),
        (Some("GET"), Some(true))
    );
    anys.open();
    let v = within("the POST", post).await.expect("no panic").ok();
    assert_eq!(v["locked"], true, "{v}");
    assert_all_empty(&m).await;
    drop(http);
    app.stop().await;
}

/// A method the route does not serve is the router's 405 — with the held key, a free key or
/// none, never a 409 or a 400, and nothing is locked for it — also when the policy locks
/// that method: every method (`any_method()` on a route with `POST` and `GET`), or `POST` (the
/// default, on a route with only `GET`).
pub async fn a_method_the_route_does_not_serve_answers_405<F: Framework>() {
    const KEY: &str = "order-405";
    let (m, redlock) = masters_and_client().await;
    let any = policy_of(&redlock)
        .any_method()
        .build()
        .expect("a valid policy");
    let probe = Probe::new();
    let app = App::new()
        .route(
            Route::locked("/any", any)
                .post(Handler::gated(&probe))
                .get(Handler::Report),
        )
        .route(Route::locked("/get-only", default_policy(&redlock)).get(Handler::Report));
    let app = F::serve(&app).await;
    let http = http_client();

    let holder = tokio::spawn(post_key(&http, &app.url("/any"), KEY));
    probe.until_started(1).await;
    assert_held(&m, &redis_key("/any", "/any", KEY)).await;
    let mut answers = Vec::new();
    for keys in [&[KEY][..], &["order-other"], &[]] {
        let delete = reply(with_keys(http.delete(app.url("/any")), keys)).await;
        answers.push((format!("DELETE /any {keys:?}"), delete.status));
        let post = reply(post_with(&http, &app.url("/get-only"), keys)).await;
        answers.push((format!("POST /get-only {keys:?}"), post.status));
    }
    let all_405: Vec<_> = answers
        .iter()
        .map(|(what, _)| (what.clone(), 405))
        .collect();
    assert_eq!(answers, all_405);
    assert_eq!(
        m.dbsizes().await,
        vec![1; 3],
        "a refused method took a lock"
    );
    let v = reply(http.get(app.url("/get-only"))).await.ok();
    assert_eq!(v["locked"], false, "{v}");

    probe.open();
    let v = within("the holder", holder).await.expect("no panic").ok();
    assert_eq!(v["locked"], true, "{v}");
    assert_all_empty(&m).await;
    drop(http);
    app.stop().await;
}
