//! A custom responder: the user's answer for a rejection, here the problem+json answer with a
//! header of its own.

use tower_redlock::key::SimpleRequest;
use tower_redlock::operate::Summary;
use tower_redlock::policy::LockPolicy;
use tower_redlock::rejection::Rejection;

use crate::harness::app::{App, Handler, Route};
use crate::harness::keys::{default_policy, policy_of};
use crate::harness::probe::Probe;
use crate::harness::Framework;
use crate::support::apps::*;
use crate::support::http::{http_client, within};

/// The responder of [`a_custom_responder_adds_a_header`]: the default answer plus
/// `x-lock-state: held`.
pub fn with_lock_state(r: &Rejection) -> tower_redlock::rejection::RejectionResponse {
    r.to_problem_json().with_header("x-lock-state", "held")
}

/// `.responder(|r: &Rejection| r.to_problem_json().with_header("x-lock-state", "held"))`: the
/// 409 carries `x-lock-state: held` (once), `Retry-After` and the problem+json body.
pub async fn a_custom_responder_adds_a_header<F: Framework>() {
    const KEY: &str = "order-responder";
    let (m, redlock) = masters_and_client().await;
    let policy = policy_of(&redlock)
        .responder(|r: &Rejection| r.to_problem_json().with_header("x-lock-state", "held"))
        .build()
        .expect("a valid policy");
    let probe = Probe::new();
    let app = F::serve(&App::gated(PATH, policy, &probe)).await;
    let http = http_client();

    let holder = tokio::spawn(post_key(&http, &app.url(PATH), KEY));
    probe.until_started(1).await;
    let refused = post_key(&http, &app.url(PATH), KEY).await;
    assert_conflict(&refused, LockPolicy::DEFAULT_TTL);
    assert_eq!(refused.header("x-lock-state"), Some("held"));
    assert_eq!(refused.headers.get_all("x-lock-state").iter().count(), 1);
    assert_eq!(refused.headers.get_all("retry-after").iter().count(), 1);

    probe.open();
    let v = within("the holder", holder).await.expect("no panic").ok();
    assert_eq!(v["locked"], true, "{v}");
    assert_all_empty(&m).await;
    drop(http);
    app.stop().await;
}

/// `.explain_votes(true)`: the 409 body lists every voter's answer (and `LockPolicy::inspect`
/// of the request's parts sees the key held meanwhile) (`held`, with the holder's
/// ttl where known), the 503 body tells the stopped masters (`unreachable`, or `suspended`
/// after the middleware's extra tries) from the one that granted; by default (off) neither body has a `votes` member — it would reveal topology.
pub async fn explain_votes_lists_each_voter_in_409_and_503_bodies<F: Framework>() {
    const KEY: &str = "order-explain";
    let (m, redlock) = masters_and_client().await;
    let explained = policy_of(&redlock)
        .explain_votes(true)
        .build()
        .expect("a valid policy");
    let probe = Probe::new();
    let app = App::new()
        .route(Route::locked(PATH, explained.clone()).post(Handler::gated(&probe)))
        .route(Route::locked("/quiet", default_policy(&redlock)).post(Handler::gated(&probe)));
    let app = F::serve(&app).await;
    let http = http_client();

    let holder = tokio::spawn(post_key(&http, &app.url(PATH), KEY));
    probe.until_started(1).await;
    let refused = post_key(&http, &app.url(PATH), KEY).await;
    let v = assert_problem(&refused, 409, "/problems/lock-contended");
    let votes = v["votes"]
        .as_array()
        .unwrap_or_else(|| panic!("no votes: {v}"));
    assert_eq!(votes.len(), 3, "{v}");
    let names: Vec<String> = m.iter().map(|s| s.addr()).collect();
    for (vote, name) in votes.iter().zip(&names) {
        assert_eq!(vote["voter"], name.as_str(), "{v}");
    }
    assert!(
        votes.iter().filter(|v| v["vote"] == "held").count() >= 2,
        "{v}"
    );
    assert!(votes.iter().any(|v| v["ttl_ms"].as_u64().is_some()), "{v}");
    // The policy finds the same key from the request's parts, and sees it held.
    let req = SimpleRequest::new("POST", PATH)
        .route(PATH)
        .header(IDEMPOTENCY_KEY, KEY);
    let seen = explained
        .inspect(&req)
        .await
        .unwrap()
        .expect("a locked request");
    assert_eq!(seen.summary(), Summary::Held);
    assert_eq!(
        Some(seen.key().to_owned()),
        explained.redis_key(&req).unwrap()
    );
    probe.open();
    within("the holder", holder).await.expect("no panic").ok();

    // Two masters stopped: 503, the live one granted.
    m[1].stop();
    m[2].stop();
    let down = post_key(&http, &app.url(PATH), "order-explain-2").await;
    let v = assert_problem(&down, 503, "/problems/lock-unavailable");
    let kinds: Vec<&str> = v["votes"]
        .as_array()
        .unwrap_or_else(|| panic!("no votes: {v}"))
        .iter()
        .map(|v| v["vote"].as_str().unwrap())
        .collect();
    // The stopped ones refused connections: unreachable — or, after the middleware's
    // extra tries (see `OnUnavailable`), suspended by then.
    assert_eq!(kinds[0], "granted", "{v}");
    assert!(
        kinds[1..]
            .iter()
            .all(|k| ["unreachable", "suspended"].contains(k)),
        "{v}"
    );
    // Off by default.
    let quiet = post_key(&http, &app.url("/quiet"), "order-explain-3").await;
    let v = assert_problem(&quiet, 503, "/problems/lock-unavailable");
    assert!(v.get("votes").is_none(), "{v}");
    drop(http);
    app.stop().await;
}
