//! The crate's one error type.
//!
//! [`Error`] is opaque, like hyper's and redis-rs' errors: ask it what happened with the
//! `is_*()` predicates or [`Error::kind`], and read the details a caller can act on
//! ([`Error::retry_after`], [`Error::held_by`], [`Error::node_errors`]).
//!
//! The three outcomes a caller must tell apart are kept apart:
//!
//! * **contended** — the resource is held by someone else ([`Error::is_contended`]);
//! * **unavailable** — too many nodes failed or timed out to reach a quorum, and none said
//!   "held" ([`Error::is_unavailable`]); each node's error is in [`Error::node_errors`];
//! * **invalid input** — the call or the configuration was wrong and nothing was locked
//!   ([`Error::is_invalid_input`]); the message says what to fix.

use std::fmt;
use std::time::Duration;

mod votes;

pub(crate) use self::votes::Ballots;
pub use self::votes::{Vote, VoteKind};

/// What kind of failure an [`Error`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The resource is held by someone else: no quorum, and at least one node answered
    /// "held" (see [`Error`] for the exact rule).
    Contended,
    /// A quorum could not be reached because nodes failed, timed out, or answered too slowly
    /// to leave any validity.
    Unavailable,
    /// The lease is no longer held: it expired, or the nodes no longer carry its token.
    Lost,
    /// The lease was extended as many times as the configured cap allows.
    ExtensionLimit,
    /// A bad argument or configuration. Nothing was locked.
    InvalidInput,
}

/// Why a single node did not give its vote.
#[derive(Debug)]
pub struct NodeError {
    node: usize,
    name: std::sync::Arc<str>,
    detail: Detail,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

/// What went wrong, formatted only when displayed (no allocation on the hot path).
#[derive(Debug)]
enum Detail {
    /// No answer within the node timeout.
    Timeout(Duration),
    /// Not asked: the node is suspended after repeated timeouts.
    Suspended,
    /// The node's own failure (its message; timeout or not; whether it reached the node).
    Failure {
        message: String,
        timeout: bool,
        unreachable: bool,
        refusal: crate::node::Refusal,
    },
}

impl NodeError {
    pub(crate) fn timeout(node: usize, name: std::sync::Arc<str>, after: Duration) -> Self {
        Self {
            node,
            name,
            detail: Detail::Timeout(after),
            source: None,
        }
    }

    /// The node was not asked: it is suspended after repeated timeouts (see
    /// [`RedlockBuilder::suspend_after`](crate::RedlockBuilder::suspend_after)).
    pub(crate) fn suspended(node: usize, name: std::sync::Arc<str>) -> Self {
        Self {
            node,
            name,
            detail: Detail::Suspended,
            source: None,
        }
    }

    pub(crate) fn from_source(
        node: usize,
        name: std::sync::Arc<str>,
        source: crate::node::CallError,
    ) -> Self {
        Self {
            node,
            name,
            detail: Detail::Failure {
                message: source.to_string(),
                timeout: source.is_timeout(),
                unreachable: source.is_unreachable(),
                refusal: source.refusal(),
            },
            source: Some(Box::new(source)),
        }
    }

    /// The index of the node in the client's node list.
    pub fn node(&self) -> usize {
        self.node
    }

    /// The node's name: `host:port` for Redis (never the password), `memory` for the in-memory
    /// node.
    pub fn node_name(&self) -> &str {
        &self.name
    }

    /// Whether the node did not answer within the per-node timeout — or was not asked
    /// because it is suspended after repeated timeouts ([`NodeError::is_suspended`]).
    pub fn is_timeout(&self) -> bool {
        match self.detail {
            Detail::Timeout(_) | Detail::Suspended => true,
            Detail::Failure { timeout, .. } => timeout,
        }
    }

    /// Whether asking again may succeed: no answer came (a timeout, a connection that could
    /// not be used). A reply that refused (an error reply) would refuse again; a suspended
    /// node is not asked.
    pub(crate) fn is_transient(&self) -> bool {
        match self.detail {
            Detail::Timeout(_) => true,
            Detail::Suspended => false,
            Detail::Failure {
                timeout,
                unreachable,
                ..
            } => timeout || unreachable,
        }
    }

    /// Whether the node was not asked at all: it timed out repeatedly, and is skipped until a
    /// probe request gets an answer from it.
    pub fn is_suspended(&self) -> bool {
        matches!(self.detail, Detail::Suspended)
    }
}

impl NodeError {
    /// What went wrong, without the node's name, on one line.
    pub(crate) fn fmt_detail(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.detail {
            Detail::Timeout(after) => write!(f, "no answer within {after:?}"),
            Detail::Suspended => f.write_str(
                "not asked: suspended after repeated timeouts, until a probe gets an answer",
            ),
            // A server's message may span lines: an error is displayed on one.
            Detail::Failure { message, .. } => message
                .split(['\r', '\n'])
                .filter(|l| !l.is_empty())
                .enumerate()
                .try_for_each(|(i, l)| {
                    if i > 0 {
                        f.write_str(" ")?;
                    }
                    f.write_str(l.trim())
                }),
        }
    }
}

impl fmt::Display for NodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "node {} ({}): ", self.node, self.name)?;
        self.fmt_detail(f)
    }
}

impl std::error::Error for NodeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// The error returned by every fallible operation of this crate.
///
/// # Contended or unavailable: the rule
///
/// A try that did not reach a quorum is **contended** when at least one node it asked
/// answered "held" (by another value) within the node timeout — however many other nodes
/// failed, timed out or were skipped as suspended. It is **unavailable** only when no node
/// said "held". To keep that true, a failure is never decided on errors alone while an
/// asked node may still answer: the try waits for it (at most its node timeout). A quorum
/// that answered too slowly to leave any validity is unavailable too.
///
/// [`Error::retry_after`] is the holder's remaining ttl: the shortest among the nodes that
/// reported a live holder with their answer (in-process nodes, the restart-guarded script);
/// otherwise one node that said "held" is asked for it (`PTTL`) once, when the error is
/// returned — not on every try of a retry loop. A node that cannot tell (the key vanished
/// meanwhile, or has no expiry) never shortens it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::time::Duration;
/// use tower_redlock::Redlock;
///
/// let redlock = Redlock::in_memory();
/// let _held = redlock.try_lock("invoice:7", Duration::from_secs(5)).await.unwrap();
/// let err = redlock.try_lock("invoice:7", Duration::from_secs(5)).await.unwrap_err();
/// assert!(err.is_contended());
/// assert_eq!(err.held_by(), 1);
/// assert!(err.retry_after().unwrap() <= Duration::from_secs(5));
/// # }
/// ```
pub struct Error {
    inner: Box<Inner>,
}

struct Inner {
    kind: ErrorKind,
    /// Empty for a contended error: its message is made from the counts when displayed (a
    /// contended try is common and must cost no formatting).
    message: String,
    held_by: usize,
    /// For a contended error: how many nodes were asked, and the first that said "held".
    nodes_total: usize,
    holder: Option<usize>,
    won: usize,
    retry_after: Option<Duration>,
    attempts: u32,
    nodes: Vec<NodeError>,
    /// Every voter's answer, for a lock's error (see [`Error::votes`]).
    ballots: Option<Ballots>,
    /// A replay acquire's nodes answered with completion records, but too few to make an
    /// answer: the work ran, so the middleware never fails open on it.
    found_records: bool,
}

impl Error {
    fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            inner: Box::new(Inner {
                kind,
                message: message.into(),
                held_by: 0,
                nodes_total: 0,
                holder: None,
                won: 0,
                retry_after: None,
                attempts: 0,
                nodes: Vec::new(),
                ballots: None,
                found_records: false,
            }),
        }
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidInput, message)
    }

    pub(crate) fn lost(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Lost, message)
    }

    pub(crate) fn extension_limit(max: u32) -> Self {
        Self::new(
            ErrorKind::ExtensionLimit,
            format!("the lease was already extended {max} times (the configured maximum)"),
        )
    }

    pub(crate) fn contended(
        held_by: usize,
        won: usize,
        nodes: usize,
        retry_after: Option<Duration>,
        errors: Vec<NodeError>,
    ) -> Self {
        let mut e = Self::new(ErrorKind::Contended, String::new());
        e.inner.held_by = held_by;
        e.inner.nodes_total = nodes;
        e.inner.won = won;
        e.inner.retry_after = retry_after;
        e.inner.nodes = errors;
        e
    }

    /// Records the first node that said "held": asked for the holder's remaining ttl when no
    /// node reported one.
    pub(crate) fn with_holder(mut self, node: usize) -> Self {
        self.inner.holder = Some(node);
        self
    }

    /// The node to ask for the holder's remaining ttl, when no node reported one yet.
    pub(crate) fn holder_to_ask(&self) -> Option<usize> {
        self.inner
            .holder
            .filter(|_| self.inner.retry_after.is_none())
    }

    /// Sets the holder's remaining ttl (asked after the try, from `node`).
    pub(crate) fn set_retry_after(&mut self, node: usize, remaining: Duration) {
        self.inner.retry_after = Some(remaining);
        if let Some(b) = &mut self.inner.ballots {
            b.ttls.push((node, remaining));
        }
    }

    /// Keeps every voter's answer to the try (see [`Error::votes`]).
    pub(crate) fn with_ballots(mut self, ballots: Ballots) -> Self {
        self.inner.ballots = Some(ballots);
        self
    }

    pub(crate) fn unavailable(message: impl Into<String>, errors: Vec<NodeError>) -> Self {
        let mut e = Self::new(ErrorKind::Unavailable, message);
        e.inner.nodes = errors;
        e
    }

    /// An unavailable error of a replay acquire that found completion records (see
    /// `Inner::found_records`).
    pub(crate) fn with_records(mut self) -> Self {
        self.inner.found_records = true;
        self
    }

    /// Whether nodes answered with completion records (see [`Error::with_records`]).
    pub(crate) fn found_records(&self) -> bool {
        self.inner.found_records
    }

    pub(crate) fn with_attempts(mut self, attempts: u32) -> Self {
        self.inner.attempts = attempts;
        self
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.inner.kind
    }

    /// The resource is held by someone else.
    pub fn is_contended(&self) -> bool {
        self.inner.kind == ErrorKind::Contended
    }

    /// Too many nodes failed or timed out to reach a quorum: the lock service is unavailable.
    pub fn is_unavailable(&self) -> bool {
        self.inner.kind == ErrorKind::Unavailable
    }

    /// The failure was caused by timeouts only: every node error was a timeout, or the
    /// answers came too late to leave any validity.
    pub fn is_timeout(&self) -> bool {
        self.inner.kind == ErrorKind::Unavailable
            && (self.inner.nodes.is_empty() || self.inner.nodes.iter().all(NodeError::is_timeout))
    }

    /// The lease is no longer held (it expired, or the nodes no longer carry its token).
    pub fn is_lost(&self) -> bool {
        self.inner.kind == ErrorKind::Lost
    }

    /// The lease reached the configured maximum number of extensions.
    pub fn is_extension_limit(&self) -> bool {
        self.inner.kind == ErrorKind::ExtensionLimit
    }

    /// A bad argument or configuration; nothing was locked.
    pub fn is_invalid_input(&self) -> bool {
        self.inner.kind == ErrorKind::InvalidInput
    }

    /// How many nodes said the resource is held (0 for an unavailable quorum: see the rule
    /// above).
    pub fn held_by(&self) -> usize {
        self.inner.held_by
    }

    /// For a contended lock: how many nodes this try had won before backing off. Above zero,
    /// the votes were likely split between concurrent requests (or a holder's SET missed a
    /// node), and a quick retry is likely to succeed.
    pub fn votes_won(&self) -> usize {
        self.inner.won
    }

    /// For a contended lock: the holder's remaining ttl (see the rule above), a fair time to
    /// wait before trying again. `None` when no node could tell (the holder set no expiry,
    /// or its key vanished meanwhile).
    pub fn retry_after(&self) -> Option<Duration> {
        self.inner.retry_after
    }

    /// How many tries were made before giving up (0 when the error came before any try).
    pub fn attempts(&self) -> u32 {
        self.inner.attempts
    }

    /// The errors of the nodes that did not answer, in the order they failed.
    pub fn node_errors(&self) -> &[NodeError] {
        &self.inner.nodes
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Error");
        d.field("kind", &self.inner.kind)
            .field("message", &format_args!("{:?}", Message(self)));
        if self.inner.kind == ErrorKind::Contended {
            d.field("held_by", &self.inner.held_by)
                .field("retry_after", &self.inner.retry_after);
        }
        if self.inner.attempts > 0 {
            d.field("attempts", &self.inner.attempts);
        }
        if !self.inner.nodes.is_empty() {
            d.field("nodes", &self.inner.nodes);
        }
        d.finish()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&Message(self), f)?;
        if self.inner.attempts > 1 {
            write!(f, " after {} tries", self.inner.attempts)?;
        }
        if self.inner.ballots.is_some() {
            for (i, vote) in self.votes().enumerate() {
                f.write_str(if i == 0 { ": " } else { "; " })?;
                fmt::Display::fmt(&vote, f)?;
            }
            return Ok(());
        }
        for (i, e) in self.inner.nodes.iter().enumerate() {
            f.write_str(if i == 0 { ": " } else { "; " })?;
            fmt::Display::fmt(e, f)?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.inner
            .nodes
            .first()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// An error's own message, without the node errors.
struct Message<'a>(&'a Error);

impl fmt::Display for Message<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let e = &self.0.inner;
        if e.kind == ErrorKind::Contended && e.message.is_empty() {
            write!(
                f,
                "resource is held by someone else ({} of {} nodes said held)",
                e.held_by, e.nodes_total
            )
        } else {
            f.write_str(&e.message)
        }
    }
}

impl fmt::Debug for Message<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.to_string(), f)
    }
}

/// A `Result` whose error is this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
