//! The Redlock client against real Redis masters: locking, quorum over every subset of
//! pre-held masters, faults (stopped masters, flushed script caches), extension and
//! auto-extension, scoped locks and their release paths, bad input, and a contention run.
//!
//! - [`lock`]: lock, unlock and lock again; the Ruby gem's flow; two clients contending,
//!   unique tokens; interop with plain `SET NX` holders and a key prefix; 16 tasks on one key;
//! - [`quorum`]: `try_lock` over every subset of pre-held masters (1, 3 and 5 masters);
//! - [`faults`]: stopped and frozen masters, late masters (the acquire, an extension and its
//!   `EVAL` fallback still reach them), `NOSCRIPT` recovery after `SCRIPT FLUSH`;
//! - [`extend`]: extension, after expiry or vanished keys (lost, never re-created), a wrong
//!   token, the extension cap;
//! - [`keep_alive`]: auto-extension past the ttl, the loss signalled, `abort_on_loss`;
//! - [`scoped`]: `with_lock` / `critical_section(..).run` release on success, error, contention,
//!   cancellation and panic;
//! - [`bad_input`]: bad resources, ttls and configurations are rejected and lock nothing;
//! - [`safety`]: paused, black-holed and restarted-empty masters, and the races of extension
//!   and release with expiry;
//! - [`fencing`]: fencing tokens of successive holders strictly increase;
//! - [`completion`]: work that runs once (`lock_unless_completed`, `Lease::complete`);
//! - [`operate`]: inspection, each voter's answer in an error, forced release;
//! - [`liveness`]: a paused majority, a blocked runtime thread, suspended masters, retried
//!   releases — the lock stays live.

use tower_redlock_testkit as support;

mod bad_input;
mod completion;
mod extend;
mod faults;
mod fencing;
mod force;
mod keep_alive;
mod liveness;
mod lock;
mod operate;
mod quorum;
mod safety;
mod scoped;
mod wake;
mod wake_load;

use std::time::Duration;

use support::{eventually, Masters};

const TTL: Duration = Duration::from_secs(10);
const SECOND: Duration = Duration::from_secs(1);

/// Every master ends empty (a release returns at a quorum; the rest follows in the
/// background).
async fn all_empty(m: &Masters) {
    eventually("every master is empty", Duration::from_secs(5), || async {
        m.dbsizes().await.iter().all(|&n| n == 0)
    })
    .await;
}

/// Asserts that `key` is gone from every master: at once from a quorum (a release returns
/// once a quorum answered), and soon after from the rest (released in the background).
async fn gone_everywhere(m: &Masters, key: &str) {
    let held = m.values(key).await.iter().filter(|v| v.is_some()).count();
    assert!(
        held < m.len() / 2 + 1,
        "{key} is still held on {held} masters"
    );
    eventually(
        format!("{key} is gone everywhere"),
        Duration::from_secs(5),
        || m.absent_everywhere(key),
    )
    .await;
}

fn ms(d: Duration) -> i64 {
    d.as_millis() as i64
}
