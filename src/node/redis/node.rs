//! The [`Node`] trait over a [`RedisNode`]'s calls (each in the file of its concern).

use std::time::Duration;

use super::RedisNode;
use crate::node::{Acquire, FenceFloor, Node, NodeFuture};

impl Node for RedisNode {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn max_ttl(&self) -> Option<Duration> {
        self.guard.as_ref().map(|g| g.max_ttl)
    }

    fn acquire<'a>(
        &'a self,
        key: &'a str,
        token: &'a str,
        ttl: Duration,
    ) -> NodeFuture<'a, Acquire> {
        Box::pin(self.acquire_key(key, token, ttl, None))
    }

    fn release<'a>(&'a self, key: &'a str, token: &'a str) -> NodeFuture<'a, bool> {
        Box::pin(self.release_key(key, token, None))
    }

    fn extend<'a>(&'a self, key: &'a str, token: &'a str, ttl: Duration) -> NodeFuture<'a, bool> {
        Box::pin(self.extend_key(key, token, ttl))
    }

    fn acquire_unless_completed<'a>(
        &'a self,
        key: &'a str,
        record_key: &'a str,
        token: &'a str,
        ttl: Duration,
    ) -> NodeFuture<'a, Acquire> {
        Box::pin(self.acquire_unless_completed_key(key, record_key, token, ttl))
    }

    fn complete<'a>(
        &'a self,
        key: &'a str,
        record_key: &'a str,
        token: &'a str,
        record: &'a [u8],
        retention: Duration,
    ) -> NodeFuture<'a, bool> {
        Box::pin(self.complete_key(key, record_key, token, record, retention))
    }

    fn acquire_fenced<'a>(
        &'a self,
        key: &'a str,
        fence_key: &'a str,
        token: &'a str,
        ttl: Duration,
        retention: Duration,
    ) -> NodeFuture<'a, Acquire> {
        Box::pin(self.acquire_fenced_key(key, fence_key, token, ttl, retention))
    }

    fn release_fenced<'a>(
        &'a self,
        key: &'a str,
        fence_key: &'a str,
        token: &'a str,
        floor: u64,
        retention: Duration,
    ) -> NodeFuture<'a, bool> {
        Box::pin(self.release_fenced_key(key, fence_key, token, floor, retention))
    }

    fn extend_fenced<'a>(
        &'a self,
        key: &'a str,
        token: &'a str,
        ttl: Duration,
        fence: FenceFloor<'a>,
    ) -> NodeFuture<'a, bool> {
        Box::pin(self.extend_fenced_key(key, token, ttl, fence))
    }

    fn acquire_unless_completed_fenced<'a>(
        &'a self,
        key: &'a str,
        record_key: &'a str,
        fence_key: &'a str,
        token: &'a str,
        ttl: Duration,
        retention: Duration,
    ) -> NodeFuture<'a, Acquire> {
        Box::pin(
            self.acquire_unless_completed_fenced_key(
                key, record_key, fence_key, token, ttl, retention,
            ),
        )
    }

    fn complete_fenced<'a>(
        &'a self,
        key: &'a str,
        record_key: &'a str,
        token: &'a str,
        record: &'a [u8],
        retention: Duration,
        fence: FenceFloor<'a>,
    ) -> NodeFuture<'a, bool> {
        Box::pin(self.complete_fenced_key(key, record_key, token, record, retention, fence))
    }
}
