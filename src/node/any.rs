//! A node as the client holds it: the built-in nodes called directly, others through the
//! [`Node`] trait.

use std::any::Any;
use std::future::{ready, Future};
use std::time::Duration;

use futures_util::future::Either;

use super::{
    Acquire, EvictionStatus, FenceFloor, MemoryNode, Node, NodeFailure, NodeFuture, RedisNode,
};

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

    /// A Redis voter's eviction state (its master's `maxmemory-policy`); the default for
    /// other nodes.
    pub(crate) fn eviction(&self) -> EvictionStatus {
        match self {
            Self::Redis(n) => n.eviction_status(),
            _ => EvictionStatus::default(),
        }
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

    /// An in-process node's answer to [`Node::acquire_fenced`], at once.
    pub(crate) fn acquire_fenced_now(
        &self,
        key: &str,
        fence_key: &str,
        token: &str,
        ttl: Duration,
        retention: Duration,
    ) -> Option<Result<Acquire, NodeFailure>> {
        match self {
            Self::Memory(n) => Some(Ok(
                n.acquire_fenced_now(key, fence_key, token, ttl, retention)
            )),
            _ => None,
        }
    }

    /// See [`Node::acquire_fenced`].
    pub(crate) fn acquire_fenced<'a>(
        &'a self,
        key: &'a str,
        fence_key: &'a str,
        token: &'a str,
        ttl: Duration,
        retention: Duration,
    ) -> NodeFuture<'a, Acquire> {
        match self {
            Self::Redis(n) => Box::pin(n.acquire_fenced_key(key, fence_key, token, ttl, retention)),
            Self::Memory(n) => Box::pin(ready(Ok(
                n.acquire_fenced_now(key, fence_key, token, ttl, retention)
            ))),
            Self::Custom(n) => n.acquire_fenced(key, fence_key, token, ttl, retention),
        }
    }

    /// An in-process node's answer to [`Node::release_fenced`], at once.
    pub(crate) fn release_fenced_now(
        &self,
        key: &str,
        fence_key: &str,
        token: &str,
        floor: u64,
        retention: Duration,
    ) -> Option<Result<bool, NodeFailure>> {
        match self {
            Self::Memory(n) => Some(Ok(
                n.release_fenced_now(key, fence_key, token, floor, retention)
            )),
            _ => None,
        }
    }

    /// See [`Node::release_fenced`].
    pub(crate) fn release_fenced<'a>(
        &'a self,
        key: &'a str,
        fence_key: &'a str,
        token: &'a str,
        floor: u64,
        retention: Duration,
    ) -> NodeFuture<'a, bool> {
        match self {
            Self::Redis(n) => {
                Box::pin(n.release_fenced_key(key, fence_key, token, floor, retention))
            }
            Self::Memory(n) => Box::pin(ready(Ok(
                n.release_fenced_now(key, fence_key, token, floor, retention)
            ))),
            Self::Custom(n) => n.release_fenced(key, fence_key, token, floor, retention),
        }
    }

    /// An in-process node's answer to [`Node::extend_fenced`], at once.
    pub(crate) fn extend_fenced_now(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        fence: FenceFloor<'_>,
    ) -> Option<Result<bool, NodeFailure>> {
        match self {
            Self::Memory(n) => Some(Ok(n.extend_fenced_now(key, token, ttl, fence))),
            _ => None,
        }
    }

    /// See [`Node::extend_fenced`].
    pub(crate) fn extend_fenced<'a>(
        &'a self,
        key: &'a str,
        token: &'a str,
        ttl: Duration,
        fence: FenceFloor<'a>,
    ) -> NodeFuture<'a, bool> {
        match self {
            Self::Redis(n) => Box::pin(n.extend_fenced_key(key, token, ttl, fence)),
            Self::Memory(n) => Box::pin(ready(Ok(n.extend_fenced_now(key, token, ttl, fence)))),
            Self::Custom(n) => n.extend_fenced(key, token, ttl, fence),
        }
    }

    /// An in-process node's answer to [`Node::acquire_unless_completed_fenced`], at once.
    pub(crate) fn acquire_unless_completed_fenced_now(
        &self,
        key: &str,
        record_key: &str,
        fence_key: &str,
        token: &str,
        ttl: Duration,
        retention: Duration,
    ) -> Option<Result<Acquire, NodeFailure>> {
        match self {
            Self::Memory(n) => Some(Ok(n.acquire_unless_completed_fenced_now(
                key, record_key, fence_key, token, ttl, retention,
            ))),
            _ => None,
        }
    }

    /// See [`Node::acquire_unless_completed_fenced`].
    pub(crate) fn acquire_unless_completed_fenced<'a>(
        &'a self,
        key: &'a str,
        record_key: &'a str,
        fence_key: &'a str,
        token: &'a str,
        ttl: Duration,
        retention: Duration,
    ) -> NodeFuture<'a, Acquire> {
        match self {
            Self::Redis(n) => Box::pin(n.acquire_unless_completed_fenced_key(
                key, record_key, fence_key, token, ttl, retention,
            )),
            Self::Memory(n) => Box::pin(ready(Ok(n.acquire_unless_completed_fenced_now(
                key, record_key, fence_key, token, ttl, retention,
            )))),
            Self::Custom(n) => {
                n.acquire_unless_completed_fenced(key, record_key, fence_key, token, ttl, retention)
            }
        }
    }

    /// An in-process node's answer to [`Node::complete_fenced`], at once.
    pub(crate) fn complete_fenced_now(
        &self,
        key: &str,
        record_key: &str,
        token: &str,
        record: &[u8],
        retention: Duration,
        fence: FenceFloor<'_>,
    ) -> Option<Result<bool, NodeFailure>> {
        match self {
            Self::Memory(n) => Some(Ok(
                n.complete_fenced_now(key, record_key, token, record, retention, fence)
            )),
            _ => None,
        }
    }

    /// See [`Node::complete_fenced`].
    pub(crate) fn complete_fenced<'a>(
        &'a self,
        key: &'a str,
        record_key: &'a str,
        token: &'a str,
        record: &'a [u8],
        retention: Duration,
        fence: FenceFloor<'a>,
    ) -> NodeFuture<'a, bool> {
        match self {
            Self::Redis(n) => {
                Box::pin(n.complete_fenced_key(key, record_key, token, record, retention, fence))
            }
            Self::Memory(n) => Box::pin(ready(Ok(
                n.complete_fenced_now(key, record_key, token, record, retention, fence)
            ))),
            Self::Custom(n) => n.complete_fenced(key, record_key, token, record, retention, fence),
        }
    }
}
