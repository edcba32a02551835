//! Replay when masters fail or time runs out: a master down before the first request or
//! hanging during the write (the response is stored on the remaining quorum), a minority and
//! then a majority losing the record (any record found is the answer), and a request
//! cancelled while its handler runs. (A holder whose lease expired before it stored: see
//! [`crate::on_lost`].)

use crate::harness::app::{App, Handler, Route};
use crate::harness::keys::redis_key;
use crate::harness::probe::Probe;
use crate::harness::Framework;
use crate::replay::{assert_ran, assert_replay_of, pay, records_on, replay_policy, BODY};
use crate::support::apps::*;
use crate::support::http::{http_client, reply, within};
use crate::support::{eventually, Masters};
use tower_redlock::replay::Replay;

/// Three masters. One is killed before the first request: the handler runs under the lock of
/// the two others, the response is stored on both, and duplicates replay it, also once the
/// dead master is back, empty. For another key, a master hangs (`SIGSTOP`) while the handler
/// runs: the write lands on the two others, and duplicates replay it while the master hangs
/// and after it resumed. The handler runs once per key.
pub async fn replay_survives_a_master_down_during_the_write<F: Framework>() {
    const KILLED: &str = "\"order-killed\"";
    const FROZEN: &str = "\"order-frozen\"";
    let m = Masters::start(3);
    let redlock = client_of(&m).await;
    let probe = Probe::open_gate();
    let app = App::new().route(
        Route::locked(PATH, replay_policy(&redlock, Replay::new())).post(Handler::payment(&probe)),
    );
    let app = F::serve(&app).await;
    let http = http_client();
    let url = app.url(PATH);

    m[2].stop();
    let first = reply(pay(&http, &url, KILLED, BODY)).await;
    assert_ran(&first);
    let lock = redis_key(PATH, PATH, KILLED);
    assert_eq!(
        records_on(&m, &lock, [0, 1]).await,
        2,
        "not on both live masters"
    );
    assert_replay_of(&first, &reply(pay(&http, &url, KILLED, BODY)).await);
    m[2].restart();
    assert_replay_of(&first, &reply(pay(&http, &url, KILLED, BODY)).await);
    assert_eq!(probe.started(), 1, "a duplicate ran the handler");
    // What the read took on the master without the record is released.
    assert_released(&m, &lock).await;
    drop(http);
    app.stop().await;

    // Another app, whose gated handler lets the test freeze a master mid-request.
    let gate = Probe::new();
    let app = App::new().route(
        Route::locked(PATH, replay_policy(&client_of(&m).await, Replay::new()))
            .post(Handler::payment(&gate)),
    );
    let app = F::serve(&app).await;
    let http = http_client();
    let url = app.url(PATH);
    let lock = redis_key(PATH, PATH, FROZEN);
    let first = tokio::spawn(reply(pay(&http, &url, FROZEN, BODY)));
    gate.until_started(1).await;
    assert_held(&m, &lock).await;
    m[2].freeze();
    gate.open();
    let first = within("the first reply", first).await.expect("no panic");
    assert_ran(&first);
    assert_eq!(
        records_on(&m, &lock, [0, 1]).await,
        2,
        "not on both live masters"
    );
    assert_replay_of(&first, &reply(pay(&http, &url, FROZEN, BODY)).await);
    m[2].thaw();
    assert_replay_of(&first, &reply(pay(&http, &url, FROZEN, BODY)).await);
    assert_eq!(gate.started(), 1, "a duplicate ran the handler");
    drop(http);
    app.stop().await;
}

/// The record is stored on every master; deleted on one (a restart without persistence, an
/// eviction), the duplicate is still replayed and what its read locked there is released;
/// deleted on a second one, the one record left is still the answer. The handler runs once.
pub async fn replay_survives_masters_losing_the_record<F: Framework>() {
    const KEY: &str = "\"order-lost\"";
    let (m, redlock) = masters_and_client().await;
    let probe = Probe::open_gate();
    let app = App::new().route(
        Route::locked(PATH, replay_policy(&redlock, Replay::new())).post(Handler::payment(&probe)),
    );
    let app = F::serve(&app).await;
    let http = http_client();
    let url = app.url(PATH);
    let lock = redis_key(PATH, PATH, KEY);

    let first = reply(pay(&http, &url, KEY, BODY)).await;
    assert_ran(&first);
    eventually("every master has the record", RELEASED_WITHIN, || async {
        records_on(&m, &lock, 0..3).await == 3
    })
    .await;
    for lost in [0, 1] {
        let record = crate::replay::record_key(&lock);
        m.del_on(&record, &[lost]).await;
        assert_eq!(records_on(&m, &lock, 0..3).await, 2 - lost);
        assert_replay_of(&first, &reply(pay(&http, &url, KEY, BODY)).await);
        assert_released(&m, &lock).await;
    }
    assert_eq!(probe.started(), 1, "a duplicate ran the handler");
    drop(http);
    app.stop().await;
}

/// A client that gives up while the handler runs (actix-web drops the handler only with
/// `h1_allow_half_closed(false)`): the handler may have done its work, so the key is marked
/// completed rather than released — the retry gets `409` completed-not-stored, without
/// `Retry-After`, and the handler never runs a second time.
pub async fn replay_a_cancelled_request_marks_the_key_completed<F: Framework>() {
    const KEY: &str = "\"order-cancelled\"";
    let m = Masters::start(3);
    let redlock = client_of(&m).await;
    let gate = Probe::new();
    let app = App::new()
        .route(
            Route::locked(PATH, replay_policy(&redlock, Replay::new()))
                .post(Handler::payment(&gate)),
        )
        .cancel_on_close();
    let app = F::serve(&app).await;
    let http = http_client();
    let url = app.url(PATH);
    let lock = redis_key(PATH, PATH, KEY);

    let request = tokio::spawn(reply(pay(&http, &url, KEY, BODY)));
    gate.until_started(1).await;
    assert_held(&m, &lock).await;
    // The client gives up: its request and connection are dropped.
    gate.client_gives_up(request, 1).await;
    // Marked completed: the record is on a quorum and the lock is gone (long before its ttl).
    eventually("the key is marked completed", RELEASED_WITHIN, || async {
        records_on(&m, &lock, 0..3).await >= 2
    })
    .await;
    assert_released(&m, &lock).await;

    gate.open();
    let retry = reply(pay(&http, &url, KEY, BODY)).await;
    assert_problem(&retry, 409, "/problems/idempotency-completed-not-stored");
    assert_eq!(retry.header("retry-after"), None, "a retry cannot help");
    assert_eq!(gate.started(), 1, "the retry ran the handler again");
    drop(http);
    app.stop().await;
}
