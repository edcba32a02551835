//! The acquire request a try sends every node. It is the acquire script or the plain `SET` (each
//! packed once for every Redis master that sends it), or the replay acquire (the completion record
//! looked at first). It may also be the fenced acquire (the counter's bump), or replay and fenced
//! at once.

use std::sync::Arc;
use std::time::Duration;

use crate::lock::call::Voter;
use crate::lock::fencing;
use crate::lock::token::Token;
use crate::node::{Acquire, AcquireRequest, AnyNode, CallError, Packed, RedisNode};

/// One try's acquire, cloned into the request to every remote node (reference counts only:
/// no allocation per try beyond the packed acquire, as before fencing).
#[derive(Clone)]
pub(crate) struct Acquisition {
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
    /// The acquire script (with its eviction check), packed once, when a Redis master will
    /// be sent it.
    script: Option<Arc<::redis::Cmd>>,
}

impl Acquisition {
    pub(crate) fn new(
        nodes: &[Arc<Voter>],
        key: &Arc<str>,
        record_key: Option<&Arc<str>>,
        fence_key: Option<&Arc<str>>,
        token: Token,
        ttl: Duration,
    ) -> Self {
        let plain = record_key.is_none() && fence_key.is_none();
        let packs = |kind| plain && nodes.iter().any(|v| v.node.packed_acquire() == Some(kind));
        let set =
            packs(Packed::Set).then(|| Arc::new(RedisNode::set_cmd(key, token.as_str(), ttl)));
        let script = packs(Packed::Script)
            .then(|| Arc::new(RedisNode::acquire_cmd(key, token.as_str(), ttl)));
        Self {
            key: key.clone(),
            record_key: record_key.cloned(),
            fence_key: fence_key.cloned(),
            token,
            ttl,
            retention: fencing::retention(ttl),
            set,
            script,
        }
    }

    /// The request as a node reads it.
    fn request(&self) -> AcquireRequest<'_> {
        let mut request = AcquireRequest::new(&self.key, self.token.as_str(), self.ttl);
        if let Some(r) = &self.record_key {
            request = request.unless_completed(r);
        }
        if let Some(f) = &self.fence_key {
            request = request.fenced(f, self.retention);
        }
        request
    }

    /// An in-process node's answer, at once; `None` for a remote node.
    pub(crate) fn now(&self, node: &AnyNode) -> Option<Result<Acquire, CallError>> {
        node.acquire_now(&self.request())
    }

    /// The request to `node`.
    pub(crate) async fn send(&self, node: &AnyNode) -> Result<Acquire, CallError> {
        let prepared = match node.packed_acquire() {
            Some(Packed::Set) => self.set.as_deref(),
            Some(Packed::Script) => self.script.as_deref(),
            None => None,
        };
        let answer = node.acquire(self.request(), prepared).await;
        if self.fence_key.is_some() {
            checked(answer)
        } else {
            answer
        }
    }
}

/// A fenced acquire's answer. A lock set without a counter (a custom node answering
/// [`Acquire::Acquired`]) is not a vote: the token must be the largest counter of every vote for.
/// It is a failure instead (its key is released with the others).
fn checked(answer: Result<Acquire, CallError>) -> Result<Acquire, CallError> {
    match answer {
        Ok(Acquire::Acquired) => Err(CallError::new(
            "answered a fenced acquire without its counter (Acquire::Fenced expected): not a vote",
        )),
        other => other,
    }
}
