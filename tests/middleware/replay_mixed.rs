//! Replay across frameworks: replicas of one idempotent service, one on axum and one on
//! actix-web, on the same masters. What one stored, the other replays — the same status,
//! header set and body — and both fingerprint a request alike (another body or path is `422`
//! on either), both ways round.

use tower_redlock::replay::Replay;

use crate::harness::app::{App, Handler, Payment, Route};
use crate::harness::probe::Probe;
use crate::harness::{Actix, Axum, Framework};
use crate::replay::{
    assert_not_stored, assert_ran, assert_replay_of, header_set, pay, replay_policy, BODY,
    OTHER_BODY, PER_RESPONSE,
};
use crate::support::apps::*;
use crate::support::http::{http_client, reply};
use crate::support::Masters;

/// The service: `POST /orders/{id}` (fingerprinting `Content-Type` too) makes a payment,
/// `POST /exports` answers 100 KiB (too large to store).
fn service(
    redlock: &tower_redlock::Redlock,
    orders: &std::sync::Arc<Probe>,
    exports: &std::sync::Arc<Probe>,
) -> App {
    let replay = Replay::new().fingerprint_header("content-type");
    App::new()
        .route(
            Route::locked("/orders/{id}", replay_policy(redlock, replay))
                .post(Handler::payment(orders)),
        )
        .route(
            Route::locked("/exports", replay_policy(redlock, Replay::new()))
                .post(Handler::Payment(exports.clone(), Payment::Large(100 << 10))),
        )
}

/// `S` stores, `R` replays: the first request runs on `S`; the same request on `R` and on `S`
/// is replayed alike (identical header sets and bodies); another body or another order on the
/// route is `422` on `R`; a response too large to store, completed on `S`, is `409`
/// completed-not-stored on `R`. Each handler ran once, on `S`.
async fn stored_by_one_replayed_by_the_other<S: Framework, R: Framework>() {
    const KEY: &str = "\"order-mixed\"";
    const ORDER: &str = "/orders/7?currency=eur";
    let m = Masters::start(3);
    let (orders, exports) = (Probe::open_gate(), Probe::open_gate());
    let storer = S::serve(&service(&client_of(&m).await, &orders, &exports)).await;
    let replayer = R::serve(&service(&client_of(&m).await, &orders, &exports)).await;
    let http = http_client();
    let what = format!("stored by {}, replayed by {}", S::NAME, R::NAME);

    let first = reply(pay(&http, &storer.url(ORDER), KEY, BODY)).await;
    let id = assert_ran(&first);
    assert_eq!(first.json()["path"], ORDER, "{what}");
    let there = reply(pay(&http, &replayer.url(ORDER), KEY, BODY)).await;
    assert_replay_of(&first, &there);
    let here = reply(pay(&http, &storer.url(ORDER), KEY, BODY)).await;
    assert_replay_of(&first, &here);
    assert_eq!(
        header_set(&there, &PER_RESPONSE),
        header_set(&here, &PER_RESPONSE),
        "{what}"
    );
    assert_eq!(there.json()["payment_id"], id, "{what}");

    for (request, why) in [
        (
            pay(&http, &replayer.url(ORDER), KEY, OTHER_BODY),
            "another body",
        ),
        (
            pay(&http, &replayer.url("/orders/8?currency=eur"), KEY, BODY),
            "another order",
        ),
        (
            post_with(&http, &replayer.url(ORDER), &[KEY])
                .header("content-type", "text/plain")
                .body(BODY),
            "another content type",
        ),
    ] {
        let answer = reply(request).await;
        assert_eq!(answer.status, 422, "{what}: {why}: {}", answer.text());
        assert_problem(&answer, 422, "/problems/idempotency-key-reused");
    }

    let export = reply(post_with(&http, &storer.url("/exports"), &[KEY])).await;
    assert_eq!(export.status, 200, "{what}");
    assert_not_stored(&reply(post_with(&http, &replayer.url("/exports"), &[KEY])).await);
    assert_eq!((orders.started(), exports.started()), (1, 1), "{what}");
    drop(http);
    storer.stop().await;
    replayer.stop().await;
}

/// axum stores, actix-web replays.
#[tokio::test(flavor = "multi_thread")]
async fn replay_across_frameworks_axum_stores_actix_replays() {
    stored_by_one_replayed_by_the_other::<Axum, Actix>().await;
}

/// actix-web stores, axum replays.
#[tokio::test(flavor = "multi_thread")]
async fn replay_across_frameworks_actix_stores_axum_replays() {
    stored_by_one_replayed_by_the_other::<Actix, Axum>().await;
}
