//! Scoped locks: `with_lock` and `critical_section(..).run` release on success, on an error value, on
//! cancellation (dropped, `select!`) and on a panic; contended, the work does not run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tower_redlock::Retry;

use crate::support::{eventually, is_token, warm_up, Masters};
use crate::{all_empty, gone_everywhere, TTL};

#[tokio::test]
async fn with_lock_always_releases() {
    let m = Masters::start(3);
    let c = m.client();
    let other = m.client();
    warm_up(&c, &m).await;

    // On success.
    let seen = c
        .critical_section("scoped", TTL)
        .run(|handle| {
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
        .critical_section("scoped", TTL)
        .run(|_| async { Err::<(), _>("boom") })
        .await
        .unwrap();
    assert_eq!(out, Err("boom"));
    gone_everywhere(&m, "scoped").await;

    // Contended: the work does not run.
    let holder = other.try_lock("scoped", TTL).await.unwrap();
    let ran = AtomicBool::new(false);
    let err = c
        .critical_section("scoped", TTL)
        .retry(Retry::never())
        .run(|_| async { ran.store(true, Ordering::SeqCst) })
        .await
        .unwrap_err();
    assert!(err.is_contended(), "{err:?}");
    assert!(!ran.load(Ordering::SeqCst));
    holder.release().await.unwrap();

    // On cancellation: the task is aborted (its future dropped) once the work has started —
    // awaited, not guessed by a timeout; the release runs in the background, long before the
    // 10 s ttl.
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let c2 = c.clone();
    let running = tokio::spawn(async move {
        c2.critical_section("scoped", TTL)
            .run(|_| async move {
                started_tx.send(()).unwrap();
                std::future::pending::<()>().await
            })
            .await
    });
    started_rx.await.expect("the work had started");
    running.abort();
    let cancelled = running.await.unwrap_err();
    assert!(cancelled.is_cancelled(), "the work never ends by itself");
    eventually(
        "the cancelled lock is released",
        Duration::from_secs(3),
        || m.absent_everywhere("scoped"),
    )
    .await;

    // On cancellation by `select!`.
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    tokio::select! {
        _ = c.critical_section("scoped", TTL).run(|_| async move {
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
        c2.critical_section("scoped", TTL)
            .run(|_| async { panic!("work panicked") })
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
