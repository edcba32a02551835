//! Safety under faults, against real masters: paused, black-holed, restarted-empty masters,
//! and the races of extension and release with expiry.

use tower_redlock_testkit as support;

use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::time::{Duration, Instant};

use support::proxy::{Fault, FaultProxy};
use support::{eventually, silent_majority_bound, warm_up, Masters, NODE_TIMEOUT};
use tower_redlock::node::RedisNodeOptions;
use tower_redlock::{Redlock, Retry};

const SECOND: Duration = Duration::from_secs(1);

/// Every master ends empty: no try or release left a key behind (the hazard of deciding at
/// quorum is a late SET landing after its release).
async fn all_empty(masters: &Masters) {
    eventually("every master is empty", Duration::from_secs(10), || async {
        masters.dbsizes().await.iter().all(|&n| n == 0)
    })
    .await;
}

/// One `try_lock` of `resource` and its release: whether both worked.
async fn lock_cycle(client: &Redlock, resource: &str, ttl: Duration) -> bool {
    match client.try_lock(resource, ttl).await {
        Ok(lease) => lease.release().await.is_ok(),
        Err(_) => false,
    }
}

/// Runs `tasks × rounds` lock + release cycles on distinct resources; returns the slowest
/// cycle (a slow or dead master must cost neither the acquire nor the release any time).
async fn burst(client: &Redlock, tasks: usize, rounds: usize) -> Duration {
    let workers = (0..tasks).map(|t| {
        let client = client.clone();
        tokio::spawn(async move {
            let mut slowest = Duration::ZERO;
            for r in 0..rounds {
                let started = Instant::now();
                let lease = client
                    .try_lock(&format!("burst:{t}:{r}"), Duration::from_secs(10))
                    .await
                    .unwrap_or_else(|e| panic!("task {t} round {r}: {e}"));
                lease.release().await.expect("release");
                slowest = slowest.max(started.elapsed());
            }
            slowest
        })
    });
    let mut slowest = Duration::ZERO;
    for w in workers {
        slowest = slowest.max(w.await.expect("burst task"));
    }
    slowest
}

/// A node timeout no healthy round trip comes near, for the tests that assert a slow or
/// paused master costs a cycle nothing: a cycle that waited for it would take at least this
/// long, a cycle decided by the quorum takes two loopback round trips. The bound asserted is
/// this timeout, its slack all of it but those round trips — no machine load closes that gap,
/// and a cycle that waits still fails.
const PATIENT: Duration = Duration::from_secs(3);

/// `paused` of `n` masters frozen during a burst of lock cycles: no cycle waits for them
/// (each is shorter than [`PATIENT`], the node timeout it would otherwise wait out).
async fn paused_minority(n: usize, paused: usize) {
    let masters = Masters::start(n);
    let client = masters
        .builder()
        .node_timeout(PATIENT)
        .retry(Retry::never())
        .build()
        .unwrap();
    warm_up(&client, &masters).await;
    for i in 0..paused {
        masters[i].freeze();
    }
    let slowest = burst(&client, 8, 10).await;
    for i in 0..paused {
        masters[i].thaw();
    }
    // Decided at quorum: the paused masters cost nothing, not even their timeout.
    assert!(
        slowest < PATIENT,
        "N={n}, {paused} paused: slowest cycle {slowest:?}"
    );
    // Once thawed, the paused masters run the SETs and then the releases queued for them,
    // in that order: nothing is stranded.
    all_empty(&masters).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn one_of_three_paused_during_a_burst() {
    paused_minority(3, 1).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_of_five_paused_during_a_burst() {
    paused_minority(5, 2).await;
}

/// A black-holed majority: every try fails as a timeout within its bound — the node timeout,
/// plus at most four node timeouts given back for this process's own stalls (`call.rs`,
/// `MAX_EXCUSE`), plus the last look — and a second of slack for the lateness of the last
/// timer on a loaded machine. A try that waited for the silent masters forever, or blamed
/// them for its own stalls beyond the excuse, fails it.
#[tokio::test(flavor = "multi_thread")]
async fn majority_black_holed_fails_within_bound_then_heals() {
    let masters = Masters::start(3);
    let mut proxies = Vec::new();
    for m in masters.iter() {
        proxies.push(FaultProxy::start(m.addr().parse().unwrap()).await);
    }
    let client = proxies
        .iter()
        .fold(Redlock::builder(), |b, p| b.redis(&p.url()))
        .node_timeout(NODE_TIMEOUT)
        .retry(Retry::never())
        .build()
        .unwrap();
    warm_up(&client, &masters).await;

    proxies[0].set(Fault::BlackHole);
    proxies[1].set(Fault::BlackHole);
    for round in 0..3 {
        let started = Instant::now();
        let err = client
            .try_lock("partitioned", Duration::from_secs(5))
            .await
            .unwrap_err();
        let took = started.elapsed();
        assert!(err.is_unavailable(), "round {round}: {err:?}");
        assert!(err.is_timeout(), "round {round}: {err:?}");
        let bound = silent_majority_bound();
        assert!(
            took < bound,
            "round {round}: the unreachable error took {took:?} (bound {bound:?})"
        );
    }

    // Heal: the same client works again, without being rebuilt.
    proxies[0].set(Fault::Pass);
    proxies[1].set(Fault::Pass);
    eventually(
        "locks work again after the partition",
        Duration::from_secs(15),
        || lock_cycle(&client, "healed", Duration::from_secs(5)),
    )
    .await;
    all_empty(&masters).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn reset_connections_are_remade() {
    let masters = Masters::start(3);
    let proxies = [
        FaultProxy::start(masters[0].addr().parse().unwrap()).await,
        FaultProxy::start(masters[1].addr().parse().unwrap()).await,
    ];
    let client = Redlock::builder()
        .redis(&proxies[0].url())
        .redis(&proxies[1].url())
        .redis(&masters[2].url())
        .node_timeout(NODE_TIMEOUT)
        .retry(Retry::never())
        .build()
        .unwrap();
    warm_up(&client, &masters).await;
    // One reset master: still a quorum.
    proxies[0].set(Fault::Reset);
    let lease = client
        .try_lock("reset", Duration::from_secs(5))
        .await
        .unwrap();
    lease.release().await.unwrap();
    // A majority reset: unavailable, then back once the connections can be remade.
    proxies[1].set(Fault::Reset);
    let err = client
        .try_lock("reset", Duration::from_secs(5))
        .await
        .unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    proxies[0].set(Fault::Pass);
    proxies[1].set(Fault::Pass);
    eventually(
        "locks work after the resets",
        Duration::from_secs(15),
        || lock_cycle(&client, "reset", Duration::from_secs(5)),
    )
    .await;
    all_empty(&masters).await;
}

/// A master slower than the node timeout costs no lock cycle anything: each cycle is shorter
/// than [`PATIENT`], the node timeout it would wait out for that master.
#[tokio::test(flavor = "multi_thread")]
async fn slowed_master_does_not_slow_the_lock() {
    let masters = Masters::start(3);
    let proxy = FaultProxy::start(masters[0].addr().parse().unwrap()).await;
    let client = Redlock::builder()
        .redis(&proxy.url())
        .redis(&masters[1].url())
        .redis(&masters[2].url())
        .node_timeout(PATIENT)
        .retry(Retry::never())
        .build()
        .unwrap();
    warm_up(&client, &masters).await;
    // Slower than the node timeout in each direction: that master never answers in time.
    proxy.set(Fault::Latency(PATIENT * 2));
    let slowest = burst(&client, 4, 10).await;
    assert!(
        slowest < PATIENT,
        "slowest lock + release cycle {slowest:?}"
    );
    proxy.set(Fault::Pass);
    all_empty(&masters).await;
}

/// Takes `first`'s lock with master 2 down (so it lands on exactly masters 0 and 1), then
/// restarts masters 2 and 0 empty, and lets `second` try again and again while the first
/// lease is valid. Returns whether `second` got the lock while the first lease was valid.
async fn restart_while_held(first: &Redlock, second: &Redlock, masters: &Masters) -> bool {
    masters[2].stop();
    let lease = first
        .try_lock("restarted", Duration::from_secs(4))
        .await
        .expect("the first client locks on masters 0 and 1");
    masters[2].restart();
    masters[0].restart();
    let mut tries = 0;
    while lease.is_valid() {
        tries += 1;
        match second.try_lock("restarted", Duration::from_secs(4)).await {
            // Judged the moment the second lock is granted.
            Ok(_) => return lease.is_valid(),
            Err(e) => assert!(e.is_unavailable() || e.is_contended(), "{e:?}"),
        }
        // The pace of a client retrying, not a synchronization.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        tries > 1,
        "the first lease expired before the second client tried"
    );
    false
}

#[tokio::test(flavor = "multi_thread")]
async fn delayed_restart_protection_keeps_a_restarted_master_out() {
    let max_ttl = Duration::from_secs(4);
    let masters = Masters::start(3);
    let protected = || {
        let opts = RedisNodeOptions::new().restart_protection(max_ttl);
        masters
            .urls()
            .iter()
            .fold(Redlock::builder(), |b, url| b.redis_with(url, &opts))
            .node_timeout(NODE_TIMEOUT)
            .retry(Retry::never())
            .build()
            .unwrap()
    };
    let (a, b) = (protected(), protected());
    // Fresh masters are as new as restarted ones: no vote until they are max_ttl old.
    let err = a.try_lock("young", max_ttl).await.unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    assert!(
        err.to_string().contains("delayed-restart protection"),
        "{err}"
    );
    eventually("the masters are old enough to vote", max_ttl * 3, || {
        lock_cycle(&a, "old-enough", max_ttl)
    })
    .await;
    // A ttl above the protected maximum is refused up front.
    let err = a.try_lock("too-long", max_ttl * 2).await.unwrap_err();
    assert!(err.is_invalid_input(), "{err}");

    assert!(
        !restart_while_held(&a, &b, &masters).await,
        "with protection, the restarted masters must not vote while the lease is valid"
    );
    // The restarted masters vote again once they have been up for max_ttl.
    eventually("the restarted masters vote again", max_ttl * 3, || {
        lock_cycle(&b, "restarted", max_ttl)
    })
    .await;
}

/// The hole the Redlock spec documents: without protection, a master restarted empty votes
/// "free" for a lock it forgot, and a second client gains a quorum while the first lease is
/// still valid. This test documents it; `delayed_restart_protection_…` shows the cure.
#[tokio::test(flavor = "multi_thread")]
async fn without_protection_a_restarted_master_breaks_exclusion() {
    let masters = Masters::start(3);
    let a = masters.builder().retry(Retry::never()).build().unwrap();
    let b = masters.builder().retry(Retry::never()).build().unwrap();
    warm_up(&a, &masters).await;
    warm_up(&b, &masters).await;
    assert!(
        restart_while_held(&a, &b, &masters).await,
        "the known hole: the second client gets the lock while the first lease is valid"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn extension_after_expiry_fails_and_never_resurrects() {
    let masters = Masters::start(3);
    let client = masters.builder().retry(Retry::never()).build().unwrap();
    warm_up(&client, &masters).await;

    // 500 ms, not less: the validity is the ttl less the acquisition's time, which a loaded
    // machine may stretch; the test waits for the expiry anyway.
    let lease = client
        .try_lock("expiring", Duration::from_millis(500))
        .await
        .unwrap();
    eventually("the keys expired", Duration::from_secs(5), || {
        masters.absent_everywhere("expiring")
    })
    .await;
    assert!(!lease.is_valid());
    let err = lease.extend(Duration::from_secs(10)).await.unwrap_err();
    assert!(err.is_lost(), "{err:?}");
    assert!(
        masters.absent_everywhere("expiring").await,
        "extend re-created the lock"
    );

    // Racing: extend right around the expiry, many times. Whatever the outcome, an
    // extension never outlives what it reports: a failed one leaves nothing that lasts.
    for i in 0..20u64 {
        let ttl = Duration::from_millis(40);
        let resource = format!("race:{i}");
        // The set-up may be retried (never the assertion): a 40 ms ttl leaves no validity when
        // a loaded machine stretches the acquisition past it.
        let mut granted = None;
        for _ in 0..50 {
            if let Ok(lease) = client.try_lock(&resource, ttl).await {
                granted = Some(lease);
                break;
            }
            // What a failed try left is released, or expires within the 40 ms (set-up: 5 s
            // for a loaded machine to run the release and the check).
            eventually(
                "could not set up the scenario: the failed try left nothing",
                5 * SECOND,
                || masters.absent_everywhere(&resource),
            )
            .await;
        }
        let lease = granted.unwrap_or_else(|| {
            panic!("could not set up the scenario: no 40 ms lease was granted in 50 tries")
        });
        tokio::time::sleep(Duration::from_millis(30 + i % 15)).await;
        match lease.extend(Duration::from_secs(60)).await {
            Ok(()) => {
                assert!(lease.is_valid());
                assert!(masters.holding(&resource, lease.value()).await >= 2);
            }
            Err(e) => {
                assert!(e.is_lost() || e.is_unavailable(), "{e:?}");
                // Not resurrected: the keys disappear — their 40 ms ttl, or the release of a
                // minority the extension reached. The bound is 2 s: a release's round trip on
                // a loaded machine fits in it, a key left with the 5 s extension does not.
                eventually("a failed extension leaves nothing", 5 * SECOND, || {
                    masters.absent_everywhere(&resource)
                })
                .await;
            }
        }
        let _ = lease.release().await;
    }
    all_empty(&masters).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn release_after_expiry_keeps_the_next_holders_lock() {
    let masters = Masters::start(3);
    let a = masters.builder().retry(Retry::never()).build().unwrap();
    let b = masters.builder().retry(Retry::never()).build().unwrap();
    warm_up(&a, &masters).await;
    warm_up(&b, &masters).await;

    // 500 ms, not less (see `extension_after_expiry_…`); its expiry is awaited.
    let late = a
        .try_lock("handover", Duration::from_millis(500))
        .await
        .unwrap();
    eventually("the first lock expired", Duration::from_secs(5), || {
        masters.absent_everywhere("handover")
    })
    .await;
    let holder = b
        .try_lock("handover", Duration::from_secs(10))
        .await
        .unwrap();
    // A lock returns at a quorum; the stale release must find the new lock on every master.
    eventually("every master holds the new lock", 5 * SECOND, || {
        masters.everywhere("handover", holder.value())
    })
    .await;
    let _ = late.release().await; // the old owner's release after its ttl
    assert!(
        masters.everywhere("handover", holder.value()).await,
        "a stale release deleted the new holder's lock"
    );
    holder.release().await.unwrap();
    all_empty(&masters).await;
}

/// A client of master 0 behind `proxy` and masters 1 and 2 directly, without retries.
fn client_behind(proxy: &FaultProxy, masters: &Masters, suspend_after: u32) -> Redlock {
    Redlock::builder()
        .redis(&proxy.url())
        .redis(&masters[1].url())
        .redis(&masters[2].url())
        .node_timeout(NODE_TIMEOUT)
        .retry(Retry::never())
        .suspend_after(suspend_after)
        .build()
        .unwrap()
}

/// One lock + release cycle on a fresh resource; whether it was granted.
async fn cycle(client: &Redlock, counter: &AtomicU32) -> bool {
    let i = counter.fetch_add(1, SeqCst);
    lock_cycle(client, &format!("suspend:{i}"), Duration::from_secs(10)).await
}

/// A black-holed master is suspended after a few timeouts: locks keep their quorum from the
/// other two meanwhile, and no longer ask it at all (its vote fails at once, as
/// `is_suspended`, not after a timeout). Once it answers again, a probe restores it, and it
/// holds the next locks. Nothing is left on any master.
#[tokio::test(flavor = "multi_thread")]
async fn an_unresponsive_master_is_suspended_then_restored() {
    let masters = Masters::start(3);
    let proxy = FaultProxy::start(masters[0].addr().parse().unwrap()).await;
    let client = client_behind(&proxy, &masters, 3);
    warm_up(&client, &masters).await;
    assert!(client.node_status().iter().all(|s| !s.is_suspended()));

    proxy.set(Fault::BlackHole);
    let i = AtomicU32::new(0);
    eventually("master 0 is suspended", Duration::from_secs(20), || {
        let client = &client;
        let i = &i;
        async move {
            assert!(
                cycle(client, i).await,
                "the other two masters grant every lock"
            );
            client.node_status()[0].is_suspended()
        }
    })
    .await;
    let status = client.node_status();
    assert!(status[0].consecutive_timeouts() >= 3, "{status:?}");
    assert!(
        !status[1].is_suspended() && !status[2].is_suspended(),
        "{status:?}"
    );

    // Not asked: a lock the other two refuse shows master 0's vote as suspended, not as a
    // timeout it waited for.
    for m in [1, 2] {
        assert!(
            masters[m]
                .set_nx("taken", "someone-else", Some(60_000))
                .await
        );
    }
    let err = client
        .try_lock("taken", Duration::from_secs(10))
        .await
        .unwrap_err();
    // (Decided as soon as one of them said "held": with master 0 out, no quorum is left.)
    assert!(err.is_contended() && err.held_by() >= 1, "{err:?}");
    let zero = err.node_errors().iter().find(|e| e.node() == 0);
    assert!(zero.is_some_and(|e| e.is_suspended()), "{err:?}");
    masters.del_on("taken", &[1, 2]).await;

    // Healed: a probe gets its answer and the master votes again.
    proxy.set(Fault::Pass);
    eventually("master 0 is restored", Duration::from_secs(20), || {
        let client = &client;
        let i = &i;
        async move {
            cycle(client, i).await;
            !client.node_status()[0].is_suspended()
        }
    })
    .await;
    let lease = client
        .try_lock("after", Duration::from_secs(10))
        .await
        .unwrap();
    let value = lease.value().to_owned();
    eventually(
        "every master holds the new lock",
        Duration::from_secs(5),
        || masters.everywhere("after", &value),
    )
    .await;
    lease.release().await.unwrap();
    all_empty(&masters).await;
}

/// `suspend_after(0)`: a black-holed master is asked by every lock and times out each time,
/// but is never suspended.
#[tokio::test(flavor = "multi_thread")]
async fn suspension_can_be_turned_off() {
    let masters = Masters::start(3);
    let proxy = FaultProxy::start(masters[0].addr().parse().unwrap()).await;
    let client = client_behind(&proxy, &masters, 0);
    warm_up(&client, &masters).await;

    proxy.set(Fault::BlackHole);
    let i = AtomicU32::new(0);
    eventually(
        "master 0 timed out 5 times",
        Duration::from_secs(20),
        || {
            let client = &client;
            let i = &i;
            async move {
                assert!(
                    cycle(client, i).await,
                    "the other two masters grant every lock"
                );
                client.node_status()[0].consecutive_timeouts() >= 5
            }
        },
    )
    .await;
    assert!(!client.node_status()[0].is_suspended());
    proxy.set(Fault::Pass);
    all_empty(&masters).await;
}

/// Every master answers later than the ttl (a latency of 80 ms each way, a ttl of 100 ms, a
/// node timeout long enough to wait for them): the quorum is reached, but with no validity
/// left — the client never returns such a lease (validity = ttl − elapsed − drift ≤ 0), and
/// the locks it took expire or are released: nothing is left.
#[tokio::test]
async fn an_acquisition_slower_than_the_ttl_never_returns_a_lease() {
    let masters = Masters::start(3);
    let mut proxies = Vec::new();
    for i in 0..3 {
        proxies.push(FaultProxy::start(masters[i].addr().parse().unwrap()).await);
    }
    let mut builder = Redlock::builder();
    for proxy in &proxies {
        builder = builder.redis(&proxy.url());
    }
    let client = builder
        .node_timeout(Duration::from_secs(1))
        .retry(Retry::never())
        .build()
        .unwrap();
    // Connections made before the latency, so that only the requests are slow.
    client
        .lock("faults:slow-warm", Duration::from_secs(1))
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    for proxy in &proxies {
        proxy.set(Fault::Latency(Duration::from_millis(80)));
    }
    let ttl = Duration::from_millis(100);
    for round in 0..5 {
        match client.lock(&format!("faults:slow-{round}"), ttl).await {
            Ok(lease) => panic!(
                "a lease whose quorum took longer than its ttl: validity {:?}",
                lease.validity()
            ),
            Err(e) => assert!(!e.is_contended(), "{e}"),
        }
    }
    for proxy in &proxies {
        proxy.set(Fault::Pass);
    }
    all_empty(&masters).await;
}
