//! The metrics an on-call reads in an incident, each in the situation it counts, on real
//! masters: node errors by kind (a stopped master, a frozen one, an ACL that refuses, tenure
//! protection, a master that may evict), what is owed to a frozen master until it is paid,
//! waits woken by a release against polls, and replay's answers and stores over axum.

use std::sync::Arc;
use std::time::Duration;

use axum::routing::post;
use axum::Router;
use tower_redlock::node::{RedisNode, RedisNodeOptions};
use tower_redlock::policy::LockPolicy;
use tower_redlock::{Redlock, RedlockLayer, Retry};

use crate::support::pubsub::Waiter;
use crate::support::{eventually, warm_up, HttpApp, Masters, RedisServer};
use crate::{serial, Snapshot, PATIENT, TTL, WITHIN};

/// `redlock_node_errors_total{node=<server>,kind=<kind>}` in `s`.
fn errors(s: &Snapshot, server: &RedisServer, kind: &str) -> f64 {
    let node = format!("node=\"{}\"", server.addr());
    let kind = format!("kind=\"{kind}\"");
    s.sum("redlock_node_errors_total", &[&node, &kind])
}

/// A client of one master at `url` through `options`, asking once.
fn one_voter(url: &str, options: &RedisNodeOptions) -> Redlock {
    Redlock::builder()
        .node(RedisNode::open_with(url, options).unwrap())
        .node_timeout(PATIENT)
        .retry(Retry::never())
        .build()
        .unwrap()
}

/// Each kind of failure is counted under its own `kind`, on its node, and only there: a
/// stopped master (`unreachable`), a frozen one (`timeout`), an ACL user without the
/// scripts (`denied`), a master younger than its tenure protection (`protected`), a master
/// that may evict keys (`abstained`).
#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_node_errors_by_kind() {
    let _serial = serial().await;
    let m = Masters::start(3);
    // Unreachable and timeout: masters 0 and 1 of three, one try each.
    let client = m
        .builder()
        .node_timeout(Duration::from_millis(300))
        .retry(Retry::never())
        .build()
        .unwrap();
    warm_up(&client, &m).await;
    let before = Snapshot::take();
    m[0].stop();
    m[1].freeze();
    let e = client.try_lock("metrics-kinds", TTL).await.unwrap_err();
    m[1].thaw();
    assert!(e.is_unavailable(), "{e}");
    let after = Snapshot::take();
    assert!(errors(&after, &m[0], "unreachable") > errors(&before, &m[0], "unreachable"));
    assert!(errors(&after, &m[1], "timeout") > errors(&before, &m[1], "timeout"));
    assert_eq!(
        errors(&after, &m[0], "timeout"),
        errors(&before, &m[0], "timeout")
    );
    let healthy = |s: &Snapshot| {
        s.sum(
            "redlock_node_errors_total",
            &[&format!("node=\"{}\"", m[2].addr())],
        )
    };
    assert_eq!(healthy(&after), healthy(&before), "{}", after.0);

    // Denied: a user allowed to read only.
    let acl = Masters::start(1);
    let mut user = redis::cmd("ACL");
    user.arg(&["SETUSER", "reader", "on", ">pw", "~*", "-@all", "+get"][..]);
    let () = acl[0].query(&user).await;
    let url = format!("redis://reader:pw@127.0.0.1:{}", acl[0].port());
    let reader = one_voter(&url, &RedisNodeOptions::new());
    let before = Snapshot::take();
    let e = reader.try_lock("metrics-denied", TTL).await.unwrap_err();
    // The try, and its cleanup's release: both refused.
    let denied = errors(&Snapshot::take(), &acl[0], "denied") - errors(&before, &acl[0], "denied");
    assert!(denied >= 1.0, "{e}");

    // Protected: tenure protection longer than the master's age.
    let young = Masters::start(1);
    let options = RedisNodeOptions::new().restart_protection(Duration::from_secs(60));
    let client = one_voter(&young[0].url(), &options);
    let before = Snapshot::take();
    let e = client.try_lock("metrics-young", TTL).await.unwrap_err();
    let protected = errors(&Snapshot::take(), &young[0], "protected");
    assert_eq!(
        protected - errors(&before, &young[0], "protected"),
        1.0,
        "{e}"
    );

    // Abstained: a master that may evict keys (`maxmemory` with an evicting policy).
    let cache = Masters::start(1);
    for (name, value) in [("maxmemory", "512mb"), ("maxmemory-policy", "allkeys-lru")] {
        let mut set = redis::cmd("CONFIG");
        set.arg("SET").arg(name).arg(value);
        let () = cache[0].query(&set).await;
    }
    let client = one_voter(&cache[0].url(), &RedisNodeOptions::new());
    let before = Snapshot::take();
    let e = client.try_lock("metrics-cache", TTL).await.unwrap_err();
    let abstained = errors(&Snapshot::take(), &cache[0], "abstained");
    assert_eq!(
        abstained - errors(&before, &cache[0], "abstained"),
        1.0,
        "{e}"
    );
}

/// A release that cannot reach a suspended master is owed to it (by the release's
/// background part): `redlock_owed_debts` and `redlock_owed_bytes` of that master rise while
/// it is frozen, and fall back to 0 once it answers again and is paid (its lock deleted). A
/// client dropped while it owes takes its debts and its suspension off the gauges;
/// `redlock_node_suspended` counts the clients that suspend the node.
#[tokio::test(flavor = "multi_thread")]
async fn metrics_show_what_a_frozen_master_is_owed_until_it_is_paid() {
    let _serial = serial().await;
    let m = Masters::start(3);
    let client = m.client();
    warm_up(&client, &m).await;
    let node = format!("node=\"{}\"", m[2].addr());
    let debts = |s: &Snapshot| s.sum("redlock_owed_debts", &[&node]);
    let bytes = |s: &Snapshot| s.sum("redlock_owed_bytes", &[&node]);
    assert_eq!(debts(&Snapshot::take()), 0.0);

    let lease = client.lock("metrics-owed", TTL).await.unwrap();
    m[2].freeze();
    eventually("the client suspends frozen master 2", WITHIN, || async {
        let _ = client.try_lock("metrics-owed-probe", TTL).await;
        client.node_status()[2].is_suspended()
    })
    .await;
    lease.release().await.unwrap();
    // The release's rest runs in the background: what a suspended master missed is owed.
    eventually(
        "the release is owed to suspended master 2",
        WITHIN,
        || async {
            let s = Snapshot::take();
            debts(&s) >= 1.0 && bytes(&s) >= "metrics-owed".len() as f64
        },
    )
    .await;
    m[2].thaw();
    eventually(
        "the debts are paid once master 2 answers",
        WITHIN,
        || async {
            let s = Snapshot::take();
            debts(&s) == 0.0 && bytes(&s) == 0.0
        },
    )
    .await;
    eventually("the owed release deleted the lock", WITHIN, || async {
        m[2].get("metrics-owed").await.is_none()
    })
    .await;

    // The first client goes: its background work (a release's retries) would meet master 2
    // frozen again below and suspend it too, a client more than the counts that follow say.
    drop(client);

    // A client dropped while it owes: its debts lapse, and leave the gauges (as does its
    // suspension of the master).
    let other = m.client();
    warm_up(&other, &m).await;
    let lease = other.lock("metrics-owed-2", TTL).await.unwrap();
    m[2].freeze();
    eventually(
        "the other client suspends frozen master 2",
        WITHIN,
        || async {
            let _ = other.try_lock("metrics-owed-probe", TTL).await;
            other.node_status()[2].is_suspended()
        },
    )
    .await;
    lease.release().await.unwrap();
    eventually("the release is owed to master 2", WITHIN, || async {
        debts(&Snapshot::take()) >= 1.0
    })
    .await;
    drop(other);
    let suspended = format!("redlock_node_suspended{{{node}}}");
    eventually("a dropped client owes nothing", WITHIN, || async {
        let s = Snapshot::take();
        debts(&s) == 0.0 && bytes(&s) == 0.0 && s.get(&suspended) == 0.0
    })
    .await;

    // The gauge counts the clients that suspend the node: two, then one once the other is
    // dropped, then none once the node answers again.
    let (a, b) = (m.client(), m.client());
    for c in [&a, &b] {
        eventually("a new client suspends frozen master 2", WITHIN, || async {
            let _ = c.try_lock("metrics-owed-probe", TTL).await;
            c.node_status()[2].is_suspended()
        })
        .await;
    }
    eventually("two clients suspend master 2", WITHIN, || async {
        Snapshot::take().get(&suspended) == 2.0
    })
    .await;
    drop(a);
    eventually("one client left suspends master 2", WITHIN, || async {
        Snapshot::take().get(&suspended) == 1.0
    })
    .await;
    m[2].thaw();
    eventually("master 2 is restored", WITHIN, || async {
        Snapshot::take().get(&suspended) == 0.0
    })
    .await;
    drop(b);
}

/// A waiter woken by the holder's release counts a `woken` wait; a wait that runs to its
/// poll (a client without the wake-up) counts `polled`, one per retry.
#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_waits_woken_and_polled() {
    let _serial = serial().await;
    let m = Masters::start(3);
    let woken = |s: &Snapshot| s.get("redlock_retry_waits_total{ended=\"woken\"}");
    let polled = |s: &Snapshot| s.get("redlock_retry_waits_total{ended=\"polled\"}");
    let holder = m.builder().wake_waiters(true).build().unwrap();
    let waiter = m.builder().wake_waiters(true).build().unwrap();
    warm_up(&waiter, &m).await;

    let lease = holder.try_lock("metrics-wake", TTL).await.unwrap();
    let before = Snapshot::take();
    let long_poll = Retry::until(Duration::from_secs(60))
        .delay(Duration::from_secs(30))
        .jitter(Duration::ZERO);
    let waiting = Waiter::heard(&waiter, "metrics-wake", TTL, long_poll, m.iter()).await;
    let released = std::time::Instant::now();
    lease.release().await.unwrap();
    waiting.woken(released, Duration::from_secs(30)).await;
    let after = Snapshot::take();
    assert!(woken(&after) - woken(&before) >= 1.0, "{}", after.0);
    assert_eq!(polled(&after), polled(&before), "{}", after.0);

    // Without the wake-up, every wait is a poll: three retries, three polls.
    let plain = m.builder().build().unwrap();
    let lease = holder.try_lock("metrics-poll", TTL).await.unwrap();
    let retries = Retry::times(3)
        .delay(Duration::from_millis(20))
        .jitter(Duration::ZERO);
    let e = plain
        .lock_with("metrics-poll", TTL, retries)
        .await
        .unwrap_err();
    assert!(e.is_contended(), "{e}");
    let last = Snapshot::take();
    assert_eq!(polled(&last) - polled(&after), 3.0, "{}", last.0);
    assert_eq!(woken(&last), woken(&after));
    lease.release().await.unwrap();
}

/// Replay's outcomes over axum: a response stored, replayed, a reused key with another
/// payload (`mismatch`, 422), a response too large to store (the key marked completed:
/// `stored`, then `not_stored` for its duplicate, 409), and a record that reaches no
/// quorum because two of three masters stopped during the handler (`store_failed`).
#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_replay_outcomes_over_http() {
    let _serial = serial().await;
    let m = Arc::new(Masters::start(3));
    let redlock = m.builder().retry(Retry::never()).build().unwrap();
    warm_up(&redlock, &m).await;
    let policy = LockPolicy::idempotent(redlock.clone()).build().unwrap();
    let stopper = m.clone();
    let app = HttpApp::serve(
        Router::new()
            .route("/pay", post(|| async { "charged" }))
            .route("/big", post(|| async { "x".repeat(200 << 10) }))
            .route(
                "/fail",
                post(move || {
                    let m = stopper.clone();
                    async move {
                        tokio::task::spawn_blocking(move || {
                            m[1].stop();
                            m[2].stop();
                        })
                        .await
                        .unwrap();
                        "charged, not stored"
                    }
                }),
            )
            .route_layer(RedlockLayer::new(policy)),
    )
    .await;
    let http = reqwest::Client::new();
    let send = |path: &str, key: &str, body: &'static str| {
        http.post(app.url(path))
            .header("idempotency-key", format!("\"{key}\""))
            .body(body)
            .send()
    };
    let outcome =
        |s: &Snapshot, o: &str| s.get(&format!("redlock_replay_total{{outcome=\"{o}\"}}"));
    let before = Snapshot::take();
    assert_eq!(
        send("/pay", "metrics-r1", "{}").await.unwrap().status(),
        200
    );
    let again = send("/pay", "metrics-r1", "{}").await.unwrap();
    assert_eq!(again.headers()["idempotency-replayed"], "true");
    assert_eq!(
        send("/pay", "metrics-r1", "{\"other\":1}")
            .await
            .unwrap()
            .status(),
        422
    );
    assert_eq!(
        send("/big", "metrics-r2", "{}").await.unwrap().status(),
        200
    );
    assert_eq!(
        send("/big", "metrics-r2", "{}").await.unwrap().status(),
        409
    );
    let after = Snapshot::take();
    for (o, n) in [
        ("stored", 2.0),
        ("replayed", 1.0),
        ("mismatch", 1.0),
        ("not_stored", 1.0),
    ] {
        assert_eq!(
            outcome(&after, o) - outcome(&before, o),
            n,
            "{o}: {}",
            after.0
        );
    }
    assert_eq!(
        outcome(&after, "store_failed"),
        outcome(&before, "store_failed")
    );

    assert_eq!(
        send("/fail", "metrics-r3", "{}").await.unwrap().status(),
        200
    );
    eventually(
        "the record that reached no quorum is counted",
        WITHIN,
        || async {
            outcome(&Snapshot::take(), "store_failed") - outcome(&after, "store_failed") == 1.0
        },
    )
    .await;
    assert_eq!(
        outcome(&Snapshot::take(), "stored"),
        outcome(&after, "stored")
    );
}
