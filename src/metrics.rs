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
//! | [`redlock_replayed_total`](REPLAYED) | counter | | HTTP requests answered with a stored response (replay) |
//! | [`redlock_acquire_duration_seconds`](ACQUIRE_SECONDS) | histogram | `outcome`: `acquired`, `contended`, `unavailable`, `completed`, `cancelled` (the caller dropped the call before its outcome: no counter moves) | the time of a lock call, its retries included |
//! | [`redlock_hold_duration_seconds`](HOLD_SECONDS) | histogram | | from the lock request to the release or completion |
//! | [`redlock_validity_left_seconds`](VALIDITY_LEFT_SECONDS) | histogram | | the validity a lease had left at its release or completion (0: it ran out) |
//! | [`redlock_node_errors_total`](NODE_ERRORS) | counter | `node` | node requests that failed with an answer or a connection error |
//! | [`redlock_node_timeouts_total`](NODE_TIMEOUTS) | counter | `node` | node requests that got no answer within the node timeout |
//! | [`redlock_node_suspended`](NODE_SUSPENDED) | gauge | `node` | 1 while the node is suspended (see [`Redlock::node_status`](crate::Redlock::node_status)), else 0 |
//! | [`redlock_wake_queue_full_total`](WAKE_QUEUE_FULL) | counter | `node` | contended keys the node's wake-up subscriber did not listen on because its queue held its capacity (4,096 keys) already: their waiters poll there ([`RedlockBuilder::wake_waiters`](crate::RedlockBuilder::wake_waiters)) |
//! | [`redlock_durable_rows_total`](DURABLE_ROWS) | counter | `outcome`: `absent` (a lookup that found no row: the handler runs), `replayed` (answered from a key's row), `not_stored` (a row without its response), `rebuilt` (its response rebuilt by `Durable::rebuild`'s hook), `stored` (a response stored in a row), `store_failed`, `lookup_failed` (the lookup failed or the lease ran out meanwhile: answered `503`), `busy` (a lock timeout, serialization failure or deadlock: `409`), `duplicate` (a handler's insert met the committed row), `unrecorded` (a handler under durable replay that did not record the row) | [durable replay](crate::durable)'s steps |
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
/// Counter: HTTP requests answered with a stored response (replay).
pub const REPLAYED: &str = "redlock_replayed_total";
/// Histogram (seconds), label `outcome`: the time of a lock call, its retries included.
pub const ACQUIRE_SECONDS: &str = "redlock_acquire_duration_seconds";
/// Histogram (seconds): from the lock request to the release or completion.
pub const HOLD_SECONDS: &str = "redlock_hold_duration_seconds";
/// Histogram (seconds): the validity a lease had left at its release or completion.
pub const VALIDITY_LEFT_SECONDS: &str = "redlock_validity_left_seconds";
/// Counter, label `node`: node requests that failed with an answer or a connection error.
pub const NODE_ERRORS: &str = "redlock_node_errors_total";
/// Counter, label `node`: node requests that got no answer within the node timeout.
pub const NODE_TIMEOUTS: &str = "redlock_node_timeouts_total";
/// Gauge, label `node`: 1 while the node is suspended, else 0.
pub const NODE_SUSPENDED: &str = "redlock_node_suspended";
/// Counter, label `node`: keys not listened on at the node for the wake-up because its
/// subscriber's queue was full: their waiters poll there.
pub const WAKE_QUEUE_FULL: &str = "redlock_wake_queue_full_total";
/// Counter, by `outcome`: durable replay's steps (see the table above).
pub const DURABLE_ROWS: &str = "redlock_durable_rows_total";

/// Registers the unit and a description of every metric with the installed recorder (the
/// `# HELP` lines of Prometheus). Building a [`Redlock`](crate::Redlock) does it too; call
/// it yourself when the recorder is installed after the client is built.
pub fn describe() {
    #[cfg(feature = "metrics")]
    {
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
        describe_counter!(REPLAYED, "HTTP requests answered with a stored response.");
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
        describe_counter!(NODE_ERRORS, "Node requests that failed.");
        describe_counter!(DURABLE_ROWS, "Durable replay's row steps, by outcome.");
        describe_counter!(NODE_TIMEOUTS, "Node requests that got no answer in time.");
        describe_gauge!(NODE_SUSPENDED, "1 while the node is suspended, else 0.");
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

/// An HTTP request was answered with its stored response.
pub(crate) fn replayed() {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(REPLAYED).increment(1);
}

/// A step of durable replay ended with `outcome` (a fixed name; see [`DURABLE_ROWS`]).
pub(crate) fn durable_row(outcome: &'static str) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(DURABLE_ROWS, "outcome" => outcome).increment(1);
}

/// A request to the node `name` failed: no answer in time (`timeout`), or an error.
pub(crate) fn node_failed(name: &Arc<str>, timeout: bool) {
    #[cfg(feature = "metrics")]
    {
        let metric = if timeout { NODE_TIMEOUTS } else { NODE_ERRORS };
        ::metrics::counter!(metric, "node" => Arc::clone(name)).increment(1);
    }
}

/// The node `name` was suspended, or restored.
pub(crate) fn node_suspended(name: &Arc<str>, suspended: bool) {
    #[cfg(feature = "metrics")]
    ::metrics::gauge!(NODE_SUSPENDED, "node" => Arc::clone(name))
        .set(f64::from(u8::from(suspended)));
}

/// The node `name`'s wake-up subscriber refused a key: its queue was full.
pub(crate) fn wake_queue_full(name: &Arc<str>) {
    #[cfg(feature = "metrics")]
    ::metrics::counter!(WAKE_QUEUE_FULL, "node" => Arc::clone(name)).increment(1);
}
