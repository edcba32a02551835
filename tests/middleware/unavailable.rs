//! An unreachable quorum (fail closed or run unlocked), and a policy that does not fit the
//! client's nodes (refused when the middleware is built, never per request).

use std::time::{Duration, Instant};
use tower_redlock::policy::OnUnavailable;

use tower_redlock::node::RedisNodeOptions;
use tower_redlock::{Redlock, Retry};

use crate::harness::app::{App, Handler, Route};
use crate::harness::keys::{default_policy, extractor, policy_of};
use crate::harness::probe::Probe;
use crate::harness::Framework;
use crate::support::apps::*;
use crate::support::http::{http_client, DEADLINE};
use crate::support::{eventually, warm_up, Masters};

/// With two of three masters down: a fail-closed route answers 503 with `Retry-After` and never
/// runs the handler; a fail-open route runs it without a lock, marked `Unlocked`, and the
/// `Option<LeaseHandle>` extractor gives `None`.
pub async fn majority_down_fails_closed_or_runs_unlocked<F: Framework>() {
    const KEY: &str = "order-3";
    let (m, redlock) = masters_and_client().await;
    let closed = default_policy(&redlock);
    let open = policy_of(&redlock)
        .on_unavailable(OnUnavailable::FailOpen)
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

/// The node timeout of [`stalled_majority_is_ridden_out_not_answered_503`]'s client: the
/// test thaws the masters after the first try failed, and the extra tries that follow take
/// at least four of these — a loaded machine's test has time to do it.
const STALL_NODE_TIMEOUT: Duration = Duration::from_secs(1);

/// Two of three healthy masters stall (`SIGSTOP`) for longer than a node timeout, and resume
/// after the request's first try failed on them: the middleware tries again (see
/// `OnUnavailable`) and the request is served — `200`, the handler run once, the lock
/// released — not answered `503`. (Masters that stay down are answered `503`:
/// [`majority_down_fails_closed_or_runs_unlocked`].)
pub async fn stalled_majority_is_ridden_out_not_answered_503<F: Framework>() {
    const KEY: &str = "order-stalled";
    let m = Masters::start(3);
    let redlock = m
        .builder()
        .node_timeout(STALL_NODE_TIMEOUT)
        .build()
        .expect("a valid client");
    warm_up(&redlock, &m).await;
    let probe = Probe::open_gate();
    let app = App::new()
        .route(Route::locked(PATH, default_policy(&redlock)).post(Handler::gated(&probe)));
    let app = F::serve(&app).await;
    let http = http_client();

    m[1].freeze();
    m[2].freeze();
    let reply = tokio::spawn(post_key(&http, &app.url(PATH), KEY));
    // The first try failed: each frozen master has a timeout against it.
    eventually(
        "the first try timed out on both frozen masters",
        DEADLINE,
        || async {
            let status = redlock.node_status();
            status[1].consecutive_timeouts() >= 1 && status[2].consecutive_timeouts() >= 1
        },
    )
    .await;
    assert_eq!(probe.started(), 0, "the handler ran without a quorum");
    m[1].thaw();
    m[2].thaw();

    let reply = reply.await.expect("the request task");
    assert_eq!(
        reply.status,
        200,
        "a stall of healthy masters answered: {}",
        reply.text()
    );
    assert_eq!(probe.completed(), 1, "the handler ran once");
    assert!(
        !redlock.node_status().iter().any(|s| s.is_suspended()),
        "a master that answered again is suspended: {:?}",
        redlock.node_status()
    );
    eventually(
        "the lock is released everywhere",
        RELEASED_WITHIN,
        || async { m.absent_everywhere(KEY).await },
    )
    .await;
    drop(http);
    app.stop().await;
}

/// The delayed-restart protection of the nodes of [`protected_client_of`].
const PROTECTION: Duration = Duration::from_secs(10);

/// A client of `masters` whose nodes vote only once their dataset is [`PROTECTION`] old, and
/// refuse longer ttls. Not warmed up: fresh masters do not vote yet.
fn protected_client_of(masters: &Masters) -> Redlock {
    let options = RedisNodeOptions::new().restart_protection(PROTECTION);
    masters
        .urls()
        .iter()
        .fold(Redlock::builder(), |b, url| b.redis_with(url, &options))
        .node_timeout(HTTP_NODE_TIMEOUT)
        .retry(Retry::never())
        .build()
        .expect("a valid client")
}

/// The middleware's checked constructor refuses a default policy whose ttl (30 s) the nodes'
/// restart protection (10 s) does not allow — up front, as an invalid input — and a policy
/// with a ttl that fits (5 s) is built and serves requests: `503` while the fresh masters are
/// too young to vote, then the lock, with the 5 s ttl.
pub async fn checked_new_refuses_a_ttl_above_restart_protection<F: Framework>() {
    const TTL: Duration = Duration::from_secs(5);
    let m = Masters::start(3);
    let protected = protected_client_of(&m);

    let e = F::checked_new(protected.clone(), extractor()).expect_err("30 s > 10 s");
    assert!(e.is_invalid_input(), "{}: {e:?}", F::NAME);
    assert!(e.to_string().contains("restart_protection"), "{e}");
    let e = policy_of(&protected).build().expect_err("30 s > 10 s");
    assert!(e.is_invalid_input(), "{e:?}");
    assert_eq!(m.dbsizes().await, vec![0; 3], "nothing was sent to Redis");

    let policy = policy_of(&protected)
        .ttl(TTL)
        .build()
        .expect("a ttl the protection allows");
    let app = App::new().route(Route::locked(PATH, policy).post(Handler::Report));
    let app = F::serve(&app).await;
    let http = http_client();

    // Fresh masters are as new as restarted ones: no vote until they are 10 s old.
    let young = post_key(&http, &app.url(PATH), "order-young").await;
    assert_problem(&young, 503, "/problems/lock-unavailable");
    let started = Instant::now();
    let v = loop {
        let reply = post_key(&http, &app.url(PATH), "order-old").await;
        if reply.status == 200 {
            break reply.json();
        }
        assert_problem(&reply, 503, "/problems/lock-unavailable");
        assert!(
            started.elapsed() < PROTECTION + DEADLINE,
            "the masters never voted"
        );
        // Polling for the masters' age: the passing of time is what is awaited here.
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(v["locked"], true, "{v}");
    let validity = v["validity_ms"].as_u64().expect("a validity");
    assert!(validity > 0 && validity <= TTL.as_millis() as u64, "{v}");
    eprintln!(
        "the masters voted {:?} after the first try",
        started.elapsed()
    );
    drop(http);
    app.stop().await;
}
