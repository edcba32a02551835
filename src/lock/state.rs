//! What a lease and its handles share: the key, the token, the validity, whether it is still
//! held, and the span it is held in.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::fencing::Fence;
use super::telemetry;
use super::token::Token;

/// What a granted try hands to its lease.
pub(crate) struct Grant {
    /// When the try started: the validity counts from there.
    pub(crate) start: Instant,
    /// The end of the validity.
    pub(crate) deadline: Instant,
    /// The nodes that may hold our token.
    pub(crate) holders: u64,
    /// The fencing token (with fencing on).
    pub(crate) fence: Option<Fence>,
}

/// What a lease and its handles share.
pub(crate) struct LeaseState {
    pub(super) key: Arc<str>,
    pub(super) prefix_len: usize,
    token: Token,
    ttl: Duration,
    status: Mutex<Status>,
    pub(super) notify: Notify,
    /// The nodes that may hold our token: those that voted for, and those whose request was
    /// sent but not answered when the lock was granted (it may land; a release sent later on
    /// the same connection follows it). The others — they said "held", were not asked, or
    /// were never sent the request — hold nothing of ours, and releases skip them.
    holders: u64,
    /// The fencing token, with fencing on.
    fence: Option<Fence>,
    /// When the lock request was sent (the hold time counts from there).
    started: Instant,
    /// The `redlock.lease` span (none unless a subscriber wants it): lasts as long as the
    /// lease; its extensions, release and background work link to it.
    span: Option<tracing::Span>,
}

pub(super) struct Status {
    pub(super) deadline: Instant,
    extensions: u32,
    /// False once the lease is released or known to be lost.
    pub(super) held: bool,
}

impl LeaseState {
    pub(crate) fn new(
        key: Arc<str>,
        prefix_len: usize,
        token: Token,
        ttl: Duration,
        grant: Grant,
        span: Option<tracing::Span>,
    ) -> Arc<Self> {
        Arc::new(Self {
            key,
            prefix_len,
            token,
            ttl,
            status: Mutex::new(Status {
                deadline: grant.deadline,
                extensions: 0,
                held: true,
            }),
            notify: Notify::new(),
            holders: grant.holders,
            fence: grant.fence,
            started: grant.start,
            span,
        })
    }

    pub(super) fn status(&self) -> MutexGuard<'_, Status> {
        // Updates are single assignments: a poisoned lock holds consistent data.
        self.status.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn key(&self) -> &str {
        &self.key
    }

    pub(crate) fn token(&self) -> &str {
        self.token.as_str()
    }

    /// The fencing token and its counter, with fencing on.
    pub(crate) fn fence(&self) -> Option<&Fence> {
        self.fence.as_ref()
    }

    /// The nodes that may hold our token (see the field).
    pub(crate) fn holders(&self) -> u64 {
        self.holders
    }

    pub(crate) fn key_arc(&self) -> Arc<str> {
        self.key.clone()
    }

    pub(crate) fn token_copy(&self) -> Token {
        self.token
    }

    pub(crate) fn ttl(&self) -> Duration {
        self.ttl
    }

    /// When the lock request was sent.
    pub(crate) fn started(&self) -> Instant {
        self.started
    }

    /// The lease's span (see the field).
    pub(crate) fn span(&self) -> Option<&tracing::Span> {
        self.span.as_ref()
    }

    pub(crate) fn deadline(&self) -> Instant {
        self.status().deadline
    }

    pub(crate) fn extension_count(&self) -> u32 {
        self.status().extensions
    }

    /// Whether the lease is still held and its validity not yet over.
    pub(crate) fn is_valid(&self) -> bool {
        let s = self.status();
        s.held && Instant::now() < s.deadline
    }

    /// The remaining validity: zero once the lease expired, was released or was lost.
    pub(crate) fn validity(&self) -> Duration {
        let s = self.status();
        if s.held {
            s.deadline.saturating_duration_since(Instant::now())
        } else {
            Duration::ZERO
        }
    }

    /// Records a successful extension (the caller checked the cap and the new validity).
    pub(crate) fn extended(&self, deadline: Instant) {
        let mut s = self.status();
        s.deadline = deadline;
        s.extensions += 1;
    }

    /// Marks the lease as no longer held and wakes every waiter of
    /// [`LeaseHandle::lost`](super::LeaseHandle::lost); returns whether it was held.
    pub(crate) fn end(&self) -> bool {
        let held = std::mem::replace(&mut self.status().held, false);
        self.notify.notify_waiters();
        held
    }

    /// An extension found the lease lost (expired, or its token gone from too many nodes):
    /// ends it, and counts the loss — once, if the lease was still held.
    pub(crate) fn lose(&self, why: &str) {
        if self.end() {
            telemetry::lost(&self.key, why);
        }
    }
}
