//! Custom [`Node`]s for tests of what the client does with nodes that lack the optional
//! calls: over a [`MemoryNode`], with only the required methods (no completion records, no
//! fencing counters — the trait's defaults answer an error), or getting fencing wrong.

use std::time::Duration;

use tower_redlock::node::{Acquire, MemoryNode, Node, NodeFuture};

/// Locks only: `acquire`, `release` and `extend` of the inner [`MemoryNode`] (public, to look
/// at what it holds); every optional call is the trait's default.
#[derive(Debug, Clone, Default)]
pub struct BareNode(pub MemoryNode);

impl Node for BareNode {
    fn name(&self) -> String {
        "bare".to_owned()
    }

    fn acquire<'a>(
        &'a self,
        key: &'a str,
        token: &'a str,
        ttl: Duration,
    ) -> NodeFuture<'a, Acquire> {
        self.0.acquire(key, token, ttl)
    }

    fn release<'a>(&'a self, key: &'a str, token: &'a str) -> NodeFuture<'a, bool> {
        self.0.release(key, token)
    }

    fn extend<'a>(&'a self, key: &'a str, token: &'a str, ttl: Duration) -> NodeFuture<'a, bool> {
        self.0.extend(key, token, ttl)
    }
}

/// A [`BareNode`] that answers a fenced acquire as a plain one (`Acquired`, no counter): a
/// node that gets fencing wrong.
#[derive(Debug, Clone, Default)]
pub struct LyingFencingNode(pub BareNode);

impl Node for LyingFencingNode {
    fn name(&self) -> String {
        "lying".to_owned()
    }

    fn acquire<'a>(
        &'a self,
        key: &'a str,
        token: &'a str,
        ttl: Duration,
    ) -> NodeFuture<'a, Acquire> {
        self.0.acquire(key, token, ttl)
    }

    fn release<'a>(&'a self, key: &'a str, token: &'a str) -> NodeFuture<'a, bool> {
        self.0.release(key, token)
    }

    fn extend<'a>(&'a self, key: &'a str, token: &'a str, ttl: Duration) -> NodeFuture<'a, bool> {
        self.0.extend(key, token, ttl)
    }

    fn acquire_fenced<'a>(
        &'a self,
        key: &'a str,
        _fence_key: &'a str,
        token: &'a str,
        ttl: Duration,
        _retention: Duration,
    ) -> NodeFuture<'a, Acquire> {
        self.0.acquire(key, token, ttl)
    }
}
