//! What a voter that wakes waiters offers the client: a [`Feed`] of the keys to listen on,
//! and a [`Listener`] it tells what it heard.
//!
//! A voter's scripts publish `released` on the channel named as a lock's key whenever they
//! delete that lock (opt-in, see `RedlockBuilder::wake_waiters`). The voter's subscriber —
//! one connection per voter, shared by every waiter of the client, reconnected in the
//! background — listens on the keys the client's waiters wait for and tells the client each
//! release it hears. A message is a hint, never a grant: the waiter it wakes tries again, as
//! after a poll.

use std::sync::Arc;

use tokio::sync::mpsc;

/// What a voter's subscriber tells the client.
pub(crate) trait Listener: Send + Sync + 'static {
    /// The lock `key` was deleted on this voter (a release, a completion, a failed try's
    /// cleanup, a forced release), or expired (keyspace notifications).
    fn released(&self, key: &str);

    /// The subscriber (re)subscribed to `keys`: releases before it may have been missed, so
    /// their waiters try again.
    fn subscribed(&self, keys: &[Arc<str>]);

    /// The voter refuses the wake-up for `key` (its ACL denies the key's channel): its
    /// waiters poll. (Redis's `NOPERM` text names the channel, the raw key: not logged.)
    fn refused(&self, key: &str);
}

/// A change to the keys a subscriber listens on.
#[derive(Debug)]
pub(crate) enum Op {
    /// Listen on the key's channel: the key has waiters.
    Watch(Arc<str>),
    /// Stop listening on the key's channel: its last waiter is gone.
    Unwatch(Arc<str>),
}

/// The client's end of one voter's subscriber: the keys to listen on. The subscriber ends
/// when this is dropped.
#[derive(Debug, Clone)]
pub(crate) struct Feed {
    ops: mpsc::UnboundedSender<Op>,
}

impl Feed {
    /// A feed and the receiving end its subscriber reads.
    pub(crate) fn channel() -> (Self, mpsc::UnboundedReceiver<Op>) {
        let (ops, rx) = mpsc::unbounded_channel();
        (Self { ops }, rx)
    }

    /// Listen on `key` (no await: the subscriber does it in the background).
    pub(crate) fn watch(&self, key: &Arc<str>) {
        let _ = self.ops.send(Op::Watch(key.clone()));
    }

    /// Stop listening on `key`.
    pub(crate) fn unwatch(&self, key: &Arc<str>) {
        let _ = self.ops.send(Op::Unwatch(key.clone()));
    }
}
