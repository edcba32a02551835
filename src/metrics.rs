//! Metrics (feature `metrics`): counters, histograms and gauges on the
//! [`metrics`](https://docs.rs/metrics/0.24) facade, for any exporter the application
//! installs (Prometheus, StatsD, OpenTelemetry, …). Without an installed recorder they cost
//! one atomic load each; without the feature they are not compiled at all.
//!
//! Names follow the Prometheus conventions (`_total` counters, `_seconds` histograms) and
//! carry only bounded labels: an outcome, or a node's name — never a key.
//!
//! | name | type | labels | counts / measures |
//! | --- | --- | --- | --- |
//! | [`redlock_acquired_total`](ACQUIRED) | counter | | lock calls that took the lock ([`Redlock::lock`](crate::Redlock::lock) and its variants, [`Redlock::lock_unless_completed`](crate::Redlock::lock_unless_completed), the middleware) |
//! | [`redlock_contended_total`](CONTENDED) | counter | | lock calls that gave up because another holder had the lock |
//! | [`redlock_unavailable_total`](UNAVAILABLE) | counter | | lock calls that gave up because too few nodes answered |
//! | [`redlock_completed_total`](COMPLETED) | counter | | `lock_unless_completed` calls answered with the work's completion record (nothing locked) |
//! | [`redlock_released_total`](RELEASED) | counter | | releases that reached their quorum (explicit, scoped, or on drop) |
//! | [`redlock_release_failed_total`](RELEASE_FAILED) | counter | | releases that did not: the lock stays until its ttl |
//! | [`redlock_extended_total`](EXTENDED) | counter | | extensions, manual or keep-alive, that succeeded |
//! | [`redlock_lost_total`](LOST) | counter | | leases lost while held: an extension found them gone, or their validity ran out before they were released or completed (once per lease) |
//! | [`redlock_recorded_total`](RECORDED) | counter | | [`Lease::complete`](crate::Lease::complete) calls that stored the completion record on a quorum |
//! | [`redlock_record_failed_total`](RECORD_FAILED) | counter | | `Lease::complete` calls that did not (the lock stays until its ttl) |
//! | [`redlock_record_minority_total`](RECORD_MINORITY) | counter | | completions whose record never reached a quorum, also after their retries in the background: a second run of the key is possible (see the crate's Safety docs) |
//! | [`redlock_replay_total`](REPLAY) | counter | `outcome`: `replayed` (answered with its stored response), `mismatch` (`422`: the key reused for another request), `not_stored` (`409`: completed without a stored response), `unknown` (`409`: stopped on a lost lease, outcome unknown), `stored` (a request's record reached its quorum), `store_failed` (it did not: duplicates get `409` until the lock's ttl) | [replay](crate::replay)'s answers from a record, and its stores |
//! | [`redlock_acquire_duration_seconds`](ACQUIRE_SECONDS) | histogram | `outcome`: `acquired`, `contended`, `unavailable`, `completed`, `cancelled` (the caller dropped the call before its outcome: no counter moves) | the time of a lock call, its retries included |
//! | [`redlock_hold_duration_seconds`](HOLD_SECONDS) | histogram | | from the lock request to the release or completion |
//! | [`redlock_validity_left_seconds`](VALIDITY_LEFT_SECONDS) | histogram | | the validity a lease had left at its release or completion (0: it ran out) |
//! | [`redlock_node_errors_total`](NODE_ERRORS) | counter | `node`; `kind`: `timeout` (no answer within the node timeout), `unreachable` (connection refused or lost), `denied` (credentials or ACL), `protected` (tenure protection: too young to vote), `abstained` (the voter refused on its own: a Sentinel group without a majority, a master that may evict), `no_script`, `wrong_type`, `failed` (any other) | node requests that failed, by kind (the kinds of [`VoteKind`](crate::VoteKind)) |
//! | [`redlock_node_suspended`](NODE_SUSPENDED) | gauge | `node` | how many of the process's clients have the node suspended (see [`Redlock::node_status`](crate::Redlock::node_status)): 1 or 0 with one client; a client dropped takes its own off |
//! | [`redlock_owed_debts`](OWED_DEBTS) | gauge | `node` | releases and completions owed to the node: they could not reach it while a lock of ours may still be there, and are paid when it answers again (the clients that share a node add up; a client dropped takes its own off). A debt that lapsed (its lock expired) stays counted until the next payment or a full ledger drops it: a node that never answers again keeps its count, up to 65,536 |
//! | [`redlock_owed_bytes`](OWED_BYTES) | gauge | `node` | the bytes of keys and records those debts hold |
//! | [`redlock_retry_waits_total`](RETRY_WAITS) | counter | `ended`: `woken` (a release heard, or the client's turn at the key came, before the poll), `polled` (the retry's time came: every wait without [`RedlockBuilder::wake_waiters`](crate::RedlockBuilder::wake_waiters), the fallback with it) | lock calls' waits between tries |
//! | [`redlock_wake_queue_full_total`](WAKE_QUEUE_FULL) | counter | `node` | contended keys the node's wake-up subscriber did not listen on because its queue held its capacity (4,096 keys) already: their waiters poll there ([`RedlockBuilder::wake_waiters`](crate::RedlockBuilder::wake_waiters)) |
//! | [`redlock_durable_rows_total`](DURABLE_ROWS) | counter | `outcome`: `absent` (a lookup that found no row: the handler runs), `replayed` (answered from a key's row), `not_stored` (a row without its response), `rebuilt` (its response rebuilt by `Durable::rebuild`'s hook), `stored` (a response stored in a row), `store_failed`, `lookup_failed` (the lookup failed or the lease ran out meanwhile: answered `503`), `busy` (a lock timeout, serialization failure or deadlock: `409`), `duplicate` (a handler's insert met the committed row), `unrecorded` (a handler under durable replay that did not record the row) | [durable replay](crate::durable)'s steps |
//!
//! Histograms are rendered as the exporter is configured: the Prometheus exporter renders
//! summaries unless it is given buckets, and a dashboard's percentiles over several replicas
//! need buckets ([`SECONDS_BUCKETS`] suits every `_seconds` histogram here).
//!
//! `node` is the node's name as [`NodeStatus::name`](crate::NodeStatus::name) reports it:
//! `host:port` of a master (never a password), `sentinel:<master name>`,
//! `cluster:<host:port>`, `memory`, or a custom node's name. A node's requests are counted
//! by every client that asks it; the gauge is set by the clients that suspend or restore it.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use metrics_exporter_prometheus::PrometheusBuilder;
//! use tower_redlock::Redlock;
//!
//! // The application installs an exporter once, before building its clients: here the
//! // Prometheus text format, rendered on demand (e.g. by `GET /metrics`).
//! let prometheus = PrometheusBuilder::new().install_recorder()?;
//!
//! let redlock = Redlock::in_memory();
//! redlock.lock("report", Duration::from_secs(2)).await?.release().await?;
//!
//! let text = prometheus.render();
//! assert!(text.contains("redlock_acquired_total 1"));
//! assert!(text.contains("redlock_released_total 1"));
//! assert!(text.contains(r#"redlock_acquire_duration_seconds_count{outcome="acquired"} 1"#));
//! # Ok(()) }
//! ```

#![cfg_attr(not(feature = "metrics"), allow(dead_code, unused_variables))]

use std::sync::Arc;
use std::time::Duration;

/// Counter: lock calls that took the lock.
pub const ACQUIRED: &str = "redlock_acquired_total";
/// Counter: lock calls that gave up because another holder had the lock.
pub const CONTENDED: &str = "redlock_contended_total";
/// Counter: lock calls that gave up because too few nodes answered.
pub const UNAVAILABLE: &str = "redlock_unavailable_total";
/// Counter: `lock_unless_completed` calls answered with a completion record.
pub const COMPLETED: &str = "redlock_completed_total";
/// Counter: releases that reached their quorum.
pub const RELEASED: &str = "redlock_released_total";
/// Counter: releases that did not reach their quorum.
pub const RELEASE_FAILED: &str = "redlock_release_failed_total";
/// Counter: successful extensions (manual or keep-alive).
pub const EXTENDED: &str = "redlock_extended_total";
/// Counter: leases lost while held (once per lease).
pub const LOST: &str = "redlock_lost_total";
/// Counter: completion records stored on a quorum by `Lease::complete`.
pub const RECORDED: &str = "redlock_recorded_total";
/// Counter: `Lease::complete` calls that did not store their record on a quorum.
pub const RECORD_FAILED: &str = "redlock_record_failed_total";
/// Counter: completion records that never reached a quorum, also after their retries in
/// the background.
pub const RECORD_MINORITY: &str = "redlock_record_minority_total";
/// Counter, label `outcome`: replay's answers from a record, and its stores (see the table
/// above).
pub const REPLAY: &str = "redlock_replay_total";
/// Histogram (seconds), label `outcome`: the time of a lock call, its retries included.
pub const ACQUIRE_SECONDS: &str = "redlock_acquire_duration_seconds";
/// Histogram (seconds): from the lock request to the release or completion.
pub const HOLD_SECONDS: &str = "redlock_hold_duration_seconds";
/// Histogram (seconds): the validity a lease had left at its release or completion.
pub const VALIDITY_LEFT_SECONDS: &str = "redlock_validity_left_seconds";
/// Counter, labels `node` and `kind`: node requests that failed, by kind.
pub const NODE_ERRORS: &str = "redlock_node_errors_total";
/// Gauge, label `node`: how many of the process's clients have the node suspended.
pub const NODE_SUSPENDED: &str = "redlock_node_suspended";
/// Counter, label `node`: keys not listened on at the node for the wake-up because its
/// subscriber's queue was full: their waiters poll there.
pub const WAKE_QUEUE_FULL: &str = "redlock_wake_queue_full_total";
/// Counter, by `outcome`: durable replay's steps (see the table above).
pub const DURABLE_ROWS: &str = "redlock_durable_rows_total";
/// Gauge, label `node`: releases and completions owed to the node.
pub const OWED_DEBTS: &str = "redlock_owed_debts";
/// Gauge, label `node`: the bytes of keys and records owed to the node.
pub const OWED_BYTES: &str = "redlock_owed_bytes";
/// Counter, label `ended` (`woken`, `polled`): lock calls' waits between tries.
pub const RETRY_WAITS: &str = "redlock_retry_waits_total";

/// Every metric's name, in the table's order: what dashboards and alerts may refer to.
///
/// ```
/// assert!(tower_redlock::metrics::NAMES.contains(&"redlock_lost_total"));
/// ```
pub const NAMES: &[&str] = &[
    ACQUIRED,
    CONTENDED,
    UNAVAILABLE,
    COMPLETED,
    RELEASED,
    RELEASE_FAILED,
    EXTENDED,
    LOST,
    RECORDED,
    RECORD_FAILED,
    RECORD_MINORITY,
    REPLAY,
    ACQUIRE_SECONDS,
    HOLD_SECONDS,
    VALIDITY_LEFT_SECONDS,
    NODE_ERRORS,
    NODE_SUSPENDED,
    OWED_DEBTS,
    OWED_BYTES,
    RETRY_WAITS,
    WAKE_QUEUE_FULL,
    DURABLE_ROWS,
];

/// Histogram buckets, in seconds, for every `_seconds` histogram of this crate: from a
/// millisecond (a lock on a local master) to five minutes (a long hold).
///
/// ```
/// # fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
/// use tower_redlock::metrics::SECONDS_BUCKETS;
///
/// let prometheus = PrometheusBuilder::new()
///     .set_buckets_for_metric(Matcher::Prefix("redlock_".into()), &SECONDS_BUCKETS)?
///     .install_recorder()?;
/// # let _ = prometheus; Ok(()) }
/// ```
pub const SECONDS_BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Registers the unit and a description of every metric with the installed recorder (the
/// `# HELP` lines of Prometheus), and every series that carries no `node` label, at 0 (a
/// histogram without samples): a rate or an alert over a counter sees its first increase only
/// from a sample before it.
/// Building a [`Redlock`](crate::Redlock) does it too, and registers its nodes' series; call it
/// yourself when the recorder is installed after the client is built.
pub fn describe() {
    #[cfg(feature = "metrics")]
    {
        for counter in [
            ACQUIRED,
            CONTENDED,
            UNAVAILABLE,
            COMPLETED,
            RELEASED,
            RELEASE_FAILED,
            EXTENDED,
            LOST,
            RECORDED,
            RECORD_FAILED,
            RECORD_MINORITY,
        ] {
            ::metrics::counter!(counter).increment(0);
        }
        let labelled = [
            (REPLAY, "outcome", &REPLAY_OUTCOMES[..]),
            (RETRY_WAITS, "ended", &["woken", "polled"][..]),
            (DURABLE_ROWS, "outcome", &DURABLE_OUTCOMES[..]),
        ];
        for (counter, label, values) in labelled {
            for &value in values {
                ::metrics::counter!(counter, label => value).increment(0);
            }
        }
        // A histogram registered without a sample renders its buckets at 0.
        for outcome in ["acquired", "contended", "unavailable", "completed"] {
            let _ = ::metrics::histogram!(ACQUIRE_SECONDS, "outcome" => outcome);
        }
        let _ = ::metrics::histogram!(HOLD_SECONDS);
        let _ = ::metrics::histogram!(VALIDITY_LEFT_SECONDS);
        use ::metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
        describe_counter!(ACQUIRED, "Lock calls that took the lock.");
        describe_counter!(
            CONTENDED,
            "Lock calls refused: another holder had the lock."
        );
        describe_counter!(UNAVAILABLE, "Lock calls refused: too few nodes answered.");
        describe_counter!(
            COMPLETED,
            "lock_unless_completed calls answered with a completion record."
        );
        describe_counter!(RELEASED, "Releases that reached their quorum.");
        describe_counter!(RELEASE_FAILED, "Releases that did not reach their quorum.");
        describe_counter!(EXTENDED, "Successful lease extensions.");
        describe_counter!(LOST, "Leases lost while held.");
        describe_counter!(RECORDED, "Completion records stored on a quorum.");
        describe_counter!(RECORD_FAILED, "Completion records not stored on a quorum.");
        describe_counter!(
            RECORD_MINORITY,
            "Completion records that never reached a quorum, also after their retries."
        );
        describe_counter!(
            REPLAY,
            "Replay's answers from a record and its stores, by outcome."
        );
        describe_histogram!(
            ACQUIRE_SECONDS,
            Unit::Seconds,
            "Time of a lock call, retries included, by outcome."
        );
        describe_histogram!(
            HOLD_SECONDS,
            Unit::Seconds,
            "Time from the lock request to the release or completion."
        );
        describe_histogram!(
            VALIDITY_LEFT_SECONDS,
            Unit::Seconds,
            "Validity a lease had left at its release or completion."
        );
        describe_counter!(NODE_ERRORS, "Node requests that failed, by kind.");
        describe_counter!(DURABLE_ROWS, "Durable replay's row steps, by outcome.");
        describe_gauge!(OWED_DEBTS, "Releases and completions owed to the node.");
        describe_gauge!(
            OWED_BYTES,
            Unit::Bytes,
            "Bytes of keys and records owed to the node."
        );
        describe_counter!(
            RETRY_WAITS,
            "Lock calls' waits between tries, by how they ended (woken, polled)."
        );
        describe_gauge!(
            NODE_SUSPENDED,
            "Clients of the process that have the node suspended."
        );
        describe_counter!(
            WAKE_QUEUE_FULL,
            "Keys not listened on for the wake-up: the subscriber's queue was full."
        );
    }
}

/// How a lock call ended, as the acquire histogram's `outcome` label says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Acquire {
    Acquired,
    Contended,
    Unavailable,
    Completed,
    /// The caller dropped the call before its outcome: histogram only.
    Cancelled,
}

impl Acquire {
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::Acquired => "acquired",
            Self::Contended => "contended",
            Self::Unavailable => "unavailable",
            Self::Completed => "completed",
            Self::Cancelled => "cancelled",
        }
    }
}

/// A lock call ended with `outcome` after `latency`.
pub(crate) fn acquire(outcome: Acquire, latency: Duration) {
    #[cfg(feature = "metrics")]
    {
        let name = match outcome {
            Acquire::Acquired => Some(ACQUIRED),
            Acquire::Contended => Some(CONTENDED),
            Acquire::Unavailable => Some(UNAVAILABLE),
            Acquire::Completed => Some(COMPLETED),
            Acquire::Cancelled => None,
        };
        if let Some(name) = name {
            ::metrics::counter!(name).increment(1);
        }
        ::metrics::histogram!(ACQUIRE_SECONDS, "outcome" => outcome.as_str())
            .record(latency.as_secs_f64());
    }
}

/// An extension succeeded.
pub(crate) fn extended() {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(EXTENDED).increment(1);
}

/// A lease was found lost (counted once per lease by the caller).
pub(crate) fn lost() {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(LOST).increment(1);
}

/// A lease ended: released (`completed` false) or completed, reaching its quorum (`ok`) or
/// not, after being held for `held`, with `left` of its validity.
pub(crate) fn ended(completed: bool, ok: bool, held: Duration, left: Duration) {
    #[cfg(feature = "metrics")]
    {
        let name = match (completed, ok) {
            (false, true) => RELEASED,
            (false, false) => RELEASE_FAILED,
            (true, true) => RECORDED,
            (true, false) => RECORD_FAILED,
        };
        ::metrics::counter!(name).increment(1);
        ::metrics::histogram!(HOLD_SECONDS).record(held.as_secs_f64());
        ::metrics::histogram!(VALIDITY_LEFT_SECONDS).record(left.as_secs_f64());
    }
}

/// A completion record never reached a quorum, also after its retries in the background.
pub(crate) fn record_minority() {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(RECORD_MINORITY).increment(1);
}

/// Replay answered from a record, or stored one, with `outcome` (a fixed name; see
/// [`REPLAY`]).
pub(crate) fn replay(outcome: &'static str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(REPLAY, "outcome" => outcome).increment(1);
}

/// A lock call's wait between tries ended: `woken` early, or at its poll.
pub(crate) fn retry_wait(woken: bool) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(RETRY_WAITS, "ended" => if woken { "woken" } else { "polled" })
        .increment(1);
}

/// `debts` debts holding `bytes` were owed to the node `name` (`owed`), or paid or lapsed.
/// Added and taken, not set: the clients that share a node add up.
pub(crate) fn owed(name: &Arc<str>, owed: bool, debts: usize, bytes: usize) {
    #[cfg(feature = "metrics")]
    {
        let debts_gauge = ::metrics::gauge!(OWED_DEBTS, "node" => Arc::clone(name));
        let bytes_gauge = ::metrics::gauge!(OWED_BYTES, "node" => Arc::clone(name));
        #[allow(clippy::cast_precision_loss)] // counts far below 2^52
        let (debts, bytes) = (debts as f64, bytes as f64);
        if owed {
            debts_gauge.increment(debts);
            bytes_gauge.increment(bytes);
        } else {
            debts_gauge.decrement(debts);
            bytes_gauge.decrement(bytes);
        }
    }
}

/// A step of durable replay ended with `outcome` (a fixed name; see [`DURABLE_ROWS`]).
pub(crate) fn durable_row(outcome: &'static str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(DURABLE_ROWS, "outcome" => outcome).increment(1);
}

/// A request to the node `name` failed, as a vote of `kind`.
pub(crate) fn node_failed(name: &Arc<str>, kind: crate::VoteKind) {
    #[cfg(feature = "metrics")]
    {
        use crate::VoteKind as K;
        let kind = ERROR_KINDS[match kind {
            K::Timeout => 0,
            K::Unreachable => 1,
            K::Denied => 2,
            K::Protected => 3,
            K::Abstained => 4,
            K::NoScript => 5,
            K::WrongType => 6,
            _ => 7,
        }];
        ::metrics::counter!(NODE_ERRORS, "node" => Arc::clone(name), "kind" => kind).increment(1);
    }
}

/// The node `name` was suspended by a client, or restored (or the client that suspended it
/// is gone). Added and taken, not set: the clients that share a node add up.
pub(crate) fn node_suspended(name: &Arc<str>, suspended: bool) {
    #[cfg(feature = "metrics")]
    {
        let gauge = ::metrics::gauge!(NODE_SUSPENDED, "node" => Arc::clone(name));
        if suspended {
            gauge.increment(1.0);
        } else {
            gauge.decrement(1.0);
        }
    }
}

/// The outcomes of [`REPLAY`].
const REPLAY_OUTCOMES: [&str; 6] = [
    "replayed",
    "mismatch",
    "not_stored",
    "unknown",
    "stored",
    "store_failed",
];

/// The outcomes of [`DURABLE_ROWS`].
const DURABLE_OUTCOMES: [&str; 10] = [
    "absent",
    "replayed",
    "not_stored",
    "rebuilt",
    "stored",
    "store_failed",
    "lookup_failed",
    "busy",
    "duplicate",
    "unrecorded",
];

/// The node error kinds, as the `kind` label names them.
const ERROR_KINDS: [&str; 8] = [
    "timeout",
    "unreachable",
    "denied",
    "protected",
    "abstained",
    "no_script",
    "wrong_type",
    "failed",
];

/// Every series of the node `name`, at 0 (a client was built): a rate or an alert over them
/// sees their first increase.
pub(crate) fn node_series(name: &Arc<str>) {
    #[cfg(feature = "metrics")]
    {
        for gauge in [NODE_SUSPENDED, OWED_DEBTS, OWED_BYTES] {
            ::metrics::gauge!(gauge, "node" => Arc::clone(name)).increment(0.0);
        }
        for kind in ERROR_KINDS {
            ::metrics::counter!(NODE_ERRORS, "node" => Arc::clone(name), "kind" => kind)
                .increment(0);
        }
    }
}

/// The node `name`'s wake-up subscriber refused a key: its queue was full.
pub(crate) fn wake_queue_full(name: &Arc<str>) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(WAKE_QUEUE_FULL, "node" => Arc::clone(name)).increment(1);
}

#[cfg(test)]
mod tests {
    /// `NAMES` is the table of the module's docs, row for row: a metric added to one and not
    /// the other (and so missing from the dashboards' check) fails here.
    #[test]
    fn names_are_the_documented_table() {
        let documented: Vec<&str> = include_str!("metrics.rs")
            .lines()
            .filter_map(|l| l.strip_prefix("//! | [`")?.split_once('`').map(|(n, _)| n))
            .collect();
        assert_eq!(documented, super::NAMES);
        let mut unique = super::NAMES.to_vec();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), super::NAMES.len());
    }
}
