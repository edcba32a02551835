//! A lease lost while its request runs (`OnLost`): abort stops the handler and answers
//! `503` lock-lost — when the keep-alive cannot reach a quorum (masters frozen), or when the
//! validity runs out without keep-alive —, breaks off a streaming body; finish runs on and
//! says `Lock-Lost: true`; with replay, the key afterwards answers "outcome unknown" (abort)
//! or the late response (finish), never a second run. Healthy masters and a live process
//! never lose a lease. Every test name contains `on_lost`.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use http_body_util::BodyExt;
use tower::{Service, ServiceExt};
use tower_redlock::key::IdempotencyKey;
use tower_redlock::policy::{
    LockPolicy, LockPolicyBuilder, LostLease, LostRule, OnLost, ReleaseOn, LOCK_LOST_HEADER,
};
use tower_redlock::replay::Replay;
use tower_redlock::Redlock;

use crate::axum_only::{lifecycle, next_data, request};
use crate::harness::app::{App, Handler, Route};
use crate::harness::keys::{policy_of, redis_key};
use crate::harness::probe::{Probe, Streams};
use crate::harness::{Actix, Axum, Framework, Served};
use crate::mixed::assert_same_answer;
use crate::release::{stream_through, streaming_app};
use crate::replay::{assert_ran, assert_replay_of, pay, records_on, BODY};
use crate::support::apps::*;
use crate::support::http::{http_client, reply, send, within, Reply};
use crate::support::{eventually, Masters};

/// The ttl of these tests. Two promises hang on it besides the losses under test: a
/// duplicate sent while the first request holds the key (keep-alive off: at most one ttl)
/// must reach the masters within that ttl — one HTTP round trip and one try of at most two
/// node timeouts (1 s) —, and a kept-alive lease on healthy masters must never be lost — an
/// extension due at ttl/3 may start up to ttl/3 − drift late (here ~1 s) and still land. At
/// 900 ms with 200 ms node timeouts a stall of a few hundred milliseconds broke either:
/// machine speed, not the promise. A duplicate that still comes too late is reported as a
/// scenario the machine could not set up ([`assert_duplicate_refused`]).
const TTL: Duration = Duration::from_secs(3);
/// What a loaded machine may add to a bound on top of the protocol's own time.
const SLACK: Duration = Duration::from_millis(1500);

/// The apps' client ([`HTTP_NODE_TIMEOUT`] per node, which fits in [`TTL`]), warmed up.
async fn quick_client_of(masters: &Masters) -> Redlock {
    client_of(masters).await
}

/// A duplicate of the first request, sent while the first holds the key, is refused with
/// `409`. The first request's lock was taken after `first_sent`, so every master holds it
/// until at least `first_sent + TTL`, and with `kept_alive` (keep-alive on, the masters
/// healthy) for as long as the first runs: a duplicate answered — or let into the handler —
/// while the key was held, and anything but a `409` is the promise broken. Without
/// keep-alive, one the machine delivered only after the ttl proves nothing: it panics as a
/// scenario that could not be set up, never as a broken promise.
async fn assert_duplicate_refused(
    duplicate: impl std::future::Future<Output = Reply>,
    first_sent: Instant,
    probe: &Probe,
    kept_alive: bool,
) {
    let too_late = |what: &str| {
        let after = first_sent.elapsed();
        if after >= TTL && !kept_alive {
            panic!(
                "could not set up the scenario: the duplicate {what} {after:?} after the first \
                 request was sent, past its ttl of {TTL:?} (a loaded machine)"
            );
        }
    };
    tokio::select! {
        reply = duplicate => {
            if reply.status != 409 {
                too_late("was answered");
            }
            assert_conflict(&reply, TTL);
        }
        () = probe.until_started(2) => {
            too_late("ran");
            panic!("a duplicate ran while the first request held the key");
        }
    }
}

/// Three masters, a warmed-up client of them, and an app built by `app` with a policy of
/// [`TTL`] that `policy` completes, served by `F`.
struct Setup {
    m: Masters,
    probe: Arc<Probe>,
    app: Served,
    http: reqwest::Client,
    url: String,
}

impl Setup {
    async fn start<F: Framework>(
        policy: impl FnOnce(LockPolicyBuilder) -> LockPolicyBuilder,
        app: fn(LockPolicy, &Arc<Probe>) -> App,
    ) -> Self {
        let m = Masters::start(3);
        let redlock = quick_client_of(&m).await;
        let policy = policy(policy_of(&redlock).ttl(TTL));
        let probe = Probe::new();
        let app = F::serve(&app(policy.build().expect("a valid policy"), &probe)).await;
        let (http, url) = (http_client(), app.url(PATH));
        Self {
            m,
            probe,
            app,
            http,
            url,
        }
    }

    /// The Redis key of `POST /payments` with `Idempotency-Key: key`.
    fn lock(&self, key: &str) -> String {
        redis_key(PATH, PATH, key)
    }

    async fn stop(self) {
        drop(self.http);
        self.app.stop().await;
    }
}

/// `POST /payments` → the gated handler behind `policy`.
fn gated(policy: LockPolicy, probe: &Arc<Probe>) -> App {
    App::gated(PATH, policy, probe)
}

/// `POST /payments` → the payment handler (replay apps) behind `policy`.
fn payments(policy: LockPolicy, probe: &Arc<Probe>) -> App {
    App::new().route(Route::locked(PATH, policy).post(Handler::payment(probe)))
}

/// `503` `/problems/lock-lost`, with a `Retry-After` no shorter than the ttl (rounded up).
#[track_caller]
pub fn assert_lock_lost(reply: &Reply, ttl: Duration) {
    let v = assert_problem(reply, 503, "/problems/lock-lost");
    let ceil = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    assert!(
        reply.retry_after() >= ceil,
        "Retry-After below the ttl: {v}"
    );
    assert_eq!(v["retry_after"], reply.retry_after(), "{v}");
    assert_eq!(reply.header(LOCK_LOST_HEADER), None);
}

/// `409` `/problems/idempotency-outcome-unknown`, without `Retry-After`.
#[track_caller]
pub fn assert_outcome_unknown(reply: &Reply) {
    assert_problem(reply, 409, "/problems/idempotency-outcome-unknown");
    assert_eq!(reply.header("retry-after"), None, "{}", reply.text());
    assert_eq!(reply.header(Replay::REPLAYED_HEADER), None);
}

/// The moments a hook saw: (the loss, when the hook was called).
type Seen = Arc<Mutex<Vec<(Instant, Instant)>>>;

/// A hook that records when each loss was and when it was told, and answers `on`.
fn recording(
    on: OnLost,
) -> (
    Seen,
    impl Fn(&LostLease<'_>) -> OnLost + Send + Sync + 'static,
) {
    let seen = Seen::default();
    let hook = {
        let seen = Arc::clone(&seen);
        move |lost: &LostLease<'_>| {
            assert!(!lost.reason().is_empty());
            seen.lock().unwrap().push((lost.lost_at(), Instant::now()));
            on
        }
    };
    (seen, hook)
}

/// Abort, with the keep-alive unable to reach a quorum (two of three masters frozen): the
/// handler is dropped within one extension interval (ttl/3) of the loss — the hook is told
/// at once —, the client gets `503` lock-lost with a `Retry-After` of at least the ttl. A
/// duplicate while the lease held got `409`; once the masters are back, the next request
/// runs (no replay: nothing is remembered).
pub async fn on_lost_abort_stops_the_handler_when_the_masters_freeze<F: Framework>() {
    const KEY: &str = "order-frozen";
    let (seen, hook) = recording(OnLost::Abort);
    let t = Setup::start::<F>(|p| p.on_lost(LostRule::decide(hook)), gated).await;
    let (m, probe, http, url) = (&t.m, &t.probe, &t.http, &t.url);

    let sent = Instant::now();
    let first = tokio::spawn(post_key(http, url, KEY));
    probe.until_started(1).await;
    assert_duplicate_refused(post_key(http, url, KEY), sent, probe, true).await;
    let frozen_at = Instant::now();
    m[0].freeze();
    m[1].freeze();
    let first = within("the aborted request", first)
        .await
        .expect("no panic");
    let took = frozen_at.elapsed();
    assert_lock_lost(&first, TTL);
    // The lease's deadline is at most a ttl after the freeze (no extension lands after it).
    assert!(
        took <= TTL + TTL / 3 + SLACK,
        "aborted {took:?} after the freeze"
    );
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "the hook is told once");
    let (lost_at, told_at) = seen[0];
    let late = told_at.saturating_duration_since(lost_at);
    assert!(late <= TTL / 3 + SLACK, "told {late:?} after the loss");
    eventually("the handler is dropped", RELEASED_WITHIN, || async {
        probe.cancelled() == 1
    })
    .await;
    assert_eq!(probe.completed(), 0, "the handler ran to its end");

    m[0].thaw();
    m[1].thaw();
    // The lost lease's lock on the thawed masters expires (its ttl was set by the last
    // extension, a few ms after the client's deadline for it) or is released by the owed
    // release: only then is the key free. A request sent before gets 409, rightly.
    let lock = t.lock(KEY);
    eventually(
        "the lost lease's lock is gone from every master",
        RELEASED_WITHIN,
        || async { m.absent_everywhere(&lock).await },
    )
    .await;
    probe.open();
    let next = post_key(http, url, KEY).await;
    assert_eq!(next.ok()["lost"], false);
    assert_eq!(probe.started(), 2);
    t.stop().await;
}

/// Abort, keep-alive off, healthy masters: the handler outlives its validity and is stopped
/// when it runs out; `503` lock-lost. A duplicate while the lease held got `409`; the key is
/// free afterwards: the next request runs.
pub async fn on_lost_abort_stops_a_handler_past_its_validity<F: Framework>() {
    const KEY: &str = "order-expiring";
    let t = Setup::start::<F>(|p| p.keep_alive(false).on_lost(OnLost::Abort), gated).await;
    let (m, probe, http, url, key) = (&t.m, &t.probe, &t.http, &t.url, t.lock(KEY));

    let started = Instant::now();
    let first = tokio::spawn(post_key(http, url, KEY));
    probe.until_started(1).await;
    assert_duplicate_refused(post_key(http, url, KEY), started, probe, false).await;
    let first = within("the aborted request", first)
        .await
        .expect("no panic");
    assert_lock_lost(&first, TTL);
    assert!(started.elapsed() <= TTL + SLACK, "{:?}", started.elapsed());
    assert_eq!((probe.started(), probe.cancelled()), (1, 1));
    assert_released(m, &key).await;
    probe.open();
    assert_eq!(post_key(http, url, KEY).await.ok()["locked"], true);
    assert_eq!(probe.started(), 2);
    t.stop().await;
}

/// Finish (the default), keep-alive off: the handler runs on past its validity and answers
/// with `Lock-Lost: true`; it saw its lease lost. The lock no longer excludes: a duplicate
/// sent after the expiry runs beside it. Nothing is left on the masters, and the next request
/// runs.
pub async fn on_lost_finish_answers_with_the_header_and_stores_nothing<F: Framework>() {
    const KEY: &str = "order-finish";
    let t = Setup::start::<F>(|p| p.keep_alive(false), gated).await;
    let (m, probe, http, url, key) = (&t.m, &t.probe, &t.http, &t.url, t.lock(KEY));

    let first = tokio::spawn(post_key(http, url, KEY));
    probe.until_started(1).await;
    eventually("the lock expires on every master", TTL + SLACK * 4, || {
        m.absent_everywhere(&key)
    })
    .await;
    let during = tokio::spawn(post_key(http, url, KEY));
    probe.until_started(2).await;
    probe.open();
    let first = within("the first request", first).await.expect("no panic");
    assert_eq!(first.header(LOCK_LOST_HEADER), Some("true"));
    assert_eq!(first.ok()["lost"], true);
    let during = within("the duplicate", during).await.expect("no panic");
    assert_eq!(during.ok()["locked"], true);
    assert_eq!(probe.completed(), 2);
    eventually(
        "nothing is left on the masters",
        RELEASED_WITHIN,
        || async { m.dbsizes().await == [0, 0, 0] },
    )
    .await;
    // Nothing remembered: the next request runs.
    assert_eq!(post_key(http, url, KEY).await.ok()["locked"], true);
    assert_eq!(probe.started(), 3);
    t.stop().await;
}

/// Abort with replay, keep-alive off: the first request is stopped (`503`); the key is
/// marked "outcome unknown" on a quorum, and every later request with it gets `409`
/// outcome-unknown — the handler ran once. A duplicate while the lease held got `409`.
pub async fn on_lost_abort_with_replay_answers_outcome_unknown<F: Framework>() {
    const KEY: &str = "\"order-unknown\"";
    let t = Setup::start::<F>(
        |p| {
            p.keep_alive(false)
                .replay(Replay::new())
                .on_lost(OnLost::Abort)
        },
        payments,
    )
    .await;
    let (m, probe, http, url, lock) = (&t.m, &t.probe, &t.http, &t.url, t.lock(KEY));

    let sent = Instant::now();
    let first = tokio::spawn(reply(pay(http, url, KEY, BODY)));
    probe.until_started(1).await;
    assert_duplicate_refused(reply(pay(http, url, KEY, BODY)), sent, probe, false).await;
    let first = within("the aborted request", first)
        .await
        .expect("no panic");
    assert_lock_lost(&first, TTL);
    // On every master: one whose mark is still on its way may hold the stopped request's
    // lock, and a live lock beside records answers `409` in flight (rule 3).
    eventually("the mark is on every master", RELEASED_WITHIN, || async {
        records_on(m, &lock, 0..3).await == 3
    })
    .await;
    probe.open();
    for _ in 0..2 {
        assert_outcome_unknown(&reply(pay(http, url, KEY, BODY)).await);
    }
    assert_eq!(probe.started(), 1, "the handler ran again");
    t.stop().await;
}

/// Abort with replay while two masters are frozen: the mark cannot be written there then;
/// once they are back it lands where the key is still ours or free, and the next request
/// gets `409` outcome-unknown instead of a second run. The test waits for the mark on every
/// master: a thawed master whose mark is still on its way holds the stopped request's lock,
/// and a live lock beside records answers `409` in flight (the replay rule's rule 3) — a
/// stress run once sent the request in that moment.
pub async fn on_lost_abort_with_replay_marks_the_key_once_the_masters_return<F: Framework>() {
    const KEY: &str = "\"order-unknown-frozen\"";
    let t = Setup::start::<F>(|p| p.replay(Replay::new()).on_lost(OnLost::Abort), payments).await;
    let (m, probe, http, url, lock) = (&t.m, &t.probe, &t.http, &t.url, t.lock(KEY));

    let first = tokio::spawn(reply(pay(http, url, KEY, BODY)));
    probe.until_started(1).await;
    m[0].freeze();
    m[1].freeze();
    let first = within("the aborted request", first)
        .await
        .expect("no panic");
    assert_lock_lost(&first, TTL);
    m[0].thaw();
    m[1].thaw();
    eventually("the mark lands on every master", SLACK * 8, || async {
        records_on(m, &lock, 0..3).await == 3
    })
    .await;
    probe.open();
    assert_outcome_unknown(&reply(pay(http, url, KEY, BODY)).await);
    assert_eq!(probe.started(), 1, "the handler ran again");
    t.stop().await;
}

/// Abort with replay for a handler declared safe to repeat (`repeatable_after_loss`): the
/// stopped request leaves no record, and the next request with the key runs.
pub async fn on_lost_abort_repeatable_runs_the_key_again<F: Framework>() {
    const KEY: &str = "\"order-repeat\"";
    let t = Setup::start::<F>(
        |p| {
            p.keep_alive(false)
                .replay(Replay::new())
                .on_lost(OnLost::Abort)
                .repeatable_after_loss(true)
        },
        payments,
    )
    .await;
    let (m, probe, http, url, lock) = (&t.m, &t.probe, &t.http, &t.url, t.lock(KEY));

    assert_lock_lost(&reply(pay(http, url, KEY, BODY)).await, TTL);
    assert_released(m, &lock).await;
    assert_eq!(records_on(m, &lock, 0..3).await, 0);
    probe.open();
    let second = reply(pay(http, url, KEY, BODY)).await;
    assert_ran(&second);
    assert_replay_of(&second, &reply(pay(http, url, KEY, BODY)).await);
    assert_eq!(probe.started(), 2);
    t.stop().await;
}

/// Finish with replay, keep-alive off: the handler outlives its lease; its response (with
/// `Lock-Lost: true`) is stored where the key is free, and the duplicate gets it replayed —
/// the handler ran once. A duplicate while the lease held got `409`.
pub async fn on_lost_finish_with_replay_stores_the_late_response<F: Framework>() {
    const KEY: &str = "\"order-late\"";
    let t = Setup::start::<F>(|p| p.keep_alive(false).replay(Replay::new()), payments).await;
    let (m, probe, http, url, lock) = (&t.m, &t.probe, &t.http, &t.url, t.lock(KEY));

    let sent = Instant::now();
    let first = tokio::spawn(reply(pay(http, url, KEY, BODY)));
    probe.until_started(1).await;
    assert_duplicate_refused(reply(pay(http, url, KEY, BODY)), sent, probe, false).await;
    eventually("the lock expires on every master", TTL + SLACK * 4, || {
        m.absent_everywhere(&lock)
    })
    .await;
    probe.open();
    let first = within("the first request", first).await.expect("no panic");
    assert_ran(&first);
    assert_eq!(first.header(LOCK_LOST_HEADER), Some("true"));
    assert!(records_on(m, &lock, 0..3).await >= 2, "not stored");
    let duplicate = reply(pay(http, url, KEY, BODY)).await;
    assert_replay_of(&first, &duplicate);
    assert_eq!(probe.started(), 1, "the handler ran again");
    t.stop().await;
}

/// Finish with replay while two masters are frozen: the handler finishes after its lease
/// was lost, and its response is not held back until the masters answer (it waits for its
/// record one second at most); the record lands in the background once they are back, and
/// the duplicate gets the response replayed — the handler ran once.
pub async fn on_lost_finish_with_replay_answers_while_the_masters_are_frozen<F: Framework>() {
    const KEY: &str = "\"order-late-frozen\"";
    let (seen, hook) = recording(OnLost::Finish);
    let t = Setup::start::<F>(
        |p| p.replay(Replay::new()).on_lost(LostRule::decide(hook)),
        payments,
    )
    .await;
    let (m, probe, http, url, lock) = (&t.m, &t.probe, &t.http, &t.url, t.lock(KEY));

    let first = tokio::spawn(reply(pay(http, url, KEY, BODY)));
    probe.until_started(1).await;
    m[0].freeze();
    m[1].freeze();
    eventually("the lease is lost", TTL + SLACK * 4, || async {
        !seen.lock().unwrap().is_empty()
    })
    .await;
    let opened = Instant::now();
    probe.open();
    let first = within("the first request", first).await.expect("no panic");
    let waited = opened.elapsed();
    assert_ran(&first);
    assert_eq!(first.header(LOCK_LOST_HEADER), Some("true"));
    assert!(
        waited <= Duration::from_secs(1) + SLACK,
        "held back {waited:?}"
    );
    m[0].thaw();
    m[1].thaw();
    // On every master (not a quorum): a thawed one whose record is still on its way holds
    // our lock, and a live lock beside records answers `409` in flight (rule 3).
    eventually("the record lands on every master", SLACK * 8, || async {
        records_on(m, &lock, 0..3).await == 3
    })
    .await;
    assert_replay_of(&first, &reply(pay(http, url, KEY, BODY)).await);
    assert_eq!(probe.started(), 1, "the handler ran again");
    t.stop().await;
}

/// Abort with release at the body's end: a body streaming when two masters freeze is broken
/// off — the client's read fails, never a clean, truncated end. While it streamed, a
/// duplicate got `409`; once the masters are back the key is free again.
pub async fn on_lost_abort_breaks_off_a_streaming_body<F: Framework>() {
    const KEY: &str = "stream-lost";
    let m = Masters::start(3);
    let redlock = quick_client_of(&m).await;
    let policy = policy_of(&redlock)
        .ttl(TTL)
        .release_on(ReleaseOn::BodyEnd)
        .on_lost(OnLost::Abort)
        .build()
        .expect("a valid policy");
    let streams = Streams::new();
    let app = F::serve(&streaming_app(policy, &streams)).await;
    let (http, url) = (http_client(), app.url(PATH));

    let body = streams.next();
    let mut response = send(post_with(&http, &url, &[KEY])).await;
    assert_eq!(response.status(), 200);
    stream_through(&body, &mut response, "first ").await;
    assert_conflict(&post_key(&http, &url, KEY).await, TTL);
    m[0].freeze();
    m[1].freeze();
    let end = within("the broken body", async {
        loop {
            match response.chunk().await {
                Ok(Some(_)) => continue,
                end => return end,
            }
        }
    })
    .await;
    assert!(end.is_err(), "the body ended cleanly: {end:?}");
    m[0].thaw();
    m[1].thaw();
    // The key is free once the lost lease's lock is gone from the thawed masters (expired,
    // or released by the owed release); before, a request gets 409, rightly.
    let lock = redis_key(PATH, PATH, KEY);
    eventually(
        "the lost lease's lock is gone from every master",
        RELEASED_WITHIN,
        || async { m.absent_everywhere(&lock).await },
    )
    .await;
    let next = post_key(&http, &url, KEY).await;
    assert_eq!(next.status, 200, "{}", next.text());
    drop((body, http));
    app.stop().await;
}

/// Abort on healthy masters and a live process: a handler running for two ttls keeps its
/// lease (kept alive), answers `200`, never lock-lost, and no hook is told. Valid two ttls
/// after it was taken, it was extended at least twice: once before the first ttl ran out,
/// once after (an extension lands only on a valid lease).
pub async fn on_lost_abort_never_fires_on_healthy_masters<F: Framework>() {
    const KEY: &str = "order-healthy";
    let (seen, hook) = recording(OnLost::Abort);
    let t = Setup::start::<F>(|p| p.on_lost(LostRule::decide(hook)), gated).await;
    let (probe, http, url) = (&t.probe, &t.http, &t.url);

    let first = tokio::spawn(post_key(http, url, KEY));
    probe.until_started(1).await;
    // The passing of time is what is tested here: two ttls.
    tokio::time::sleep(2 * TTL).await;
    probe.open();
    let first = within("the request", first).await.expect("no panic");
    let v = first.ok();
    assert_eq!(v["lost"], false, "{v}");
    assert!(v["extensions"].as_u64().expect("extensions") >= 2, "{v}");
    assert_eq!(first.header(LOCK_LOST_HEADER), None);
    assert!(seen.lock().unwrap().is_empty(), "a hook was told");
    t.stop().await;
}

/// The same in process (the tower service): a body whose lease is lost while it streams
/// ends with an error for an HTTP client, and with `grpc-status: 14` (`UNAVAILABLE`)
/// trailers for a gRPC call — never with a clean end: whether the loss comes while the body
/// waits for its next chunk (masters frozen, the keep-alive fails), or is found when the
/// next chunk is ready (keep-alive off, the lock expired meanwhile: that chunk is not sent).
#[tokio::test(flavor = "multi_thread")]
async fn on_lost_abort_ends_a_tower_body_with_an_error_or_grpc_trailers() {
    for (grpc, keep_alive) in [(false, true), (true, true), (false, false)] {
        let mut t = lifecycle(|redlock| {
            LockPolicy::builder(redlock, IdempotencyKey::required())
                .ttl(TTL)
                .keep_alive(keep_alive)
                .release_on(ReleaseOn::BodyEnd)
                .on_lost(OnLost::Abort)
                .build()
                .expect("a valid policy")
        })
        .await;
        let mut req = request("stream-grpc");
        if grpc {
            req.headers_mut().insert(
                "content-type",
                http::HeaderValue::from_static("application/grpc"),
            );
        }
        let service = t.service.ready().await.expect("ready");
        let res = within("the response", service.call(req))
            .await
            .expect("a response");
        let mut body = res.into_body();
        let tx = within("the body", t.bodies.recv()).await.expect("a body");
        tx.send(bytes::Bytes::from_static(b"first"))
            .await
            .expect("streaming");
        assert_eq!(next_data(&mut body).await.as_deref(), Some(&b"first"[..]));
        if keep_alive {
            t.masters[0].freeze();
            t.masters[1].freeze();
        } else {
            let key = crate::axum_only::redis_key("stream-grpc");
            eventually("the lock expires on every master", TTL + SLACK * 4, || {
                t.masters.absent_everywhere(&key)
            })
            .await;
            tx.send(bytes::Bytes::from_static(b"after the loss"))
                .await
                .expect("streaming");
        }
        let last = within("the last frame", body.frame())
            .await
            .expect("a last frame");
        if grpc {
            let trailers = last.expect("trailers, not an error").into_trailers();
            let trailers = trailers.expect("trailers");
            assert_eq!(trailers["grpc-status"], "14", "{trailers:?}");
        } else {
            let e = last.expect_err("an error, not a frame");
            assert!(
                e.is_lock_lost() && e.to_string().contains("lock was lost"),
                "{e}"
            );
        }
        assert!(within("the end", body.frame()).await.is_none());
        assert!(http_body::Body::is_end_stream(&body));
        if keep_alive {
            t.masters[0].thaw();
            t.masters[1].thaw();
        }
        drop(tx);
    }
}

/// axum and actix-web answer a lost lease alike: the same `503` lock-lost (status,
/// `Content-Type`, `Retry-After`, byte-identical problem+json) and, with replay, the same
/// `409` outcome-unknown for the key afterwards.
#[tokio::test(flavor = "multi_thread")]
async fn on_lost_axum_and_actix_answer_alike() {
    let m = Masters::start(3);
    let redlock = quick_client_of(&m).await;
    let policy = policy_of(&redlock)
        .ttl(TTL)
        .keep_alive(false)
        .replay(Replay::new())
        .on_lost(OnLost::Abort)
        .build()
        .expect("a valid policy");
    let probe = Probe::new();
    let app = payments(policy, &probe);
    let (axum_app, actix_app) = (Axum::serve(&app).await, Actix::serve(&app).await);
    let http = http_client();
    let (axum_url, actix_url) = (axum_app.url(PATH), actix_app.url(PATH));

    let (axum, actix) = tokio::join!(
        reply(pay(&http, &axum_url, "\"lost-axum\"", BODY)),
        reply(pay(&http, &actix_url, "\"lost-actix\"", BODY)),
    );
    assert_lock_lost(&axum, TTL);
    assert_same_answer("lock lost", &axum, &actix);
    for key in ["\"lost-axum\"", "\"lost-actix\""] {
        let lock = redis_key(PATH, PATH, key);
        eventually("the mark is on a quorum", RELEASED_WITHIN, || async {
            records_on(&m, &lock, 0..3).await >= 2
        })
        .await;
    }
    let (axum, actix) = tokio::join!(
        reply(pay(&http, &axum_url, "\"lost-axum\"", BODY)),
        reply(pay(&http, &actix_url, "\"lost-actix\"", BODY)),
    );
    assert_outcome_unknown(&axum);
    assert_same_answer("outcome unknown", &axum, &actix);
    assert_eq!(probe.started(), 2, "a handler ran twice");
    drop(http);
    axum_app.stop().await;
    actix_app.stop().await;
}
