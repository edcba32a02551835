//! Byte-identical answers: every case of durable replay, run over axum and actix-web, each
//! with sqlx and with tokio-postgres, answers the same status, headers (but `date` and the
//! hop-by-hop `connection`) and body.

use std::collections::BTreeMap;
use std::time::Duration;

use super::web::{Replica, Variant, Web};
use super::work::DriverKind;
use super::{app, flush_and_restart, pay};
use tower_redlock_testkit as support;

use support::http::Reply;
use support::Masters;

/// What a client reads of an answer: the status, every end-to-end header but `date`, the
/// body. The hop-by-hop `connection` is the connection's (actix-web closes one whose request
/// body was left unread, as before a `400`), not the answer's.
#[derive(Debug, PartialEq, Eq)]
struct Answer {
    case: &'static str,
    status: u16,
    headers: BTreeMap<String, String>,
    body: String,
}

impl Answer {
    fn of(case: &'static str, reply: &Reply) -> Self {
        let headers = reply
            .headers
            .iter()
            .filter(|(name, _)| !matches!(name.as_str(), "date" | "connection"))
            .map(|(n, v)| (n.to_string(), String::from_utf8_lossy(v.as_bytes()).into()))
            .collect();
        Self {
            case,
            status: reply.status,
            headers,
            body: reply.text(),
        }
    }
}

/// Takes the response out of the row of the payment with `body`, and dates the row's commit
/// `age_s` seconds back: as a replica killed after its commit leaves it.
async fn forget_response(db: &app::Db, body: &str, age_s: f64) {
    let sql = "UPDATE tower_redlock_keys SET record = NULL, \
               created_at = now() - $2 * interval '1 second' \
               WHERE encode(key_hash, 'hex') = (SELECT key_hash FROM payments WHERE body = $1)";
    let done = sqlx::query(sql)
        .bind(body)
        .bind(age_s)
        .execute(&db.pool)
        .await
        .unwrap();
    assert_eq!(done.rows_affected(), 1);
}

/// The cases, in order, on one variant: its answers.
async fn answers(variant: Variant, pg: &app::Server) -> Vec<Answer> {
    let (masters, db) = (Masters::start(3), app::Db::create(pg).await);
    let replica = Replica::start(variant, &masters, &db, Duration::from_secs(5)).await;
    let url = replica.url();
    let mut out = Vec::new();
    let mut case = async |case: &'static str, key: &str, body: &str, mode: &str| {
        out.push(Answer::of(case, &pay(&url, key, body, mode).await));
    };
    case("ran", "k-1", "10 EUR", "ok").await;
    case("replayed from redis", "k-1", "10 EUR", "ok").await;
    case("another payload, redis", "k-1", "99 EUR", "ok").await;
    case("declined", "k-402", "2 EUR", "rollback-402").await;
    case("failed", "k-500", "3 EUR", "rollback-500").await;
    case("unrecorded", "k-u", "4 EUR", "unrecorded").await;
    case("young, ran", "k-young", "5 EUR", "ok").await;
    case("old, ran", "k-old", "6 EUR", "ok").await;
    forget_response(&db, "5 EUR", 0.0).await;
    forget_response(&db, "6 EUR", 3600.0).await;
    flush_and_restart(&masters);
    case("replayed from the row", "k-1", "10 EUR", "ok").await;
    case("another payload, row", "k-1", "99 EUR", "ok").await;
    case("declined, from the row", "k-402", "2 EUR", "ok").await;
    case("unrecorded, from the row", "k-u", "4 EUR", "ok").await;
    case("after a 5xx, runs", "k-500", "3 EUR", "ok").await;
    case("in flight", "k-young", "5 EUR", "ok").await;
    case("completed, not stored", "k-old", "6 EUR", "ok").await;
    case("another payload, no response", "k-old", "99 EUR", "ok").await;
    let no_key = support::http::http_client().post(&url).body("10 EUR");
    out.push(Answer::of("no key", &support::http::reply(no_key).await));
    assert_eq!(
        db.payments().await,
        5,
        "each key's work once, k-402's never"
    );
    out
}

/// Every case of durable replay answers byte for byte the same over axum and actix-web, with
/// sqlx and with tokio-postgres: the handler's answers, the replays from Redis and from the
/// row, `422` for another payload, `409` + `Retry-After` for a row whose response may still
/// come, `409` completed-not-stored, `400` for no key.
#[tokio::test]
async fn durable_answers_are_byte_identical_over_every_framework_and_driver() {
    let pg = app::server().await;
    let mut all = Vec::new();
    for web in [Web::Axum, Web::Actix] {
        for driver in [DriverKind::Sqlx, DriverKind::TokioPostgres] {
            let variant = Variant::new(web, driver);
            all.push((variant, answers(variant, &pg).await));
        }
    }
    let (first, expected) = &all[0];
    let statuses: Vec<u16> = expected.iter().map(|a| a.status).collect();
    assert_eq!(
        statuses,
        [201, 201, 422, 402, 500, 201, 201, 201, 201, 422, 402, 201, 201, 409, 409, 422, 400],
        "{expected:#?}"
    );
    assert_eq!(
        expected[1]
            .headers
            .get("idempotency-replayed")
            .map(String::as_str),
        Some("true")
    );
    assert!(expected[13].headers.contains_key("retry-after"));
    assert!(expected[14]
        .body
        .contains("idempotency-completed-not-stored"));
    for (variant, answers) in &all[1..] {
        for (theirs, ours) in answers.iter().zip(expected) {
            assert_eq!(
                theirs,
                ours,
                "{} differs from {}",
                variant.name(),
                first.name()
            );
        }
    }
}
