//! One voter in the quorum.
//!
//! A [`Node`] is one independent lock server: a Redis voter ([`RedisNode`]: one master, a
//! Sentinel-managed group ([`Sentinel`]) or a Redis Cluster (`Cluster`, feature `cluster`))
//! or an in-process map ([`MemoryNode`]). [`Redlock`](crate::Redlock) asks every node in parallel and counts
//! their votes; a node knows nothing of quorums, retries or HTTP.
//!
//! Implement [`Node`] yourself to vote with another store; the conformance tests in
//! `tests/` show the semantics every node must keep (owner-only release and extend, expiry,
//! an expired key never re-created by an extend).

use std::fmt;
use std::future::{ready, Future};
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;

mod any;
mod memory;
mod redis;

pub(crate) use self::any::AnyNode;
pub(crate) use self::redis::EvictionStatus;

pub use self::memory::MemoryNode;
#[cfg(feature = "cluster")]
#[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
pub use self::redis::Cluster;
pub use self::redis::{split_urls, RedisNode, RedisNodeOptions, Sentinel};

/// The future a [`Node`] returns: boxed, `Send`, borrowing its arguments.
pub type NodeFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, NodeFailure>> + Send + 'a>>;

/// A node's answer to "set this key if it is absent".
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Acquire {
    /// The key was absent and now holds our token with the requested ttl.
    Acquired,
    /// The key is held by **another** value; `remaining` is the holder's remaining ttl, or
    /// `None` when the node cannot tell (no expiry, or the key vanished before its ttl was
    /// read): only a live holder's ttl makes a `Retry-After`.
    ///
    /// The client relies on "another": it sends no release to a node that answered `Held`.
    /// A node that retries a request internally (its first `SET` landed, the answer was
    /// lost, the retry found the key taken) must answer [`Acquire::Acquired`] when the key
    /// holds this very token.
    Held {
        /// The holder's remaining time to live, when it has one.
        remaining: Option<Duration>,
    },
    /// Only from [`Node::acquire_unless_completed`]: the work this key guards is done, and
    /// `record` is what [`Node::complete`] stored for it. Nothing was locked.
    Completed {
        /// The stored completion record.
        record: Bytes,
    },
    /// Only from [`Node::acquire_fenced`]: as [`Acquire::Acquired`], and the resource's
    /// fencing counter on this node is now `fence`.
    Fenced {
        /// The counter's new value.
        fence: u64,
    },
}

/// One lock server voting in the quorum.
///
/// Every method must be atomic on the node and must not re-create an absent key except in
/// [`Node::acquire`]. Implementations need not apply timeouts: the client wraps every call
/// in its per-node timeout.
///
/// **Order.** The client stops polling an acquire's future once the lock's outcome is
/// decided without it (and drops it with the failed try, or with the lease), and may then
/// release the same key and token on the node. A node must keep
/// the two in order: a request whose future was dropped is either never carried out, or
/// carried out before any request made to the same node afterwards. A single connection or
/// queue per node gives this (redis-rs' multiplexed connection does: a request handed to it
/// is written before any later one, and one not yet handed over is never sent).
pub trait Node: fmt::Debug + Send + Sync + 'static {
    /// A short name for errors and logs (`host:port`; never a password).
    fn name(&self) -> String;

    /// Set `key` to `token` with a time to live of `ttl`, only if `key` is absent. Answer
    /// [`Acquire::Held`] only when the key holds a different value (see there).
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

    /// For idempotent work: answer [`Acquire::Completed`] with the record stored at
    /// `record_key` if there is one (locking nothing); otherwise do what
    /// [`acquire`](Self::acquire) does. Both in one atomic step, so that no completion can
    /// slip between the look and the lock.
    ///
    /// The default answers an error: a node that does not store records never votes
    /// "not completed".
    fn acquire_unless_completed<'a>(
        &'a self,
        key: &'a str,
        record_key: &'a str,
        token: &'a str,
        ttl: Duration,
    ) -> NodeFuture<'a, Acquire> {
        let _ = (key, record_key, token, ttl);
        Box::pin(ready(Err(NodeFailure::no_records(&self.name()))))
    }

    /// For idempotent work, fenced by the lock: only if `key` holds `token`, store `record` at
    /// `record_key` with a time to live of `retention` and delete `key`, atomically. Returns
    /// whether it did: `false` when `key` no longer holds `token` (the lease expired or was
    /// lost), so a stale answer is never stored. Idempotent: asked again with the same
    /// `record` after its answer was lost, it finds that record and answers `true` (deleting
    /// `key` if it still holds `token`); a different record already there answers `false`.
    ///
    /// The default answers an error (see [`acquire_unless_completed`](Self::acquire_unless_completed)).
    fn complete<'a>(
        &'a self,
        key: &'a str,
        record_key: &'a str,
        token: &'a str,
        record: &'a [u8],
        retention: Duration,
    ) -> NodeFuture<'a, bool> {
        let _ = (key, record_key, token, record, retention);
        Box::pin(ready(Err(NodeFailure::no_records(&self.name()))))
    }

    /// For fencing tokens ([`RedlockBuilder::fencing`](crate::RedlockBuilder::fencing)): what
    /// [`acquire`](Self::acquire) does and, when it sets the key, in the same atomic step,
    /// bump the counter at `fence_key` to its value plus one — or, when it has none (it
    /// expired or was lost), to this node's clock in microseconds since 1970, so that it
    /// starts again above the tokens it gave — keeping it for `retention`; answer
    /// [`Acquire::Fenced`] with the new value. (Bumping an existing counter to the clock when
    /// that is larger is allowed too; the built-in nodes do not, so that counters kept level
    /// by [`extend_fenced`](Self::extend_fenced) and the releases stay level.)
    ///
    /// The default answers an error: a node without counters never grants a fenced lock.
    fn acquire_fenced<'a>(
        &'a self,
        key: &'a str,
        fence_key: &'a str,
        token: &'a str,
        ttl: Duration,
        retention: Duration,
    ) -> NodeFuture<'a, Acquire> {
        let _ = (key, fence_key, token, ttl, retention);
        Box::pin(ready(Err(NodeFailure::no_fencing(&self.name()))))
    }

    /// For fencing tokens: raise the counter at `fence_key` to `floor` if it is below
    /// (keeping it for `retention`; also when the key no longer holds `token`) — a counter
    /// that is gone (expired, or lost) starts again from the larger of `floor` and this
    /// node's clock in microseconds, never from an old token alone — then what
    /// [`release`](Self::release) does. The raise must come first (or in the same atomic
    /// step): the next holder's bump follows the delete.
    ///
    /// The default answers an error (see [`acquire_fenced`](Self::acquire_fenced)).
    fn release_fenced<'a>(
        &'a self,
        key: &'a str,
        fence_key: &'a str,
        token: &'a str,
        floor: u64,
        retention: Duration,
    ) -> NodeFuture<'a, bool> {
        let _ = (key, fence_key, token, floor, retention);
        Box::pin(ready(Err(NodeFailure::no_fencing(&self.name()))))
    }

    /// For fencing tokens: only if `key` holds `token`, raise the counter `fence.key` to
    /// `fence.floor` as [`release_fenced`](Self::release_fenced) does, and then set the
    /// time to live of `key` to `ttl` as [`extend`](Self::extend) does, in one atomic step.
    /// Returns whether it did (`false`: the key does not hold `token`; nothing changed).
    ///
    /// The client calls it right after a fenced grant, before it hands the lease out, on
    /// nodes that granted it with a counter below the lease's token (the largest counter of
    /// the grant), so that enough of them to meet every later quorum carry the token: the
    /// next holder's token is then larger whatever the nodes' clocks say.
    ///
    /// The default answers an error (see [`acquire_fenced`](Self::acquire_fenced)): such a
    /// node's counter is never raised, and a grant that needs it fails.
    fn extend_fenced<'a>(
        &'a self,
        key: &'a str,
        token: &'a str,
        ttl: Duration,
        fence: FenceFloor<'a>,
    ) -> NodeFuture<'a, bool> {
        let _ = (key, token, ttl, fence);
        Box::pin(ready(Err(NodeFailure::no_fencing(&self.name()))))
    }

    /// For fencing tokens with idempotent work: what
    /// [`acquire_unless_completed`](Self::acquire_unless_completed) does and, when it sets
    /// the key, the counter's bump of [`acquire_fenced`](Self::acquire_fenced), in one atomic
    /// step.
    ///
    /// The default answers an error (see [`acquire_fenced`](Self::acquire_fenced)).
    fn acquire_unless_completed_fenced<'a>(
        &'a self,
        key: &'a str,
        record_key: &'a str,
        fence_key: &'a str,
        token: &'a str,
        ttl: Duration,
        retention: Duration,
    ) -> NodeFuture<'a, Acquire> {
        let _ = (key, record_key, fence_key, token, ttl, retention);
        Box::pin(ready(Err(NodeFailure::no_fencing(&self.name()))))
    }

    /// For fencing tokens with idempotent work: raise the counter `fence.key` to
    /// `fence.floor` as [`release_fenced`](Self::release_fenced) does, then what
    /// [`complete`](Self::complete) does (the raise first, or in the same atomic step).
    ///
    /// The default answers an error (see [`acquire_fenced`](Self::acquire_fenced)).
    fn complete_fenced<'a>(
        &'a self,
        key: &'a str,
        record_key: &'a str,
        token: &'a str,
        record: &'a [u8],
        retention: Duration,
        fence: FenceFloor<'a>,
    ) -> NodeFuture<'a, bool> {
        let _ = (key, record_key, token, record, retention, fence);
        Box::pin(ready(Err(NodeFailure::no_fencing(&self.name()))))
    }
}

/// A fencing counter to raise: before a lease's lock is deleted ([`Node::complete_fenced`]),
/// or right after its grant ([`Node::extend_fenced`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FenceFloor<'a> {
    /// The counter's key.
    pub key: &'a str,
    /// The lease's token: the counter's least value after the raise.
    pub floor: u64,
    /// How long the counter is kept after the raise.
    pub retention: Duration,
}

/// Why a node call failed.
#[derive(Debug)]
pub struct NodeFailure {
    timeout: bool,
    unreachable: bool,
    /// A default of the trait: the node does not do what was asked at all.
    unsupported: bool,
    /// The voter refused here, without asking the node (it abstains): neither a reply nor a
    /// silence of the node.
    local: bool,
    message: String,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl NodeFailure {
    /// A failure with a message.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            timeout: false,
            unreachable: false,
            unsupported: false,
            local: false,
            message: message.into(),
            source: None,
        }
    }

    /// A failure caused by `source`.
    pub fn from_error(source: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self {
            timeout: false,
            unreachable: false,
            unsupported: false,
            local: false,
            message: source.to_string(),
            source: Some(Box::new(source)),
        }
    }

    /// A node without completion records (the defaults of [`Node::complete`] and
    /// [`Node::acquire_unless_completed`]).
    fn no_records(name: &str) -> Self {
        Self::new(format!("{name} does not store completion records"))
    }

    /// A node without fencing counters (the defaults of [`Node::acquire_fenced`] and
    /// [`Node::release_fenced`]).
    fn no_fencing(name: &str) -> Self {
        Self {
            unsupported: true,
            ..Self::new(format!("{name} does not keep fencing counters"))
        }
    }

    /// Whether the node does not support the call at all (the trait's default answered).
    pub(crate) fn is_unsupported(&self) -> bool {
        self.unsupported
    }

    /// Marks the failure as the voter's own refusal, made without asking the node (it
    /// abstains): it says nothing of the node's health.
    pub(crate) fn abstaining(mut self) -> Self {
        self.local = true;
        self
    }

    /// Whether the voter refused without asking the node (see [`NodeFailure::abstaining`]).
    pub(crate) fn is_local(&self) -> bool {
        self.local
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

    /// Mark the failure as "the node could not be reached" (connection refused, dropped,
    /// not yet made): no reply came from the node. Such failures count toward its
    /// suspension, like timeouts; a reply — even an error reply — shows the node is there.
    pub fn with_unreachable(mut self) -> Self {
        self.unreachable = true;
        self
    }

    /// Whether the node could not be reached (see [`NodeFailure::with_unreachable`]).
    pub fn is_unreachable(&self) -> bool {
        self.unreachable
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
        let unreachable = self::redis::conn::connection_lost(&e);
        let local = self::redis::conn::is_abstention(&e);
        let mut f = Self::from_error(e);
        f.timeout = timeout;
        f.unreachable = unreachable;
        f.local = local;
        f
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A node of the user's own: it goes through the trait's boxed futures. With
    /// `hang_on_release`, its releases never answer (a node that is slow for one request).
    #[derive(Debug, Clone, Default)]
    pub(crate) struct Wrapped {
        pub(crate) inner: MemoryNode,
        pub(crate) hang_on_release: bool,
        /// How many releases it was asked.
        pub(crate) releases: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    }

    impl Node for Wrapped {
        fn name(&self) -> String {
            "wrapped".to_owned()
        }
        fn acquire<'a>(
            &'a self,
            key: &'a str,
            token: &'a str,
            ttl: Duration,
        ) -> NodeFuture<'a, Acquire> {
            self.inner.acquire(key, token, ttl)
        }
        fn release<'a>(&'a self, key: &'a str, token: &'a str) -> NodeFuture<'a, bool> {
            self.releases
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if self.hang_on_release {
                return Box::pin(std::future::pending());
            }
            self.inner.release(key, token)
        }
        fn extend<'a>(
            &'a self,
            key: &'a str,
            token: &'a str,
            ttl: Duration,
        ) -> NodeFuture<'a, bool> {
            self.inner.extend(key, token, ttl)
        }
    }

    #[test]
    fn built_in_nodes_are_dispatched_statically() {
        assert!(matches!(
            AnyNode::new(MemoryNode::new()),
            AnyNode::Memory(_)
        ));
        let custom = AnyNode::new(Wrapped::default());
        assert!(matches!(custom, AnyNode::Custom(_)));
        assert_eq!(custom.name(), "wrapped");
    }

    #[tokio::test]
    async fn a_redis_node_given_as_a_node_is_dispatched_statically() {
        // Lazy: nothing connects to this port.
        let node = RedisNode::open("redis://127.0.0.1:9").unwrap();
        assert!(matches!(AnyNode::new(node), AnyNode::Redis(_)));
    }

    #[tokio::test]
    async fn a_custom_node_votes_through_the_trait() {
        let node = MemoryNode::new();
        let redlock = crate::Redlock::builder()
            .node(Wrapped {
                inner: node.clone(),
                hang_on_release: false,
                releases: Default::default(),
            })
            .build()
            .unwrap();
        let ttl = Duration::from_secs(5);
        let lease = redlock.try_lock("custom:1", ttl).await.unwrap();
        assert_eq!(node.get("custom:1").as_deref(), Some(lease.value()));
        assert!(redlock
            .try_lock("custom:1", ttl)
            .await
            .unwrap_err()
            .is_contended());
        lease.extend(ttl).await.unwrap();
        lease.release().await.unwrap();
        assert!(node.is_empty());
    }
}
