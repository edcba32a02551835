//! An unreachable quorum: fail closed, or run unlocked.

use crate::harness::app::{App, Handler, Route};
use crate::harness::keys::{default_policy, policy_of};
use crate::harness::probe::Probe;
use crate::harness::Framework;
use crate::support::apps::*;
use crate::support::eventually;
use crate::support::http::http_client;

/// With two of three masters down: a fail-closed route answers 503 with `Retry-After` and never
/// runs the handler; a fail-open route runs it without a lock, marked `Unlocked`, and the
/// `Option<LeaseHandle>` extractor gives `None`.
pub async fn majority_down_fails_closed_or_runs_unlocked<F: Framework>() {
    const KEY: &str = "order-3";
    let (m, redlock) = masters_and_client().await;
    let closed = default_policy(&redlock);
    let open = policy_of(&redlock)
        .fail_open()
        .build()
        .expect("a valid policy");
    let probe = Probe::open_gate();
    let app = App::new()
        .route(Route::locked("/closed", closed).post(Handler::gated(&probe)))
        .route(Route::locked("/open", open).post(Handler::gated(&probe)));
    let app = F::serve(&app).await;
    m[1].stop();
    m[2].stop();
    let http = http_client();

    let reply = post_key(&http, &app.url("/closed"), KEY).await;
    let v = assert_problem(&reply, 503, "/problems/lock-unavailable");
    assert_eq!(reply.retry_after(), 1);
    assert_eq!(v["retry_after"], 1, "{v}");
    assert_eq!(probe.started(), 0, "the fail-closed handler ran");
    // The failed tries gave back what they took on the one master that answers.
    eventually("the live master is empty", RELEASED_WITHIN, || async {
        m[0].dbsize().await == 0
    })
    .await;

    let v = post_key(&http, &app.url("/open"), KEY).await.ok();
    assert_eq!(probe.completed(), 1);
    assert_eq!(v["unlocked"], true, "no Unlocked marker: {v}");
    assert_eq!(v["locked"], false, "a lease without a quorum: {v}");
    eventually("the live master is empty", RELEASED_WITHIN, || async {
        m[0].dbsize().await == 0
    })
    .await;
    drop(http);
    app.stop().await;
}
