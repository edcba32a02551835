//! Fencing tokens from the quorum (opt-in: [`RedlockBuilder::fencing`]): a lease's
//! [`Fence`], and the counter's key and retention. The scheme is stated here; the acquire
//! settles the token (`acquire/fence.rs`), the release and the completion raise the counters
//! to it.
//!
//! Each node keeps a counter per resource. The fenced acquire bumps it in the same atomic
//! step as the `SET`, to its value plus one (or, when it has none, to the node's clock in
//! microseconds); a lease's token is the largest counter among the nodes that granted it
//! (counted until the decision; in replay, every vote counted for the grant).
//!
//! **Settling the token** (before the lease is handed out): the granting nodes whose counter is
//! below the token have it raised to the token ([`ExtendRequest::fence`], only where the lock is
//! still ours). This goes on until at least `N − quorum + 1` nodes holding our lock carry it —
//! enough to share a node with every later quorum. If that cannot be done while the lease is valid,
//! the try fails (and releases what it took). See `acquire/fence.rs`.
//!
//! Why the next holder's token is larger: its quorum shares a node `m` with those that carry this
//! lease's token. It can bump `m`'s counter only after this lease's lock is gone from `m` — after
//! the raise, so its bump is above the token. No clock enters it as long as the counters live. The
//! fenced release (and completion) raises them again, and a counter expires only `retention` after
//! its last use (≥ twice the ttl, at least 10 s). A counter that expired or was lost (a restart
//! without persistence) starts again from the node's clock. That clock is above every token it
//! carried as long as the nodes' clocks differ by less than the time that took. That time is the
//! retention, or the restart protection's window (≥ the longest ttl) — not the acquisition's
//! duration (`tests/client/fencing.rs`:
//! `fencing_skew_a_master_ahead_by_most_of_a_ttl_never_sends_tokens_back`).
//!
//! [`RedlockBuilder::fencing`]: crate::RedlockBuilder::fencing
//! [`ExtendRequest::fence`]: crate::node::ExtendRequest::fence

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
        crate::node::FenceFloor::new(&self.key, self.token, self.retention)
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
