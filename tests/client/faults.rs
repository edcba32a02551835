//! Faults: stopped and frozen masters (a minority locks, a majority is unavailable, promptly),
//! masters that answer late (the `SET`, an extension and the `EVAL` fallback still reach
//! them; a `SET` never handed to a connection is not sent late), `NOSCRIPT` recovery after
//! `SCRIPT FLUSH`.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use tower_redlock::Retry;

use crate::support::{eventually, silent_majority_bound, warm_up, Masters};
use crate::{gone_everywhere, SECOND, TTL};

/// Runs `op` while master `i` is frozen; the master thaws 50 ms in — late, but well within
/// the 200 ms node timeout — whether or not `op` has returned by then.
async fn with_late_master<T>(m: &Masters, i: usize, op: impl std::future::Future<Output = T>) -> T {
    m[i].freeze();
    let thaw = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        m[i].thaw();
    };
    let (out, ()) = tokio::join!(op, thaw);
    out
}

#[tokio::test]
async fn minority_down_locks_majority_down_is_unavailable() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let m = Masters::start(5);
        let c = m.client();
        warm_up(&c, &m).await;

        // Two of five down: a quorum of three is still there.
        m[0].stop();
        m[3].stop();
        let lease = c.try_lock("faults", TTL).await.unwrap();
        assert!(m[1].get("faults").await.is_some() || m[2].get("faults").await.is_some());
        lease.release().await.unwrap();

        // Three of five down: unavailable, promptly, naming the dead.
        m[4].stop();
        let dead: HashSet<usize> = [0, 3, 4].into();
        let start = Instant::now();
        let err = c.try_lock("faults", TTL).await.unwrap_err();
        let took = start.elapsed();
        assert!(err.is_unavailable(), "{err:?}");
        assert!(!err.is_contended());
        assert!(took < Duration::from_secs(3), "took {took:?}");
        let named: HashSet<usize> = err.node_errors().iter().map(|e| e.node()).collect();
        assert_eq!(named, dead, "{err:?}");
        for e in err.node_errors() {
            assert_eq!(e.node_name(), m[e.node()].addr());
        }
        // Nothing of ours is left on the live masters.
        eventually("the live masters are released", 5 * SECOND, || async {
            m[1].get("faults").await.is_none() && m[2].get("faults").await.is_none()
        })
        .await;

        // With retries: still bounded, every try counted.
        let start = Instant::now();
        let err = c
            .lock_with(
                "faults",
                TTL,
                Retry::times(2).delay(Duration::from_millis(20)),
            )
            .await
            .unwrap_err();
        assert!(err.is_unavailable(), "{err:?}");
        assert_eq!(err.attempts(), 3);
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "{:?}",
            start.elapsed()
        );

        // Back up (empty): the client reconnects and locks again.
        for i in [0, 3, 4] {
            m[i].restart();
        }
        eventually(
            "the client locks after the restart",
            Duration::from_secs(10),
            || async {
                match c.try_lock("faults", TTL).await {
                    Ok(lease) => {
                        lease.release().await.unwrap();
                        true
                    }
                    Err(e) => {
                        assert!(e.is_unavailable(), "{e:?}");
                        false
                    }
                }
            },
        )
        .await;
    })
    .await
    .expect("no hang");
}

/// Two of three masters frozen: the try fails as a timeout naming both, within the bound a
/// silent majority gets (`silent_majority_bound`: the node timeout, the stalls of this
/// process given back, the last look and a second for a late timer); the live master is
/// released, and once thawed the queued requests run and the lock can be had.
#[tokio::test]
async fn frozen_majority_times_out_promptly() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let m = Masters::start(3);
        let c = m.client();
        warm_up(&c, &m).await;

        // Two of three masters hang (SIGSTOP): every try ends at the node timeout.
        m[1].freeze();
        m[2].freeze();
        let start = Instant::now();
        let err = c.try_lock("frozen", TTL).await.unwrap_err();
        let took = start.elapsed();
        assert!(err.is_unavailable(), "{err:?}");
        assert!(err.is_timeout(), "{err:?}");
        let bound = silent_majority_bound();
        assert!(took < bound, "took {took:?} (bound {bound:?})");
        let named: HashSet<usize> = err.node_errors().iter().map(|e| e.node()).collect();
        assert_eq!(named, [1, 2].into(), "{err:?}");
        assert!(err.node_errors().iter().all(|e| e.is_timeout()));
        eventually("the live master is released", 5 * SECOND, || async {
            m[0].get("frozen").await.is_none()
        })
        .await;

        // Back: the requests queued while frozen run (SET, then the release sent after it),
        // and the lock can be had.
        m[1].thaw();
        m[2].thaw();
        eventually(
            "the frozen masters are released too",
            Duration::from_secs(3),
            || m.absent_everywhere("frozen"),
        )
        .await;
        eventually(
            "the client locks after the thaw",
            Duration::from_secs(5),
            || async {
                match c.try_lock("frozen", TTL).await {
                    Ok(lease) => lease.release().await.is_ok(),
                    Err(_) => false,
                }
            },
        )
        .await;
    })
    .await
    .expect("no hang");
}

/// A master that answers late (frozen while the other two decide the lock, thawed within
/// the node timeout) still gets the `SET`: Redlock sends it to all masters, and deciding early
/// must not withdraw it. Here the connections are up, so the request was already written.
#[tokio::test]
async fn lock_reaches_a_late_master() {
    let m = Masters::start(3);
    let c = m.client();
    warm_up(&c, &m).await;
    let lease = with_late_master(&m, 2, c.try_lock("late", TTL))
        .await
        .unwrap();
    eventually(
        "the late master holds the lock",
        Duration::from_secs(2),
        || m.everywhere("late", lease.value()),
    )
    .await;
    lease.release().await.unwrap();
    gone_everywhere(&m, "late").await;
}

/// The same with a master whose connection is still being made when the lock is decided
/// (the first lock of a fresh client): its `SET` was never handed to a connection, so it is
/// dropped with the decision — never sent once the outcome is known — and that master gets
/// nothing of this lease. (A `SET` that was handed over is always followed by the release
/// on the same connection: see `lock_reaches_a_late_master`.)
///
/// Master 2 stays frozen until the lock is decided (not thawed after a fixed 50 ms, which a
/// loaded machine could reach before the decision, letting the connection come up in time
/// and the `SET` be handed over legitimately). Masters 0 and 1 must grant it within the
/// node timeout, including their first connections: if they time out, the test fails as
/// "could not set up the scenario"; any other failure is the lock's.
#[tokio::test]
async fn a_set_never_handed_to_a_connection_is_not_sent_late() {
    let m = Masters::start(3);
    let c = m.client(); // connections are made lazily, on first use
    m[2].freeze();
    let first = c.try_lock("late-fresh", TTL).await;
    m[2].thaw();
    let lease = match first {
        Ok(lease) => lease,
        Err(e) if e.is_timeout() => {
            panic!("could not set up the scenario: masters 0 and 1 did not answer in time: {e}")
        }
        Err(e) => panic!("masters 0 and 1 (a quorum, up) did not grant the free key: {e}"),
    };
    assert_eq!(m.holding("late-fresh", lease.value()).await, 2);
    // Once master 2's connection is up, a later lock reaches it; a `SET` of the first lease
    // handed to that connection would have run before it.
    eventually(
        "a later lock reaches master 2",
        Duration::from_secs(5),
        || async {
            let Ok(probe) = c.try_lock("late-fresh:after", TTL).await else {
                return false;
            };
            let reached = m[2].get("late-fresh:after").await.as_deref() == Some(probe.value());
            probe.release().await.unwrap();
            reached
        },
    )
    .await;
    assert_eq!(m[2].get("late-fresh").await, None, "a stale SET was sent");
    lease.release().await.unwrap();
    gone_everywhere(&m, "late-fresh").await;
    gone_everywhere(&m, "late-fresh:after").await;
}

/// The same with a master that lost its script cache (a restart, `SCRIPT FLUSH`) and
/// answers late: the acquire is a script, and what reaches it must be the whole of it. (An
/// `EVALSHA` it answered `NOSCRIPT` after the try was decided was never followed by its
/// `EVAL`: the try keeps its late requests unpolled. Acquires are sent whole since.)
#[tokio::test]
async fn lock_reaches_a_late_master_after_script_flush() {
    let m = Masters::start(3);
    let c = m.client();
    warm_up(&c, &m).await;
    m[2].script_flush().await;
    let lease = with_late_master(&m, 2, c.try_lock("late-noscript", TTL))
        .await
        .unwrap();
    eventually(
        "the master that answered NOSCRIPT late holds the lock",
        Duration::from_secs(2),
        || m.everywhere("late-noscript", lease.value()),
    )
    .await;
    lease.release().await.unwrap();
    gone_everywhere(&m, "late-noscript").await;
}

/// An extension, too, must reach a master that answers late: otherwise that master's key
/// expires at the old ttl and the lock is left on exactly a quorum.
#[tokio::test]
async fn extend_reaches_a_late_master_after_script_flush() {
    let m = Masters::start(3);
    let c = m.client();
    warm_up(&c, &m).await;
    let lease = c.try_lock("late-extend", TTL).await.unwrap();
    eventually("every master holds the lock", 5 * SECOND, || {
        m.everywhere("late-extend", lease.value())
    })
    .await;
    m[2].script_flush().await;
    with_late_master(&m, 2, lease.extend(Duration::from_secs(60)))
        .await
        .unwrap();
    eventually(
        "the late master's key got the new ttl",
        Duration::from_secs(2),
        || async { m[2].pttl("late-extend").await > 20_000 },
    )
    .await;
    lease.release().await.unwrap();
    gone_everywhere(&m, "late-extend").await;
}

#[tokio::test]
async fn noscript_recovery_after_script_flush() {
    let m = Masters::start(3);
    let a = m.client();
    let b = m.client();
    warm_up(&a, &m).await;
    warm_up(&b, &m).await;
    let lease = a.lock("noscript", TTL).await.unwrap();
    let value = lease.value().to_owned();

    for s in m.iter() {
        s.script_flush().await;
    }
    // Extend runs its script again (EVALSHA → NOSCRIPT → EVAL): the PTTL moves.
    lease.extend(Duration::from_secs(60)).await.unwrap();
    let pttls = m.pttls("noscript").await;
    assert!(
        pttls.iter().filter(|p| **p > 20_000).count() >= 2,
        "extend did not run after the flush: {pttls:?}"
    );

    for s in m.iter() {
        s.script_flush().await;
    }
    // The acquire script answers the holder's PTTL: a retry-after proves it ran.
    let err = b.try_lock("noscript", TTL).await.unwrap_err();
    assert!(err.is_contended(), "{err:?}");
    let ra = err
        .retry_after()
        .expect("the acquire script reported the PTTL");
    assert!(
        ra > Duration::ZERO && ra <= Duration::from_secs(60),
        "{err:?}"
    );

    for s in m.iter() {
        s.script_flush().await;
    }
    // Release runs its script: the keys are gone.
    lease.release().await.unwrap();
    gone_everywhere(&m, "noscript").await;

    for s in m.iter() {
        s.script_flush().await;
    }
    let again = b.try_lock("noscript", TTL).await.unwrap();
    assert_ne!(again.value(), value);
    assert!(m.holding("noscript", again.value()).await >= 2);
    again.release().await.unwrap();
    // A release returns at a quorum; the last master's finishes in the background.
    gone_everywhere(&m, "noscript").await;
    assert_eq!(m.dbsizes().await, [0, 0, 0]);
}
