//! Handlers that use the adapter's steps in ways its docs allow but that could mislead the
//! middleware (tokio-postgres; the rules are the core's, shared by every adapter): a commit
//! after an error past its check, a busy error after the commit, an insert outside a
//! transaction, work whose insert was busy. Each is answered so that the key runs once.

use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use tower_redlock::durable::{KeyRow, RowError};
use tower_redlock::RedlockLayer;
use tower_redlock_testkit as support;

use super::app;
use super::work::{Driver, DriverKind};
use super::{flush_and_restart, pay};
use support::Masters;

const PAYMENT: &str = "INSERT INTO payments (key_hash, body) VALUES ($1, $2)";

async fn handler(
    State(driver): State<Driver>,
    row: KeyRow,
    headers: HeaderMap,
    body: String,
) -> Response {
    let mode = headers
        .get("x-mode")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("ok")
        .to_owned();
    let Driver::TokioPostgres(clients) = &driver else {
        unreachable!()
    };
    let pg = row.postgres();
    let mut client = clients.get().await.unwrap();
    let key_hash = row.key_hash();
    match mode.as_str() {
        "ok" => {
            let tx = client.transaction().await.unwrap();
            if let Err(e) = pg.insert_in(&tx).await {
                return e.into_response();
            }
            tx.execute(PAYMENT, &[&key_hash, &body]).await.unwrap();
            match pg.commit(tx).await {
                Ok(()) => (StatusCode::CREATED, "payment").into_response(),
                Err(e) => e.into_response(),
            }
        }
        // The documented two halves on a client that ran BEGIN; an optional step between the
        // check and the commit meets a lock timeout (classified by the row, then ignored).
        "two-halves" => {
            client.batch_execute("BEGIN").await.unwrap();
            pg.insert_in(&*client).await.unwrap();
            client.execute(PAYMENT, &[&key_hash, &body]).await.unwrap();
            pg.before_commit(&*client).await.unwrap();
            client
                .batch_execute("SET LOCAL lock_timeout = '100ms'")
                .await
                .unwrap();
            let e = client
                .execute("SELECT pg_advisory_xact_lock(9)", &[])
                .await
                .unwrap_err();
            let _ = pg.check(e);
            // The COMMIT of an aborted transaction: a rollback, answered without an error.
            match pg.committed(client.batch_execute("COMMIT").await) {
                Ok(()) => (StatusCode::CREATED, "payment").into_response(),
                Err(e) => e.into_response(),
            }
        }
        // insert_in on a Client in autocommit, then the work fails.
        "autocommit" => {
            if let Err(e) = pg.insert_in(&*client).await {
                return e.into_response();
            }
            (StatusCode::INTERNAL_SERVER_ERROR, "").into_response()
        }
        // The documented commit, then a statement of another transaction whose lock timeout
        // the handler classifies with row.check (as the docs' `map_err(|e| row.check(e))`).
        "post-commit-busy" => {
            let tx = client.transaction().await.unwrap();
            pg.insert_in(&tx).await.unwrap();
            tx.execute(PAYMENT, &[&key_hash, &body]).await.unwrap();
            pg.commit(tx).await.unwrap();
            let tx = client.transaction().await.unwrap();
            tx.batch_execute("SET LOCAL lock_timeout = '100ms'")
                .await
                .unwrap();
            if let Err(e) = tx.execute("SELECT pg_advisory_xact_lock(9)", &[]).await {
                let _ = pg.check(e);
            }
            drop(tx);
            (StatusCode::CREATED, "payment").into_response()
        }
        // The insert in a savepoint; its lock timeout recovered; then row.commit.
        "busy-insert-savepoint" => {
            let tx = client.transaction().await.unwrap();
            tx.batch_execute("SAVEPOINT ins").await.unwrap();
            match pg.insert_in(&tx).await {
                Err(e) if e.is_busy() => {
                    tx.batch_execute("ROLLBACK TO SAVEPOINT ins").await.unwrap()
                }
                other => other.unwrap(),
            }
            tx.execute(PAYMENT, &[&key_hash, &body]).await.unwrap();
            match pg.commit(tx).await {
                Ok(()) => (StatusCode::CREATED, "payment").into_response(),
                Err(e) => e.into_response(),
            }
        }
        // The driver-neutral steps (`KeyRow::statements`), as an adapter of another driver
        // runs them: errors without their SQLSTATE, as diesel reports them.
        "statements" => {
            let s = row.statements();
            let tx = client.transaction().await.unwrap();
            let err = |e: tokio_postgres::Error| s.error(RowError::database(e, None));
            let (key, fingerprint, run_id) = (s.key_hash(), s.fingerprint(), s.run_id());
            let (retention, lock_timeout) = (s.retention_ms(), s.lock_timeout());
            let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] =
                [&key, &fingerprint, &retention, &lock_timeout, &run_id];
            let insert = tx.execute(s.insert_sql(), &params);
            if let Err(e) = insert.await.map_err(err).and_then(|n| s.inserted(n)) {
                return e.into_response();
            }
            tx.execute(PAYMENT, &[&key_hash, &body]).await.unwrap();
            let check = match s.before_commit() {
                Ok(Some(sql)) => tx.execute(sql, &[&key, &run_id]).await,
                Ok(None) => Ok(1),
                Err(e) => return e.into_response(),
            };
            if let Err(e) = check.map_err(err).and_then(|n| s.checked(n)) {
                return e.into_response();
            }
            match tx.commit().await.map_err(err).and_then(|()| s.committed()) {
                Ok(()) => (StatusCode::CREATED, "payment").into_response(),
                Err(e) => e.into_response(),
            }
        }
        other => panic!("mode {other}"),
    }
}

struct Setup {
    masters: Masters,
    db: app::Db,
    _app: support::HttpApp,
    url: String,
    lock_key: String,
}

async fn setup(pg: &app::Server, lock_timeout: Duration) -> Setup {
    use tower_redlock::key::SimpleRequest;
    let (masters, db) = (Masters::start(3), app::Db::create(pg).await);
    let kind = DriverKind::TokioPostgres;
    let policy = app::policy(kind, masters.client(), &db.url, lock_timeout);
    let req = SimpleRequest::new("POST", "/payments")
        .route("/payments")
        .header("idempotency-key", "\"k-1\"");
    let lock_key = policy
        .resource(&req)
        .unwrap()
        .expect("a key")
        .as_str()
        .to_owned();
    let router = Router::new()
        .route("/payments", post(handler))
        .layer(RedlockLayer::new(policy))
        .with_state(Driver::lazy(kind, &db.url));
    let app = support::HttpApp::serve(router).await;
    let url = format!("http://{}/payments", app.addr());
    Setup {
        masters,
        db,
        _app: app,
        url,
        lock_key,
    }
}

async fn hold_advisory_9(db: &app::Db) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut holder = db.pool.begin().await.unwrap();
    sqlx::query("SELECT pg_advisory_xact_lock(9)")
        .execute(&mut *holder)
        .await
        .unwrap();
    holder
}

/// The two halves of a commit (`before_commit`, the commit, `committed`) with a statement
/// between the check and the commit whose error aborts the transaction (its COMMIT is then a
/// silent rollback): `committed` refuses to tell the middleware the work committed, so the
/// key is answered `409` + `Retry-After` — never a success replayed for a payment that does
/// not exist — and its retry runs once.
#[tokio::test]
async fn durable_a_commit_after_an_error_past_the_check_is_not_trusted() {
    let pg = app::server().await;
    let s = setup(&pg, Duration::from_secs(5)).await;
    let holder = hold_advisory_9(&s.db).await;
    let first = pay(&s.url, "k-1", "10 EUR", "two-halves").await;
    holder.rollback().await.unwrap();
    assert_eq!(first.status, 409, "{}", first.text());
    assert!(first.retry_after() >= 1);
    assert_eq!(s.db.payments().await, 0, "the COMMIT was a rollback");
    assert_eq!(s.db.key_rows().await, (0, 0));
    let retry = pay(&s.url, "k-1", "10 EUR", "ok").await;
    assert_eq!(retry.status, 201, "{}", retry.text());
    assert_eq!(s.db.payments().await, 1);
}

/// A statement of another transaction after `row.commit`, whose lock timeout the handler
/// classifies with `row.check` (as the docs' `map_err(|e| row.check(e))` does everywhere):
/// the committed work keeps its answer — `201`, stored and replayed, never `409`.
#[tokio::test]
async fn durable_a_busy_error_after_the_commit_keeps_the_answer() {
    let pg = app::server().await;
    let s = setup(&pg, Duration::from_secs(5)).await;
    let holder = hold_advisory_9(&s.db).await;
    let first = pay(&s.url, "k-1", "10 EUR", "post-commit-busy").await;
    holder.rollback().await.unwrap();
    assert_eq!(first.status, 201, "{}", first.text());
    assert_eq!(s.db.key_rows().await, (1, 1), "stored in the row");
    flush_and_restart(&s.masters);
    let retry = pay(&s.url, "k-1", "10 EUR", "ok").await;
    assert_eq!(retry.status, 201, "{}", retry.text());
    assert_eq!(retry.header("idempotency-replayed"), Some("true"));
    assert_eq!(s.db.payments().await, 1);
}

/// `insert_in` on a client in autocommit (no `BEGIN`, not a `Transaction`) refuses: the row
/// would commit at once, before and without the work. Nothing is recorded, the handler's
/// `500` leaves the key free, and the retry runs.
#[tokio::test]
async fn durable_an_insert_outside_a_transaction_is_refused() {
    let pg = app::server().await;
    let s = setup(&pg, Duration::from_secs(5)).await;
    let first = pay(&s.url, "k-1", "10 EUR", "autocommit").await;
    assert_eq!(first.status, 500, "{}", first.text());
    assert_eq!(s.db.key_rows().await, (0, 0), "no row without the work");
    let retry = pay(&s.url, "k-1", "10 EUR", "ok").await;
    assert_eq!(retry.status, 201, "{}", retry.text());
    assert_eq!(s.db.payments().await, 1);
}

/// The insert's lock timeout (another execution's row, uncommitted) recovered in a
/// savepoint, then `row.commit`: the commit is refused — the work has no row, and the
/// middleware answers `409` + `Retry-After` — so the retry is the key's one run.
#[tokio::test]
async fn durable_work_whose_insert_was_busy_never_commits() {
    use sha2::{Digest, Sha256};
    let pg = app::server().await;
    let s = setup(&pg, Duration::from_millis(300)).await;
    // Another execution's uncommitted row for the key (a duplicate whose lease was lost).
    let key_hash = Sha256::digest(s.lock_key.as_bytes()).to_vec();
    let mut other = s.db.pool.begin().await.unwrap();
    sqlx::query(
        "INSERT INTO tower_redlock_keys (key_hash, fingerprint, run_id, expires_at) \
                 VALUES ($1, '\\x00', '\\x00', now() + interval '1 hour')",
    )
    .bind(&key_hash)
    .execute(&mut *other)
    .await
    .unwrap();
    let first = pay(&s.url, "k-1", "10 EUR", "busy-insert-savepoint").await;
    assert_eq!(first.status, 409, "{}", first.text());
    assert!(first.retry_after() >= 1);
    assert_eq!(s.db.payments().await, 0, "the commit was refused");
    other.rollback().await.unwrap(); // that execution failed (a 5xx)
    let retry = pay(&s.url, "k-1", "10 EUR", "ok").await;
    assert_eq!(retry.status, 201, "{}", retry.text());
    assert_eq!(s.db.payments().await, 1, "the key's work ran once");
}

/// What the autocommit guard relies on: a savepoint is refused outside a transaction block
/// (SQLSTATE `25P01`), and accepted in a `Transaction` or after `BEGIN`.
#[tokio::test]
async fn durable_a_savepoint_tells_a_transaction_from_autocommit() {
    let pg = app::server().await;
    let db = app::Db::create(&pg).await;
    let (mut client, conn) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let guard = "SAVEPOINT tower_redlock_row; RELEASE SAVEPOINT tower_redlock_row";
    let auto = client.batch_execute(guard).await.unwrap_err();
    assert_eq!(auto.code().map(|c| c.code()), Some("25P01"));
    let tx = client.transaction().await.unwrap();
    tx.batch_execute(guard).await.expect("in a Transaction");
    tx.rollback().await.unwrap();
    client.batch_execute("BEGIN").await.unwrap();
    client.batch_execute(guard).await.expect("after BEGIN");
    client.batch_execute("ROLLBACK").await.unwrap();
}

/// A driver without an adapter, through `KeyRow::statements` (errors without SQLSTATEs, as
/// diesel gives them): the row commits with the work, the response is stored in it, and a
/// retry after every voter was flushed is replayed from it.
#[tokio::test]
async fn durable_another_driver_through_the_statements_is_replayed_from_the_row() {
    let pg = app::server().await;
    let s = setup(&pg, Duration::from_secs(5)).await;
    let first = pay(&s.url, "k-1", "10 EUR", "statements").await;
    assert_eq!(first.status, 201, "{}", first.text());
    assert_eq!(s.db.key_rows().await, (1, 1));
    flush_and_restart(&s.masters);
    let retry = pay(&s.url, "k-1", "10 EUR", "statements").await;
    assert_eq!(retry.status, 201, "{}", retry.text());
    assert_eq!(retry.header("idempotency-replayed"), Some("true"));
    assert_eq!(s.db.payments().await, 1);
}

/// A handler that takes `KeyRow` on a route whose policy has no durable replay (a wiring
/// mistake) is answered `500` on axum and on actix-web, and never runs without the row.
#[tokio::test]
async fn durable_a_key_row_without_durable_replay_is_a_500_and_nothing_runs() {
    use super::web::{Served, Variant, Web};
    use tower_redlock::policy::LockPolicy;

    let pg = app::server().await;
    for web in [Web::Axum, Web::Actix] {
        let (masters, db) = (Masters::start(3), app::Db::create(&pg).await);
        let policy = LockPolicy::idempotent(masters.client()).build().unwrap();
        let (hooks, _reached) = app::Hooks::new();
        let variant = Variant::new(web, DriverKind::Sqlx);
        let served = Served::start(variant, &db.url, policy, hooks).await;
        let url = format!("http://{}/payments", served.addr());
        let reply = pay(&url, "k-1", "10 EUR", "ok").await;
        assert_eq!(reply.status, 500, "{web:?}: {}", reply.text());
        assert_eq!(db.payments().await, 0, "{web:?}: the handler ran");
    }
}
