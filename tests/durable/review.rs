//! Review of issue 46 (reproductions, not for merge): handlers that use the tokio-postgres
//! adapter in ways its docs allow, and what the middleware then answers.

use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::Router;
use tower_redlock::durable::KeyRow;
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

/// F1: `committed` marks the work committed without a check that covers the commit: a
/// success is replayed for a payment that never committed.
#[tokio::test]
async fn review_two_halves_committed_after_a_silent_rollback() {
    let pg = app::server().await;
    let s = setup(&pg, Duration::from_secs(5)).await;
    let holder = hold_advisory_9(&s.db).await;
    let first = pay(&s.url, "k-1", "10 EUR", "two-halves").await;
    holder.rollback().await.unwrap();
    eprintln!("first: {} {}", first.status, first.text());
    eprintln!(
        "payments {}, key rows {:?}",
        s.db.payments().await,
        s.db.key_rows().await
    );
    flush_and_restart(&s.masters);
    let retry = pay(&s.url, "k-1", "10 EUR", "ok").await;
    eprintln!(
        "retry: {} {} replayed={:?}",
        retry.status,
        retry.text(),
        retry.header("idempotency-replayed")
    );
    eprintln!("payments {}", s.db.payments().await);
    assert_eq!(
        s.db.payments().await,
        1,
        "BUG? the key's success is replayed, no payment exists"
    );
}

/// F2: a busy error observed after the commit turns a committed request into `409`, and the
/// key answers 409 (then completed-not-stored) ever after.
#[tokio::test]
async fn review_busy_after_commit() {
    let pg = app::server().await;
    let s = setup(&pg, Duration::from_secs(5)).await;
    let holder = hold_advisory_9(&s.db).await;
    let first = pay(&s.url, "k-1", "10 EUR", "post-commit-busy").await;
    holder.rollback().await.unwrap();
    eprintln!("first: {} {}", first.status, first.text());
    eprintln!(
        "payments {}, key rows {:?}",
        s.db.payments().await,
        s.db.key_rows().await
    );
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let retry = pay(&s.url, "k-1", "10 EUR", "ok").await;
    eprintln!("retry: {} {}", retry.status, retry.text());
    assert_eq!(
        first.status, 201,
        "BUG: the committed payment was answered {}",
        first.status
    );
}

/// F3: insert_in on a Client in autocommit commits the row before, and without, the work.
#[tokio::test]
async fn review_autocommit_insert_burns_the_key() {
    let pg = app::server().await;
    let s = setup(&pg, Duration::from_secs(5)).await;
    let first = pay(&s.url, "k-1", "10 EUR", "autocommit").await;
    eprintln!(
        "first: {}; payments {}, key rows {:?}",
        first.status,
        s.db.payments().await,
        s.db.key_rows().await
    );
    tokio::time::sleep(Duration::from_millis(3500)).await;
    let retry = pay(&s.url, "k-1", "10 EUR", "ok").await;
    eprintln!("retry: {} {}", retry.status, retry.text());
    assert_eq!(
        retry.status, 201,
        "BUG: a key whose work never ran is answered {}",
        retry.status
    );
}

/// F4: the insert's lock timeout recovered in a savepoint: row.commit commits the work
/// without its row, the middleware answers 409, the retry runs the work again.
#[tokio::test]
async fn review_busy_insert_recovered_commits_without_the_row() {
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
    eprintln!(
        "first: {} {}; payments {}",
        first.status,
        first.text(),
        s.db.payments().await
    );
    other.rollback().await.unwrap(); // that execution failed (a 5xx)
    let retry = pay(&s.url, "k-1", "10 EUR", "ok").await;
    eprintln!(
        "retry: {} {}; payments {}",
        retry.status,
        retry.text(),
        s.db.payments().await
    );
    assert!(s.db.payments().await <= 1, "BUG: the key's work ran twice");
}

/// Probe: a savepoint tells a transaction block from autocommit.
#[tokio::test]
async fn review_probe_autocommit_savepoint() {
    let pg = app::server().await;
    let db = app::Db::create(&pg).await;
    let (mut client, conn) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    let guard = "SAVEPOINT tower_redlock_row; RELEASE SAVEPOINT tower_redlock_row";
    let auto = client.batch_execute(guard).await;
    eprintln!(
        "autocommit: {:?}",
        auto.as_ref()
            .map_err(|e| e.code().map(|c| c.code().to_owned()))
    );
    let auto1 = client.execute("SAVEPOINT tower_redlock_row", &[]).await;
    eprintln!(
        "autocommit, extended: {:?}",
        auto1
            .as_ref()
            .map_err(|e| e.code().map(|c| c.code().to_owned()))
    );
    let tx = client.transaction().await.unwrap();
    eprintln!(
        "in a transaction: {:?}",
        tx.batch_execute(guard).await.is_ok()
    );
    tx.rollback().await.unwrap();
    client.batch_execute("BEGIN").await.unwrap();
    eprintln!(
        "after BEGIN: {:?}",
        client.batch_execute(guard).await.is_ok()
    );
    client.batch_execute("ROLLBACK").await.unwrap();
}
