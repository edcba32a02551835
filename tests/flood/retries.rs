//! Issue 12: retries under a flood, with replay on (`LockPolicy::idempotent`). Each key is
//! sent [`COPIES`] times in a row by different senders — most copies arrive while the first
//! is in flight (`409`), the later ones after it completed (replayed) — then once more each,
//! after the flood. No handler may run twice for a key, every replay must carry the payment
//! id of the run it replays, at most 0.1 % of answers may be `503`, and no lock may be left:
//! only the completion records stay on the masters.

use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::SeqCst;

use crate::replicas::{ActixReplica, AxumReplica};
use crate::support::apps::PATH;
use crate::support::{eventually, Masters};
use crate::{
    assert_live, fresh_masters, run, Flood, Outcome, EMPTY_WITHIN, IN_FLIGHT, ONE_FLOOD_AT_A_TIME,
};
use tower_redlock::policy::LockPolicy;
use tower_redlock::Redlock;

/// How many distinct keys.
const KEYS: usize = 200;
/// How many times each key is sent during the flood.
const COPIES: usize = 20;

#[tokio::test(flavor = "multi_thread")]
async fn flood_of_retries_replay_axum() {
    let _turn = ONE_FLOOD_AT_A_TIME.lock().await;
    let masters = fresh_masters().await;
    let replica = AxumReplica::start(&masters, policy).await;
    let url = replica.url(PATH);
    flood_of_retries("axum", &masters, &url, &replica.redlock, &replica.runs).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn flood_of_retries_replay_actix() {
    let _turn = ONE_FLOOD_AT_A_TIME.lock().await;
    let masters = fresh_masters().await;
    let replica = ActixReplica::start(&masters, policy).await;
    let url = replica.url(PATH);
    flood_of_retries("actix", &masters, &url, &replica.redlock, &replica.runs).await;
}

/// Replay on, with the defaults.
fn policy(redlock: Redlock) -> LockPolicy {
    LockPolicy::idempotent(redlock)
        .build()
        .expect("the idempotent policy")
}

/// During the flood, the key of request `i`: [`COPIES`] requests in a row share one.
fn copy_key(label: &str, i: usize) -> String {
    format!("retry-{label}-{}", i / COPIES)
}

/// After the flood, the key of request `i`: each key once.
fn once_key(label: &str, i: usize) -> String {
    format!("retry-{label}-{i}")
}

/// Per key: the payment ids of the answers that ran the handler, and of those replayed.
#[derive(Debug, Default)]
pub(crate) struct PerKey {
    pub(crate) executed: Vec<String>,
    pub(crate) replayed: Vec<String>,
}

/// Sorts the `200`s of `outcome` by key (`key_of`): runs and replays.
pub(crate) fn by_key(
    label: &str,
    outcome: &Outcome,
    key_of: fn(&str, usize) -> String,
    into: &mut HashMap<String, PerKey>,
) {
    for a in &outcome.tally.answered {
        let (Some(body), 200) = (&a.body, a.status) else {
            continue;
        };
        let entry = into.entry(key_of(label, a.i)).or_default();
        if a.replayed {
            entry.replayed.push(body.clone());
        } else {
            entry.executed.push(body.clone());
        }
    }
}

async fn flood_of_retries(
    label: &'static str,
    masters: &Masters,
    url: &str,
    redlock: &Redlock,
    runs: &AtomicUsize,
) {
    assert_eq!(masters.dbsizes().await, [0, 0, 0], "empty before the flood");
    let flood = Flood {
        url: url.to_owned(),
        label,
        requests: KEYS * COPIES,
        key_of: copy_key,
        in_flight: IN_FLIGHT,
    };
    let during = run(&flood, masters, redlock).await;
    assert_live(&flood, &during, KEYS * COPIES / 4);
    let again = Flood {
        requests: KEYS,
        key_of: once_key,
        ..flood.clone()
    };
    let after = run(&again, masters, redlock).await;
    assert_live(&again, &after, KEYS);

    let mut keys = HashMap::new();
    by_key(label, &during, copy_key, &mut keys);
    let executed_during: usize = keys.values().map(|k| k.executed.len()).sum();
    by_key(label, &after, once_key, &mut keys);
    let replayed: usize = keys.values().map(|k| k.replayed.len()).sum();
    let executed: usize = keys.values().map(|k| k.executed.len()).sum();
    println!(
        "[{label}] handler runs {}; answers that ran it {executed} ({executed_during} during the \
         flood); replayed {replayed}; 409 during the flood {}",
        runs.load(SeqCst),
        during.tally.conflicts
    );

    // No handler ran twice for a key, and every answer that ran it is one run.
    for (key, k) in &keys {
        assert!(
            k.executed.len() <= 1,
            "{key}: the handler ran {} times",
            k.executed.len()
        );
        if let Some(first) = k.executed.first() {
            assert!(
                k.replayed.iter().all(|r| r == first),
                "{key}: a replay differs from the run it replays ({first} vs {:?})",
                k.replayed
            );
        }
    }
    assert_eq!(
        runs.load(SeqCst),
        executed,
        "handler runs vs answers that ran it"
    );
    // After the flood every key is done: once it ran, each further answer is its replay.
    assert_eq!(
        after.tally.ok, KEYS,
        "every key answered 200 after the flood"
    );
    let replayed_after = after.tally.answered.iter().filter(|a| a.replayed).count();
    assert!(
        replayed_after + (executed - executed_during) == KEYS,
        "after the flood: {replayed_after} replayed and {} ran, of {KEYS}",
        executed - executed_during
    );
    assert!(replayed_after > 0, "nothing was replayed after the flood");

    // No lock is left (released, not expired: well within the 30 s ttl); the records stay.
    let locks_left = || async {
        let mut locks = 0;
        for master in masters.iter() {
            let keys: Vec<String> = master.query(redis::cmd("KEYS").arg("*")).await;
            locks += keys.iter().filter(|k| !k.ends_with(":record")).count();
        }
        locks
    };
    let gone = eventually(
        format_args!("no lock left after the {label} retries"),
        EMPTY_WITHIN,
        || async { locks_left().await == 0 },
    )
    .await;
    println!("[{label}] no lock left {gone:?} after the flood");
    for (i, n) in masters.dbsizes().await.into_iter().enumerate() {
        assert!(
            n as usize <= KEYS,
            "master {i} has {n} records for {KEYS} keys"
        );
    }
}
