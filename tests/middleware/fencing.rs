//! Fencing tokens through the middleware: with `fencing_header`, the handler gets the lease's
//! token in a request header (and from its `LeaseHandle`), the client's own header of that name
//! never reaches it, and each new holder of a key gets a larger token.

use tower_redlock::replay::Replay;
use tower_redlock::Redlock;

use crate::harness::app::{App, Handler, Route, FENCING_HEADER};
use crate::harness::keys::policy_of;
use crate::harness::Framework;
use crate::support::apps::*;
use crate::support::http::{http_client, reply};
use crate::support::{eventually, warm_up, Masters};

/// A forged token a client might send.
const FORGED: &str = "18446744073709551615";

async fn fencing_client(masters: &Masters) -> Redlock {
    let redlock = masters
        .builder()
        .node_timeout(HTTP_NODE_TIMEOUT)
        .fencing(true)
        .build()
        .expect("a valid client");
    warm_up(&redlock, masters).await;
    redlock
}

/// Waits until the masters hold nothing but fencing counters (`…:fence`): every lock released.
async fn only_counters_left(masters: &Masters) {
    left_only(masters, false).await;
}

/// As [`only_counters_left`], completion records (`…:record`) allowed too.
async fn only_counters_and_records_left(masters: &Masters) {
    left_only(masters, true).await;
}

async fn left_only(masters: &Masters, records: bool) {
    eventually("every lock is released", RELEASED_WITHIN, || async {
        for master in masters.iter() {
            let keys: Vec<String> = master.query(&redis::cmd("KEYS").arg("*").clone()).await;
            if !keys
                .iter()
                .all(|k| k.ends_with(":fence") || (records && k.ends_with(":record")))
            {
                return false;
            }
        }
        true
    })
    .await;
}

/// Locked requests get the lease's token in the header, the same one the `LeaseHandle`
/// gives, larger for each new holder of the key; a forged header is replaced on a locked
/// request and removed on one that passes through unlocked (`GET`).
pub async fn fencing_header_carries_the_lease_token<F: Framework>() {
    let m = Masters::start(3);
    let redlock = fencing_client(&m).await;
    let policy = policy_of(&redlock)
        .fencing_header("Fencing-Token")
        .build()
        .expect("a valid policy");
    let route = Route::locked(PATH, policy)
        .post(Handler::Report)
        .get(Handler::Report);
    let app = F::serve(&App::new().route(route)).await;
    let http = http_client();

    // Tokens order the holders of one key (a counter each), not of different keys.
    let mut last = std::collections::HashMap::new();
    for (round, key) in ["order-1", "order-1", "order-2", "order-1"]
        .iter()
        .enumerate()
    {
        let post = post_with(&http, &app.url(PATH), &[key]).header(FENCING_HEADER, FORGED);
        let v = reply(post).await.ok();
        assert_eq!(v["locked"], true, "{v}");
        let token = v["fencing_token"].as_u64().expect("a fencing token");
        assert_eq!(
            v["fencing_header"].as_str(),
            Some(token.to_string().as_str()),
            "round {round}: the header is not the lease's token: {v}"
        );
        // Each request's lease came after the last one's release: a new holder.
        let before = last.insert(*key, token).unwrap_or(0);
        assert!(
            token > before,
            "round {round}: token {token} after {before}"
        );
    }

    let get = http.get(app.url(PATH)).header(FENCING_HEADER, FORGED);
    let v = reply(get).await.ok();
    assert_eq!(v["locked"], false, "{v}");
    assert_eq!(
        v["fencing_header"],
        serde_json::Value::Null,
        "a forged token passed: {v}"
    );
    only_counters_left(&m).await;
    drop(http);
    app.stop().await;
}

/// Without `fencing_header`, the handler still reads the token from its `LeaseHandle`, and the
/// middleware leaves the request's headers as they are.
pub async fn fencing_token_without_header_is_on_the_lease_handle<F: Framework>() {
    let m = Masters::start(3);
    let redlock = fencing_client(&m).await;
    let policy = policy_of(&redlock).build().expect("a valid policy");
    let app = F::serve(&App::new().route(Route::locked(PATH, policy).post(Handler::Report))).await;
    let http = http_client();
    let post = post_with(&http, &app.url(PATH), &["order-1"]).header(FENCING_HEADER, "42");
    let v = reply(post).await.ok();
    assert_eq!(v["locked"], true, "{v}");
    assert!(v["fencing_token"].as_u64().is_some(), "{v}");
    assert_eq!(v["fencing_header"], "42", "{v}");
    only_counters_left(&m).await;
    drop(http);
    app.stop().await;
}

/// With replay: the request that runs gets its lease's token in the header; a duplicate
/// gets that run's stored answer (the same token in it, `Idempotency-Replayed: true`), and
/// another key's run a token of its own in its header.
pub async fn fencing_header_with_replay<F: Framework>() {
    let m = Masters::start(3);
    let redlock = fencing_client(&m).await;
    let policy = policy_of(&redlock)
        .replay(Replay::new())
        .fencing_header(FENCING_HEADER)
        .build()
        .expect("a valid policy");
    let app = F::serve(&App::new().route(Route::locked(PATH, policy).post(Handler::Report))).await;
    let http = http_client();
    let post = |key: &str| post_with(&http, &app.url(PATH), &[key]).header(FENCING_HEADER, FORGED);

    let first = reply(post("pay-1")).await;
    assert_eq!(first.header(Replay::REPLAYED_HEADER), None);
    let v = first.ok();
    let token = v["fencing_token"].as_u64().expect("a fencing token");
    assert_eq!(
        v["fencing_header"].as_str(),
        Some(token.to_string().as_str()),
        "{v}"
    );

    let again = reply(post("pay-1")).await;
    assert_eq!(again.header(Replay::REPLAYED_HEADER), Some("true"));
    assert_eq!(again.ok()["fencing_token"].as_u64(), Some(token));

    let other = reply(post("pay-2")).await.ok();
    let next = other["fencing_token"].as_u64().expect("a fencing token");
    assert_eq!(
        other["fencing_header"].as_str(),
        Some(next.to_string().as_str()),
        "{other}"
    );
    only_counters_and_records_left(&m).await;
    drop(http);
    app.stop().await;
}
