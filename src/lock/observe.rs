//! What the lock client tells operators: one span per acquire, extend, release and
//! completion, with its outcome, the votes, the elapsed time and the validity as fields; a
//! `redlock.lease` span for the time a lease is held, to which background work (keep-alive,
//! a release on drop) is linked; per-node answers at debug; and the metrics of
//! [`crate::metrics`] (no-ops without the feature `metrics`).
//!
//! A span is an `Option<Span>` here, `Some` only when a subscriber wants it: without one no
//! span is built, not even a disabled one (one atomic load), nothing is hashed (a key is
//! hashed only when a subscriber formats it), and the extra clock reads are only for an
//! enabled span or for the metrics. What is left costs an in-process lock + release cycle
//! about 100 ns (+8 %) with all of it off.

use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant};

use tracing::field::{debug, display, Empty};
use tracing::level_filters::{LevelFilter, STATIC_MAX_LEVEL};
use tracing::{Instrument, Span};

use super::lease::LeaseState;
use super::records::Claim;
use super::tally::{Tally, Vote};
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

/// Records a count of votes on `span`: for, held (against), failed.
#[inline]
pub(crate) fn votes(span: Option<&Span>, t: &Tally) {
    if let Some(span) = span.filter(|s| !s.is_disabled()) {
        span.record("votes_for", t.for_);
        span.record("votes_held", t.against);
        span.record("votes_failed", t.errors.len());
    }
}

/// Node `i`'s answer, at debug.
#[inline]
pub(crate) fn answered(i: usize, vote: &Vote) {
    if !on(LevelFilter::DEBUG) {
        return;
    }
    let vote = match vote {
        Vote::For => "for",
        Vote::Fenced(_) => "for (fenced)",
        Vote::Against(_) => "against",
        Vote::Completed(_) => "completed",
    };
    tracing::debug!(node = i, vote, "node answered");
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

    /// A try was counted: its votes, at debug (the span keeps the last try's).
    #[inline]
    pub(crate) fn tried(&self, t: &Tally) {
        let Some(span) = &self.span else {
            return;
        };
        votes(Some(span), t);
        tracing::debug!(
            parent: span,
            votes_for = t.for_,
            votes_held = t.against,
            votes_failed = t.errors.len(),
            completed = t.record.is_some(),
            "try counted"
        );
    }

    /// The span of the lease granted for `key`: a child of the caller's span, following
    /// from this acquisition; it lasts as long as the lease.
    #[inline]
    pub(crate) fn lease_span(&self, key: &str) -> Option<Span> {
        let (acquire, caller) = (self.span.as_ref()?, self.caller.as_ref()?);
        let span = tracing::info_span!(parent: caller, "redlock.lease", key = %hashed(key));
        span.follows_from(acquire);
        enabled(span)
    }

    /// The call's outcome: recorded, counted, and logged when exceptional; returned.
    #[inline]
    pub(crate) fn done(mut self, result: crate::Result<Claim>) -> crate::Result<Claim> {
        self.finished = true;
        if cfg!(feature = "metrics") || self.span.is_some() {
            self.record(&result);
        }
        result
    }

    fn record(&self, result: &crate::Result<Claim>) {
        let outcome = match result {
            Ok(Claim::Locked(_)) => Some(Acquire::Acquired),
            Ok(Claim::Completed(_)) => Some(Acquire::Completed),
            Err(e) if e.is_contended() => Some(Acquire::Contended),
            Err(e) if e.is_unavailable() => Some(Acquire::Unavailable),
            // Invalid input: refused before any I/O, not counted.
            Err(_) => None,
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
            Ok(Claim::Locked(lease)) => {
                span.record("validity", debug(lease.validity()));
            }
            Ok(Claim::Completed(_)) => {}
            Err(e) => {
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

/// An extension of a lease to `ttl`: its span, following from the lease's.
#[inline]
pub(crate) fn extend_span(state: &LeaseState, ttl: Duration) -> Option<Span> {
    if !on(LevelFilter::INFO) {
        return None;
    }
    let span = tracing::info_span!(
        "redlock.extend",
        key = %hashed(state.key()),
        ?ttl,
        outcome = Empty,
        votes_for = Empty,
        votes_held = Empty,
        votes_failed = Empty,
        elapsed = Empty,
        validity = Empty,
    );
    let span = enabled(span)?;
    span.follows_from(state.span().and_then(Span::id));
    Some(span)
}

/// An extension's outcome: recorded and counted (a loss is counted where it is noticed,
/// see [`lost`]).
pub(crate) fn extended(
    span: &Option<Span>,
    t0: Option<Instant>,
    state: &LeaseState,
    r: &crate::Result<()>,
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
    span.record("validity", debug(state.validity()));
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
    pub(crate) fn start(state: &LeaseState, completing: bool) -> Self {
        let span = if !on(LevelFilter::INFO) {
            None
        } else if completing {
            enabled(tracing::info_span!(
                "redlock.complete",
                key = %hashed(state.key()),
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
                key = %hashed(state.key()),
                outcome = Empty,
                votes_for = Empty,
                votes_failed = Empty,
                elapsed = Empty,
                validity = Empty,
            ))
        };
        let t0 = clock(&span);
        let left = t0.map_or(Duration::ZERO, |now| {
            state.deadline().saturating_duration_since(now)
        });
        if let Some(span) = &span {
            span.follows_from(state.span().and_then(Span::id));
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

    /// The outcome: recorded, and counted with the hold time and the validity left.
    #[inline]
    pub(crate) fn done(&self, state: &LeaseState, r: &crate::Result<()>) {
        if let Some(t0) = self.t0 {
            let held = t0.saturating_duration_since(state.started());
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

/// A lease was found lost while held (once per lease: see `LeaseState::lose`): counted, and
/// logged at warn.
pub(crate) fn lost(state: &LeaseState, why: &str) {
    metrics::lost();
    tracing::warn!(key = %hashed(state.key()), "lease lost: {why}");
}

/// The span of a lease's keep-alive task, following from the lease's span.
pub(crate) fn keep_alive_span(state: &LeaseState) -> Span {
    let span = tracing::info_span!(parent: None, "redlock.keep_alive", key = %hashed(state.key()));
    if !span.is_disabled() {
        span.follows_from(state.span().and_then(Span::id));
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
    use std::io::Write;
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use tracing_subscriber::fmt::format::FmtSpan;

    use super::hashed;
    use crate::node::MemoryNode;
    use crate::{Claim, Redlock, Retry};

    /// The log lines of a test, written by a `fmt` subscriber.
    #[derive(Clone, Default)]
    struct Lines(Arc<Mutex<Vec<u8>>>);

    impl Write for Lines {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// With a subscriber, every lock call, extension, release and completion closes its span
    /// with its outcome; the key appears only hashed — also for a lease dropped, whose
    /// release runs in the background.
    #[test]
    fn spans_record_outcomes_and_never_the_key() {
        let lines = Lines::default();
        let writer = lines.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_span_events(FmtSpan::CLOSE)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        tracing::subscriber::with_default(subscriber, || {
            rt.block_on(async {
                let node = MemoryNode::new();
                let redlock = Redlock::builder().node(node.clone()).build().unwrap();
                let ttl = Duration::from_secs(10);
                let lease = redlock.lock("secret-resource", ttl).await.unwrap();
                let busy = redlock.try_lock("secret-resource", ttl).await.unwrap_err();
                assert!(busy.is_contended());
                lease.extend(ttl).await.unwrap();
                lease.release().await.unwrap();
                drop(redlock.lock("secret-resource", ttl).await.unwrap());
                for _ in 0..1000 {
                    if node.get("secret-resource").is_none() {
                        break;
                    }
                    tokio::task::yield_now().await;
                }
                assert_eq!(node.get("secret-resource"), None, "released on drop");
                let work = || redlock.lock_unless_completed("secret-work", ttl, Retry::never());
                match work().await.unwrap() {
                    Claim::Locked(lease) => lease.complete("done", ttl).await.unwrap(),
                    Claim::Completed(_) => panic!("first run"),
                }
                assert!(matches!(work().await.unwrap(), Claim::Completed(_)));
            });
        });
        let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
        let closed = |span: &str, outcome: &str| {
            text.lines()
                .filter(|l| l.contains(&format!("{span}{{")) && l.contains("close"))
                .filter(|l| l.contains(&format!("outcome=\"{outcome}\"")))
                .count()
        };
        assert_eq!(closed("redlock.acquire", "acquired"), 3, "{text}");
        assert_eq!(closed("redlock.acquire", "contended"), 1, "{text}");
        assert_eq!(closed("redlock.acquire", "completed"), 1, "{text}");
        assert_eq!(closed("redlock.extend", "extended"), 1, "{text}");
        assert_eq!(closed("redlock.release", "released"), 2, "{text}");
        assert_eq!(closed("redlock.complete", "completed"), 1, "{text}");
        assert!(text.contains("redlock.lease{"), "{text}");
        assert!(text.contains("try counted"), "{text}");
        assert!(
            text.contains(&hashed("secret-resource").to_string()),
            "{text}"
        );
        assert!(!text.contains("secret-resource"), "{text}");
        assert!(!text.contains("secret-work"), "{text}");
    }

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
