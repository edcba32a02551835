//! One voter in the quorum.
//!
//! A [`Node`] is one independent lock server: a Redis master ([`RedisNode`]) or an in-process
//! map ([`MemoryNode`]). [`Redlock`](crate::Redlock) asks every node in parallel and counts
//! their votes; a node knows nothing of quorums, retries or HTTP.
//!
//! Implement [`Node`] yourself to vote with another store; the conformance tests in
//! `tests/` show the semantics every node must keep (owner-only release and extend, expiry,
//! an expired key never re-created by an extend).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

mod memory;
mod redis;

pub use self::memory::MemoryNode;
pub use self::redis::{RedisNode, RedisNodeOptions};

/// The future a [`Node`] returns: boxed, `Send`, borrowing its arguments.
pub type NodeFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, NodeFailure>> + Send + 'a>>;

/// A node's answer to "set this key if it is absent".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquire {
    /// The key was absent and now holds our token with the requested ttl.
    Acquired,
    /// The key is held by another value; `remaining` is its remaining ttl (`None` when the
    /// key has no expiry).
    Held {
        /// The holder's remaining time to live, when it has one.
        remaining: Option<Duration>,
    },
}

/// One lock server voting in the quorum.
///
/// Every method must be atomic on the node and must not re-create an absent key except in
/// [`Node::acquire`]. Implementations need not apply timeouts: the client wraps every call
/// in its per-node timeout.
pub trait Node: fmt::Debug + Send + Sync + 'static {
    /// A short name for errors and logs (`host:port`; never a password).
    fn name(&self) -> String;

    /// Set `key` to `token` with a time to live of `ttl`, only if `key` is absent.
    fn acquire<'a>(
        &'a self,
        key: &'a str,
        token: &'a str,
        ttl: Duration,
    ) -> NodeFuture<'a, Acquire>;

    /// Delete `key` only if it holds `token`. Returns whether it was deleted.
    fn release<'a>(&'a self, key: &'a str, token: &'a str) -> NodeFuture<'a, bool>;

    /// The longest ttl this node accepts, if it limits it (delayed-restart protection). The
    /// client refuses longer locks up front.
    fn max_ttl(&self) -> Option<Duration> {
        None
    }

    /// Set the time to live of `key` to `ttl`, only if it holds `token`. Returns whether it
    /// was extended. An absent (expired) key is never re-created.
    fn extend<'a>(&'a self, key: &'a str, token: &'a str, ttl: Duration) -> NodeFuture<'a, bool>;
}

/// Why a node call failed.
#[derive(Debug)]
pub struct NodeFailure {
    timeout: bool,
    message: String,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl NodeFailure {
    /// A failure with a message.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            timeout: false,
            message: message.into(),
            source: None,
        }
    }

    /// A failure caused by `source`.
    pub fn from_error(source: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self {
            timeout: false,
            message: source.to_string(),
            source: Some(Box::new(source)),
        }
    }

    /// Mark the failure as a timeout.
    pub fn with_timeout(mut self) -> Self {
        self.timeout = true;
        self
    }

    /// Whether the node did not answer in time.
    pub fn is_timeout(&self) -> bool {
        self.timeout
    }
}

impl fmt::Display for NodeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for NodeFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<::redis::RedisError> for NodeFailure {
    fn from(e: ::redis::RedisError) -> Self {
        let timeout = e.is_timeout();
        let mut f = Self::from_error(e);
        f.timeout = timeout;
        f
    }
}
