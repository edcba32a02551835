//! Issue 23: retry storms against one replica with replay on (the examples' policy:
//! `Idempotency-Key` required, the handler working [`WORK`] like the examples' `WORK_MS`), from
//! [`CONNECTIONS`] client connections, every master healthy. No `503` may come back — a
//! queue, a slower `409` or replay, never "unavailable" — no handler may run twice for a key,
//! every replay carries its run's payment id, no healthy master is suspended, no lock is
//! left:
//!
//! - one `Idempotency-Key` × 10,000 (one run, then `409`s and replays);
//! - 20,000 distinct keys (one run each);
//! - a replica pinned to one core beside a CPU hog (a busy process pinned there too, spawned
//!   and killed by pid), 200 keys × 5 copies.
//!
//! Each on axum and on actix-web, one at a time (`ONE_FLOOD_AT_A_TIME`).

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use crate::replicas::{ActixReplica, AxumReplica, Setup};
use crate::retries::{by_key, PerKey};
use crate::support::apps::PATH;
use crate::support::{eventually, Masters};
use crate::{
    fresh_masters, run, Flood, Outcome, EMPTY_WITHIN, FLOOD_DEADLINE, ONE_FLOOD_AT_A_TIME,
};
use tower_redlock::policy::LockPolicy;
use tower_redlock::{NodeStatus, Redlock};

/// How many client connections (requests in flight at once).
const CONNECTIONS: usize = 300;
/// The handler's work, as the examples' `WORK_MS=300`.
const WORK: Duration = Duration::from_millis(300);

/// Replay on, with the defaults (the examples' policy); a `503` names every voter's vote,
/// so that a failure says why.
fn policy(redlock: Redlock) -> LockPolicy {
    LockPolicy::idempotent(redlock)
        .explain_votes(true)
        .build()
        .expect("the idempotent policy")
}

fn one_key(label: &str, _: usize) -> String {
    format!("storm-one-{label}")
}

fn distinct_key(label: &str, i: usize) -> String {
    format!("storm-distinct-{label}-{i}")
}

/// 200 keys × 5 copies: copies of a key are 200 requests apart, so most arrive while the
/// first is in flight or right after it completed.
fn copy_key(label: &str, i: usize) -> String {
    format!("storm-copy-{label}-{}", i % 200)
}

/// A replica of either framework.
enum Replica {
    Axum(AxumReplica),
    Actix(ActixReplica),
}

impl Replica {
    async fn start(framework: &str, masters: &Arc<Masters>, setup: Setup) -> Self {
        match framework {
            "axum" => Self::Axum(AxumReplica::start_with(masters, policy, setup).await),
            _ => Self::Actix(ActixReplica::start_with(masters, policy, setup).await),
        }
    }

    fn url(&self) -> String {
        match self {
            Self::Axum(r) => r.url(PATH),
            Self::Actix(r) => r.url(PATH),
        }
    }

    fn redlock(&self) -> &Redlock {
        match self {
            Self::Axum(r) => &r.redlock,
            Self::Actix(r) => &r.redlock,
        }
    }

    fn runs(&self) -> usize {
        let runs = match self {
            Self::Axum(r) => &r.runs,
            Self::Actix(r) => &r.runs,
        };
        runs.load(std::sync::atomic::Ordering::SeqCst)
    }
}

/// A busy process pinned to CPU 0 (`taskset`), killed by its pid on drop.
struct CpuHog(Child);

impl CpuHog {
    fn start() -> Self {
        let child = Command::new("taskset")
            .args(["-c", "0", "sh", "-c", "while :; do :; done"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn the CPU hog");
        Self(child)
    }
}

impl Drop for CpuHog {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One storm: `requests` sent to a fresh replica of `framework` with `key_of`, then checked.
/// Returns the run's outcome and the handler's runs.
async fn storm(
    framework: &'static str,
    label: &'static str,
    requests: usize,
    key_of: fn(&str, usize) -> String,
    pinned: bool,
) {
    let _turn = ONE_FLOOD_AT_A_TIME.lock().await;
    // The crate's warnings (a quorum not reached names every voter's answer), shown with a
    // failure's output.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("tower_redlock=warn"))
        .with_test_writer()
        .try_init();
    let masters = fresh_masters().await;
    let setup = Setup { work: WORK, pinned };
    let replica = Replica::start(framework, &masters, setup).await;
    let hog = pinned.then(CpuHog::start);
    let flood = Flood {
        url: replica.url(),
        label,
        requests,
        key_of,
        in_flight: CONNECTIONS,
    };
    let outcome = run(&flood, &masters, replica.redlock()).await;
    drop(hog);
    check(
        &flood,
        &masters,
        &outcome,
        replica.redlock(),
        replica.runs(),
    )
    .await;
}

/// What every storm must show.
async fn check(
    flood: &Flood,
    masters: &Masters,
    outcome: &Outcome,
    redlock: &Redlock,
    runs: usize,
) {
    let (tally, label) = (&outcome.tally, flood.label);
    // Every request sent has an answer or is listed among `others` (no answer in time):
    // fewer means the deadline cut the flood, a machine too slow to produce the storm.
    assert_eq!(
        tally.answers(),
        flood.requests,
        "[{label}] could not set up the scenario: only {} of {} requests were sent before \
         the {FLOOD_DEADLINE:?} deadline",
        tally.answers(),
        flood.requests
    );
    assert!(
        tally.others.is_empty(),
        "[{label}] answers other than 200, 409 or 503: {:?}",
        &tally.others[..tally.others.len().min(5)]
    );
    assert_eq!(
        tally.unavailable, 0,
        "[{label}] {} answers were 503 with every master healthy, e.g. {:?}",
        tally.unavailable, tally.a_503
    );
    let status = redlock.node_status();
    assert!(
        !status.iter().any(NodeStatus::is_suspended) && tally.seen_suspended == 0,
        "[{label}] a healthy master was suspended ({} answers saw it): {status:?}",
        tally.seen_suspended
    );
    // At most one run per key; every replay carries that run's payment id.
    let mut keys: HashMap<String, PerKey> = HashMap::new();
    by_key(label, outcome, flood.key_of, &mut keys);
    let executed: usize = keys.values().map(|k| k.executed.len()).sum();
    let replayed: usize = keys.values().map(|k| k.replayed.len()).sum();
    for (key, k) in &keys {
        assert!(
            k.executed.len() <= 1,
            "{key}: ran {} times",
            k.executed.len()
        );
        if let Some(first) = k.executed.first() {
            assert!(
                k.replayed.iter().all(|r| r == first),
                "{key}: a replay differs from its run"
            );
        }
    }
    assert_eq!(
        runs, executed,
        "[{label}] handler runs vs answers that ran it"
    );
    println!(
        "[{label}] runs {runs}, replayed {replayed}, 409 {}, 503 {}",
        tally.conflicts, tally.unavailable
    );
    // No lock left (released well within the 30 s ttl); the completion records stay.
    eventually(
        format_args!("[{label}] no lock left"),
        EMPTY_WITHIN,
        || async {
            for master in masters.iter() {
                let keys: Vec<String> = master.query(redis::cmd("KEYS").arg("*")).await;
                if keys.iter().any(|k| !k.ends_with(":record")) {
                    return false;
                }
            }
            true
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn storm_one_key_axum() {
    storm("axum", "one-key-axum", 10_000, one_key, false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn storm_one_key_actix() {
    storm("actix", "one-key-actix", 10_000, one_key, false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn storm_distinct_keys_axum() {
    storm("axum", "distinct-axum", 20_000, distinct_key, false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn storm_distinct_keys_actix() {
    storm("actix", "distinct-actix", 20_000, distinct_key, false).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn storm_on_one_core_beside_a_hog_axum() {
    storm("axum", "hog-axum", 1_000, copy_key, true).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn storm_on_one_core_beside_a_hog_actix() {
    storm("actix", "hog-actix", 1_000, copy_key, true).await;
}
