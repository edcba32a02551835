//! The acquire request a try sends every node: the plain `SET` (packed once for every Redis
//! master), the replay acquire (the completion record looked at first), the fenced acquire
//! (the counter's bump), or replay and fenced at once.

use std::sync::Arc;
use std::time::Duration;

use super::fencing;
use super::lease::Token;
use super::quorum::Voter;
use crate::node::{Acquire, AnyNode, NodeFailure, RedisNode};

/// One try's acquire, cloned into the request to every remote node (reference counts only:
/// no allocation per try beyond the packed `SET`, as before fencing).
#[derive(Clone)]
pub(crate) struct AcquireRequest {
    key: Arc<str>,
    /// The completion record's key (replay).
    record_key: Option<Arc<str>>,
    /// The fencing counter's key (fencing).
    fence_key: Option<Arc<str>>,
    token: Token,
    ttl: Duration,
    /// How long the fencing counter is kept.
    pub(crate) retention: Duration,
    /// The plain `SET`, packed once, when a Redis master will be sent it.
    set: Option<Arc<::redis::Cmd>>,
}

impl AcquireRequest {
    pub(crate) fn new(
        nodes: &[Arc<Voter>],
        key: &Arc<str>,
        record_key: Option<&Arc<str>>,
        fence_key: Option<&Arc<str>>,
        token: Token,
        ttl: Duration,
    ) -> Self {
        let plain = record_key.is_none() && fence_key.is_none();
        let set = (plain && nodes.iter().any(|v| v.node.uses_prepared(true)))
            .then(|| Arc::new(RedisNode::set_cmd(key, token.as_str(), ttl)));
        Self {
            key: key.clone(),
            record_key: record_key.cloned(),
            fence_key: fence_key.cloned(),
            token,
            ttl,
            retention: fencing::retention(ttl),
            set,
        }
    }

    /// An in-process node's answer, at once; `None` for a remote node.
    pub(crate) fn now(&self, node: &AnyNode) -> Option<Result<Acquire, NodeFailure>> {
        let (key, token, ttl) = (&*self.key, self.token.as_str(), self.ttl);
        match (self.record_key.as_deref(), self.fence_key.as_deref()) {
            (Some(r), Some(f)) => {
                node.acquire_unless_completed_fenced_now(key, r, f, token, ttl, self.retention)
            }
            (Some(r), None) => node.acquire_unless_completed_now(key, r, token, ttl),
            (None, Some(f)) => node.acquire_fenced_now(key, f, token, ttl, self.retention),
            (None, None) => node.acquire_now(key, token, ttl),
        }
    }

    /// The request to `node`.
    pub(crate) async fn send(&self, node: &AnyNode) -> Result<Acquire, NodeFailure> {
        let (key, token, ttl) = (&*self.key, self.token.as_str(), self.ttl);
        match (self.record_key.as_deref(), self.fence_key.as_deref()) {
            (Some(r), Some(f)) => fenced(
                node.acquire_unless_completed_fenced(key, r, f, token, ttl, self.retention)
                    .await,
            ),
            (Some(r), None) => node.acquire_unless_completed(key, r, token, ttl).await,
            (None, Some(f)) => fenced(
                node.acquire_fenced(key, f, token, ttl, self.retention)
                    .await,
            ),
            (None, None) => node.acquire(key, token, ttl, self.set.as_deref()).await,
        }
    }
}

/// A fenced acquire's answer: a lock set without a counter (a custom node answering
/// [`Acquire::Acquired`]) is not a vote — the token must be the largest counter of every
/// vote for — but a failure (its key is released with the others).
fn fenced(answer: Result<Acquire, NodeFailure>) -> Result<Acquire, NodeFailure> {
    match answer {
        Ok(Acquire::Acquired) => Err(NodeFailure::new(
            "answered a fenced acquire without its counter (Acquire::Fenced expected): not a vote",
        )),
        other => other,
    }
}
