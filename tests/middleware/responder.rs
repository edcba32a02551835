//! A custom responder: the user's answer for a rejection, here the problem+json answer with a
//! header of its own.

use tower_redlock::policy::LockPolicy;
use tower_redlock::rejection::Rejection;

use crate::harness::app::App;
use crate::harness::keys::policy_of;
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
