//! Auto-extension: a kept-alive lease holds past its ttl (also scoped); a loss is signalled
//! within one keep-alive period; `abort_on_loss` stops the work.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::gone_everywhere;
use crate::support::{warm_up, Masters};

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
            while start.elapsed() < Duration::from_millis(1000) {
                assert!(b
                    .try_lock("kept-scope", ttl)
                    .await
                    .unwrap_err()
                    .is_contended());
                assert!(!handle.is_lost());
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            handle.extension_count()
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
        .critical_section("aborted", Duration::from_millis(1500))
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
