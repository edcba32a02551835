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
//! | after the first was stopped on a lost lease ([`OnLost::Abort`](crate::policy::OnLost::Abort)) | `409` problem+json (`/problems/idempotency-outcome-unknown`), no `Retry-After`, once the mark is on a quorum: it may have had its effects, and does not run again (unless [`repeatable_after_loss`](crate::policy::LockPolicyBuilder::repeatable_after_loss); `on_lost_abort_with_replay_answers_outcome_unknown`) |
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
//! **At most once**: once the handler has started, the key is never released for a second
//! run. When no response can be stored — the inner service returned an error, the response
//! body failed while it was read (answered `500`), or the request was cancelled (a client
//! that went away, a timeout layer outside) — the key is marked completed without a
//! response, and retries get `409` completed-not-stored.
//!
//! **Scope**: the stored response is found by the lock key, so scope the key as finely as
//! responses may be shared — by route, and by principal
//! ([`scoped_by_extension`](crate::key::KeyExtractorExt::scoped_by_extension) with the
//! authenticated user, or [`scoped_by_header`](crate::key::KeyExtractorExt::scoped_by_header)
//! with a tenant header): one tenant never receives another tenant's stored response.
//!
//! **Safety**: the record is written with the lock's token, only where that token still
//! holds, and counts once a quorum stored it; a read takes any record it finds and
//! concludes "not done" only from a quorum (fewer answers: `503`). If the record cannot be
//! stored on a quorum, the lock is not released early: duplicates get `409` until its ttl
//! ends (logged at warn); after that, a key whose record no master kept runs again. So does
//! a key whose replica crashed. A request whose lease was lost writes its record (its
//! response, or the "outcome unknown" mark of an abort) where the key is still its own or
//! free, never over another holder (`completion_if_free_never_takes_another_holders_lock`): a
//! duplicate that took the expired key before runs (see
//! [`OnLost`](crate::policy::OnLost)). Replay is as strong as the lock. See
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

pub use crate::http::replay::{RecordTransform, Replay, TransformError};
