//! Telemetry: what the lock client tells operators. One span per acquire, extend, release
//! and completion, with its outcome, the votes, the elapsed time and the validity as fields;
//! a `redlock.lease` span for the time a lease is held, to which background work
//! (keep-alive, a release on drop) is linked; per-node answers at debug; and the metrics of
//! [`crate::metrics`] (no-ops without the feature `metrics`).
//!
//! It imports no other lock module: callers hand it plain values (keys, instants, counts,
//! the lease's span, the crate's [`Error`]) and its own outcome types ([`Votes`],
//! [`NodeVote`], [`LockOutcome`]), mapped from the lock's at the call site.
//!
//! A span is an `Option<Span>` here, `Some` only when a subscriber wants it. Without one no span is
//! built, not even a disabled one (one atomic load). Nothing is hashed (a key is hashed only when a
//! subscriber formats it), and the extra clock reads are only for an enabled span or for the
//! metrics. What is left costs an in-process lock + release cycle about 100 ns (+8 %) with all of
//! it off.

use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant};

use tracing::field::{debug, display, Empty};
use tracing::level_filters::{LevelFilter, STATIC_MAX_LEVEL};
use tracing::{Instrument, Span};

use crate::error::Error;
use crate::metrics::{self, Acquire};

/// How a Redis key appears in logs and spans: the first 8 bytes of its SHA-256, in hex —
/// never the key itself. Hashed only when formatted.
pub(crate) fn hashed(key: &str) -> KeyHash<'_> {
    KeyHash("", key)
}

/// [`hashed`] of the Redis key `prefix` + `resource`, without building it.
pub(crate) fn hashed_in<'a>(prefix: &'a str, resource: &'a str) -> KeyHash<'a> {
    KeyHash(prefix, resource)
}

/// A key (prefix, rest) shown by its short hash (see [`hashed`]).
#[derive(Clone, Copy)]
pub(crate) struct KeyHash<'a>(&'a str, &'a str);

impl fmt::Display for KeyHash<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use sha2::{Digest, Sha256};
        let digest = Sha256::new()
            .chain_update(self.0.as_bytes())
            .chain_update(self.1.as_bytes())
            .finalize();
        digest.iter().take(8).try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for KeyHash<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

/// Whether events or spans at `level` may be enabled at all (one atomic load).
#[inline]
fn on(level: LevelFilter) -> bool {
    STATIC_MAX_LEVEL >= level && LevelFilter::current() >= level
}

/// `span`, if a subscriber wants it.
#[inline]
fn enabled(span: Span) -> Option<Span> {
    (!span.is_disabled()).then_some(span)
}

/// Runs `work` inside `span`, if any: no enter and exit of a disabled span at every poll.
pub(crate) async fn within<F: Future>(span: &Option<Span>, work: F) -> F::Output {
    match span {
        None => work.await,
        Some(span) => work.instrument(span.clone()).await,
    }
}

/// Now, when a span records it or the metrics are compiled in.
#[inline]
pub(crate) fn clock(span: &Option<Span>) -> Option<Instant> {
    (cfg!(feature = "metrics") || span.is_some()).then(Instant::now)
}

fn since(t0: Option<Instant>) -> Duration {
    t0.map_or(Duration::ZERO, |t| t.elapsed())
}

/// A count of votes, as a span records it.
#[derive(Clone, Copy)]
pub(crate) struct Votes {
    /// The nodes that did what was asked.
    pub(crate) for_: usize,
    /// The nodes that refused: the key is held by another value (or no longer holds ours).
    pub(crate) held: usize,
    /// The nodes that failed or gave no answer.
    pub(crate) failed: usize,
}

/// Records a count of votes on `span`: for, held (against), failed (`counted` is asked only
/// for an enabled span).
#[inline]
pub(crate) fn votes(span: Option<&Span>, counted: impl FnOnce() -> Votes) {
    if let Some(span) = span.filter(|s| !s.is_disabled()) {
        let votes = counted();
        span.record("votes_for", votes.for_);
        span.record("votes_held", votes.held);
        span.record("votes_failed", votes.failed);
    }
}

/// One node's answer, as its debug event names it.
#[derive(Clone, Copy)]
pub(crate) enum NodeVote {
    /// The node did what was asked.
    For,
    /// The node set the key and bumped the fencing counter.
    Fenced,
    /// The node refused.
    Against,
    /// The node had the completion record.
    Completed,
}

/// Node `i`'s answer, at debug.
#[inline]
pub(crate) fn answered(i: usize, vote: NodeVote) {
    if !on(LevelFilter::DEBUG) {
        return;
    }
    let vote = match vote {
        NodeVote::For => "for",
        NodeVote::Fenced => "for (fenced)",
        NodeVote::Against => "against",
        NodeVote::Completed => "completed",
    };
    tracing::debug!(node = i, vote, "node answered");
}

/// How a lock call ended.
pub(crate) enum LockOutcome<'a> {
    /// The lock was taken; its validity ends at this instant.
    Locked(Instant),
    /// A node had the completion record (replay): nothing was locked.
    Completed,
    /// The call failed or was refused.
    Failed(&'a Error),
}

/// One lock call ([`Redlock::lock`](crate::Redlock::lock) and its variants,
/// `lock_unless_completed`): its span, the caller's span, and when it started.
pub(crate) struct Acquiring {
    pub(crate) span: Option<Span>,
    /// The span the caller was in (the request's): the lease span's parent.
    caller: Option<Span>,
    pub(crate) started: Instant,
    /// Whether the outcome was recorded: a call dropped before it (its caller gave up)
    /// is recorded as `cancelled` when this is dropped.
    finished: bool,
}

impl Acquiring {
    pub(crate) fn start(ttl: Duration, replay: bool) -> Self {
        let started = Instant::now();
        let span = on(LevelFilter::INFO)
            .then(|| {
                tracing::info_span!(
                    "redlock.acquire",
                    key = Empty,
                    ?ttl,
                    replay,
                    outcome = Empty,
                    attempts = Empty,
                    votes_for = Empty,
                    votes_held = Empty,
                    votes_failed = Empty,
                    elapsed = Empty,
                    validity = Empty,
                )
            })
            .and_then(enabled);
        let caller = span.as_ref().map(|_| Span::current());
        Self {
            span,
            caller,
            started,
            finished: false,
        }
    }

    /// The Redis key, once checked.
    #[inline]
    pub(crate) fn key(&self, key: &str) {
        if let Some(span) = &self.span {
            span.record("key", display(hashed(key)));
        }
    }

    /// A try starts (the span keeps the number of the last).
    #[inline]
    pub(crate) fn attempt(&self, attempt: u32) {
        if let Some(span) = &self.span {
            span.record("attempts", attempt);
        }
    }

    /// A try was counted: its votes, and whether a node had the completion record, at
    /// debug (the span keeps the last try's). `counted` is asked only for an enabled span.
    #[inline]
    pub(crate) fn tried(&self, counted: impl FnOnce() -> (Votes, bool)) {
        let Some(span) = &self.span else {
            return;
        };
        let (v, completed) = counted();
        votes(Some(span), || v);
        tracing::debug!(
            parent: span,
            votes_for = v.for_,
            votes_held = v.held,
            votes_failed = v.failed,
            completed,
            "try counted"
        );
    }

    /// The span of the lease granted for `key`: a child of the caller's span, following
    /// from this acquisition; it lasts as long as the lease.
    #[inline]
    pub(crate) fn lease_span(&self, key: &str) -> Option<Span> {
        let (acquire, caller) = (self.span.as_ref()?, self.caller.as_ref()?);
        let span = tracing::info_span!(
            parent: caller,
            "redlock.lease",
            key = %hashed(key),
            lost_after = tracing::field::Empty
        );
        span.follows_from(acquire);
        enabled(span)
    }

    /// The call's outcome: recorded, counted, and logged when exceptional.
    #[inline]
    pub(crate) fn done(mut self, outcome: LockOutcome<'_>) {
        self.finished = true;
        if cfg!(feature = "metrics") || self.span.is_some() {
            self.record(&outcome);
        }
    }

    fn record(&self, result: &LockOutcome<'_>) {
        let outcome = match result {
            LockOutcome::Locked(_) => Some(Acquire::Acquired),
            LockOutcome::Completed => Some(Acquire::Completed),
            LockOutcome::Failed(e) if e.is_contended() => Some(Acquire::Contended),
            LockOutcome::Failed(e) if e.is_unavailable() => Some(Acquire::Unavailable),
            // Invalid input: refused before any I/O, not counted.
            LockOutcome::Failed(_) => None,
        };
        let elapsed = self.started.elapsed();
        if let Some(outcome) = outcome {
            metrics::acquire(outcome, elapsed);
        }
        let Some(span) = &self.span else {
            return;
        };
        span.record("outcome", outcome.map_or("invalid", Acquire::as_str));
        span.record("elapsed", debug(elapsed));
        match result {
            LockOutcome::Locked(deadline) => {
                let validity = deadline.saturating_duration_since(Instant::now());
                span.record("validity", debug(validity));
            }
            LockOutcome::Completed => {}
            LockOutcome::Failed(e) => {
                if e.is_unavailable() {
                    tracing::info!(parent: span, error = %e, "lock quorum unreachable");
                } else if !e.is_contended() {
                    tracing::info!(parent: span, error = %e, "lock call refused");
                }
            }
        }
    }
}

impl Drop for Acquiring {
    /// A lock call whose future was dropped before its outcome (a request cancelled while
    /// it waited for the lock): `outcome = cancelled` on its span and in the acquire-time
    /// histogram; no counter moves (it neither got nor was refused the lock).
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let elapsed = self.started.elapsed();
        metrics::acquire(Acquire::Cancelled, elapsed);
        if let Some(span) = &self.span {
            span.record("outcome", Acquire::Cancelled.as_str());
            span.record("elapsed", debug(elapsed));
        }
    }
}

/// An extension to `ttl` of the lease of `key` (held in the span `lease`): its span,
/// following from the lease's.
#[inline]
pub(crate) fn extend_span(key: &str, lease: Option<&Span>, ttl: Duration) -> Option<Span> {
    if !on(LevelFilter::INFO) {
        return None;
    }
    let span = tracing::info_span!(
        "redlock.extend",
        key = %hashed(key),
        ?ttl,
        outcome = Empty,
        votes_for = Empty,
        votes_held = Empty,
        votes_failed = Empty,
        elapsed = Empty,
        validity = Empty,
    );
    let span = enabled(span)?;
    span.follows_from(lease.and_then(Span::id));
    Some(span)
}

/// An extension's outcome: recorded, with the lease's `validity` now (asked only for an
/// enabled span), and counted (a loss is counted where it is noticed, see [`lost`]).
pub(crate) fn extended(
    span: &Option<Span>,
    t0: Option<Instant>,
    r: &crate::Result<()>,
    validity: impl FnOnce() -> Duration,
) {
    if r.is_ok() {
        metrics::extended();
    }
    let Some(span) = span else {
        return;
    };
    let outcome = match r {
        Ok(()) => "extended",
        Err(e) if e.is_lost() => "lost",
        Err(e) if e.is_unavailable() => "unavailable",
        Err(e) if e.is_extension_limit() => "limit",
        Err(_) => "invalid",
    };
    span.record("outcome", outcome);
    span.record("elapsed", debug(since(t0)));
    span.record("validity", debug(validity()));
    if let Err(e) = r {
        if e.is_unavailable() {
            tracing::info!(parent: span, error = %e, "extension: quorum unreachable");
        }
    }
}

/// The end of a lease by its owner — a release (`completing` false) or a completion — at
/// `t0`, with the validity it had left.
pub(crate) struct Ending {
    pub(crate) span: Option<Span>,
    t0: Option<Instant>,
    left: Duration,
    completing: bool,
}

impl Ending {
    /// The end of the lease of `key` (held in the span `lease`), whose validity ends at
    /// `deadline` (asked only when a span or the metrics record it).
    pub(crate) fn start(
        key: &str,
        lease: Option<&Span>,
        deadline: impl FnOnce() -> Instant,
        completing: bool,
    ) -> Self {
        let span = if !on(LevelFilter::INFO) {
            None
        } else if completing {
            enabled(tracing::info_span!(
                "redlock.complete",
                key = %hashed(key),
                outcome = Empty,
                votes_for = Empty,
                votes_held = Empty,
                votes_failed = Empty,
                elapsed = Empty,
                validity = Empty,
            ))
        } else {
            enabled(tracing::info_span!(
                "redlock.release",
                key = %hashed(key),
                outcome = Empty,
                votes_for = Empty,
                votes_failed = Empty,
                elapsed = Empty,
                validity = Empty,
            ))
        };
        let t0 = clock(&span);
        let left = t0.map_or(Duration::ZERO, |now| {
            deadline().saturating_duration_since(now)
        });
        if let Some(span) = &span {
            span.follows_from(lease.and_then(Span::id));
            span.record("validity", debug(left));
        }
        Self {
            span,
            t0,
            left,
            completing,
        }
    }

    /// A release's nodes: released (or holding nothing of ours), and failed.
    #[inline]
    pub(crate) fn released(&self, released: usize, failed: usize) {
        if let Some(span) = &self.span {
            span.record("votes_for", released);
            span.record("votes_failed", failed);
        }
    }

    /// The outcome: recorded, and counted with the hold time (since the lock request was
    /// sent, at `started`) and the validity left.
    #[inline]
    pub(crate) fn done(&self, started: Instant, r: &crate::Result<()>) {
        if let Some(t0) = self.t0 {
            let held = t0.saturating_duration_since(started);
            metrics::ended(self.completing, r.is_ok(), held, self.left);
        }
        let Some(span) = &self.span else {
            return;
        };
        let outcome = match (r, self.completing) {
            (Ok(()), false) => "released",
            (Ok(()), true) => "completed",
            (Err(e), _) if e.is_lost() => "lost",
            (Err(e), _) if e.is_invalid_input() => "invalid",
            (Err(_), false) => "failed",
            (Err(_), true) => "unavailable",
        };
        span.record("outcome", outcome);
        span.record("elapsed", debug(since(self.t0)));
    }
}

/// The lease of `key` was found lost while held (once per lease: see `LeaseState::lose`),
/// `after` its lock request was sent: counted, recorded on the lease's span (`lost_after`),
/// and logged at warn in it.
pub(crate) fn lost(key: &str, why: &str, after: Duration, lease: Option<&Span>) {
    metrics::lost();
    match lease {
        Some(span) => {
            span.record("lost_after", debug(after));
            tracing::warn!(parent: span, key = %hashed(key), lost_after = ?after, "lease lost: {why}");
        }
        None => tracing::warn!(key = %hashed(key), lost_after = ?after, "lease lost: {why}"),
    }
}

/// The span of the keep-alive task of the lease of `key`, following from the lease's span
/// (`lease`).
pub(crate) fn keep_alive_span(key: &str, lease: Option<&Span>) -> Span {
    let span = tracing::info_span!(parent: None, "redlock.keep_alive", key = %hashed(key));
    if !span.is_disabled() {
        span.follows_from(lease.and_then(Span::id));
    }
    span
}

/// A span for background work started from the current span (the request's): the rest of
/// a release, the requests still in flight at a decision, a cancelled try's release.
pub(crate) fn background(kind: Background) -> Span {
    let span = match kind {
        Background::Stragglers => tracing::debug_span!(parent: None, "redlock.stragglers"),
        Background::Settle => tracing::debug_span!(parent: None, "redlock.settle"),
        Background::ReleaseRest => tracing::debug_span!(parent: None, "redlock.release_rest"),
        Background::Cancelled => tracing::debug_span!(parent: None, "redlock.cancelled"),
        Background::Completing => tracing::debug_span!(parent: None, "redlock.completing"),
        Background::Owed => tracing::debug_span!(parent: None, "redlock.owed"),
    };
    if !span.is_disabled() {
        span.follows_from(Span::current());
    }
    span
}

/// Which background work (see [`background`]).
#[derive(Clone, Copy)]
pub(crate) enum Background {
    /// The requests still in flight when an extension or a completion was decided.
    Stragglers,
    /// A replay try that found a record: its requests still in flight, and their release.
    Settle,
    /// The part of a release that goes on after the caller's quorum.
    ReleaseRest,
    /// The release of a try whose caller went away mid-flight.
    Cancelled,
    /// A completion that lacks its quorum, asked again where the lease's lock may hold.
    Completing,
    /// The releases and completions a node is owed, paid when it answers again.
    Owed,
}

#[cfg(test)]
mod tests {
    use super::hashed;

    #[test]
    fn a_key_is_shown_by_a_short_stable_hash() {
        let h = hashed("resource_key").to_string();
        assert_eq!(h.len(), 16);
        assert!(h.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(h, hashed("resource_key").to_string());
        assert_ne!(h, hashed("resource_kez").to_string());
        assert!(!h.contains("resource"));
        assert_eq!(format!("{:?}", hashed("")), "e3b0c44298fc1c14");
        // The HTTP layer's events hash prefix and resource apart: the same value.
        assert_eq!(
            super::hashed_in("app:", "resource_key").to_string(),
            hashed("app:resource_key").to_string()
        );
    }
}
