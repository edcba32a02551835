//! Fencing tokens from the quorum (opt-in: [`RedlockBuilder::fencing`]).
//!
//! Each node keeps a counter per resource. The fenced acquire bumps it in the same atomic
//! step as the `SET`, to the larger of its value plus one and the node's clock in
//! microseconds; a lease's token is the largest counter among the nodes that granted it
//! (counted until the decision; in replay, every vote counted for the grant). The fenced
//! release — and the fenced completion of idempotent work — first raises the counter of
//! every node it reaches to the lease's token.
//!
//! Why the next holder's token is larger: its quorum shares a node `m` with this lease's.
//! On `m` this lease's key was released — the counter was raised to this token there, and
//! the next bump exceeds it — or it expired: then at least a ttl passed on `m`'s clock since
//! this lease's bump there, and the next bump is at least `m`'s clock, which is then above
//! every token of this lease as long as the nodes' clocks differ by less than the ttl
//! (tokens are at most the granting nodes' clocks, or counters raised by earlier tokens). A
//! counter expires `retention` after its last use (≥ twice the ttl), so an expired one
//! restarts from the clock too: memory stays bounded, tokens never go back.
//!
//! [`RedlockBuilder::fencing`]: crate::RedlockBuilder::fencing

use std::sync::Arc;
use std::time::Duration;

/// A lease's fencing token, and what its release needs to raise the counters to it.
#[derive(Debug, Clone)]
pub(crate) struct Fence {
    pub(crate) token: u64,
    /// The counter's key (beside the lock's).
    pub(crate) key: Arc<str>,
    /// How long a counter is kept after its last use.
    pub(crate) retention: Duration,
}

impl Fence {
    /// What a node raises the counter to before the lease's lock is deleted.
    pub(crate) fn floor(&self) -> crate::node::FenceFloor<'_> {
        crate::node::FenceFloor {
            key: &self.key,
            floor: self.token,
            retention: self.retention,
        }
    }
}

/// The counter's key of the lock `key`.
pub(crate) fn fence_key(key: &str) -> Arc<str> {
    format!("{key}:fence").into()
}

/// How long a counter is kept after its last use: twice the ttl, at least 10 s.
pub(crate) fn retention(ttl: Duration) -> Duration {
    ttl.saturating_mul(2).max(Duration::from_secs(10))
}
