//! Idempotent endpoints (replay on): a key's first request runs the handler and its response
//! is stored on the masters; duplicates get it replayed and never run the handler; a key
//! reused with another request is `422`; a `5xx` is not stored; a stored response lasts its
//! retention; keys scoped by principal never share responses. The handlers count their runs
//! (the probe's `started`) and make a fresh `payment_id` per run.
//!
//! The helpers here are shared by [`crate::replay_faults`], [`crate::replay_limits`] and
//! [`crate::replay_mixed`].

use std::collections::BTreeMap;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::time::Duration;

use tower_redlock::key::{IdempotencyKey, KeyExtractorExt};
use tower_redlock::policy::{LockPolicy, OnContention};
use tower_redlock::replay::Replay;

use crate::exclusion::burst_until_one_holds;
use crate::harness::app::{App, Handler, Payment, Principal, Route, USER_HEADER};
use crate::harness::keys::{policy_of, redis_key};
use crate::harness::probe::Probe;
use crate::harness::Framework;
use crate::support::apps::*;
use crate::support::http::{http_client, reply, within, Reply};
use crate::support::{eventually, Masters};

/// The body of most payments.
pub const BODY: &str = r#"{"amount":1200,"currency":"EUR"}"#;
/// Another body.
pub const OTHER_BODY: &str = r#"{"amount":9900,"currency":"EUR"}"#;

/// A replay policy with the suite's extractor (`Idempotency-Key`, scoped by route).
pub fn replay_policy(redlock: &tower_redlock::Redlock, replay: Replay) -> LockPolicy {
    policy_of(redlock)
        .replay(replay)
        .build()
        .expect("a valid policy")
}

/// `POST url` with `Idempotency-Key: key`, `Content-Type: application/json` and `body`.
pub fn pay(http: &reqwest::Client, url: &str, key: &str, body: &str) -> reqwest::RequestBuilder {
    post_with(http, url, &[key])
        .header("content-type", "application/json")
        .body(body.to_owned())
}

/// The Redis key of the completion record beside the lock key `lock`.
pub fn record_key(lock: &str) -> String {
    format!("{lock}:record")
}

/// On how many of the masters `which` the completion record of `lock` exists (records are
/// binary: `EXISTS`, not `GET`).
pub async fn records_on(
    masters: &Masters,
    lock: &str,
    which: impl IntoIterator<Item = usize>,
) -> usize {
    let record = record_key(lock);
    let mut n = 0;
    for i in which {
        let exists: i64 = masters[i].query(redis::cmd("EXISTS").arg(&record)).await;
        n += usize::try_from(exists).expect("EXISTS counts");
    }
    n
}

/// A response's headers as a set: name → its values in order, without the names `without`.
pub fn header_set(reply: &Reply, without: &[&str]) -> BTreeMap<String, Vec<String>> {
    let mut set = BTreeMap::<String, Vec<String>>::new();
    for (name, value) in &reply.headers {
        if !without.contains(&name.as_str()) {
            set.entry(name.as_str().to_owned())
                .or_default()
                .push(String::from_utf8_lossy(value.as_bytes()).into_owned());
        }
    }
    set
}

/// A handler ran for `reply` (not a replay): `201` with a payment; returns its id.
#[track_caller]
pub fn assert_ran(reply: &Reply) -> String {
    assert_eq!(reply.status, 201, "{}", reply.text());
    assert_eq!(
        reply.header(Replay::REPLAYED_HEADER),
        None,
        "a run is marked replayed"
    );
    let v = reply.json();
    assert_eq!(v["locked"], true, "{v}");
    v["payment_id"]
        .as_str()
        .unwrap_or_else(|| panic!("no payment_id: {v}"))
        .to_owned()
}

/// Headers the server sets per connection or per response, never stored: left out when two
/// responses are compared. (`Connection: close`: actix-web closes a connection whose request
/// body was not read, as when a body outside the fingerprint is replayed without reading it.)
pub const PER_RESPONSE: [&str; 2] = ["date", "connection"];

/// Every one of `duplicates` (bounded: [`within`]) is `first` replayed ([`assert_replay_of`]).
pub async fn assert_replays_of(first: &Reply, duplicates: Vec<tokio::task::JoinHandle<Reply>>) {
    for duplicate in duplicates {
        let duplicate = within("a duplicate's reply", duplicate)
            .await
            .expect("no panic");
        assert_replay_of(first, &duplicate);
    }
}

/// `replay` is `first` replayed: the same status and body, the same header set but for
/// [`PER_RESPONSE`] and what is never stored (`Set-Cookie`), and `Idempotency-Replayed: true`.
#[track_caller]
pub fn assert_replay_of(first: &Reply, replay: &Reply) {
    assert_eq!(
        first.header(Replay::REPLAYED_HEADER),
        None,
        "the first answer is a replay"
    );
    assert_eq!(
        replay.header(Replay::REPLAYED_HEADER),
        Some("true"),
        "not a replay: {} {}",
        replay.status,
        replay.text()
    );
    assert_eq!(replay.status, first.status, "{}", replay.text());
    assert_eq!(replay.body, first.body, "the replayed body differs");
    assert_eq!(
        header_set(
            replay,
            &[PER_RESPONSE[0], PER_RESPONSE[1], Replay::REPLAYED_HEADER]
        ),
        header_set(first, &[PER_RESPONSE[0], PER_RESPONSE[1], "set-cookie"]),
        "the replayed headers differ"
    );
}

/// `409` `/problems/idempotency-completed-not-stored`, without `Retry-After` (retrying
/// cannot help: the request completed).
#[track_caller]
pub fn assert_not_stored(reply: &Reply) {
    assert_problem(reply, 409, "/problems/idempotency-completed-not-stored");
    assert_eq!(
        reply.header("retry-after"),
        None,
        "a Retry-After to wait for nothing"
    );
    assert_eq!(reply.header(Replay::REPLAYED_HEADER), None);
}

/// `RedlockLayer::idempotent` / `RedlockMiddleware::idempotent`: a key's first request runs
/// the handler and its response is stored on a quorum before it is answered (the write ended
/// the lock), kept the default retention; three duplicates, one after the other, get it
/// replayed — same status, body and header set (a repeated header kept in order, `Set-Cookie`
/// left out), `Idempotency-Replayed: true` — the handler never runs again, and a replay locks
/// nothing. `Replay::keep_header` and `drop_header` change which headers are stored.
pub async fn replay_sequential_duplicates_get_the_stored_response<F: Framework>() {
    const KEY: &str = "\"order-seq\"";
    const SESSIONS: &str = "/sessions";
    let (m, redlock) = masters_and_client().await;
    let policy = F::idempotent(redlock.clone()).expect("the idempotent short form");
    assert!(policy.replay().is_some());
    let probe = Probe::open_gate();
    let sessions = Probe::open_gate();
    let kept = Replay::new()
        .keep_header("Set-Cookie")
        .drop_header("X-Ledger-Tag");
    let app = App::new()
        .route(Route::locked(PATH, policy).post(Handler::payment(&probe)))
        .route(
            Route::locked(SESSIONS, replay_policy(&redlock, kept))
                .post(Handler::payment(&sessions)),
        );
    let app = F::serve(&app).await;
    let http = http_client();
    let lock = redis_key(PATH, PATH, KEY);

    let first = reply(pay(&http, &app.url(PATH), KEY, BODY)).await;
    let id = assert_ran(&first);
    let v = first.json();
    assert_eq!(
        (&v["resource"], &v["body"]),
        (&lock.clone().into(), &BODY.into())
    );
    assert!(first.header("set-cookie").is_some());
    let tags: Vec<_> = first.headers.get_all("x-ledger-tag").iter().collect();
    assert_eq!(tags, ["first", "second"]);
    assert!(
        records_on(&m, &lock, 0..3).await >= 2,
        "not stored on a quorum"
    );
    let pttl = m[0]
        .pttl(&record_key(&lock))
        .await
        .max(m[1].pttl(&record_key(&lock)).await);
    let retention = Replay::DEFAULT_RETENTION.as_millis() as i64;
    assert!(
        (retention - 60_000..=retention).contains(&pttl),
        "record PTTL {pttl} ms"
    );
    assert_released(&m, &lock).await;

    for _ in 0..3 {
        let duplicate = reply(pay(&http, &app.url(PATH), KEY, BODY)).await;
        assert_replay_of(&first, &duplicate);
        assert_eq!(duplicate.json()["payment_id"], id);
    }
    assert_eq!(probe.started(), 1, "a duplicate ran the handler");
    // Only the record is left, on every master.
    eventually(
        "the record, and nothing else, on every master",
        RELEASED_WITHIN,
        || async { m.dbsizes().await == [1, 1, 1] && records_on(&m, &lock, 0..3).await == 3 },
    )
    .await;

    // `keep_header("Set-Cookie")` stores the cookie, `drop_header("X-Ledger-Tag")` leaves
    // the tags out.
    let first = reply(pay(&http, &app.url(SESSIONS), KEY, BODY)).await;
    assert_ran(&first);
    let duplicate = reply(pay(&http, &app.url(SESSIONS), KEY, BODY)).await;
    assert_eq!(duplicate.header(Replay::REPLAYED_HEADER), Some("true"));
    assert_eq!(
        (duplicate.status, &duplicate.body),
        (first.status, &first.body)
    );
    assert_eq!(
        duplicate.header("set-cookie"),
        first.header("set-cookie"),
        "the kept cookie"
    );
    assert_eq!(
        header_set(
            &duplicate,
            &[PER_RESPONSE[0], PER_RESPONSE[1], Replay::REPLAYED_HEADER]
        ),
        header_set(&first, &[PER_RESPONSE[0], PER_RESPONSE[1], "x-ledger-tag"]),
    );
    assert_eq!(sessions.started(), 1);
    drop(http);
    app.stop().await;
}

/// 20 concurrent requests with one key: one runs (held at the gate), the 19 others get `409`
/// with `Retry-After`; once it answered, 20 concurrent duplicates all get its response
/// replayed (the same `payment_id`). With waiting on (`OnContention::wait(..)`), duplicates sent while the
/// first is in flight get the replay once it is done, not a `409`.
pub async fn replay_concurrent_duplicates_run_the_handler_once<F: Framework>() {
    const REQUESTS: usize = 20;
    const KEY: &str = "\"order-burst\"";
    const WAITING: &str = "/waiting";
    let (m, redlock) = masters_and_client().await;
    let probe = Probe::new();
    let waiting = Probe::new();
    let wait_policy = policy_of(&redlock)
        .replay(Replay::new())
        .on_contention(OnContention::wait(Duration::from_secs(20)))
        .build()
        .expect("a valid policy");
    let app = App::new()
        .route(
            Route::locked(PATH, replay_policy(&redlock, Replay::new()))
                .post(Handler::payment(&probe)),
        )
        .route(Route::locked(WAITING, wait_policy).post(Handler::payment(&waiting)));
    let app = F::serve(&app).await;
    let http = http_client();
    let urls = [app.url(PATH)];

    let mut replies = burst_until_one_holds(&http, &urls, KEY, REQUESTS, &probe, &m).await;
    assert_eq!(probe.started(), 1);
    probe.open();
    let first = next_reply(&mut replies).await;
    let id = assert_ran(&first);
    let mut duplicates = burst(&http, &urls, KEY, REQUESTS);
    for _ in 0..REQUESTS {
        let duplicate = next_reply(&mut duplicates).await;
        assert_replay_of(&first, &duplicate);
        assert_eq!(duplicate.json()["payment_id"], id);
    }
    assert_eq!(probe.started(), 1, "a duplicate ran the handler");

    let holder = tokio::spawn(reply(pay(&http, &app.url(WAITING), KEY, BODY)));
    waiting.until_started(1).await;
    let duplicates: Vec<_> = (0..5)
        .map(|_| tokio::spawn(reply(pay(&http, &app.url(WAITING), KEY, BODY))))
        .collect();
    waiting.open();
    let first = within("the holder's reply", holder)
        .await
        .expect("no panic");
    assert_ran(&first);
    assert_replays_of(&first, duplicates).await;
    assert_eq!(waiting.started(), 1, "a waiting duplicate ran the handler");
    drop(http);
    app.stop().await;
}

/// A key reused with another request — another body, another path of the same route (the key
/// is scoped by route, so it collides), another method, a query, another value of a
/// fingerprinted header, no body — is `422` `/problems/idempotency-key-reused`, and never runs
/// the handler; a header outside the fingerprint changes nothing (replayed). With
/// `Replay::without_body`, the body is not compared: another body is replayed.
pub async fn replay_a_reused_key_with_another_request_is_422<F: Framework>() {
    const KEY: &str = "\"order-reused\"";
    const ORDERS: &str = "/orders/{id}";
    const NOTES: &str = "/notes";
    let (_m, redlock) = masters_and_client().await;
    let probe = Probe::open_gate();
    let notes = Probe::open_gate();
    let by_content_type = Replay::new().fingerprint_header("Content-Type");
    let app = App::new()
        .route(
            Route::locked(ORDERS, replay_policy(&redlock, by_content_type))
                .post(Handler::payment(&probe))
                .put(Handler::payment(&probe)),
        )
        .route(
            Route::locked(NOTES, replay_policy(&redlock, Replay::new().without_body()))
                .post(Handler::payment(&notes)),
        );
    let app = F::serve(&app).await;
    let http = http_client();
    let order = app.url("/orders/1");

    let first = reply(pay(&http, &order, KEY, BODY)).await;
    assert_ran(&first);
    let reused = [
        ("another body", pay(&http, &order, KEY, OTHER_BODY)),
        ("another path", pay(&http, &app.url("/orders/2"), KEY, BODY)),
        (
            "another method",
            with_keys(http.put(&order), &[KEY])
                .header("content-type", "application/json")
                .body(BODY),
        ),
        (
            "a query",
            pay(&http, &app.url("/orders/1?dry_run=1"), KEY, BODY),
        ),
        (
            "another content type",
            post_with(&http, &order, &[KEY])
                .header("content-type", "text/plain")
                .body(BODY),
        ),
        ("no body", post_with(&http, &order, &[KEY])),
    ];
    for (what, request) in reused {
        let answer = reply(request).await;
        assert_eq!(answer.status, 422, "{what}: {}", answer.text());
        assert_problem(&answer, 422, "/problems/idempotency-key-reused");
        assert_eq!(answer.header(Replay::REPLAYED_HEADER), None, "{what}");
        assert_eq!(answer.header("retry-after"), None, "{what}");
    }
    let traced = pay(&http, &order, KEY, BODY).header("x-trace-id", "t-2");
    assert_replay_of(&first, &reply(traced).await);
    assert_eq!(probe.started(), 1, "a reused key ran the handler");

    let note = reply(pay(&http, &app.url(NOTES), KEY, BODY)).await;
    assert_ran(&note);
    assert_eq!(note.json()["body"], BODY, "the streamed body changed");
    let other = reply(pay(&http, &app.url(NOTES), KEY, OTHER_BODY)).await;
    assert_replay_of(&note, &other);
    assert_eq!(notes.started(), 1);
    drop(http);
    app.stop().await;
}

/// A `500` is not stored and its lock is released at once: the retry runs the handler again
/// (two runs), and its `201` is what duplicates get replayed. With `store_if(|_| true)` the
/// `500` itself is stored and replayed, and the handler runs once.
pub async fn replay_a_5xx_is_not_stored_and_the_retry_runs<F: Framework>() {
    const KEY: &str = "\"order-5xx\"";
    const STORE_ALL: &str = "/store-all";
    let (m, redlock) = masters_and_client().await;
    let probe = Probe::open_gate();
    let stored = Probe::open_gate();
    let failing = |probe: &Arc<Probe>| {
        Handler::Payment(
            probe.clone(),
            Payment::FailingFirst(Arc::new(AtomicUsize::new(1))),
        )
    };
    let app = App::new()
        .route(Route::locked(PATH, replay_policy(&redlock, Replay::new())).post(failing(&probe)))
        .route(
            Route::locked(
                STORE_ALL,
                replay_policy(&redlock, Replay::new().store_if(|_| true)),
            )
            .post(failing(&stored)),
        );
    let app = F::serve(&app).await;
    let http = http_client();
    let lock = redis_key(PATH, PATH, KEY);

    let failed = reply(pay(&http, &app.url(PATH), KEY, BODY)).await;
    assert_eq!(failed.status, 500, "{}", failed.text());
    assert_eq!(failed.header(Replay::REPLAYED_HEADER), None);
    assert_eq!(records_on(&m, &lock, 0..3).await, 0, "a 500 was stored");
    // Released, not left to its ttl.
    assert_released(&m, &lock).await;

    let retried = reply(pay(&http, &app.url(PATH), KEY, BODY)).await;
    let id = assert_ran(&retried);
    assert_ne!(failed.json()["payment_id"], id);
    assert_eq!(probe.started(), 2, "the retry did not run the handler");
    let duplicate = reply(pay(&http, &app.url(PATH), KEY, BODY)).await;
    assert_replay_of(&retried, &duplicate);
    assert_eq!(probe.started(), 2);

    let failed = reply(pay(&http, &app.url(STORE_ALL), KEY, BODY)).await;
    assert_eq!(failed.status, 500, "{}", failed.text());
    let duplicate = reply(pay(&http, &app.url(STORE_ALL), KEY, BODY)).await;
    assert_replay_of(&failed, &duplicate);
    assert_eq!(stored.started(), 1, "a stored 500 ran again");
    drop(http);
    app.stop().await;
}

/// With `Replay::retention(3 s)`, the record expires on the masters (PTTL at most 3 s); a
/// duplicate within it is replayed, the same key after it runs the handler again (a new
/// payment), and that run is replayed in turn.
pub async fn replay_ends_with_the_retention<F: Framework>() {
    const KEY: &str = "\"order-retention\"";
    const RETENTION: Duration = Duration::from_secs(3);
    let (m, redlock) = masters_and_client().await;
    let probe = Probe::open_gate();
    let policy = replay_policy(&redlock, Replay::new().retention(RETENTION));
    let app =
        F::serve(&App::new().route(Route::locked(PATH, policy).post(Handler::payment(&probe))))
            .await;
    let http = http_client();
    let lock = redis_key(PATH, PATH, KEY);

    let first = reply(pay(&http, &app.url(PATH), KEY, BODY)).await;
    let id = assert_ran(&first);
    let pttls = m.pttls(&record_key(&lock)).await;
    let live = pttls.iter().filter(|&&p| p > 0).count();
    assert!(live >= 2, "the record on a quorum: PTTLs {pttls:?}");
    assert!(
        pttls
            .iter()
            .all(|&p| p == -2 || (1..=RETENTION.as_millis() as i64).contains(&p)),
        "PTTLs {pttls:?}: a record without expiry, or over the retention"
    );
    assert_replay_of(&first, &reply(pay(&http, &app.url(PATH), KEY, BODY)).await);

    eventually(
        "the record expires on every master",
        Duration::from_secs(30),
        || async { records_on(&m, &lock, 0..3).await == 0 },
    )
    .await;
    let again = reply(pay(&http, &app.url(PATH), KEY, BODY)).await;
    let new_id = assert_ran(&again);
    assert_ne!(new_id, id, "the expired response was replayed");
    assert_eq!(probe.started(), 2);
    assert_replay_of(&again, &reply(pay(&http, &app.url(PATH), KEY, BODY)).await);
    assert_eq!(probe.started(), 2);
    drop(http);
    app.stop().await;
}

/// Two tenants with the same `Idempotency-Key` and the same request, scoped by the
/// authenticated principal (`scoped_by_extension`) on one route and by a tenant header
/// (`scoped_by_header("x-tenant")`) on another: each tenant's first request runs (two runs,
/// two payments), each tenant's duplicate replays its own response, never the other's; a
/// request without the scope is `400`.
pub async fn replay_is_scoped_by_the_principal<F: Framework>() {
    const KEY: &str = "\"order-tenants\"";
    const TRANSFERS: &str = "/transfers";
    const TENANT_HEADER: &str = "x-tenant";
    let (_m, redlock) = masters_and_client().await;
    let by_user = IdempotencyKey::required()
        .scoped_by_route()
        .scoped_by_extension(|p: &Principal| p.tenant.clone());
    let by_header = IdempotencyKey::required()
        .scoped_by_route()
        .scoped_by_header(TENANT_HEADER);
    let by_user = LockPolicy::builder(redlock.clone(), by_user).replay(Replay::new());
    let by_header = LockPolicy::builder(redlock, by_header).replay(Replay::new());
    let (users, tenants) = (Probe::open_gate(), Probe::open_gate());
    let app = App::new()
        .route(
            Route::locked(PATH, by_user.build().expect("a valid policy"))
                .post(Handler::payment(&users)),
        )
        .route(
            Route::locked(TRANSFERS, by_header.build().expect("a valid policy"))
                .post(Handler::payment(&tenants)),
        );
    let app = F::serve(&app).await;
    let http = http_client();

    for (path, header, probe) in [
        (PATH, USER_HEADER, &users),
        (TRANSFERS, TENANT_HEADER, &tenants),
    ] {
        let as_tenant = |tenant: &str| pay(&http, &app.url(path), KEY, BODY).header(header, tenant);
        let acme = reply(as_tenant("acme")).await;
        let globex = reply(as_tenant("globex")).await;
        let (acme_id, globex_id) = (assert_ran(&acme), assert_ran(&globex));
        assert_ne!(acme_id, globex_id, "{path}: a tenant got another's payment");
        if path == PATH {
            assert_eq!(acme.json()["tenant"], "acme");
            assert_eq!(globex.json()["tenant"], "globex");
        }
        for _ in 0..2 {
            for (tenant, first) in [("acme", &acme), ("globex", &globex)] {
                assert_replay_of(first, &reply(as_tenant(tenant)).await);
            }
        }
        assert_eq!(probe.started(), 2, "{path}");
        let anonymous = reply(pay(&http, &app.url(path), KEY, BODY)).await;
        assert_problem(&anonymous, 400, "/problems/lock-key-missing");
        assert_eq!(probe.started(), 2, "{path}");
    }
    drop(http);
    app.stop().await;
}
