//! Idempotent endpoints: replay a completed request's response instead of running its
//! handler again. Turned on with [`LockPolicyBuilder::replay`](crate::policy::LockPolicyBuilder::replay)
//! (or [`LockPolicy::idempotent`](crate::policy::LockPolicy::idempotent) for the common case).
//!
//! | request with key K | answer |
//! | --- | --- |
//! | first | the handler runs under K's lock; its response is stored on a quorum of masters, then the lock ends |
//! | while the first is in flight | `409` + `Retry-After` (or, waiting, the stored response once it is done) |
//! | after it completed (within the retention) | the stored response + `Idempotency-Replayed: true`; the handler does not run, nothing is locked |
//! | the same K, another request | `422` problem+json (`/problems/idempotency-key-reused`) |
//! | body over the fingerprint limit | `413` problem+json (`/problems/request-body-too-large`) |
//! | after a completion whose response was not stored (streamed, or over the response limit) | `409` problem+json (`/problems/idempotency-completed-not-stored`), no `Retry-After`: the handler never runs twice |
//! | after the first was stopped on a lost lease ([`OnLost::Abort`](crate::policy::OnLost::Abort)) | `409` problem+json (`/problems/idempotency-outcome-unknown`), no `Retry-After`, once the mark is on a quorum: it may have had its effects, and does not run again (unless [`repeatable_after_loss`](crate::policy::LockPolicyBuilder::repeatable_after_loss)) |
//! | after the first finished without its lease ([`OnLost::Finish`](crate::policy::OnLost::Finish)) | its response, stored where the key was still its own or free |
//!
//! **The request fingerprint** is a SHA-256 over the method, the path, the query, the
//! headers named with [`Replay::fingerprint_header`] and the body's SHA-256. The body is
//! buffered (up to [`Replay::body_limit`]) and handed to the handler unchanged (trailers
//! are dropped); [`Replay::without_body`] leaves the body out and streams it.
//!
//! **Stored**: responses with a status below 500 ([`Replay::store_if`] changes that): the
//! status, the headers except the framing and hop-by-hop ones (also those `Connection`
//! names), `Date` and `Set-Cookie`
//! ([`Replay::keep_header`], [`Replay::drop_header`]), and the body (trailers are not kept).
//! A `5xx` is not stored and the lock is released: the client's retry runs the handler
//! again. [`Replay::transform`] seals what is stored (encrypt, redact) and opens it on
//! replay (see [`RecordTransform`]).
//!
//! **At most once**: once the handler has started, the key is never released for a second run.
//! Sometimes no response can be stored. The inner service returned an error, the response body
//! failed while it was read (answered `500`), or the request was cancelled (a client that went
//! away, a timeout layer outside). Then the key is marked completed without a response, and retries
//! get `409` completed-not-stored.
//!
//! **Scope**: the stored response is found by the lock key. So scope the key as finely as responses
//! may be shared: by route, and by principal. For the principal, use
//! [`scoped_by_extension`](crate::key::KeyExtractorExt::scoped_by_extension) with the authenticated
//! user, or [`scoped_by_header`](crate::key::KeyExtractorExt::scoped_by_header) with a tenant
//! header. Then one tenant never receives another tenant's stored response.
//!
//! **Safety**: the record is written with the lock's token, only where that token still holds, and
//! counts once a quorum stored it. A read takes any record it finds and concludes "not done" only
//! from a quorum (fewer answers: `503`). If the record cannot be stored on a quorum, the lock is
//! not released early. Duplicates get `409` until its ttl ends (logged at warn). After that, a key
//! whose record no master kept runs again. So does a key whose replica crashed — unless the
//! key is also kept in the handler's database ([`Replay::durable`]). A request whose
//! lease was lost writes its record (its response, or the "outcome unknown" mark of an abort) where
//! the key is still its own or free. It never writes over another holder
//! (`completion_if_free_never_takes_another_holders_lock`). A duplicate that took the expired key
//! before runs (see [`OnLost`](crate::policy::OnLost)). Replay is as strong as the lock. See
//! [`Redlock::lock_unless_completed`](crate::Redlock::lock_unless_completed).
//!
//! **Costs**: a request body is buffered (up to [`Replay::body_limit`]) before the lock is
//! taken, duplicates included — bound the requests in flight (e.g. tower's
//! `ConcurrencyLimitLayer`) if that memory matters. Each completed key keeps a record of up
//! to [`Replay::response_limit`] on every master for the retention. Put compression layers
//! *outside* the lock layer: a response stored compressed would be replayed compressed.
//!
//! **Other settings**: with [`OnContention::wait`](crate::policy::OnContention::wait), a
//! duplicate in flight waits and then gets the stored response.
//! [`OnUnavailable::FailOpen`](crate::policy::OnUnavailable::FailOpen) is refused with replay (a request run unlocked could run a completed key again). The
//! request body is read *before* the lock is taken, so a slow client never holds a key.
//!
//! A stored response is replayed byte for byte by either framework: an actix-web replica
//! replays what an axum replica stored, and the reverse.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_redlock::Error> {
//! use std::time::Duration;
//! use tower_redlock::key::{IdempotencyKey, KeyExtractorExt};
//! use tower_redlock::policy::LockPolicy;
//! use tower_redlock::replay::Replay;
//! use tower_redlock::Redlock;
//!
//! let redlock = Redlock::in_memory();
//! // The common case: the Idempotency-Key header (required), scoped by route, replayed
//! // for 24 h.
//! let short = LockPolicy::idempotent(redlock.clone()).build()?;
//! // Or every knob:
//! let custom = LockPolicy::builder(redlock, IdempotencyKey::required().scoped_by_header("x-tenant"))
//!     .replay(
//!         Replay::new()
//!             .retention(Duration::from_secs(3600))
//!             .body_limit(256 * 1024)
//!             .fingerprint_header("content-type")
//!             .store_if(|status| (200..300).contains(&status)),
//!     )
//!     .build()?;
//! assert!(short.replay().is_some() && custom.replay().is_some());
//! # Ok(()) }
//! ```

// Without tower or actix-web, the middleware's part of this module has no caller.
#![cfg_attr(
    not(any(feature = "tower", feature = "actix")),
    allow(dead_code, unused_imports)
)]

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

mod fingerprint;
mod record;
mod recorder;
mod transform;

pub(crate) use fingerprint::{Fingerprint, FingerprintBuilder};
pub(crate) use record::StoredResponse;
#[cfg(any(feature = "tower", feature = "actix"))]
pub(crate) use recorder::Running;
pub(crate) use recorder::{Collector, Plan, Recorder, LOST_RECORD_PATIENCE};
pub use transform::{RecordTransform, TransformError};

/// The answer for a completed request's `record`: its stored response, or why it cannot be
/// replayed (counted as `redlock_replay_total` by outcome, with the feature `metrics`).
pub(crate) fn answer(
    record: &bytes::Bytes,
    fingerprint: &Fingerprint,
    transform: Option<&dyn RecordTransform>,
) -> Result<StoredResponse, crate::rejection::RejectionKind> {
    use crate::rejection::RejectionKind;
    let answer = record::answer(record, fingerprint, transform);
    crate::metrics::replay(match &answer {
        Ok(_) => "replayed",
        Err(RejectionKind::Mismatch) => "mismatch",
        Err(RejectionKind::OutcomeUnknown) => "unknown",
        Err(_) => "not_stored",
    });
    answer
}

/// See [`Replay::REPLAYED_HEADER`].
pub(crate) const REPLAYED_HEADER: &str = "idempotency-replayed";
/// See [`Replay::DEFAULT_RETENTION`].
pub(crate) const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// See [`Replay::DEFAULT_BODY_LIMIT`].
pub(crate) const DEFAULT_BODY_LIMIT: usize = 1 << 20;
/// See [`Replay::DEFAULT_RESPONSE_LIMIT`].
pub(crate) const DEFAULT_RESPONSE_LIMIT: usize = 64 << 10;

/// Response headers never stored: the framing and the hop-by-hop ones (RFC 9110 §7.6.1),
/// and the replay marker itself.
const NEVER_STORED: [&str; 10] = [
    "connection",
    "content-length",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "date",
    REPLAYED_HEADER,
];

/// The replay settings of a [`LockPolicy`](crate::policy::LockPolicy); see the
/// [module docs](crate::replay).
#[derive(Clone)]
#[must_use = "replay settings do nothing until given to a policy"]
pub struct Replay {
    pub(crate) retention: Duration,
    pub(crate) body_limit: Option<usize>,
    pub(crate) response_limit: usize,
    pub(crate) fingerprint_headers: Vec<Box<str>>,
    pub(crate) dropped_headers: Vec<Box<str>>,
    pub(crate) store_if: Arc<dyn Fn(u16) -> bool + Send + Sync>,
    pub(crate) transform: Option<Arc<dyn RecordTransform>>,
    pub(crate) durable: Option<crate::durable::Durable>,
}

impl Default for Replay {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Replay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Replay")
            .field("retention", &self.retention)
            .field("body_limit", &self.body_limit)
            .field("response_limit", &self.response_limit)
            .field("fingerprint_headers", &self.fingerprint_headers)
            .field("dropped_headers", &self.dropped_headers)
            .field("durable", &self.durable)
            .finish_non_exhaustive()
    }
}

impl Replay {
    /// The header added to a replayed response (`idempotency-replayed: true`).
    pub const REPLAYED_HEADER: &'static str = REPLAYED_HEADER;
    /// The default retention of a stored response (24 h).
    pub const DEFAULT_RETENTION: Duration = DEFAULT_RETENTION;
    /// The default limit of a request body buffered for the fingerprint (1 MiB).
    pub const DEFAULT_BODY_LIMIT: usize = DEFAULT_BODY_LIMIT;
    /// The default limit of a stored response: status, headers and body (64 KiB).
    pub const DEFAULT_RESPONSE_LIMIT: usize = DEFAULT_RESPONSE_LIMIT;

    /// The defaults: kept [`DEFAULT_RETENTION`](Self::DEFAULT_RETENTION) (24 h); the body
    /// fingerprinted, buffered up to [`DEFAULT_BODY_LIMIT`](Self::DEFAULT_BODY_LIMIT)
    /// (1 MiB); responses below `500` stored up to
    /// [`DEFAULT_RESPONSE_LIMIT`](Self::DEFAULT_RESPONSE_LIMIT) (64 KiB), without
    /// `Set-Cookie`.
    pub fn new() -> Self {
        Self {
            retention: DEFAULT_RETENTION,
            body_limit: Some(DEFAULT_BODY_LIMIT),
            response_limit: DEFAULT_RESPONSE_LIMIT,
            fingerprint_headers: Vec::new(),
            dropped_headers: vec!["set-cookie".into()],
            store_if: Arc::new(|status| status < 500),
            transform: None,
            durable: None,
        }
    }

    /// How long a stored response is replayed (default 24 h, at most
    /// [`Lease::MAX_RECORD_RETENTION`](crate::Lease::MAX_RECORD_RETENTION)). After it, the key runs the
    /// handler again.
    pub fn retention(mut self, retention: Duration) -> Self {
        self.retention = retention;
        self
    }

    /// The largest request body buffered for the fingerprint (default 1 MiB): a larger one
    /// is answered `413` without running the handler. A request whose `Content-Length`
    /// says so is refused before its body is read.
    pub fn body_limit(mut self, limit: usize) -> Self {
        self.body_limit = Some(limit);
        self
    }

    /// Fingerprint without the body: the body is not buffered but streamed to the handler,
    /// and a reused key with the same method, path, query and headers but another body is
    /// replayed instead of answered `422`.
    pub fn without_body(mut self) -> Self {
        self.body_limit = None;
        self
    }

    /// Adds a request header to the fingerprint (its first value and how many there are),
    /// e.g. `content-type`. Names are matched case-insensitively.
    pub fn fingerprint_header(mut self, name: impl AsRef<str>) -> Self {
        self.fingerprint_headers
            .push(name.as_ref().to_ascii_lowercase().into());
        self
    }

    /// The largest stored response, status, headers and body together (default 64 KiB, at
    /// most [`Lease::MAX_RECORD_LEN`](crate::Lease::MAX_RECORD_LEN)). A larger response, or one whose body
    /// length is not known in advance (a stream), is sent as it is and K is marked
    /// completed without it: duplicates get `409`
    /// (`/problems/idempotency-completed-not-stored`), the handler never runs twice.
    pub fn response_limit(mut self, limit: usize) -> Self {
        self.response_limit = limit;
        self
    }

    /// Which statuses are stored (default: below `500`). A response that is not stored
    /// releases the lock, and a retry runs the handler again.
    ///
    /// A gRPC response (HTTP `200` with a gRPC `content-type`) reaches `f` as its HTTP equivalent.
    /// A trailers-only one (a call that failed before its first message) reaches it as the
    /// [`GrpcCode::http_equivalent`](crate::grpc::GrpcCode::http_equivalent) of its `grpc-status`.
    /// In that case, `CANCELLED`, `DEADLINE_EXCEEDED`, `ABORTED`, `RESOURCE_EXHAUSTED` and
    /// `UNAVAILABLE` invite a retry and reach it as `503` instead. An unknown code there reaches it
    /// as `500`. A response whose status comes in the trailers reaches it as `200`, but its
    /// response is never stored (trailers are not). When `f` accepts `200` its key is marked
    /// completed without a response, else the lock is released. `content-type`, `grpc-status` and
    /// `grpc-message` of a stored gRPC response are kept even if [`drop_header`](Self::drop_header)
    /// names them.
    pub fn store_if(mut self, f: impl Fn(u16) -> bool + Send + Sync + 'static) -> Self {
        self.store_if = Arc::new(f);
        self
    }

    /// Stores a response header that is left out by default (`Set-Cookie`). The framing and
    /// hop-by-hop headers (`Content-Length`, `Transfer-Encoding`, `Connection`, …) and `Date`
    /// are never stored.
    pub fn keep_header(mut self, name: impl AsRef<str>) -> Self {
        let name = name.as_ref();
        self.dropped_headers
            .retain(|h| !h.eq_ignore_ascii_case(name));
        self
    }

    /// Leaves a response header out of the stored response.
    pub fn drop_header(mut self, name: impl AsRef<str>) -> Self {
        self.dropped_headers
            .push(name.as_ref().to_ascii_lowercase().into());
        self
    }

    /// Seals every stored response with `transform` before the write, and opens it on
    /// replay: encrypt or redact what Redis keeps (see [`RecordTransform`]).
    pub fn transform(mut self, transform: impl RecordTransform) -> Self {
        self.transform = Some(Arc::new(transform));
        self
    }

    /// Keeps every completed key in a row of the handler's own database as well, written in
    /// the handler's transaction: a crash after the commit, a Redis restart or a flush no
    /// longer means a second run. See [`durable`](crate::durable).
    pub fn durable(mut self, durable: crate::durable::Durable) -> Self {
        self.durable = Some(durable);
        self
    }

    /// Whether responses with `status` are stored.
    pub fn stores(&self, status: u16) -> bool {
        (self.store_if)(status)
    }

    /// Whether the response header `name` is stored.
    pub fn stores_header(&self, name: &str) -> bool {
        let mut never = NEVER_STORED
            .iter()
            .copied()
            .chain(self.dropped_headers.iter().map(|h| &**h));
        !never.any(|h| h.eq_ignore_ascii_case(name))
    }

    /// Checks the settings (from [`LockPolicyBuilder::build`](crate::policy::LockPolicyBuilder::build)).
    pub(crate) fn check(&self) -> crate::Result<()> {
        if self.retention < Duration::from_millis(1)
            || self.retention > crate::Lease::MAX_RECORD_RETENTION
        {
            return Err(crate::Error::invalid(format!(
                "the replay retention must be between 1 ms and {:?}",
                crate::Lease::MAX_RECORD_RETENTION
            )));
        }
        if self.response_limit > crate::Lease::MAX_RECORD_LEN {
            return Err(crate::Error::invalid(format!(
                "the replay response limit is at most {} bytes (Lease::MAX_RECORD_LEN)",
                crate::Lease::MAX_RECORD_LEN
            )));
        }
        if let Some(bad) = self
            .fingerprint_headers
            .iter()
            .chain(&self.dropped_headers)
            .find(|h| !crate::rejection::is_token(h))
        {
            return Err(crate::Error::invalid(format!(
                "{bad:?} is not a header name (a token: letters, digits, !#$%&'*+-.^_`|~)"
            )));
        }
        if let Some(durable) = &self.durable {
            durable.check()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_store_below_500_without_cookies_or_framing() {
        let r = Replay::new();
        assert!(r.stores(200) && r.stores(201) && r.stores(404) && r.stores(422));
        assert!(!r.stores(500) && !r.stores(503));
        assert!(r.stores_header("content-type") && r.stores_header("x-request-id"));
        for h in [
            "Set-Cookie",
            "content-length",
            "Transfer-Encoding",
            "connection",
            "date",
        ] {
            assert!(!r.stores_header(h), "{h}");
        }
        let r = r.keep_header("set-cookie").drop_header("X-Trace");
        assert!(r.stores_header("set-cookie") && !r.stores_header("x-trace"));
        // Framing can never be kept.
        assert!(!Replay::new()
            .keep_header("content-length")
            .stores_header("content-length"));
        assert!(Replay::new().check().is_ok());
    }

    #[test]
    fn bad_settings_say_what_to_fix() {
        let e = Replay::new().retention(Duration::ZERO).check().unwrap_err();
        assert!(
            e.is_invalid_input() && e.to_string().contains("retention"),
            "{e}"
        );
        let e = Replay::new()
            .response_limit(crate::Lease::MAX_RECORD_LEN + 1)
            .check()
            .unwrap_err();
        assert!(e.to_string().contains("response limit"), "{e}");
        let e = Replay::new()
            .fingerprint_header("bad name")
            .check()
            .unwrap_err();
        assert!(e.to_string().contains("not a header name"), "{e}");
    }
}
