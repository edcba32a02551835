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
    /// Why and when the lease was lost, once it was.
    loss: Option<Loss>,
}

/// Why a lease held past its deadline is lost.
const VALIDITY_RAN_OUT: &str = "its validity ran out before an extension landed";

/// How a lease was lost: decided once (see [`LeaseState::lose`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Loss {
    /// The moment the lease stopped being held: its deadline when its validity ran out,
    /// else when an extension found its token gone.
    pub(crate) at: Instant,
    /// Why, in words (for logs and hooks).
    pub(crate) why: &'static str,
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
                loss: None,
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

    /// Whether the lease is still held and its validity not yet over. A lease found still
    /// held past its deadline is lost from here on — decided once, by whoever looks first
    /// (this, [`LeaseHandle::lost`](super::LeaseHandle::lost), an extension or the release),
    /// and counted then.
    pub(crate) fn is_valid(&self) -> bool {
        let deadline = {
            let s = self.status();
            if !s.held {
                return false;
            }
            if Instant::now() < s.deadline {
                return true;
            }
            s.deadline
        };
        self.lose_at(deadline, VALIDITY_RAN_OUT);
        false
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

    /// Records a successful extension (the caller checked the cap and the new validity);
    /// `false`, recording nothing, when the lease ended meanwhile (found lost, or released):
    /// a loss, once decided, is never undone.
    pub(crate) fn extended(&self, deadline: Instant) -> bool {
        let mut s = self.status();
        if s.held {
            s.deadline = deadline;
            s.extensions += 1;
        }
        s.held
    }

    /// Marks the lease as no longer held and wakes every waiter of
    /// [`LeaseHandle::lost`](super::LeaseHandle::lost); returns whether it was held.
    pub(crate) fn end(&self) -> bool {
        let held = std::mem::replace(&mut self.status().held, false);
        self.notify.notify_waiters();
        held
    }

    /// Its owner ends the lease (a release): one still held past its deadline is lost first
    /// (counted once, as [`is_valid`](Self::is_valid) does).
    pub(crate) fn finish(&self) {
        let lost = {
            let mut s = self.status();
            let held = std::mem::replace(&mut s.held, false);
            let lost = held && Instant::now() >= s.deadline;
            if lost {
                s.loss = Some(Loss {
                    at: s.deadline,
                    why: VALIDITY_RAN_OUT,
                });
            }
            lost.then_some(s.deadline)
        };
        self.notify.notify_waiters();
        if let Some(at) = lost {
            let after = at.saturating_duration_since(self.started);
            telemetry::lost(&self.key, VALIDITY_RAN_OUT, after, self.span.as_ref());
        }
    }

    /// The lease was found lost (expired, or its token gone from too many nodes): ends it,
    /// and counts the loss — once, if the lease was still held.
    pub(crate) fn lose(&self, why: &'static str) {
        let at = Instant::now().min(self.deadline());
        self.lose_at(at, why);
    }

    /// [`lose`](Self::lose), lost at `at`: the loss is kept (see [`LeaseState::loss`]),
    /// counted, and recorded on the lease's span.
    fn lose_at(&self, at: Instant, why: &'static str) {
        let held = {
            let mut s = self.status();
            let held = std::mem::replace(&mut s.held, false);
            if held {
                s.loss = Some(Loss { at, why });
            }
            held
        };
        self.notify.notify_waiters();
        if held {
            let after = at.saturating_duration_since(self.started);
            telemetry::lost(&self.key, why, after, self.span.as_ref());
        }
    }

    /// A loss found once its owner had ended the lease (its completion found the token
    /// gone): kept and counted, unless a loss was already.
    pub(crate) fn lost_after_end(&self, why: &'static str) {
        let at = Instant::now().min(self.deadline());
        let first = {
            let mut s = self.status();
            s.held = false;
            s.loss
                .is_none()
                .then(|| s.loss = Some(Loss { at, why }))
                .is_some()
        };
        if first {
            let after = at.saturating_duration_since(self.started);
            telemetry::lost(&self.key, why, after, self.span.as_ref());
        }
    }

    /// Why and when the lease was lost, if it was (not when it was released or completed).
    pub(crate) fn loss(&self) -> Option<Loss> {
        self.status().loss
    }
}
