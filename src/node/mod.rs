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

use std::any::Any;
use std::fmt;
use std::future::{ready, Future};
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::Either;

mod memory;
mod redis;

pub use self::memory::MemoryNode;
#[cfg(feature = "cluster")]
#[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
pub use self::redis::Cluster;
pub use self::redis::{
    split_urls, RedisNode, RedisNodeOptions, Sentinel, DEFAULT_FAILOVER_MAX_TTL,
};

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
    /// lost), so a stale answer is never stored.
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
}

/// A node as the client holds it. The built-in nodes are called directly, so a request to
/// one costs no boxed future (measured in `bench/benches/profile.rs`: a box per request cost about
/// a tenth of the throughput); other nodes go through the [`Node`] trait.
#[derive(Debug)]
pub(crate) enum AnyNode {
    Redis(RedisNode),
    Memory(MemoryNode),
    Custom(Box<dyn Node>),
}

impl AnyNode {
    pub(crate) fn new<N: Node>(node: N) -> Self {
        let mut slot = Some(node);
        let any: &mut dyn Any = &mut slot;
        if let Some(n) = any
            .downcast_mut::<Option<RedisNode>>()
            .and_then(Option::take)
        {
            return Self::Redis(n);
        }
        if let Some(n) = any
            .downcast_mut::<Option<MemoryNode>>()
            .and_then(Option::take)
        {
            return Self::Memory(n);
        }
        match slot {
            Some(n) => Self::Custom(Box::new(n)),
            // `slot` is emptied only by a `take` above, which returns.
            None => unreachable!("a node moved out of its slot without being returned"),
        }
    }

    fn as_node(&self) -> &dyn Node {
        match self {
            Self::Redis(n) => n,
            Self::Memory(n) => n,
            Self::Custom(n) => &**n,
        }
    }

    pub(crate) fn name(&self) -> String {
        self.as_node().name()
    }

    pub(crate) fn max_ttl(&self) -> Option<Duration> {
        self.as_node().max_ttl()
    }

    /// An in-process node's answer to [`AnyNode::acquire`], at once; `None` for a remote node.
    pub(crate) fn acquire_now(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
    ) -> Option<Result<Acquire, NodeFailure>> {
        match self {
            Self::Memory(n) => Some(Ok(n.acquire_now(key, token, ttl))),
            _ => None,
        }
    }

    /// An in-process node's answer to [`AnyNode::release`], at once.
    pub(crate) fn release_now(&self, key: &str, token: &str) -> Option<Result<bool, NodeFailure>> {
        match self {
            Self::Memory(n) => Some(Ok(n.release_now(key, token))),
            _ => None,
        }
    }

    /// An in-process node's answer to [`AnyNode::extend`], at once.
    pub(crate) fn extend_now(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
    ) -> Option<Result<bool, NodeFailure>> {
        match self {
            Self::Memory(n) => Some(Ok(n.extend_now(key, token, ttl))),
            _ => None,
        }
    }

    /// The holder's remaining ttl at `key`, for a node whose "held" answer did not carry it:
    /// asked once per contended error, from one node. `None` for a custom node (it reports
    /// the ttl in [`Acquire::Held`] if it can).
    pub(crate) fn remaining_ttl<'a>(
        &'a self,
        key: &'a str,
    ) -> Option<impl Future<Output = Result<Option<Duration>, NodeFailure>> + Send + 'a> {
        match self {
            Self::Redis(n) => Some(Either::Left(n.remaining_ttl(key))),
            Self::Memory(n) => Some(Either::Right(ready(Ok(n.remaining_now(key))))),
            Self::Custom(_) => None,
        }
    }

    /// Whether this node uses the Redis command a fan-out packs once for all its masters
    /// ([`RedisNode::set_cmd`] when `acquire`, else [`RedisNode::release_cmd`]).
    pub(crate) fn uses_prepared(&self, acquire: bool) -> bool {
        match self {
            Self::Redis(n) => !acquire || n.plain_acquire(),
            _ => false,
        }
    }

    pub(crate) fn acquire<'a>(
        &'a self,
        key: &'a str,
        token: &'a str,
        ttl: Duration,
        prepared: Option<&'a ::redis::Cmd>,
    ) -> impl Future<Output = Result<Acquire, NodeFailure>> + Send + 'a {
        match self {
            Self::Redis(n) => Either::Left(n.acquire_key(key, token, ttl, prepared)),
            Self::Memory(n) => {
                Either::Right(Either::Left(ready(Ok(n.acquire_now(key, token, ttl)))))
            }
            Self::Custom(n) => Either::Right(Either::Right(n.acquire(key, token, ttl))),
        }
    }

    pub(crate) fn release<'a>(
        &'a self,
        key: &'a str,
        token: &'a str,
        prepared: Option<&'a ::redis::Cmd>,
    ) -> impl Future<Output = Result<bool, NodeFailure>> + Send + 'a {
        match self {
            Self::Redis(n) => Either::Left(n.release_key(key, token, prepared)),
            Self::Memory(n) => Either::Right(Either::Left(ready(Ok(n.release_now(key, token))))),
            Self::Custom(n) => Either::Right(Either::Right(n.release(key, token))),
        }
    }

    /// An in-process node's answer to [`Node::acquire_unless_completed`], at once.
    pub(crate) fn acquire_unless_completed_now(
        &self,
        key: &str,
        record_key: &str,
        token: &str,
        ttl: Duration,
    ) -> Option<Result<Acquire, NodeFailure>> {
        match self {
            Self::Memory(n) => Some(Ok(
                n.acquire_unless_completed_now(key, record_key, token, ttl)
            )),
            _ => None,
        }
    }

    /// See [`Node::acquire_unless_completed`].
    pub(crate) fn acquire_unless_completed<'a>(
        &'a self,
        key: &'a str,
        record_key: &'a str,
        token: &'a str,
        ttl: Duration,
    ) -> NodeFuture<'a, Acquire> {
        match self {
            Self::Redis(n) => Box::pin(n.acquire_unless_completed_key(key, record_key, token, ttl)),
            Self::Memory(n) => Box::pin(ready(Ok(
                n.acquire_unless_completed_now(key, record_key, token, ttl)
            ))),
            Self::Custom(n) => n.acquire_unless_completed(key, record_key, token, ttl),
        }
    }

    /// An in-process node's answer to [`Node::complete`], at once.
    pub(crate) fn complete_now(
        &self,
        key: &str,
        record_key: &str,
        token: &str,
        record: &[u8],
        retention: Duration,
    ) -> Option<Result<bool, NodeFailure>> {
        match self {
            Self::Memory(n) => Some(Ok(n.complete_now(key, record_key, token, record, retention))),
            _ => None,
        }
    }

    /// See [`Node::complete`].
    pub(crate) fn complete<'a>(
        &'a self,
        key: &'a str,
        record_key: &'a str,
        token: &'a str,
        record: &'a [u8],
        retention: Duration,
    ) -> NodeFuture<'a, bool> {
        match self {
            Self::Redis(n) => Box::pin(n.complete_key(key, record_key, token, record, retention)),
            Self::Memory(n) => Box::pin(ready(Ok(
                n.complete_now(key, record_key, token, record, retention)
            ))),
            Self::Custom(n) => n.complete(key, record_key, token, record, retention),
        }
    }

    pub(crate) fn extend<'a>(
        &'a self,
        key: &'a str,
        token: &'a str,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, NodeFailure>> + Send + 'a {
        match self {
            Self::Redis(n) => Either::Left(n.extend_key(key, token, ttl)),
            Self::Memory(n) => {
                Either::Right(Either::Left(ready(Ok(n.extend_now(key, token, ttl)))))
            }
            Self::Custom(n) => Either::Right(Either::Right(n.extend(key, token, ttl))),
        }
    }
}

/// Why a node call failed.
#[derive(Debug)]
pub struct NodeFailure {
    timeout: bool,
    unreachable: bool,
    message: String,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl NodeFailure {
    /// A failure with a message.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            timeout: false,
            unreachable: false,
            message: message.into(),
            source: None,
        }
    }

    /// A failure caused by `source`.
    pub fn from_error(source: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self {
            timeout: false,
            unreachable: false,
            message: source.to_string(),
            source: Some(Box::new(source)),
        }
    }

    /// A node without completion records (the defaults of [`Node::complete`] and
    /// [`Node::acquire_unless_completed`]).
    fn no_records(name: &str) -> Self {
        Self::new(format!("{name} does not store completion records"))
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
        let unreachable = e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal();
        let mut f = Self::from_error(e);
        f.timeout = timeout;
        f.unreachable = unreachable;
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
