//! The metrics (feature `metrics`) move as the requests say, on real masters: a Prometheus
//! recorder is installed once for this test binary, and each test compares the rendered
//! counters before and after its requests. The tests share that recorder, so they run one
//! at a time (`SERIAL`).

use tower_redlock_testkit as support;

use std::sync::OnceLock;
use std::time::Duration;

use axum::routing::post;
use axum::Router;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use support::{eventually, warm_up, HttpApp, Masters};
use tower_redlock::policy::LockPolicy;
use tower_redlock::{LockOrRecord, Redlock, RedlockLayer, Retry};

mod oncall;

const TTL: Duration = Duration::from_secs(10);
const WITHIN: Duration = Duration::from_secs(20);
/// The node timeout of clients whose counts must not move by a timeout: a healthy master
/// starved of the CPU on a loaded machine still answers within it, so an exact count of
/// refusals (never turned into `unavailable`) and of a healthy master's failures (none) is
/// the promise, not the machine's speed.
const PATIENT: Duration = Duration::from_secs(1);

/// One test at a time: the counters are global.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Takes this binary's turn, with the recorder installed (before any client is built: a
/// client registers its metrics' descriptions and nodes with the recorder in place).
async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    let turn = SERIAL.lock().await;
    prometheus();
    turn
}

/// The recorder of this test binary, installed on first use.
fn prometheus() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        PrometheusBuilder::new()
            .install_recorder()
            .expect("the only recorder of this test binary")
    })
}

/// The rendered metrics, read by series.
struct Snapshot(String);

impl Snapshot {
    fn take() -> Self {
        Self(prometheus().render())
    }

    /// The value of `series` (`name` or `name{labels}`), 0 when absent.
    fn get(&self, series: &str) -> f64 {
        self.0
            .lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| {
                let (name, value) = l.rsplit_once(' ')?;
                (name == series).then(|| value.parse().ok())?
            })
            .unwrap_or(0.0)
    }

    /// The sum of the series of `name` that carry every one of `labels` (`key="value"`).
    fn sum(&self, name: &str, labels: &[&str]) -> f64 {
        self.0
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
                let labelled = labels.iter().all(|want| {
                    rest.trim_end_matches('}')
                        .split(',')
                        .any(|label| label == *want)
                });
                (metric == name && labelled).then(|| value.parse::<f64>().ok())?
            })
            .sum()
    }

    /// How much `series` grew since `before`.
    fn delta(&self, before: &Snapshot, series: &str) -> f64 {
        self.get(series) - before.get(series)
    }
}

fn hist_count(name: &str, outcome: &str) -> String {
    format!("{name}_count{{outcome=\"{outcome}\"}}")
}

#[tokio::test]
async fn metrics_count_acquisitions_releases_and_latency() {
    let _serial = serial().await;
    let m = Masters::start(3);
    let client = m.client();
    warm_up(&client, &m).await;
    let before = Snapshot::take();
    const N: usize = 5;
    for i in 0..N {
        let lease = client
            .lock(&format!("metrics-resource:{i}"), TTL)
            .await
            .unwrap();
        lease.release().await.unwrap();
    }
    let after = Snapshot::take();
    assert_eq!(after.delta(&before, "redlock_acquired_total"), N as f64);
    assert_eq!(after.delta(&before, "redlock_released_total"), N as f64);
    assert_eq!(after.delta(&before, "redlock_release_failed_total"), 0.0);
    let latency = hist_count("redlock_acquire_duration_seconds", "acquired");
    assert_eq!(after.delta(&before, &latency), N as f64);
    assert_eq!(
        after.delta(&before, "redlock_hold_duration_seconds_count"),
        N as f64
    );
    assert_eq!(
        after.delta(&before, "redlock_validity_left_seconds_count"),
        N as f64
    );
    // Every lease was released well within its validity.
    let left = after.delta(&before, "redlock_validity_left_seconds_sum");
    assert!(left > N as f64 * 5.0, "validity left in all: {left} s");
    // Bounded labels only: no key, no resource name.
    assert!(!after.0.contains("metrics-resource"), "{}", after.0);
    // Described: the exporter prints the help lines.
    assert!(
        after.0.contains("# HELP redlock_acquired_total"),
        "{}",
        after.0
    );
}

#[tokio::test]
async fn metrics_count_contention() {
    let _serial = serial().await;
    let m = Masters::start(3);
    let patient = || m.builder().node_timeout(PATIENT).build().unwrap();
    let (a, b) = (patient(), patient());
    warm_up(&a, &m).await;
    warm_up(&b, &m).await;
    let before = Snapshot::take();
    let held = a.lock("metrics-contended", TTL).await.unwrap();
    for _ in 0..3 {
        let e = b.try_lock("metrics-contended", TTL).await.unwrap_err();
        assert!(e.is_contended(), "{e}");
    }
    // A caller that gives up while waiting (its future dropped): `cancelled`, no counter.
    let waiting = b.lock_with("metrics-contended", TTL, Retry::until(TTL));
    let gave_up = tokio::time::timeout(Duration::from_millis(300), waiting).await;
    assert!(gave_up.is_err(), "the lock is held: the wait cannot end");
    held.release().await.unwrap();
    let after = Snapshot::take();
    assert_eq!(after.delta(&before, "redlock_contended_total"), 3.0);
    assert_eq!(after.delta(&before, "redlock_acquired_total"), 1.0);
    assert_eq!(after.delta(&before, "redlock_unavailable_total"), 0.0);
    let latency = hist_count("redlock_acquire_duration_seconds", "contended");
    assert_eq!(after.delta(&before, &latency), 3.0);
    let cancelled = hist_count("redlock_acquire_duration_seconds", "cancelled");
    assert_eq!(after.delta(&before, &cancelled), 1.0);
}

#[tokio::test]
async fn metrics_count_extensions_and_lost_leases() {
    let _serial = serial().await;
    let m = Masters::start(3);
    let client = m.client();
    warm_up(&client, &m).await;
    let before = Snapshot::take();

    // Two extensions, then the token is gone from every master: the next one finds the
    // lease lost — counted once, not again by its release.
    let lease = client.lock("metrics-extend", TTL).await.unwrap();
    lease.extend(TTL).await.unwrap();
    lease.extend(TTL).await.unwrap();
    m.del_on("metrics-extend", &[0, 1, 2]).await;
    let e = lease.extend(TTL).await.unwrap_err();
    assert!(e.is_lost(), "{e}");
    assert!(lease.extend(TTL).await.unwrap_err().is_lost());
    lease.release().await.unwrap();
    let mid = Snapshot::take();
    assert_eq!(mid.delta(&before, "redlock_extended_total"), 2.0);
    assert_eq!(mid.delta(&before, "redlock_lost_total"), 1.0);

    // A lease whose validity runs out while its holder works: lost the moment its handle
    // sees it run out, and counted then — once, not again by its release.
    // Tried again if a loaded machine made a try slower than the 300 ms ttl.
    let short = client
        .lock_with(
            "metrics-expired",
            Duration::from_millis(300),
            Retry::times(50).delay(Duration::from_millis(20)),
        )
        .await
        .expect("a 300 ms lock within 50 tries");
    short.handle().lost().await;
    assert!(short.handle().is_lost());
    assert_eq!(Snapshot::take().delta(&mid, "redlock_lost_total"), 1.0);
    short.release().await.unwrap();
    let after = Snapshot::take();
    assert_eq!(after.delta(&mid, "redlock_lost_total"), 1.0);
    assert_eq!(after.delta(&mid, "redlock_released_total"), 1.0);
    // Released with no validity left.
    assert_eq!(after.delta(&mid, "redlock_validity_left_seconds_sum"), 0.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_unavailable_and_node_failures() {
    let _serial = serial().await;
    let m = Masters::start(3);
    let client = m.builder().node_timeout(PATIENT).build().unwrap();
    warm_up(&client, &m).await;
    let node = |i: usize| m[i].addr();
    let suspended = |i: usize| format!("redlock_node_suspended{{node=\"{}\"}}", node(i));
    let failures = |s: &Snapshot, i: usize| {
        s.sum(
            "redlock_node_errors_total",
            &[&format!("node=\"{}\"", node(i))],
        )
    };
    let before = Snapshot::take();
    assert_eq!(before.get(&suspended(0)), 0.0, "{}", before.0);

    m[0].stop();
    m[1].stop();
    let e = client
        .try_lock("metrics-unavailable", TTL)
        .await
        .unwrap_err();
    assert!(e.is_unavailable(), "{e}");
    let after = Snapshot::take();
    assert_eq!(after.delta(&before, "redlock_unavailable_total"), 1.0);
    let latency = hist_count("redlock_acquire_duration_seconds", "unavailable");
    assert_eq!(after.delta(&before, &latency), 1.0);
    for i in [0, 1] {
        assert!(failures(&after, i) > failures(&before, i), "{}", after.0);
    }
    assert_eq!(failures(&after, 2), failures(&before, 2), "{}", after.0);

    // Failing again and again over a node timeout, they are suspended; restarted, restored.
    eventually("masters 0 and 1 are suspended", WITHIN, || async {
        let _ = client.try_lock("metrics-unavailable", TTL).await;
        let s = Snapshot::take();
        s.get(&suspended(0)) == 1.0 && s.get(&suspended(1)) == 1.0
    })
    .await;
    assert!(client.node_status()[0].is_suspended());
    m[0].restart();
    m[1].restart();
    eventually("masters 0 and 1 are restored", WITHIN, || async {
        let s = Snapshot::take();
        s.get(&suspended(0)) == 0.0 && s.get(&suspended(1)) == 0.0
    })
    .await;
    assert_eq!(Snapshot::take().get(&suspended(2)), 0.0);
}

#[tokio::test]
async fn metrics_count_replays_over_http() {
    let _serial = serial().await;
    let m = Masters::start(3);
    let redlock = m.builder().retry(Retry::never()).build().unwrap();
    warm_up(&redlock, &m).await;
    let policy = LockPolicy::idempotent(redlock.clone()).build().unwrap();
    let app = HttpApp::serve(Router::new().route(
        "/payments",
        post(|| async { "charged" }).route_layer(RedlockLayer::new(policy)),
    ))
    .await;
    let http = reqwest::Client::new();
    let pay = || {
        http.post(app.url("/payments"))
            .header("idempotency-key", "\"metrics-key-1\"")
            .body("{}")
            .send()
    };
    let before = Snapshot::take();
    let first = pay().await.unwrap();
    assert_eq!(first.status(), 200);
    assert!(first.headers().get("idempotency-replayed").is_none());
    for _ in 0..3 {
        let again = pay().await.unwrap();
        assert_eq!(again.status(), 200);
        assert_eq!(again.headers()["idempotency-replayed"], "true");
    }
    let after = Snapshot::take();
    assert_eq!(after.delta(&before, "redlock_acquired_total"), 1.0);
    assert_eq!(after.delta(&before, "redlock_recorded_total"), 1.0);
    assert_eq!(after.delta(&before, "redlock_completed_total"), 3.0);
    assert_eq!(
        after.delta(&before, "redlock_replay_total{outcome=\"replayed\"}"),
        3.0
    );
    let latency = hist_count("redlock_acquire_duration_seconds", "completed");
    assert_eq!(after.delta(&before, &latency), 3.0);
    assert!(!after.0.contains("metrics-key-1"));

    // The client's own completion records count the same way, without HTTP.
    let done = || redlock.lock_unless_completed("metrics-work", TTL, Retry::never());
    match done().await.unwrap() {
        LockOrRecord::Locked(lease) => lease.complete("ok", TTL).await.unwrap(),
        other => panic!("first run: {other:?}"),
    }
    assert!(matches!(done().await.unwrap(), LockOrRecord::Completed(_)));
    let last = Snapshot::take();
    assert_eq!(last.delta(&after, "redlock_recorded_total"), 1.0);
    assert_eq!(last.delta(&after, "redlock_completed_total"), 1.0);
    assert_eq!(
        last.delta(&after, "redlock_replay_total{outcome=\"replayed\"}"),
        0.0
    );
}

/// A client built before anything is rendered shows every series: each node's, and every
/// counter's without a node label.
#[tokio::test]
async fn metrics_show_every_node_from_the_start() {
    let _serial = serial().await;
    let m = Masters::start(3);
    let _client: Redlock = m.client();
    let s = Snapshot::take();
    for i in 0..3 {
        let node = format!("node=\"{}\"", m[i].addr());
        for series in [
            format!("redlock_node_suspended{{{node}}}"),
            format!("redlock_owed_debts{{{node}}}"),
            format!("redlock_node_errors_total{{{node},kind=\"timeout\"}}"),
            format!("redlock_node_errors_total{{{node},kind=\"denied\"}}"),
        ] {
            assert!(s.0.contains(&series), "{series} missing in\n{}", s.0);
        }
    }
    // Every counter without a node label is there too (at 0 in a fresh process): a rate or
    // an alert sees its first increase.
    for series in [
        "redlock_lost_total ",
        "redlock_record_minority_total ",
        "redlock_replay_total{outcome=\"store_failed\"} ",
        "redlock_retry_waits_total{ended=\"woken\"} ",
    ] {
        assert!(s.0.contains(series), "{series} missing in\n{}", s.0);
    }
}

/// A completion whose record never reaches a quorum — two of three masters down until the
/// lock has expired where they are — is counted once it gives up, besides the failed
/// `Lease::complete` call.
#[tokio::test]
async fn metrics_count_a_record_that_never_reaches_its_quorum() {
    let _serial = serial().await;
    let m = Masters::start(3);
    let client = m.client();
    warm_up(&client, &m).await;
    let lease = match client
        .lock_unless_completed("minority", Duration::from_millis(500), Retry::never())
        .await
    {
        Ok(LockOrRecord::Locked(lease)) => lease,
        other => panic!("expected a lease, got {other:?}"),
    };
    let before = Snapshot::take();
    m[1].stop();
    m[2].stop();
    let e = lease
        .complete("done", Duration::from_secs(60))
        .await
        .unwrap_err();
    assert!(e.is_unavailable(), "{e}");
    eventually("the completion gives up and is counted", WITHIN, || async {
        Snapshot::take().delta(&before, "redlock_record_minority_total") == 1.0
    })
    .await;
    let after = Snapshot::take();
    assert_eq!(after.delta(&before, "redlock_record_failed_total"), 1.0);
    assert_eq!(
        m[0].get("minority:record").await.as_deref(),
        Some("TRR1\ndone")
    );
}

/// A voter's wake-up queue holds at most 4,096 keys: while its subscriber waits on a frozen
/// master (a `SUBSCRIBE` without an answer, up to the response timeout), 6,000 newly
/// contended keys arrive; those beyond the capacity are not listened on there, each counted
/// by `redlock_wake_queue_full_total{node}` for that master (their waiters poll).
///
/// What it waits for: the subscriber connected to every master (a waiter listened
/// everywhere) before the freeze; and it fails as "could not set up" if the keys did not
/// fill the queue (a machine too slow to start 6,000 waiters within the subscriber's wait).
#[tokio::test(flavor = "multi_thread")]
async fn metrics_count_keys_a_full_wake_queue_refuses() {
    use support::pubsub::{listening, Waiter};
    use tower_redlock::node::{RedisNode, RedisNodeOptions};
    let _serial = serial().await;
    let m = Masters::start(3);
    // The voters' response timeout (the subscribers' bound) is a minute: the subscriber's
    // `SUBSCRIBE` to the frozen master waits until the thaw, so the keys queue behind it
    // however slowly a loaded machine starts the waiters (with the default second, the
    // subscriber went back to connecting — where it takes the keys without a queue — before
    // they came: seen in a CI run beside the checker).
    let options = RedisNodeOptions::new().response_timeout(Duration::from_secs(60));
    let client = m
        .iter()
        .fold(Redlock::builder(), |b, s| {
            b.node(RedisNode::open_with(&s.url(), &options).unwrap())
        })
        .node_timeout(Duration::from_millis(100))
        .wake_waiters(true)
        .build()
        .unwrap();
    warm_up(&client, &m).await;
    let holder = m.client();
    let lease = holder.try_lock("metrics-wake-warm", TTL).await.unwrap();
    let slow = Retry::until(Duration::from_secs(30)).delay(Duration::from_secs(20));
    let warm = Waiter::start(&client, "metrics-wake-warm", TTL, slow);
    listening(m.iter(), "metrics-wake-warm").await;
    drop(warm);
    lease.release().await.unwrap();

    let full = |i: usize| format!("redlock_wake_queue_full_total{{node=\"{}\"}}", m[i].addr());
    let before = Snapshot::take();
    let keys: Vec<String> = (0..6_000).map(|i| format!("metrics-wake:{i}")).collect();
    for s in m.iter().take(2) {
        let client = redis::Client::open(s.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let mut pipe = redis::pipe();
        for key in &keys {
            pipe.cmd("SET")
                .arg(key)
                .arg("a-holder")
                .arg("PX")
                .arg(60_000)
                .ignore();
        }
        let () = pipe.query_async(&mut conn).await.unwrap();
    }
    m[2].freeze();
    let waiters: Vec<_> = keys
        .iter()
        .map(|key| Waiter::start(&client, key, TTL, slow))
        .collect();
    let refused = async {
        while Snapshot::take().delta(&before, &full(2)) == 0.0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let filled = tokio::time::timeout(WITHIN, refused).await;
    m[2].thaw();
    drop(waiters);
    assert!(
        filled.is_ok(),
        "could not set up the scenario: 6,000 waiters never filled the frozen master's queue"
    );
    let after = Snapshot::take();
    let refused = after.delta(&before, &full(2));
    assert!(
        refused > 0.0 && refused < 6_000.0,
        "{refused} keys refused: {}",
        after.0
    );
}
