//! Durable replay ([`tower_redlock::durable`]) on axum, against a real PostgreSQL (a throwaway
//! cluster from the test kit) and three real `redis-server` masters. Every test name starts
//! with `durable_`; what each one shows is in its doc line. The work is `app.rs`'s handler:
//! the key's row first in its transaction, then a payment row, then commit.
//!
//! - [`crash`]: a replica process killed (`SIGKILL`) after its commit — before the Redis
//!   record, or even before the response reached the row;
//! - [`races`]: a duplicate that runs because the lease was lost waits on the row, and the
//!   three SQLSTATEs that mean "later" (`55P03`, `40001`, `40P01`) are `409` + `Retry-After`;
//! - below: the row survives the Redis voters, outcomes without a commit, `422`, a handler
//!   that never records the row, the sweep and the migration.

mod app;
mod crash;
mod grpc;
mod misuse;
mod parity;
mod races;
mod web;
mod work;

use std::time::Duration;

use tower_redlock::durable::sqlx_0_8::SqlxStore;
use tower_redlock::durable::tokio_postgres::PgStore;
use tower_redlock::durable::{FoundRow, RowStore, Table};
use tower_redlock_testkit as support;

use support::http::Reply;
use support::Masters;
use web::{each, Replica};
use work::DriverKind;

/// `POST url` with `key`, `body` and `x-mode: mode`, read to its end.
pub async fn pay(url: &str, key: &str, body: &str, mode: &str) -> Reply {
    let request = support::http::http_client()
        .post(url)
        .header("idempotency-key", format!("\"{key}\""))
        .header("x-mode", mode)
        .body(body.to_owned());
    support::http::reply(request).await
}

/// [`pay`], spawned: the request goes on while the test acts.
pub fn spawn_pay(url: &str, key: &str, body: &str, mode: &str) -> tokio::task::JoinHandle<Reply> {
    let (url, key, body, mode) = (
        url.to_owned(),
        key.to_owned(),
        body.to_owned(),
        mode.to_owned(),
    );
    tokio::spawn(async move { pay(&url, &key, &body, &mode).await })
}

/// Flushes every master and restarts it with an empty dataset.
pub fn flush_and_restart(masters: &Masters) {
    for master in masters.iter() {
        master.restart();
    }
}

/// Asserts a replay of `first`: the same status and body, marked replayed.
#[track_caller]
pub fn assert_replayed(reply: &Reply, first: &Reply) {
    assert_eq!(reply.status, first.status, "{}", reply.text());
    assert_eq!(reply.body, first.body);
    assert_eq!(reply.header("idempotency-replayed"), Some("true"));
}

/// A completed request's retry after every Redis voter lost its data (a flush and a restart
/// without persistence) is replayed from the row — the same payment — and the record is
/// back on the voters, so the next retry is replayed from Redis.
#[tokio::test]
async fn durable_replays_from_the_row_after_every_voter_was_flushed_and_restarted() {
    each(|v, pg| async move {
        let (masters, db) = (Masters::start(3), app::Db::create(&pg).await);
        let replica = Replica::start(v, &masters, &db, Duration::from_secs(5)).await;
        let first = pay(&replica.url(), "k-1", "10 EUR", "ok").await;
        assert_eq!(first.status, 201, "{}", first.text());
        assert_eq!(db.key_rows().await, (1, 1), "the row holds the response");

        flush_and_restart(&masters);
        assert_eq!(masters.dbsizes().await, vec![0, 0, 0]);
        let retry = pay(&replica.url(), "k-1", "10 EUR", "ok").await;
        assert_replayed(&retry, &first);
        assert_eq!(db.payments().await, 1, "the work ran once");
        assert!(
            masters.dbsizes().await.iter().all(|&n| n >= 1),
            "the record is restored on every voter"
        );
        // Even with the row gone now, the Redis record answers.
        sqlx::query("DELETE FROM tower_redlock_keys")
            .execute(&db.pool)
            .await
            .unwrap();
        assert_replayed(&pay(&replica.url(), "k-1", "10 EUR", "ok").await, &first);
    })
    .await;
}

/// Outcomes without a commit: a rollback answered `500` leaves no row and the key runs again
/// (once); a rollback answered `402` is stored in a row of its own, so a flush of every
/// voter still replays the `402` instead of running the key.
#[tokio::test]
async fn durable_a_rollback_is_run_again_after_a_5xx_and_replayed_after_a_402() {
    each(|v, pg| async move {
        let (masters, db) = (Masters::start(3), app::Db::create(&pg).await);
        let replica = Replica::start(v, &masters, &db, Duration::from_secs(5)).await;

        let failed = pay(&replica.url(), "k-500", "1 EUR", "rollback-500").await;
        assert_eq!(failed.status, 500);
        assert_eq!(db.key_rows().await, (0, 0), "a 5xx leaves no row");
        let ran = pay(&replica.url(), "k-500", "1 EUR", "ok").await;
        assert_eq!(ran.status, 201, "{}", ran.text());
        assert_replayed(&pay(&replica.url(), "k-500", "1 EUR", "ok").await, &ran);
        assert_eq!(db.payments().await, 1, "the key ran once after its 5xx");

        let declined = pay(&replica.url(), "k-402", "2 EUR", "rollback-402").await;
        assert_eq!(declined.status, 402);
        assert_eq!(db.key_rows().await, (2, 2), "the 402 has a row of its own");
        flush_and_restart(&masters);
        let retry = pay(&replica.url(), "k-402", "2 EUR", "ok").await;
        assert_replayed(&retry, &declined);
        assert_eq!(db.payments().await, 1, "the 402 key never committed work");
    })
    .await;
}

/// Another payload under a key whose row holds a response is `422`, from the Redis record
/// and, after a flush, from the row; the handler does not run.
#[tokio::test]
async fn durable_another_payload_under_a_stored_key_is_422() {
    each(|v, pg| async move {
        let (masters, db) = (Masters::start(3), app::Db::create(&pg).await);
        let replica = Replica::start(v, &masters, &db, Duration::from_secs(5)).await;
        let first = pay(&replica.url(), "k-1", "10 EUR", "ok").await;
        assert_eq!(first.status, 201);
        assert_eq!(pay(&replica.url(), "k-1", "99 EUR", "ok").await.status, 422);
        flush_and_restart(&masters);
        let reused = pay(&replica.url(), "k-1", "99 EUR", "ok").await;
        assert_eq!(reused.status, 422, "{}", reused.text());
        assert_eq!(db.payments().await, 1);
    })
    .await;
}

/// A handler that never records the row (a wiring mistake, or an answer before its
/// transaction) is still locked and replayed; the middleware writes the key's row after its
/// response (not atomic with any work — logged and counted), so a flush of every voter still
/// replays it.
#[tokio::test]
async fn durable_a_handler_that_never_records_the_row_gets_one_after_its_response() {
    each(|v, pg| async move {
        let (masters, db) = (Masters::start(3), app::Db::create(&pg).await);
        let replica = Replica::start(v, &masters, &db, Duration::from_secs(5)).await;
        let first = pay(&replica.url(), "k-1", "10 EUR", "unrecorded").await;
        assert_eq!(first.status, 201);
        assert_eq!(db.key_rows().await, (1, 1), "the middleware's row");
        assert_replayed(&pay(&replica.url(), "k-1", "10 EUR", "ok").await, &first);
        flush_and_restart(&masters);
        assert_replayed(&pay(&replica.url(), "k-1", "10 EUR", "ok").await, &first);
        assert_eq!(db.payments().await, 1);
    })
    .await;
}

/// Either adapter's store, for the tests of the store itself.
enum AnyStore {
    Sqlx(SqlxStore),
    TokioPostgres(PgStore),
}

impl AnyStore {
    async fn open(kind: DriverKind, db: &app::Db) -> Self {
        match kind {
            DriverKind::Sqlx => Self::Sqlx(SqlxStore::new(db.pool.clone())),
            DriverKind::TokioPostgres => {
                let (client, connection) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls)
                    .await
                    .expect("connect");
                tokio::spawn(connection);
                Self::TokioPostgres(PgStore::new(std::sync::Arc::new(client)))
            }
        }
    }

    fn table(self, table: Table) -> Self {
        match self {
            Self::Sqlx(s) => Self::Sqlx(s.table(table)),
            Self::TokioPostgres(s) => Self::TokioPostgres(s.table(table)),
        }
    }

    fn rows(&self) -> &dyn RowStore {
        match self {
            Self::Sqlx(s) => s,
            Self::TokioPostgres(s) => s,
        }
    }

    async fn sweep(&self, batch: u32) -> u64 {
        match self {
            Self::Sqlx(s) => s.sweep(batch).await.unwrap(),
            Self::TokioPostgres(s) => s.sweep(batch).await.unwrap(),
        }
    }

    async fn migrate(&self) {
        match self {
            Self::Sqlx(s) => s.migrate().await.unwrap(),
            Self::TokioPostgres(s) => s.migrate().await.unwrap(),
        }
    }
}

/// The sweep deletes expired rows in batches and keeps the others; the lookup never
/// answers from an expired row; a custom table name gets its own schema — with either
/// adapter.
#[tokio::test]
async fn durable_the_sweep_deletes_expired_rows_only() {
    let pg = app::server().await;
    for kind in [DriverKind::Sqlx, DriverKind::TokioPostgres] {
        let db = app::Db::create(&pg).await;
        let store = AnyStore::open(kind, &db).await;
        for (i, expired) in [(1_u8, true), (2, true), (3, true), (4, false)] {
            let sql = "INSERT INTO tower_redlock_keys (key_hash, fingerprint, record, run_id, \
                       expires_at) VALUES ($1, $2, $3, $1, now() + $4 * interval '1 hour')";
            sqlx::query(sql)
                .bind(vec![i; 32])
                .bind(vec![0_u8; 32])
                .bind(vec![i])
                .bind(if expired { -1.0_f64 } else { 1.0 })
                .execute(&db.pool)
                .await
                .unwrap();
        }
        let rows = store.rows();
        assert_eq!(rows.find(&[1; 32]).await.unwrap(), None, "expired");
        let live: FoundRow = rows.find(&[4; 32]).await.unwrap().expect("live");
        assert_eq!(live.fingerprint, vec![0; 32]);
        assert_eq!(live.record.as_deref(), Some(&[4][..]));
        assert!(live.left > Duration::from_secs(3000) && live.left <= Duration::from_secs(3600));
        assert!(live.age < Duration::from_secs(60));
        assert_eq!(store.sweep(2).await, 3, "three expired, in two batches");
        assert_eq!(db.key_rows().await, (1, 1));
        assert_eq!(store.sweep(2).await, 0);

        let custom = store.table(Table::new("billing_keys").unwrap());
        custom.migrate().await;
        custom.migrate().await; // idempotent
        assert_eq!(custom.rows().find(&[4; 32]).await.unwrap(), None);
    }
}

/// Golden: the row format other versions read during a rolling deploy (CHANGELOG.md, *Stable
/// formats*): the table's columns and types, `key_hash` = SHA-256 of the policy's lock key
/// (never the raw key), `record` = the very bytes of the Redis record (`TRH1` after `TRR1\n`, at
/// `<lock key>:record`).
#[tokio::test]
async fn durable_golden_row_format() {
    each(|v, pg| async move {
    use sha2::{Digest, Sha256};
    use tower_redlock::key::SimpleRequest;

    let (masters, db) = (Masters::start(3), app::Db::create(&pg).await);
    let replica = Replica::start(v, &masters, &db, Duration::from_secs(5)).await;
    assert_eq!(pay(&replica.url(), "k-1", "10 EUR", "ok").await.status, 201);

    let columns: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT column_name::text, data_type::text, is_nullable::text FROM information_schema.columns \
         WHERE table_name = 'tower_redlock_keys' ORDER BY ordinal_position",
    )
    .fetch_all(&db.pool)
    .await
    .unwrap();
    let expected = [
        ("key_hash", "bytea", "NO"),
        ("fingerprint", "bytea", "NO"),
        ("record", "bytea", "YES"),
        ("run_id", "bytea", "NO"),
        ("created_at", "timestamp with time zone", "NO"),
        ("expires_at", "timestamp with time zone", "NO"),
    ];
    let columns: Vec<(&str, &str, &str)> = columns
        .iter()
        .map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str()))
        .collect();
    assert_eq!(columns, expected);

    let policy = app::policy(v.driver, masters.client(), &db.url.clone(), Duration::from_secs(5));
    let req = SimpleRequest::new("POST", "/payments")
        .route("/payments")
        .header("idempotency-key", "\"k-1\"");
    let lock_key = policy.resource(&req).unwrap().expect("a key");
    let (key_hash, record): (Vec<u8>, Vec<u8>) =
        sqlx::query_as("SELECT key_hash, record FROM tower_redlock_keys")
            .fetch_one(&db.pool)
            .await
            .unwrap();
    assert_eq!(
        key_hash,
        Sha256::digest(lock_key.as_str().as_bytes()).to_vec()
    );
    assert!(!String::from_utf8_lossy(&record).contains("k-1"));
    assert_eq!(&record[..4], b"TRH1");
    let redis_key = masters
        .client()
        .redis_key(&format!("{}:record", lock_key.as_str()));
    let in_redis: Vec<u8> = masters
        .iter()
        .next()
        .unwrap()
        .query(redis::cmd("GET").arg(&redis_key))
        .await;
    assert_eq!(
        in_redis,
        [b"TRR1\n".as_slice(), &record].concat(),
        "the row keeps the Redis record's bytes"
    );
    })
    .await;
}

/// A request cancelled while its row is looked up (the client went away while the lookup
/// waited on a lock of the whole table) ran nothing: its lock is released, and the key's
/// retry runs — not `409` completed-not-stored.
#[tokio::test]
async fn durable_a_request_cancelled_during_the_lookup_leaves_the_key_free() {
    each(|v, pg| async move {
        let (masters, db) = (Masters::start(3), app::Db::create(&pg).await);
        let replica = Replica::start(v, &masters, &db, Duration::from_secs(5)).await;
        let mut lock = db.pool.begin().await.unwrap();
        sqlx::query("LOCK TABLE tower_redlock_keys IN ACCESS EXCLUSIVE MODE")
            .execute(&mut *lock)
            .await
            .unwrap();
        let impatient = spawn_pay(&replica.url(), "k-1", "10 EUR", "ok");
        // Its lookup waits on the table's lock; then the client goes away.
        races::until_waiting(&db, 1).await;
        impatient.abort();
        // The server cancelled the request before its handler: the lock is released (only
        // the lock was on the voters).
        support::http::within("the cancelled request's lock released", async {
            while masters.dbsizes().await.iter().any(|&n| n > 0) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        lock.rollback().await.unwrap();
        let ran = pay(&replica.url(), "k-1", "10 EUR", "ok").await;
        assert_eq!(ran.status, 201, "{}", ran.text());
        assert!(ran.header("idempotency-replayed").is_none(), "it ran");
        assert_eq!(db.payments().await, 1);
    })
    .await;
}

/// The business's own errors are the handler's: a unique violation recovered from in a
/// savepoint, then `row.commit`, is the handler's `201`, stored in the row and replayed.
#[tokio::test]
async fn durable_a_business_error_recovered_in_a_savepoint_is_the_handlers_answer() {
    each(|v, pg| async move {
        let (masters, db) = (Masters::start(3), app::Db::create(&pg).await);
        let replica = Replica::start(v, &masters, &db, Duration::from_secs(5)).await;
        let first = pay(&replica.url(), "k-1", "10 EUR", "coupon").await;
        assert_eq!(first.status, 201, "{}", first.text());
        assert_eq!(db.key_rows().await, (1, 1));
        flush_and_restart(&masters);
        assert_replayed(&pay(&replica.url(), "k-1", "10 EUR", "ok").await, &first);
    })
    .await;
}

/// A lock timeout (SQLSTATE `55P03`) the handler recovers from in a savepoint, then
/// `row.commit`: the handler's `201`, stored in the row — the busy error does not stick.
#[tokio::test]
async fn durable_a_busy_error_recovered_in_a_savepoint_is_the_handlers_answer() {
    each(|v, pg| async move {
        let (masters, db) = (Masters::start(3), app::Db::create(&pg).await);
        let replica = Replica::start(v, &masters, &db, Duration::from_secs(5)).await;
        let mut holder = db.pool.begin().await.unwrap();
        sqlx::query("SELECT pg_advisory_xact_lock(9)")
            .execute(&mut *holder)
            .await
            .unwrap();
        let first = pay(&replica.url(), "k-1", "10 EUR", "busy-savepoint").await;
        holder.rollback().await.unwrap();
        assert_eq!(first.status, 201, "{}", first.text());
        assert_eq!(db.key_rows().await, (1, 1));
        flush_and_restart(&masters);
        assert_replayed(&pay(&replica.url(), "k-1", "10 EUR", "ok").await, &first);
    })
    .await;
}

/// Settings PostgreSQL cannot take are refused when the policy is built: a `lock_timeout`
/// over its int4 of milliseconds, a zero timeout.
#[tokio::test]
async fn durable_settings_out_of_range_are_refused_at_build() {
    use tower_redlock::durable::Durable;
    use tower_redlock::policy::LockPolicy;
    use tower_redlock::replay::Replay;

    let pool = sqlx::PgPool::connect_lazy("postgres://nobody@127.0.0.1:1/none").unwrap();
    let build = |durable: Durable| {
        LockPolicy::idempotent(tower_redlock::Redlock::in_memory())
            .replay(Replay::new().durable(durable))
            .build()
    };
    let month = Duration::from_secs(30 * 24 * 3600);
    let store = || SqlxStore::new(pool.clone());
    let error = build(Durable::new(store()).lock_timeout(month)).unwrap_err();
    assert!(error.is_invalid_input() && error.to_string().contains("lock_timeout"));
    assert!(build(Durable::new(store()).timeout(Duration::ZERO)).is_err());
    assert!(build(Durable::new(store())).is_ok());
}
