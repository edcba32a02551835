//! Why a node call failed: [`CallError`], and the kinds of refusal ([`Refusal`]) a node can
//! report, as the built-in voters do.

use std::fmt;

use super::redis as redis_node;
#[cfg(doc)]
use super::Node;

/// Why a node call failed.
#[derive(Debug)]
pub struct CallError {
    timeout: bool,
    unreachable: bool,
    /// A default of the trait: the node does not do what was asked at all.
    unsupported: bool,
    /// The voter refused here, without asking the node (it abstains): neither a reply nor a
    /// silence of the node.
    local: bool,
    /// What kind of refusal an error reply was (for [`Error::votes`](crate::Error::votes)).
    refusal: Refusal,
    message: String,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

/// What kind of refusal a node's error was, as [`VoteKind`](crate::VoteKind) names it in
/// [`Error::votes`](crate::Error::votes): set by [`CallError::with_refusal`].
///
/// ```
/// use tower_redlock::node::{CallError, Refusal};
///
/// let e = CallError::new("the store's ACL refuses the key").with_refusal(Refusal::Denied);
/// assert_eq!(e.refusal(), Refusal::Denied);
/// assert_eq!(CallError::new("boom").refusal(), Refusal::Other);
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// Any other failure.
    #[default]
    Other,
    /// `NOSCRIPT`: the script is not loaded, and could not be sent.
    NoScript,
    /// `WRONGTYPE`, or a key the voter will not overwrite: a key of another kind is there.
    WrongType,
    /// `NOAUTH`, `WRONGPASS`, `NOPERM`: the credentials or the ACL refuse the command.
    Denied,
    /// Delayed-restart (tenure) protection: the master is too young to vote.
    Protected,
    /// The voter refused on its own (a Sentinel group without a recent majority, a master
    /// that may evict).
    Abstained,
}

impl CallError {
    /// A failure with a message.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            timeout: false,
            unreachable: false,
            unsupported: false,
            local: false,
            refusal: Refusal::Other,
            message: message.into(),
            source: None,
        }
    }

    /// A failure caused by `source`.
    pub fn from_error(source: impl std::error::Error + Send + Sync + 'static) -> Self {
        let mut e = Self::new(source.to_string());
        e.source = Some(Box::new(source));
        e
    }

    /// A node without completion records: the default of [`Node::complete`], and the
    /// client's answer in the place of a node that does not declare them.
    pub(super) fn no_records(name: &str) -> Self {
        Self::new(format!("{name} does not store completion records"))
    }

    /// A node without operator calls (the default of [`Node::operate`], and the client's
    /// answer in the place of a node that does not declare them).
    pub(super) fn unsupported_by(name: &str, what: &str) -> Self {
        Self {
            unsupported: true,
            ..Self::new(format!("{name} does not support {what}"))
        }
    }

    /// A node without fencing counters: the client's answer to a fenced request in the place
    /// of a node that does not declare them (a release or completion falls back to the plain
    /// form on it).
    pub(super) fn no_fencing(name: &str) -> Self {
        Self {
            unsupported: true,
            ..Self::new(format!("{name} does not keep fencing counters"))
        }
    }

    /// Whether the node does not keep fencing counters (see [`CallError::no_fencing`]).
    pub(crate) fn is_unsupported(&self) -> bool {
        self.unsupported
    }

    /// Marks the failure as the voter's own refusal, made without asking the node (it
    /// abstains): it says nothing of the node's health.
    pub(crate) fn abstaining(mut self) -> Self {
        self.local = true;
        self.refusal = Refusal::Abstained;
        self
    }

    /// Marks the failure as a refusal of this kind: the vote is reported as that kind
    /// ([`VoteKind`](crate::VoteKind)). A refusal is a reply: the node is there (for its
    /// health, only [`with_timeout`](Self::with_timeout) and
    /// [`with_unreachable`](Self::with_unreachable) count against it).
    #[must_use]
    pub fn with_refusal(mut self, refusal: Refusal) -> Self {
        self.refusal = refusal;
        self
    }

    /// What kind of refusal it was ([`Refusal::Other`] unless marked).
    pub fn refusal(&self) -> Refusal {
        self.refusal
    }

    /// Whether the voter refused without asking the node (see [`CallError::abstaining`]).
    pub(crate) fn is_local(&self) -> bool {
        self.local
    }

    /// Mark the failure as a timeout.
    #[must_use]
    pub fn with_timeout(mut self) -> Self {
        self.timeout = true;
        self
    }

    /// Whether the node did not answer in time.
    pub fn is_timeout(&self) -> bool {
        self.timeout
    }

    /// Mark the failure as "the node could not be reached" (connection refused, dropped,
    /// not yet made): no reply came from the node. Such failures count toward its
    /// suspension, like timeouts; a reply — even an error reply — shows the node is there.
    #[must_use]
    pub fn with_unreachable(mut self) -> Self {
        self.unreachable = true;
        self
    }

    /// Whether the node could not be reached (see [`CallError::with_unreachable`]).
    pub fn is_unreachable(&self) -> bool {
        self.unreachable
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CallError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<::redis::RedisError> for CallError {
    fn from(e: ::redis::RedisError) -> Self {
        if let Some(abstains) = redis_node::eviction_refusal(&e) {
            return abstains;
        }
        let timeout = e.is_timeout();
        let unreachable = redis_node::conn::connection_lost(&e);
        let local = redis_node::conn::is_abstention(&e);
        let refusal = match e.code() {
            _ if local => Refusal::Abstained,
            _ if e.kind() == ::redis::ErrorKind::AuthenticationFailed => Refusal::Denied,
            Some("NOSCRIPT") => Refusal::NoScript,
            Some("WRONGTYPE") => Refusal::WrongType,
            Some("NOPERM" | "NOAUTH" | "WRONGPASS") => Refusal::Denied,
            _ => Refusal::Other,
        };
        let mut f = Self::from_error(e);
        f.timeout = timeout;
        f.unreachable = unreachable;
        f.local = local;
        f.refusal = refusal;
        f
    }
}
