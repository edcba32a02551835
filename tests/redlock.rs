//! The Redlock client against real Redis masters: locking, quorum over every subset of
//! pre-held masters, faults (stopped masters, flushed script caches), extension and
//! auto-extension, scoped locks and their release paths, bad input, and a contention run.

use tower_redlock_testkit as support;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use support::{eventually, is_token, warm_up, Masters};
use tower_redlock::node::{Node, RedisNode};
use tower_redlock::{Redlock, Retry};

const TTL: Duration = Duration::from_secs(10);
const SECOND: Duration = Duration::from_secs(1);

/// Asserts that `key` is gone from every master: at once from a quorum (a release returns
/// once a quorum answered), and soon after from the rest (released in the background).
/// Every master ends empty (a release returns at a quorum; the rest follows in the
/// background).
async fn all_empty(m: &Masters) {
    eventually("every master is empty", Duration::from_secs(5), || async {
        m.dbsizes().await.iter().all(|&n| n == 0)
    })
    .await;
}

async fn gone_everywhere(m: &Masters, key: &str) {
    let held = m.values(key).await.iter().filter(|v| v.is_some()).count();
    assert!(
        held < m.len() / 2 + 1,
        "{key} is still held on {held} masters"
    );
    eventually(
        format!("{key} is gone everywhere"),
        Duration::from_secs(5),
        || m.absent_everywhere(key),
    )
    .await;
}

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

fn ms(d: Duration) -> i64 {
    d.as_millis() as i64
}

// --- lock / unlock -----------------------------------------------------------------------------

#[tokio::test]
async fn lock_unlock_relock() {
    let m = Masters::start(3);
    let c = m.client();
    assert_eq!((c.node_count(), c.quorum()), (3, 2));
    warm_up(&c, &m).await;

    let ttl = Duration::from_secs(5);
    let lease = c.lock("resource_key", ttl).await.unwrap();
    assert_eq!(lease.resource(), "resource_key");
    assert_eq!(lease.key(), "resource_key", "no prefix by default");
    assert!(is_token(lease.value()), "value {:?}", lease.value());
    assert_eq!(lease.ttl(), ttl);
    assert_eq!(lease.extensions(), 0);
    let validity = lease.validity();
    assert!(validity > Duration::ZERO && validity <= ttl, "{validity:?}");
    assert!(lease.is_valid());
    let shown = lease.to_string();
    assert!(
        shown.contains("resource_key") && shown.contains(lease.value()),
        "{shown}"
    );

    let value = lease.value().to_owned();
    eventually("every master holds the lease's value", SECOND, || {
        m.everywhere("resource_key", &value)
    })
    .await;
    for pttl in m.pttls("resource_key").await {
        assert!(pttl > 0 && pttl <= ms(ttl), "PTTL {pttl}");
    }

    c.unlock(lease).await.unwrap();
    gone_everywhere(&m, "resource_key").await;

    let again = c.lock("resource_key", ttl).await.unwrap();
    assert_ne!(again.value(), value, "a fresh token per lock");
    assert!(m.holding("resource_key", again.value()).await >= 2);
    again.release().await.unwrap();
    gone_everywhere(&m, "resource_key").await;
    assert_eq!(m.dbsizes().await, [0, 0, 0]);
}

/// The Ruby gem's README, step by step.
#[tokio::test]
async fn ruby_style_flow() {
    let m = Masters::start(3);
    let lock_manager = Redlock::new(m.urls()).unwrap();
    let ttl = Duration::from_millis(2000);

    // first_try_lock_info = lock_manager.lock("resource_key", 2000)
    let first_try_lock_info = lock_manager.lock("resource_key", ttl).await.unwrap();
    // second_try_lock_info = lock_manager.lock("resource_key", 2000) # => false
    let second_try_lock_info = lock_manager
        .lock_with("resource_key", ttl, Retry::never())
        .await;
    assert!(second_try_lock_info.unwrap_err().is_contended());
    // {validity: 1987, resource: "resource_key", value: "generated_uuid4"}
    assert!(first_try_lock_info.validity() <= ttl);
    assert_eq!(first_try_lock_info.resource(), "resource_key");

    // lock_manager.unlock(first_try_lock_info)
    lock_manager.unlock(first_try_lock_info).await.unwrap();
    gone_everywhere(&m, "resource_key").await;
    // second_try_lock_info = lock_manager.lock("resource_key", 2000) # => lock info
    let second_try_lock_info = lock_manager.lock("resource_key", ttl).await.unwrap();
    assert!(second_try_lock_info.is_valid());
    // lock(..., extend: lock_info)
    second_try_lock_info
        .extend(Duration::from_millis(3000))
        .await
        .unwrap();
    assert!(second_try_lock_info.validity() > ttl);
    lock_manager.unlock(second_try_lock_info).await.unwrap();

    // lock_manager.lock("resource_key", 2000) do |locked| ... end
    let ran = lock_manager
        .with_lock("resource_key", ttl, |lease| async move {
            assert!(!lease.is_lost());
            "critical code ran"
        })
        .await;
    assert_eq!(ran.unwrap(), "critical code ran");
    gone_everywhere(&m, "resource_key").await;

    // lock! raising LockError when held: `?` propagates the contended error.
    let holder = lock_manager.lock("resource_key", ttl).await.unwrap();
    let bang = async {
        let other = m.builder().build()?;
        let out = other
            .with_lock("resource_key", ttl, |_| async { "must not run" })
            .await?;
        Ok::<_, tower_redlock::Error>(out)
    }
    .await;
    assert!(bang.unwrap_err().is_contended());
    holder.release().await.unwrap();
    // A release returns at a quorum; the last master's finishes in the background.
    all_empty(&m).await;
}

#[tokio::test]
async fn two_clients_contend_and_tokens_are_unique() {
    let m = Masters::start(3);
    let a = m.client();
    let b = m.client();
    let ttl = Duration::from_secs(5);

    let lease = a.lock("contended", ttl).await.unwrap();
    let err = b.try_lock("contended", ttl).await.unwrap_err();
    assert!(err.is_contended(), "{err:?}");
    assert!(!err.is_unavailable() && !err.is_invalid_input());
    assert!(err.held_by() >= b.quorum(), "{err:?}");
    let retry_after = err
        .retry_after()
        .expect("a contended error says when to retry");
    assert!(
        retry_after > Duration::ZERO && retry_after <= ttl,
        "{retry_after:?}"
    );
    assert_eq!(err.attempts(), 1);

    // With retries: still contended, after every try.
    let start = Instant::now();
    let err = b
        .lock_with(
            "contended",
            ttl,
            Retry::times(2)
                .delay(Duration::from_millis(20))
                .jitter(Duration::from_millis(5)),
        )
        .await
        .unwrap_err();
    assert!(err.is_contended(), "{err:?}");
    assert_eq!(err.attempts(), 3);
    assert!(start.elapsed() >= Duration::from_millis(40));
    // The contender left nothing of its own behind.
    let now = m.values("contended").await;
    assert!(
        now.iter()
            .all(|v| v.is_none() || v.as_deref() == Some(lease.value())),
        "{now:?}"
    );
    assert!(m.holding("contended", lease.value()).await >= 2, "{now:?}");

    lease.release().await.unwrap();
    let taken = b.try_lock("contended", ttl).await.unwrap();
    assert!(a
        .try_lock("contended", ttl)
        .await
        .unwrap_err()
        .is_contended());
    taken.release().await.unwrap();

    let mut seen = HashSet::new();
    for i in 0..100 {
        let client = if i % 2 == 0 { &a } else { &b };
        let lease = client.try_lock("tokens", ttl).await.unwrap();
        assert!(is_token(lease.value()));
        assert!(seen.insert(lease.value().to_owned()), "token reused");
        lease.release().await.unwrap();
    }
    assert_eq!(seen.len(), 100);
    // A release returns at a quorum; the last master's finishes in the background.
    all_empty(&m).await;
}

// --- quorum ------------------------------------------------------------------------------------

/// For every subset of masters pre-held by a foreign value, `try_lock` succeeds exactly when
/// the free masters make a quorum; a failed try leaves nothing of ours behind.
async fn every_subset(n: usize) {
    let m = Masters::start(n);
    let c = m.client();
    let q = n / 2 + 1;
    assert_eq!(c.quorum(), q);
    warm_up(&c, &m).await;

    for mask in 0u32..(1 << n) {
        let key = format!("subset-{n}-{mask:0n$b}");
        let held: Vec<usize> = (0..n).filter(|i| mask & (1 << i) != 0).collect();
        for &i in &held {
            assert!(m[i].set_nx(&key, "foreign", Some(10_000)).await);
        }
        let free = n - held.len();
        let expected = |i: usize, ours: &str| -> Option<String> {
            if held.contains(&i) {
                Some("foreign".to_owned())
            } else if ours.is_empty() {
                None
            } else {
                Some(ours.to_owned())
            }
        };

        match c.try_lock(&key, TTL).await {
            Ok(lease) => {
                assert!(free >= q, "{key}: locked with {free} free of {n}");
                let ours = lease.value().to_owned();
                eventually(
                    format!("{key}: the value is on every free master"),
                    SECOND,
                    || async {
                        let now = m.values(&key).await;
                        (0..n).all(|i| now[i] == expected(i, &ours))
                    },
                )
                .await;
                lease.release().await.unwrap();
            }
            Err(e) => {
                assert!(free < q, "{key}: not locked with {free} free of {n}: {e:?}");
                assert!(e.is_contended(), "{key}: {e:?}");
                assert!(
                    e.held_by() > n - q && e.held_by() <= held.len(),
                    "{key}: held_by {} (n {n}, held {})",
                    e.held_by(),
                    held.len()
                );
                let ra = e.retry_after().expect("retry-after");
                assert!(ra <= Duration::from_secs(10), "{ra:?}");
            }
        }
        // After the try (and the release): no master holds our token; the foreign holds
        // are untouched. (A failed try releases the masters that had not answered yet in
        // the background, so this is awaited.)
        eventually(
            format!("{key}: only the foreign holds are left"),
            SECOND,
            || async {
                let now = m.values(&key).await;
                for (i, v) in now.iter().enumerate() {
                    if held.contains(&i) {
                        assert_eq!(v.as_deref(), Some("foreign"), "{key}: master {i}");
                    }
                }
                (0..n).all(|i| now[i] == expected(i, ""))
            },
        )
        .await;
    }
}

#[tokio::test]
async fn quorum_every_subset_of_1() {
    every_subset(1).await;
}

#[tokio::test]
async fn quorum_every_subset_of_3() {
    every_subset(3).await;
}

#[tokio::test]
async fn quorum_every_subset_of_5() {
    every_subset(5).await;
}

// --- faults ------------------------------------------------------------------------------------

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
        eventually("the live masters are released", SECOND, || async {
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
        assert!(took < Duration::from_secs(2), "took {took:?}");
        let named: HashSet<usize> = err.node_errors().iter().map(|e| e.node()).collect();
        assert_eq!(named, [1, 2].into(), "{err:?}");
        assert!(err.node_errors().iter().all(|e| e.is_timeout()));
        eventually("the live master is released", SECOND, || async {
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
#[tokio::test]
async fn a_set_never_handed_to_a_connection_is_not_sent_late() {
    let m = Masters::start(3);
    let c = m.client(); // connections are made lazily, on first use
    let lease = with_late_master(&m, 2, c.try_lock("late-fresh", TTL))
        .await
        .unwrap();
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

/// The same with a master that lost its script cache (a restart, `SCRIPT FLUSH`): its
/// `EVALSHA` answers `NOSCRIPT` late, and the `EVAL` fallback must still be sent.
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
    eventually("every master holds the lock", SECOND, || {
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

// --- interop -----------------------------------------------------------------------------------

#[tokio::test]
async fn interop_with_plain_set_nx_and_key_prefix() {
    let m = Masters::start(3);
    let c = m.client();
    warm_up(&c, &m).await;

    // Another client's plain `SET resource x NX PX …` blocks us.
    for s in m.iter() {
        assert!(s.set_nx("theirs", "x", Some(10_000)).await);
    }
    let err = c.try_lock("theirs", TTL).await.unwrap_err();
    assert!(err.is_contended(), "{err:?}");
    let ra = err.retry_after().unwrap();
    assert!(
        ra > Duration::from_secs(5) && ra <= Duration::from_secs(10),
        "{ra:?}"
    );
    assert_eq!(m.values("theirs").await, vec![Some("x".to_owned()); 3]);

    // … also without an expiry: contended, but no time to suggest.
    for s in m.iter() {
        assert!(s.set_nx("forever", "x", None).await);
    }
    let err = c.try_lock("forever", TTL).await.unwrap_err();
    assert!(err.is_contended(), "{err:?}");
    assert_eq!(err.retry_after(), None);
    assert_eq!(m.values("forever").await, vec![Some("x".to_owned()); 3]);

    // Our lock blocks their plain `SET resource y NX`.
    let ours = c.try_lock("ours", TTL).await.unwrap();
    eventually("our value is on every master", SECOND, || {
        m.everywhere("ours", ours.value())
    })
    .await;
    for s in m.iter() {
        assert!(
            !s.set_nx("ours", "y", None).await,
            "SET NX overwrote our lock"
        );
    }
    ours.release().await.unwrap();
    gone_everywhere(&m, "ours").await;

    // A key prefix, for clients that use one.
    let prefixed = m.builder().key_prefix("redlock:").build().unwrap();
    let lease = prefixed.try_lock("pref", TTL).await.unwrap();
    assert_eq!(lease.key(), "redlock:pref");
    assert_eq!(lease.resource(), "pref");
    assert!(m.holding("redlock:pref", lease.value()).await >= 2);
    gone_everywhere(&m, "pref").await;
    // The unprefixed client does not see it; a plain holder of the prefixed key blocks it.
    c.try_lock("pref", TTL)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    for s in m.iter() {
        assert!(s.set_nx("redlock:pref2", "x", Some(10_000)).await);
    }
    assert!(prefixed
        .try_lock("pref2", TTL)
        .await
        .unwrap_err()
        .is_contended());
    lease.release().await.unwrap();
    gone_everywhere(&m, "redlock:pref").await;
}

// --- extension ---------------------------------------------------------------------------------

#[tokio::test]
async fn extend_keeps_the_lock() {
    let m = Masters::start(3);
    let c = m.client();
    warm_up(&c, &m).await;
    let ttl = Duration::from_millis(1000);
    let lease = c.lock("extend", ttl).await.unwrap();

    eventually(
        "the PTTL drops below 700 ms",
        Duration::from_secs(2),
        || async {
            let p = m.pttls("extend").await;
            p.iter().filter(|p| **p > 0 && **p < 700).count() >= 2
        },
    )
    .await;
    let before = lease.validity();
    lease.extend(ttl).await.unwrap();
    assert_eq!(lease.extensions(), 1);
    assert!(
        lease.validity() > before,
        "{:?} <= {before:?}",
        lease.validity()
    );
    let p = m.pttls("extend").await;
    assert!(
        p.iter().filter(|p| **p > 800 && **p <= 1000).count() >= 2,
        "the PTTL did not grow back: {p:?}"
    );

    c.extend(&lease, Duration::from_secs(5)).await.unwrap();
    assert_eq!(lease.extensions(), 2);
    assert!(lease.validity() > ttl);
    let p = m.pttls("extend").await;
    assert!(p.iter().filter(|p| **p > 1000).count() >= 2, "{p:?}");
    assert_eq!(m.holding("extend", lease.value()).await, 3);
    lease.release().await.unwrap();
    gone_everywhere(&m, "extend").await;
}

#[tokio::test]
async fn extend_after_expiry_is_lost_and_does_not_recreate() {
    let m = Masters::start(3);
    let c = m.client();
    warm_up(&c, &m).await;
    let lease = c.lock("expired", Duration::from_millis(100)).await.unwrap();
    eventually(
        "the lock expires everywhere",
        Duration::from_secs(3),
        || async { !lease.is_valid() && m.absent_everywhere("expired").await },
    )
    .await;
    let err = lease.extend(TTL).await.unwrap_err();
    assert!(err.is_lost(), "{err:?}");
    assert!(
        m.absent_everywhere("expired").await,
        "extend re-created the key"
    );
    assert_eq!(lease.validity(), Duration::ZERO);
    // Someone else can have it.
    c.try_lock("expired", TTL)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn extend_after_keys_vanished_is_lost_and_does_not_recreate() {
    let m = Masters::start(3);
    let c = m.client();
    warm_up(&c, &m).await;

    // Gone on every master while the lease still believes it is valid.
    let lease = c.lock("vanished", TTL).await.unwrap();
    eventually("every master holds the lock", SECOND, || {
        m.everywhere("vanished", lease.value())
    })
    .await;
    m.del_on("vanished", &[0, 1, 2]).await;
    assert!(lease.is_valid());
    let err = lease.extend(TTL).await.unwrap_err();
    assert!(err.is_lost(), "{err:?}");
    assert!(!lease.is_valid(), "a lost lease is no longer valid");
    assert!(lease.handle().is_lost());
    assert!(
        m.absent_everywhere("vanished").await,
        "extend re-created the key"
    );

    // Gone on a majority only: lost too, and not re-created there.
    let lease = c.lock("vanished-2", TTL).await.unwrap();
    eventually("every master holds the lock", SECOND, || {
        m.everywhere("vanished-2", lease.value())
    })
    .await;
    m.del_on("vanished-2", &[0, 2]).await;
    let err = lease.extend(TTL).await.unwrap_err();
    assert!(err.is_lost(), "{err:?}");
    assert_eq!(m[0].get("vanished-2").await, None);
    assert_eq!(m[2].get("vanished-2").await, None);
    lease.release().await.unwrap();
    gone_everywhere(&m, "vanished-2").await;
}

#[tokio::test]
async fn wrong_token_release_and_extend_do_nothing() {
    let m = Masters::start(3);
    let c = m.client();
    warm_up(&c, &m).await;
    let lease = c.lock("owned", TTL).await.unwrap();
    let value = lease.value().to_owned();
    eventually("every master holds the lock", SECOND, || {
        m.everywhere("owned", &value)
    })
    .await;

    let node = RedisNode::open(&m[0].url()).unwrap();
    assert!(!node.release("owned", "wrong").await.unwrap());
    assert_eq!(m[0].get("owned").await.as_deref(), Some(value.as_str()));
    assert!(!node
        .extend("owned", "wrong", Duration::from_secs(100))
        .await
        .unwrap());
    let pttl = m[0].pttl("owned").await;
    assert!(pttl > 0 && pttl <= ms(TTL), "PTTL {pttl}");
    assert_eq!(m[0].get("owned").await.as_deref(), Some(value.as_str()));

    // The owner's token does work through the same node.
    assert!(node
        .extend("owned", &value, Duration::from_secs(100))
        .await
        .unwrap());
    assert!(m[0].pttl("owned").await > ms(TTL));
    lease.release().await.unwrap();
    gone_everywhere(&m, "owned").await;
}

#[tokio::test]
async fn extensions_are_capped() {
    let m = Masters::start(3);
    let c = m.builder().max_extensions(2).build().unwrap();
    let lease = c.lock("capped", Duration::from_secs(5)).await.unwrap();
    lease.extend(Duration::from_secs(5)).await.unwrap();
    lease.extend(Duration::from_secs(5)).await.unwrap();
    let err = lease.extend(Duration::from_secs(5)).await.unwrap_err();
    assert!(err.is_extension_limit(), "{err:?}");
    assert!(!err.is_lost());
    assert_eq!(lease.extensions(), 2);
    assert!(lease.is_valid(), "hitting the cap does not end the lease");
    assert!(m.holding("capped", lease.value()).await >= 2);
    lease.release().await.unwrap();
    gone_everywhere(&m, "capped").await;
}

// --- auto-extension ----------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_holds_past_the_ttl() {
    let m = Masters::start(3);
    let a = m.client();
    let b = m.client();
    warm_up(&a, &m).await;
    let ttl = Duration::from_millis(300);

    let mut lease = a.lock("kept", ttl).await.unwrap();
    lease.keep_alive();
    lease.keep_alive(); // a second call does nothing
    let value = lease.value().to_owned();
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(1200) {
        let err = b.try_lock("kept", ttl).await.unwrap_err();
        assert!(err.is_contended(), "at {:?}: {err:?}", start.elapsed());
        let (values, pttls) = (m.values("kept").await, m.pttls("kept").await);
        let alive = (0..3)
            .filter(|&i| values[i].as_deref() == Some(value.as_str()) && pttls[i] > 0)
            .count();
        assert!(alive >= 2, "at {:?}: {values:?} {pttls:?}", start.elapsed());
        assert!(lease.is_valid(), "at {:?}", start.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(lease.extensions() >= 3, "{} extensions", lease.extensions());
    lease.release().await.unwrap();
    gone_everywhere(&m, "kept").await;

    // The scoped form.
    let out = a
        .scope("kept-scope", ttl)
        .keep_alive()
        .run(|handle| async move {
            let start = Instant::now();
            while start.elapsed() < Duration::from_millis(1000) {
                assert!(b
                    .try_lock("kept-scope", ttl)
                    .await
                    .unwrap_err()
                    .is_contended());
                assert!(!handle.is_lost());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            handle.extensions()
        })
        .await
        .unwrap();
    assert!(out >= 3, "{out} extensions");
    gone_everywhere(&m, "kept-scope").await;
}

/// Deleting the keys under a kept-alive lease: the next extension finds it lost and says so,
/// well before the lease's own validity would have run out.
async fn loss_is_signalled(deleted: &[usize]) {
    let m = Masters::start(3);
    let c = m.client();
    warm_up(&c, &m).await;
    let ttl = Duration::from_millis(1500); // extended every 500 ms
    let mut lease = c.lock("lossy", ttl).await.unwrap();
    assert!(m.holding("lossy", lease.value()).await >= 2);
    lease.keep_alive();
    let handle = lease.handle();

    m.del_on("lossy", deleted).await;
    let start = Instant::now();
    tokio::time::timeout(Duration::from_millis(1200), handle.lost())
        .await
        .expect("the loss is signalled within one keep-alive period");
    assert!(handle.is_lost());
    assert_eq!(handle.validity(), Duration::ZERO);
    assert!(!lease.is_valid());
    assert!(start.elapsed() < Duration::from_millis(1200));
    // Signalled, and keep-alive stopped: the deleted keys stay deleted.
    for &i in deleted {
        assert_eq!(m[i].get("lossy").await, None, "master {i}");
    }
    let err = lease.extend(ttl).await.unwrap_err();
    assert!(err.is_lost(), "{err:?}");
    drop(lease);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_signals_loss_on_all_masters() {
    loss_is_signalled(&[0, 1, 2]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_signals_loss_on_a_majority() {
    loss_is_signalled(&[1, 2]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_on_loss_stops_the_work() {
    let m = Masters::start(3);
    let c = m.client();
    warm_up(&c, &m).await;
    let finished = Arc::new(AtomicBool::new(false));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();

    let work_finished = finished.clone();
    let run = c
        .scope("aborted", Duration::from_millis(1500))
        .keep_alive()
        .abort_on_loss()
        .run(move |handle| async move {
            started_tx.send(handle.resource().to_owned()).unwrap();
            tokio::time::sleep(Duration::from_secs(10)).await;
            work_finished.store(true, Ordering::SeqCst);
        });
    let saboteur = async {
        assert_eq!(started_rx.await.unwrap(), "aborted");
        m.del_on("aborted", &[0, 1, 2]).await;
        Instant::now()
    };
    let (out, deleted_at) = tokio::time::timeout(Duration::from_secs(5), async {
        tokio::join!(run, saboteur)
    })
    .await
    .expect("run returns once the lock is lost");
    let err = out.unwrap_err();
    assert!(err.is_lost(), "{err:?}");
    assert!(
        deleted_at.elapsed() < Duration::from_millis(1200),
        "{:?}",
        deleted_at.elapsed()
    );
    assert!(!finished.load(Ordering::SeqCst), "the work was not stopped");
    gone_everywhere(&m, "aborted").await;
}

// --- scoped locks ------------------------------------------------------------------------------

#[tokio::test]
async fn with_lock_always_releases() {
    let m = Masters::start(3);
    let c = m.client();
    let other = m.client();
    warm_up(&c, &m).await;

    // On success.
    let seen = c
        .with_lock("scoped", TTL, |handle| {
            let m = &m;
            async move {
                assert_eq!(handle.resource(), "scoped");
                assert!(handle.validity() > Duration::ZERO);
                m.values("scoped").await
            }
        })
        .await
        .unwrap();
    assert!(
        seen.iter().flatten().filter(|v| is_token(v)).count() >= 2,
        "{seen:?}"
    );
    gone_everywhere(&m, "scoped").await;

    // On an error value from the work.
    let out = c
        .with_lock("scoped", TTL, |_| async { Err::<(), _>("boom") })
        .await
        .unwrap();
    assert_eq!(out, Err("boom"));
    gone_everywhere(&m, "scoped").await;

    // Contended: the work does not run.
    let holder = other.try_lock("scoped", TTL).await.unwrap();
    let ran = AtomicBool::new(false);
    let err = c
        .scope("scoped", TTL)
        .retry(Retry::never())
        .run(|_| async { ran.store(true, Ordering::SeqCst) })
        .await
        .unwrap_err();
    assert!(err.is_contended(), "{err:?}");
    assert!(!ran.load(Ordering::SeqCst));
    holder.release().await.unwrap();

    // On cancellation: the future is dropped mid-work; the release runs in the background,
    // long before the 10 s ttl.
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let cancelled = tokio::time::timeout(Duration::from_millis(300), async {
        c.with_lock("scoped", TTL, |_| async move {
            started_tx.send(()).unwrap();
            std::future::pending::<()>().await
        })
        .await
    })
    .await;
    assert!(cancelled.is_err(), "the work never ends by itself");
    started_rx.await.expect("the work had started");
    eventually(
        "the cancelled lock is released",
        Duration::from_secs(3),
        || m.absent_everywhere("scoped"),
    )
    .await;

    // On cancellation by `select!`.
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    tokio::select! {
        _ = c.with_lock("scoped", TTL, |_| async move {
            started_tx.send(()).unwrap();
            std::future::pending::<()>().await
        }) => unreachable!(),
        _ = started_rx => {}
    }
    eventually(
        "the lock dropped by select! is released",
        Duration::from_secs(3),
        || m.absent_everywhere("scoped"),
    )
    .await;

    // On a panic in the work.
    let c2 = c.clone();
    let panicked = tokio::spawn(async move {
        c2.with_lock("scoped", TTL, |_| async { panic!("work panicked") })
            .await
    })
    .await;
    assert!(panicked.unwrap_err().is_panic());
    eventually(
        "the lock of the panicked work is released",
        Duration::from_secs(3),
        || m.absent_everywhere("scoped"),
    )
    .await;

    other
        .try_lock("scoped", TTL)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    // A release returns at a quorum; the last master's finishes in the background.
    all_empty(&m).await;
}

// --- bad input ---------------------------------------------------------------------------------

#[tokio::test]
async fn bad_input_is_rejected_and_locks_nothing() {
    let m = Masters::start(1);
    let c = m.client();
    let invalid = |r: Result<Redlock, tower_redlock::Error>| {
        let e = r.unwrap_err();
        assert!(e.is_invalid_input(), "{e:?}");
        assert!(!e.to_string().is_empty());
    };

    for (resource, ttl) in [
        ("", TTL),
        ("x", Duration::ZERO),
        ("x", Duration::from_millis(1)),
        ("x", Duration::from_millis(2)),
    ] {
        let e = c.try_lock(resource, ttl).await.unwrap_err();
        assert!(e.is_invalid_input(), "{resource:?} {ttl:?}: {e:?}");
        assert!(!e.is_contended() && !e.is_unavailable());
        let e = c.lock(resource, ttl).await.unwrap_err();
        assert!(e.is_invalid_input(), "{e:?}");
        assert_eq!(e.attempts(), 0, "nothing was tried");
    }
    let long = "x".repeat(tower_redlock::MAX_RESOURCE_LEN + 1);
    assert!(c.try_lock(&long, TTL).await.unwrap_err().is_invalid_input());
    let ran = AtomicBool::new(false);
    let e = c
        .with_lock("", TTL, |_| async { ran.store(true, Ordering::SeqCst) })
        .await
        .unwrap_err();
    assert!(e.is_invalid_input());
    assert!(!ran.load(Ordering::SeqCst));

    // A bad ttl for an extension leaves the lease as it was.
    let lease = c.try_lock("x", TTL).await.unwrap();
    assert!(lease
        .extend(Duration::from_millis(1))
        .await
        .unwrap_err()
        .is_invalid_input());
    assert!(lease.is_valid());
    assert_eq!(lease.extensions(), 0);
    lease.release().await.unwrap();

    // Bad configurations.
    invalid(Redlock::builder().build());
    invalid(Redlock::new(Vec::<String>::new()));
    invalid(m.builder().node_timeout(Duration::ZERO).build());
    invalid(m.builder().drift_factor(1.0).build());
    invalid(m.builder().drift_factor(f64::NAN).build());
    invalid(Redlock::new(["not a url"]));
    invalid(Redlock::new(["redis://127.0.0.1:notaport"]));
    invalid(Redlock::new(["http://127.0.0.1:6379"]));
    invalid(Redlock::new([m[0].url(), "::::".to_owned()]));
    let e = Redlock::new(["redis://user:hunter2@127.0.0.1:notaport"]).unwrap_err();
    assert!(
        !e.to_string().contains("hunter2"),
        "the password leaked: {e}"
    );

    assert_eq!(m.dbsizes().await, [0]);
}

// --- concurrency -------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_tasks_never_overlap() {
    const TASKS: usize = 16;
    const ROUNDS: usize = 4;
    let m = Masters::start(3);
    let clients: Vec<Redlock> = (0..4)
        .map(|_| {
            m.builder()
                .retry(
                    Retry::until(Duration::from_secs(30))
                        .delay(Duration::from_millis(2))
                        .jitter(Duration::from_millis(10)),
                )
                .build()
                .unwrap()
        })
        .collect();
    for c in &clients {
        warm_up(c, &m).await;
    }
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));

    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let client = clients[t % clients.len()].clone();
            let (inside, most, done) = (inside.clone(), most.clone(), done.clone());
            tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let lease = client.lock("hot", Duration::from_secs(2)).await.unwrap();
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    assert!(lease.is_valid());
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    lease.release().await.unwrap();
                    done.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    tokio::time::timeout(Duration::from_secs(60), async {
        for t in tasks {
            t.await.unwrap();
        }
    })
    .await
    .expect("the contention run finishes");

    assert_eq!(most.load(Ordering::SeqCst), 1, "two holders at once");
    assert_eq!(done.load(Ordering::SeqCst), TASKS * ROUNDS);
    // Failed tries release the masters that had not answered in the background: give those
    // releases a moment, then nothing may be left.
    eventually("no master holds a key", Duration::from_secs(2), || async {
        m.dbsizes().await == [0, 0, 0]
    })
    .await;
}
