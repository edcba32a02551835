//! The tonic tests: a real tonic client against [`Server`], keyed by the `idempotency-key`
//! metadata and scoped by the gRPC method.

use std::sync::atomic::Ordering;
use std::time::Duration;

use tonic::Code;
use tower_redlock::key::{IdempotencyKey, KeyExtractor, KeyExtractorExt};
use tower_redlock::policy::{LockPolicy, OnContention};
use tower_redlock::replay::Replay;

use super::server::{Layout, Server};
use super::service::PayRequest;
use super::support;
use super::support::apps::{assert_held, assert_released, masters_and_client};
use super::support::http::within;
use super::{assert_retry_hint, meta, policy_of, redis_key, refused, PAY, REFUND, TTL};

#[tokio::test(flavor = "multi_thread")]
async fn grpc_duplicate_in_flight_is_aborted_with_a_retry_hint() {
    const KEY: &str = "order-grpc-1";
    let (m, redlock) = masters_and_client().await;
    let server = Server::serve(policy_of(&redlock).build().unwrap()).await;

    let first = tokio::spawn(server.pay(Some(KEY), true));
    server.gate.until_started(1).await;
    // The metadata is the `idempotency-key` header: its lock is on every master.
    assert_held(&m, &redis_key(PAY, KEY)).await;

    let status = refused(server.pay(Some(KEY), false).await);
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert_retry_hint(&status, TTL);
    assert!(status.message().contains("same key"), "{status:?}");
    assert!(
        !status.message().contains(KEY),
        "the key leaked: {status:?}"
    );
    assert_eq!(server.gate.started(), 1, "the duplicate ran");

    server.gate.release.add_permits(1);
    let reply = within("the first call", first).await.unwrap().unwrap();
    assert!(reply.get_ref().payment_id.starts_with("pay_1250"));
    assert_released(&m, &redis_key(PAY, KEY)).await;
    // Free again: the next call with the key runs (no replay here).
    server.pay(Some(KEY), false).await.unwrap();
    assert_eq!(server.gate.started(), 2);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn grpc_distinct_keys_and_methods_run_side_by_side() {
    let (_m, redlock) = masters_and_client().await;
    let server = Server::serve(policy_of(&redlock).build().unwrap()).await;
    let hold = PayRequest {
        amount_cents: 1,
        hold: true,
        fail: 0,
    };
    let calls = [
        tokio::spawn(server.pay(Some("order-grpc-a"), true)),
        tokio::spawn(server.pay(Some("order-grpc-b"), true)),
        // The same key on another method: scoped by method, another lock.
        tokio::spawn(server.call(REFUND, Some("order-grpc-a"), hold)),
    ];
    server.gate.until_started(3).await;
    server.gate.release.add_permits(3);
    for call in calls {
        within("a held call", call).await.unwrap().unwrap();
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn grpc_masters_down_is_unavailable_with_a_retry_hint() {
    let (m, redlock) = masters_and_client().await;
    let server = Server::serve(policy_of(&redlock).build().unwrap()).await;
    m[1].stop();
    m[2].stop();
    let status = refused(server.pay(Some("order-grpc-down"), false).await);
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_retry_hint(&status, Duration::from_secs(1));
    assert_eq!(server.gate.started(), 0, "ran without a lock");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn grpc_missing_or_too_long_key_is_invalid_argument() {
    let (_m, redlock) = masters_and_client().await;
    let server = Server::serve(policy_of(&redlock).build().unwrap()).await;
    let long = format!("zebra{}", "z".repeat(251));
    for key in [None, Some(long.as_str()), Some("\"zebra")] {
        let status = refused(server.pay(key, false).await);
        assert_eq!(status.code(), Code::InvalidArgument, "{key:?}: {status:?}");
        assert!(status.message().contains("idempotency-key"), "{status:?}");
        assert!(
            !status.message().contains("zebra"),
            "the key leaked: {status:?}"
        );
        assert_eq!(meta(&status, "retry-after"), None, "{status:?}");
    }
    assert_eq!(server.gate.started(), 0);
    server.stop().await;
}

/// The key extractor of a server whose every service is behind the layer: the
/// `idempotency-key` metadata scoped by method on `shop.Payments`, no key elsewhere.
fn payments_key() -> impl KeyExtractor {
    IdempotencyKey::required()
        .scoped_by_grpc_method()
        .only_grpc_service("shop.Payments")
}

/// `Server::builder().layer(..)` locks every service of the server: with
/// `IdempotencyKey::required()` a health check (a Kubernetes gRPC probe) is refused with
/// `INVALID_ARGUMENT`. A key extractor that gives other services no key lets them through
/// unlocked — as does the layer on one service (`named_layer`) —, while `Pay` still needs
/// its key.
#[tokio::test(flavor = "multi_thread")]
async fn grpc_other_services_pass_through_unlocked_without_a_key() {
    let (_m, redlock) = masters_and_client().await;

    // The problem: every call needs a key.
    let server = Server::serve(policy_of(&redlock).build().unwrap()).await;
    let status = match server.health_check().await {
        Err(status) => status,
        Ok(reply) => panic!("expected a refusal, got {:?}", reply.get_ref()),
    };
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert_eq!(server.gate.checks.load(Ordering::SeqCst), 0);
    server.stop().await;

    // The fix, in the key extractor or in the layout.
    let policy = || {
        LockPolicy::builder(redlock.clone(), payments_key())
            .ttl(TTL)
            .build()
            .unwrap()
    };
    let plain = LockPolicy::builder(redlock.clone(), IdempotencyKey::required())
        .ttl(TTL)
        .build()
        .unwrap();
    for (policy, layout) in [
        (policy(), Layout::WholeServer),
        (plain, Layout::PaymentsOnly),
    ] {
        let server = Server::serve_as(policy, layout).await;
        // While a `Pay` call holds its lock, and twice: nothing is locked for the check.
        let first = tokio::spawn(server.pay(Some("order-grpc-health"), true));
        server.gate.until_started(1).await;
        for _ in 0..2 {
            let reply = server.health_check().await.expect("a health check passes");
            assert_eq!(reply.get_ref().status, 1);
        }
        assert_eq!(server.gate.checks.load(Ordering::SeqCst), 2);
        // The lease reaches a locked handler's extensions; not the health check's.
        assert!(server.gate.call_locked.load(Ordering::SeqCst));
        assert!(
            !server.gate.check_locked.load(Ordering::SeqCst),
            "a health check ran under a lock"
        );
        // `Pay` still needs its key.
        let status = refused(server.pay(None, false).await);
        assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
        server.gate.release.add_permits(1);
        within("the first call", first).await.unwrap().unwrap();
        assert_eq!(server.gate.started(), 1);
        server.stop().await;
    }
}

/// The same layer answers a plain HTTP request (HTTP/2, `application/json`) with
/// problem+json, and a gRPC call with a status, for the same lock.
#[tokio::test(flavor = "multi_thread")]
async fn grpc_and_plain_http_on_one_layer_get_their_own_answers() {
    const KEY: &str = "order-grpc-http";
    let (_m, redlock) = masters_and_client().await;
    let server = Server::serve(policy_of(&redlock).build().unwrap()).await;
    let http = reqwest::Client::builder()
        .no_proxy()
        .http2_prior_knowledge()
        .build()
        .unwrap();
    let url = format!("http://{}{PAY}", server.addr);
    let post = |key: Option<&str>| {
        let req = http
            .post(&url)
            .header("content-type", "application/json")
            .body("{}");
        let req = match key {
            Some(key) => req.header("idempotency-key", key),
            None => req,
        };
        support::http::reply(req)
    };

    let missing = post(None).await;
    assert_eq!(missing.status, 400);
    assert_eq!(
        missing.header("content-type"),
        Some("application/problem+json")
    );
    assert_eq!(missing.json()["type"], "/problems/lock-key-missing");
    assert_eq!(missing.header("grpc-status"), None);

    let first = tokio::spawn(server.pay(Some(KEY), true));
    server.gate.until_started(1).await;
    let held = post(Some(KEY)).await;
    assert_eq!(held.status, 409);
    assert_eq!(held.json()["type"], "/problems/lock-contended");
    assert!(held.retry_after() >= 1);
    server.gate.release.add_permits(1);
    within("the first call", first).await.unwrap().unwrap();
    server.stop().await;
}

/// Replay on gRPC: the duplicate in flight is `ABORTED`; a success (its status comes in
/// trailers, which are not stored) marks the key completed, so later duplicates get
/// `ALREADY_EXISTS` and never run; a trailers-only failure is stored and replayed when it is
/// a client error (`NOT_FOUND`) — with its gRPC headers, though the policy drops them —, not
/// stored when it is a server error or a code that invites a retry (`UNAVAILABLE`,
/// `ABORTED`, `RESOURCE_EXHAUSTED`, `CANCELLED`, `DEADLINE_EXCEEDED`).
#[tokio::test(flavor = "multi_thread")]
async fn grpc_replay_aborts_in_flight_and_answers_already_exists_after() {
    let (_m, redlock) = masters_and_client().await;
    let replay = Replay::new()
        .drop_header("grpc-status")
        .drop_header("grpc-message")
        .drop_header("content-type");
    let policy = policy_of(&redlock).replay(replay).build().unwrap();
    let server = Server::serve(policy).await;

    let first = tokio::spawn(server.pay(Some("order-grpc-r1"), true));
    server.gate.until_started(1).await;
    let status = refused(server.pay(Some("order-grpc-r1"), true).await);
    assert_eq!(status.code(), Code::Aborted, "{status:?}");
    assert_retry_hint(&status, TTL);
    server.gate.release.add_permits(1);
    within("the first call", first).await.unwrap().unwrap();
    let status = refused(server.pay(Some("order-grpc-r1"), true).await);
    assert_eq!(status.code(), Code::AlreadyExists, "{status:?}");
    assert_eq!(meta(&status, "retry-after"), None);
    assert_eq!(server.gate.started(), 1, "a completed key ran again");

    let failing = |fail: Code| PayRequest {
        amount_cents: 7,
        hold: false,
        fail: fail as i32,
    };
    // A client error, trailers-only: stored, replayed with the marker.
    let status = refused(
        server
            .call(PAY, Some("order-grpc-r2"), failing(Code::NotFound))
            .await,
    );
    assert_eq!(status.code(), Code::NotFound);
    let replayed = refused(
        server
            .call(PAY, Some("order-grpc-r2"), failing(Code::NotFound))
            .await,
    );
    assert_eq!(
        (replayed.code(), replayed.message()),
        (Code::NotFound, "the handler failed")
    );
    assert_eq!(meta(&replayed, "idempotency-replayed"), Some("true"));
    assert_eq!(server.gate.started(), 2, "a stored failure ran again");
    // A server error, or a code that invites a retry: not stored, the retry runs again.
    let retried = [
        Code::Unavailable,
        Code::Internal,
        Code::Aborted,
        Code::ResourceExhausted,
        Code::Cancelled,
        Code::DeadlineExceeded,
    ];
    for code in retried {
        let key = format!("order-grpc-r3-{}", code as i32);
        for _ in 0..2 {
            let status = refused(server.call(PAY, Some(key.as_str()), failing(code)).await);
            assert_eq!(status.code(), code, "{status:?}");
            assert_eq!(meta(&status, "idempotency-replayed"), None, "{code:?}");
        }
    }
    assert_eq!(server.gate.started(), 2 + 2 * retried.len());
    server.stop().await;
}

/// A call whose lease is lost while its handler runs (keep-alive off, the handler held past
/// the ttl), with `OnLost::Abort`: `UNAVAILABLE`, with a retry hint of at least the ttl (1 s);
/// the key is free afterwards and the next call runs.
#[tokio::test(flavor = "multi_thread")]
async fn grpc_on_lost_abort_is_unavailable() {
    const KEY: &str = "order-grpc-lost";
    let ttl = Duration::from_millis(900);
    let (m, redlock) = masters_and_client().await;
    let policy = policy_of(&redlock)
        .ttl(ttl)
        .keep_alive(false)
        .on_lost(tower_redlock::policy::OnLost::Abort)
        .build()
        .unwrap();
    let server = Server::serve(policy).await;

    let status = refused(server.pay(Some(KEY), true).await);
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_retry_hint(&status, Duration::from_secs(1));
    assert!(status.message().contains("lost"), "{status:?}");
    assert_eq!(server.gate.started(), 1);
    assert_released(&m, &redis_key(PAY, KEY)).await;
    server.pay(Some(KEY), false).await.unwrap();
    assert_eq!(server.gate.started(), 2);
    server.stop().await;
}

/// With replay, a call stopped on a lost lease (`OnLost::Abort`) leaves its key marked
/// "outcome unknown": the call itself gets `UNAVAILABLE`; every later call with the key gets
/// `UNKNOWN` (the middleware's `409` outcome-unknown) once the mark is on a quorum, without a
/// retry hint, and the handler never runs again.
#[tokio::test(flavor = "multi_thread")]
async fn grpc_replay_after_a_lost_lease_is_unknown() {
    const KEY: &str = "order-grpc-lost-replay";
    let ttl = Duration::from_millis(900);
    let (_m, redlock) = masters_and_client().await;
    let replay = Replay::new()
        .drop_header("grpc-status")
        .drop_header("grpc-message")
        .drop_header("content-type");
    let policy = policy_of(&redlock)
        .ttl(ttl)
        .keep_alive(false)
        .on_lost(tower_redlock::policy::OnLost::Abort)
        .replay(replay)
        .build()
        .unwrap();
    let server = Server::serve(policy).await;

    let status = refused(server.pay(Some(KEY), true).await);
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    // The same request again (a held one: it would wait for the gate, were it run). Until
    // the mark is on a quorum (the stopped call's lock may still hold on a master for the
    // clock drift allowance), `ABORTED` in flight; never a run.
    support::eventually("the key is marked outcome-unknown", ttl * 10, || async {
        let status = refused(server.pay(Some(KEY), true).await);
        assert!(
            matches!(status.code(), Code::Unknown | Code::Aborted),
            "{status:?}"
        );
        status.code() == Code::Unknown
    })
    .await;
    for _ in 0..3 {
        let status = refused(server.pay(Some(KEY), true).await);
        assert_eq!(status.code(), Code::Unknown, "{status:?}");
        assert_eq!(meta(&status, "retry-after"), None);
    }
    assert_eq!(server.gate.started(), 1, "the stopped call's key ran again");
    server.stop().await;
}

/// A waiting policy (`OnContention::wait(30 s)`) bounds a gRPC caller's wait by its own deadline
/// (`grpc-timeout`, here 3 s): two duplicates of a held call — one waiting for releases, one
/// queued behind it (the client wakes waiters) — are both answered `ABORTED` with a retry hint
/// before that deadline: not held for the policy's 30 s, nor cut by the caller's deadline
/// (`DEADLINE_EXCEEDED`/`CANCELLED`).
///
/// The deadline is the server's: it counts 3 s from when it read the call, and the `ABORTED`
/// status (not a deadline's) is what shows it answered within them — the wait ends a tenth
/// before (2.7 s), leaving the answer 300 ms to beat tonic's own cancellation at 3 s. The test's own clock
/// starts before the calls are sent and stops after both answers are read, so it also
/// counts both transits: it is allowed `TRANSIT` (2 s) of them on a loaded machine — still
/// far below the policy's 30 s wait.
#[tokio::test(flavor = "multi_thread")]
async fn grpc_a_wait_is_bounded_by_the_callers_grpc_timeout() {
    const KEY: &str = "order-grpc-deadline";
    let (m, _) = masters_and_client().await;
    let redlock = m
        .builder()
        .node_timeout(support::apps::HTTP_NODE_TIMEOUT)
        .wake_waiters(true)
        .build()
        .unwrap();
    let policy = policy_of(&redlock)
        .on_contention(OnContention::wait(Duration::from_secs(30)))
        .build()
        .unwrap();
    let server = Server::serve(policy).await;
    let first = tokio::spawn(server.pay(Some(KEY), true));
    server.gate.until_started(1).await;

    let started = std::time::Instant::now();
    let duplicate = || {
        let message = PayRequest {
            amount_cents: 1250,
            hold: false,
            fail: 0,
        };
        server.call_within(PAY, Some(KEY), message, Some(Duration::from_secs(3)))
    };
    let (one, two) = tokio::join!(duplicate(), duplicate());
    for status in [refused(one), refused(two)] {
        assert_eq!(status.code(), Code::Aborted, "{status:?}");
        assert_retry_hint(&status, TTL);
    }
    const TRANSIT: Duration = Duration::from_secs(2);
    assert!(
        started.elapsed() < Duration::from_secs(3) + TRANSIT,
        "{:?}",
        started.elapsed()
    );
    assert_eq!(server.gate.started(), 1, "a duplicate ran");
    server.gate.release.add_permits(1);
    within("the first call", first).await.unwrap().unwrap();
    server.stop().await;
}
