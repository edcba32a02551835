//! Auto-extension: a kept-alive lease holds past its ttl (also scoped); a loss is signalled
//! within one keep-alive period; `abort_on_loss` stops the work.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::gone_everywhere;
use crate::support::{warm_up, Masters};

/// A kept-alive lease (extended every third of its ttl) holds for three ttls and more, and
/// so does the scoped form.
///
/// The ttl is 1 s: a keep-alive round may be late by up to two thirds of it (667 ms) on a
/// loaded machine before the keys expire; with 300 ms, 200 ms of lateness broke it. Still
/// valid after three ttls needs at least three extensions (each gives at most one ttl from
/// when it was sent, and the lease never lapsed between them): that count is derived, not
/// a measurement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_holds_past_the_ttl() {
    let m = Masters::start(3);
    let a = m.client();
    let b = m.client();
    warm_up(&a, &m).await;
    let ttl = Duration::from_secs(1);

    let mut lease = a.lock("kept", ttl).await.unwrap();
    lease.keep_alive();
    lease.keep_alive(); // a second call does nothing
    let value = lease.value().to_owned();
    let start = Instant::now();
    while start.elapsed() < ttl * 3 {
        // The pace of a watcher, not a synchronization.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let err = b.try_lock("kept", ttl).await.unwrap_err();
        assert!(err.is_contended(), "at {:?}: {err:?}", start.elapsed());
        let (values, pttls) = (m.values("kept").await, m.pttls("kept").await);
        let alive = (0..3)
            .filter(|&i| values[i].as_deref() == Some(value.as_str()) && pttls[i] > 0)
            .count();
        assert!(alive >= 2, "at {:?}: {values:?} {pttls:?}", start.elapsed());
        assert!(lease.is_valid(), "at {:?}", start.elapsed());
    }
    assert!(
        lease.extension_count() >= 3,
        "{} extensions",
        lease.extension_count()
    );
    lease.release().await.unwrap();
    gone_everywhere(&m, "kept").await;

    // The scoped form.
    let out = a
        .critical_section("kept-scope", ttl)
        .keep_alive()
        .run(|handle| async move {
            let start = Instant::now();
            while start.elapsed() < ttl * 3 {
                tokio::time::sleep(Duration::from_millis(50)).await;
                assert!(b
                    .try_lock("kept-scope", ttl)
                    .await
                    .unwrap_err()
                    .is_contended());
                assert!(!handle.is_lost());
            }
            handle.extension_count()
        })
        .await
        .unwrap();
    assert!(out >= 3, "{out} extensions");
    gone_everywhere(&m, "kept-scope").await;
}

/// Deleting the keys under a kept-alive lease: the next extension finds it lost and says so,
/// before the lease's own validity would have run out.
///
/// That is the bound asserted: the loss is dated when an extension found it (`lost_at`),
/// strictly before the lease's deadline — a keep-alive that never looked would only see its
/// validity run out, dated at the deadline. No wall-clock margin: an extension comes every
/// 500 ms, the deadline is at least 1 s after the deletion, so the keep-alive may be late by
/// 500 ms on a loaded machine. (The 10 s around the wait only guards against a hang.)
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
    tokio::time::timeout(Duration::from_secs(10), handle.lost())
        .await
        .expect("the loss is signalled");
    assert!(handle.is_lost());
    assert_eq!(handle.validity(), Duration::ZERO);
    assert!(!lease.is_valid());
    let lost_at = handle.lost_at().expect("lost, not released");
    assert!(
        lost_at < handle.deadline(),
        "the loss was not found by an extension: the validity ran out ({:?} late)",
        lost_at.saturating_duration_since(handle.deadline())
    );
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

/// `abort_on_loss`: the keys deleted under the running work, the next extension finds the
/// lease lost — before its validity ran out (`lost_at` before the deadline, as in
/// `loss_is_signalled`, not a wall-clock margin) — and the work is stopped: `run` returns the
/// loss long before the work's 10 s would end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_on_loss_stops_the_work() {
    let m = Masters::start(3);
    let c = m.client();
    warm_up(&c, &m).await;
    let finished = Arc::new(AtomicBool::new(false));
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();

    let work_finished = finished.clone();
    let run = c
        .critical_section("aborted", Duration::from_millis(1500))
        .keep_alive()
        .abort_on_loss()
        .run(move |handle| async move {
            started_tx.send(handle.clone()).unwrap();
            tokio::time::sleep(Duration::from_secs(10)).await;
            work_finished.store(true, Ordering::SeqCst);
        });
    let saboteur = async {
        let handle = started_rx.await.unwrap();
        assert_eq!(handle.resource(), "aborted");
        m.del_on("aborted", &[0, 1, 2]).await;
        handle
    };
    let (out, handle) = tokio::time::timeout(Duration::from_secs(5), async {
        tokio::join!(run, saboteur)
    })
    .await
    .expect("run returns once the lock is lost");
    let err = out.unwrap_err();
    assert!(err.is_lost(), "{err:?}");
    let lost_at = handle.lost_at().expect("lost, not released");
    assert!(
        lost_at < handle.deadline(),
        "the loss was not found by an extension: the validity ran out"
    );
    assert!(!finished.load(Ordering::SeqCst), "the work was not stopped");
    gone_everywhere(&m, "aborted").await;
}
