//! Races inside the database: a duplicate that runs because the first's lease was lost (here:
//! every voter flushed while the first holds its transaction open) meets the first's
//! uncommitted row and waits; and the errors that mean "try later" are `409` +
//! `Retry-After`, never a `500` nor a second commit.

use std::time::Duration;

use super::web::{each, Replica};
use super::{app, flush_and_restart, pay, spawn_pay};
use tower_redlock_testkit as support;

use support::Masters;

/// Waits until `n` backends wait on a lock (a row's insert, an advisory lock).
pub async fn until_waiting(db: &app::Db, n: i64) {
    let sql = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
               AND datname = current_database()";
    support::http::within(format!("{n} backends waiting on a lock"), async {
        loop {
            let waiting: i64 = sqlx::query_scalar(sql).fetch_one(&db.pool).await.unwrap();
            if waiting >= n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// Retries `key` until it is not `409` (a ttl, a store in flight) nor `503`, within the
/// deadline.
async fn settled(url: &str, key: &str, body: &str) -> support::http::Reply {
    support::http::within("an answer other than 409", async {
        loop {
            let reply = pay(url, key, body, "ok").await;
            // 503: a lookup slower than its bound on a busy machine; both say when to retry.
            if reply.status != 409 && reply.status != 503 {
                return reply;
            }
            let _ = reply.retry_after();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
}

/// The first request holds its transaction open; every voter is flushed (its lease is
/// gone), so a duplicate takes the lock and runs. Its insert waits on the first's row; when
/// the first commits, the duplicate's insert finds the row and it answers from it (the
/// stored response, or `409` + `Retry-After` while the first stores it). Its handler ignores
/// that and goes on; `row.commit` refuses: exactly one payment exists.
#[tokio::test]
async fn durable_a_duplicate_after_a_lost_lease_waits_on_the_row_and_replays() {
    each(|v, pg| async move {
        let (masters, db) = (Masters::start(3), app::Db::create(&pg).await);
        let mut replica = Replica::start(v, &masters, &db, Duration::from_secs(30)).await;
        let url = replica.url();
        let first = spawn_pay(&url, "k-1", "10 EUR", "hold");
        replica.reached("hold").await;
        flush_and_restart(&masters);
        // A handler that ignores its insert's answer: `row.commit` refuses its transaction.
        let duplicate = spawn_pay(&url, "k-1", "10 EUR", "stubborn");
        until_waiting(&db, 1).await;
        replica.hooks.go.add_permits(1);
        let first = first.await.unwrap();
        assert_eq!(first.status, 201, "{}", first.text());
        let duplicate = duplicate.await.unwrap();
        match duplicate.status {
            409 => assert!(duplicate.retry_after() >= 1),
            _ => super::assert_replayed(&duplicate, &first),
        }
        let retry = settled(&url, "k-1", "10 EUR").await;
        super::assert_replayed(&retry, &first);
        assert_eq!(
            db.payments().await,
            1,
            "the duplicate's work never committed"
        );
    })
    .await;
}

/// SQLSTATE `55P03`: a duplicate whose wait on the first's row passes the `lock_timeout` is
/// `409` + `Retry-After`; nothing of it commits, and the key completes once.
#[tokio::test]
async fn durable_a_lock_timeout_is_409_with_retry_after() {
    each(|v, pg| async move {
        let (masters, db) = (Masters::start(3), app::Db::create(&pg).await);
        let mut replica = Replica::start(v, &masters, &db, Duration::from_millis(300)).await;
        let url = replica.url();
        let first = spawn_pay(&url, "k-1", "10 EUR", "hold");
        replica.reached("hold").await;
        flush_and_restart(&masters);
        let duplicate = pay(&url, "k-1", "10 EUR", "ok").await;
        assert_eq!(duplicate.status, 409, "{}", duplicate.text());
        assert!(duplicate.retry_after() >= 1);
        replica.reached("sqlstate 55P03").await;
        replica.hooks.go.add_permits(1);
        let first = first.await.unwrap();
        assert_eq!(first.status, 201, "{}", first.text());
        super::assert_replayed(&settled(&url, "k-1", "10 EUR").await, &first);
        assert_eq!(db.payments().await, 1);
    })
    .await;
}

/// SQLSTATE `40001`: a duplicate in a repeatable-read transaction that waited on the first's
/// row fails to serialize when the first commits: `409` + `Retry-After`, never a `500`.
#[tokio::test]
async fn durable_a_serialization_failure_is_409_with_retry_after() {
    each(|v, pg| async move {
        let (masters, db) = (Masters::start(3), app::Db::create(&pg).await);
        let mut replica = Replica::start(v, &masters, &db, Duration::from_secs(30)).await;
        let url = replica.url();
        let first = spawn_pay(&url, "k-1", "10 EUR", "hold");
        replica.reached("hold").await;
        flush_and_restart(&masters);
        let duplicate = spawn_pay(&url, "k-1", "10 EUR", "repeatable");
        until_waiting(&db, 1).await;
        replica.hooks.go.add_permits(1);
        let first = first.await.unwrap();
        assert_eq!(first.status, 201, "{}", first.text());
        let duplicate = duplicate.await.unwrap();
        assert_eq!(duplicate.status, 409, "{}", duplicate.text());
        assert!(duplicate.retry_after() >= 1);
        replica.reached("sqlstate 40001").await;
        assert_eq!(db.payments().await, 1);
    })
    .await;
}

/// SQLSTATE `40P01`: a handler in a deadlock (it holds advisory lock 1 and waits for 2,
/// which another transaction holds while it waits for 1) is `409` + `Retry-After`; its
/// transaction rolled back, so nothing of it is left, and the key's retry runs.
#[tokio::test]
async fn durable_a_deadlock_is_409_with_retry_after() {
    each(|v, pg| async move {
        let (masters, db) = (Masters::start(3), app::Db::create(&pg).await);
        let mut replica = Replica::start(v, &masters, &db, Duration::from_secs(30)).await;
        let mut other = db.pool.begin().await.unwrap();
        // The handler's backend, waiting first with the default 1 s, is the one that detects
        // the cycle, however late this one closes it.
        sqlx::query("SET LOCAL deadlock_timeout = '60s'")
            .execute(&mut *other)
            .await
            .unwrap();
        sqlx::query("SELECT pg_advisory_xact_lock(2)")
            .execute(&mut *other)
            .await
            .unwrap();
        let url = replica.url();
        let deadlocked = spawn_pay(&url, "k-1", "10 EUR", "deadlock");
        until_waiting(&db, 1).await;
        // Now close the cycle: the handler's backend, which waited first, detects it.
        sqlx::query("SELECT pg_advisory_xact_lock(1)")
            .execute(&mut *other)
            .await
            .expect("granted once the handler's transaction rolled back");
        other.commit().await.unwrap();
        let deadlocked = deadlocked.await.unwrap();
        assert_eq!(deadlocked.status, 409, "{}", deadlocked.text());
        assert!(deadlocked.retry_after() >= 1);
        replica.reached("sqlstate 40P01").await;
        assert_eq!(db.payments().await, 0);
        assert_eq!(db.key_rows().await, (0, 0));
        let ran = pay(&url, "k-1", "10 EUR", "ok").await;
        assert_eq!(ran.status, 201, "{}", ran.text());
    })
    .await;
}

/// The first request's lease is lost while it holds its transaction; a duplicate runs and
/// waits on the first's row; the first rolls back and answers `402`. Whichever of the first's
/// store and the duplicate's insert comes first, the key's row and its replay match the
/// database: the duplicate's `201` and its one payment, or the first's `402` and no payment —
/// never a `402` replayed for a payment that committed (the first's `402` never lands in the
/// duplicate's row).
#[tokio::test]
async fn durable_a_rolled_back_answer_never_lands_in_another_executions_row() {
    each(|v, pg| async move {
        let (masters, db) = (Masters::start(3), app::Db::create(&pg).await);
        let mut replica = Replica::start(v, &masters, &db, Duration::from_secs(30)).await;
        let url = replica.url();
        let first = spawn_pay(&url, "k-1", "10 EUR", "hold-then-402");
        replica.reached("hold").await;
        flush_and_restart(&masters);
        let duplicate = spawn_pay(&url, "k-1", "10 EUR", "ok");
        until_waiting(&db, 1).await;
        replica.hooks.go.add_permits(1);
        assert_eq!(first.await.unwrap().status, 402);
        let duplicate = duplicate.await.unwrap();
        flush_and_restart(&masters);
        let retry = settled(&url, "k-1", "10 EUR").await;
        assert_eq!(retry.header("idempotency-replayed"), Some("true"));
        match retry.status {
            201 => {
                assert_eq!(duplicate.status, 201, "{}", duplicate.text());
                assert_eq!(retry.body, duplicate.body);
                assert_eq!(db.payments().await, 1);
            }
            402 => assert_eq!(
                db.payments().await,
                0,
                "a 402 replayed for a committed payment"
            ),
            other => panic!("{other}: {}", retry.text()),
        }
        assert_eq!(db.key_rows().await, (1, 1));
    })
    .await;
}
