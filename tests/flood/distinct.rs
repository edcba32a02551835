//! Issue 10: a flood of distinct `Idempotency-Key`s with the default policy (30 s ttl, `503`
//! when the quorum is unreachable). While every master is healthy it must leave no key in
//! Redis, suspend no master, and get at most 0.1 % of `503`s; distinct keys never contend, so
//! every answer is a `200` or a `503`, nothing else.

use std::collections::HashMap;

use crate::replicas::{ActixReplica, AxumReplica};
use crate::support::apps::{IDEMPOTENCY_KEY, PATH};
use crate::support::{eventually, Masters};
use crate::{
    assert_live, fresh_masters, run, Flood, Tally, EMPTY_WITHIN, IN_FLIGHT, ONE_FLOOD_AT_A_TIME,
};
use tower_redlock::key::{IdempotencyKey, KeyExtractor, KeyExtractorExt, SimpleRequest};
use tower_redlock::policy::LockPolicy;
use tower_redlock::Redlock;

/// How many requests, each with a key of its own (enough that 0.1 % is a few answers, not a
/// fraction of one).
const REQUESTS: usize = 8_000;

#[tokio::test(flavor = "multi_thread")]
async fn flood_of_distinct_keys_axum() {
    let _turn = ONE_FLOOD_AT_A_TIME.lock().await;
    let masters = fresh_masters().await;
    let replica = AxumReplica::start(&masters, policy).await;
    flood_of_distinct_keys("axum", &masters, &replica.url(PATH), &replica.redlock).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn flood_of_distinct_keys_actix() {
    let _turn = ONE_FLOOD_AT_A_TIME.lock().await;
    let masters = fresh_masters().await;
    let replica = ActixReplica::start(&masters, policy).await;
    flood_of_distinct_keys("actix", &masters, &replica.url(PATH), &replica.redlock).await;
}

/// The key extractor of the examples: `Idempotency-Key`, scoped by the matched route.
fn extractor() -> impl KeyExtractor + Clone {
    IdempotencyKey::required().scoped_by_route()
}

/// The default policy.
fn policy(redlock: Redlock) -> LockPolicy {
    LockPolicy::builder(redlock, extractor())
        .build()
        .expect("the default policy")
}

/// The `Idempotency-Key` of request `i`.
fn flood_key(label: &str, i: usize) -> String {
    format!("flood-{label}-{i}")
}

/// The Redis key the replicas lock for `POST PATH` with `Idempotency-Key: key`.
fn redis_key(key: &str) -> String {
    let req = SimpleRequest::new("POST", PATH)
        .route(PATH)
        .header(IDEMPOTENCY_KEY, key);
    extractor()
        .extract(&req)
        .expect("a valid key")
        .expect("a key")
        .into_string()
}

/// Which requests the keys still on the masters belong to, and what they were answered:
/// `status (count)` per answer, and a few of the keys with their `PTTL` on each master.
async fn describe_leftovers(label: &str, masters: &Masters, tally: &Tally) -> String {
    let status_of: HashMap<String, u16> = tally
        .answered
        .iter()
        .map(|a| (redis_key(&flood_key(label, a.i)), a.status))
        .collect();
    let mut keys: Vec<String> = Vec::new();
    for master in masters.iter() {
        let on_master: Vec<String> = master.query(redis::cmd("KEYS").arg("*")).await;
        keys.extend(on_master);
    }
    keys.sort_unstable();
    keys.dedup();
    let mut by_answer: HashMap<u16, usize> = HashMap::new();
    for key in &keys {
        *by_answer
            .entry(status_of.get(key).copied().unwrap_or(0))
            .or_default() += 1;
    }
    let mut by_answer: Vec<_> = by_answer.into_iter().collect();
    by_answer.sort_unstable();
    let mut examples = Vec::new();
    for key in keys.iter().take(3) {
        examples.push(format!(
            "{} PTTL {:?} ms",
            status_of.get(key).copied().unwrap_or(0),
            masters.pttls(key).await
        ));
    }
    format!(
        "{} distinct keys, by their request's answer (status, keys): {by_answer:?}; e.g. {examples:?}",
        keys.len()
    )
}

/// Floods `url` (`POST` behind the lock, served by a replica whose client is `redlock`) with
/// [`REQUESTS`] distinct keys, [`IN_FLIGHT`] at a time, and checks issue 10's promise.
/// Floods `url` (`POST` behind the lock, served by a replica whose client is `redlock`) with
/// [`REQUESTS`] distinct keys and checks issue 10's promise.
async fn flood_of_distinct_keys(
    label: &'static str,
    masters: &Masters,
    url: &str,
    redlock: &Redlock,
) {
    let flood = Flood {
        url: url.to_owned(),
        label,
        requests: REQUESTS,
        key_of: flood_key,
        in_flight: IN_FLIGHT,
    };
    assert_eq!(masters.dbsizes().await, [0, 0, 0], "empty before the flood");
    let outcome = run(&flood, masters, redlock).await;
    if outcome.left.iter().any(|n| *n > 0) {
        println!(
            "[{label}] keys left right after the flood: {}",
            describe_leftovers(label, masters, &outcome.tally).await
        );
    }

    // Every key is released (well within the ttl: released, not expired).
    let emptied = eventually(
        format_args!("every master is empty after the {label} flood"),
        EMPTY_WITHIN,
        || async { masters.dbsizes().await.iter().all(|n| *n == 0) },
    )
    .await;
    println!("[{label}] every master empty {emptied:?} after the flood");

    // A flood cut short by the deadline must still have had a quarter of its answers.
    assert_live(&flood, &outcome, REQUESTS / 4);
    assert_eq!(
        outcome.tally.conflicts, 0,
        "distinct keys never contend, yet {} answers were 409",
        outcome.tally.conflicts
    );
}
