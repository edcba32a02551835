//! What a voter that wakes waiters offers the client: a [`Feed`] of the keys to listen on,
//! and a [`Listener`] it tells what it heard.
//!
//! A voter's scripts publish `released` on the channel named as a lock's key whenever they
//! delete that lock (opt-in, see `RedlockBuilder::wake_waiters`). The voter's subscriber —
//! one connection per voter, shared by every waiter of the client, reconnected in the
//! background — listens on the keys the client's waiters wait for and tells the client each
//! release it hears. A message is a hint, never a grant: the waiter it wakes tries again, as
//! after a poll.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

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

/// The most keys a voter's subscriber has waiting for their subscription: a key that comes
/// when as many wait is not listened on at that voter (its waiters count on the other
/// voters' releases, and poll), counted by [`WAKE_QUEUE_FULL`](crate::metrics::WAKE_QUEUE_FULL).
/// The subscriber takes them in batches, each one command per batch on a master.
pub(crate) const QUEUE_CAPACITY: usize = 4_096;

/// The keys a subscriber is asked to listen on (`true`) or to stop listening on (`false`),
/// not yet taken: the latest word per key, so a key that comes and goes before the
/// subscriber looks costs nothing.
#[derive(Debug, Default)]
struct Pending {
    changes: HashMap<Arc<str>, bool>,
    /// The feed was dropped: the subscriber ends.
    closed: bool,
    /// The subscriber ended (it could not start): nothing is taken any more.
    gone: bool,
}

#[derive(Debug)]
struct Shared {
    pending: Mutex<Pending>,
    ready: Notify,
    /// The voter's name (the metrics' `node` label).
    name: Arc<str>,
}

/// The client's end of one voter's subscriber: the keys to listen on. The subscriber ends
/// when this is dropped.
#[derive(Debug)]
pub(crate) struct Feed {
    shared: Arc<Shared>,
}

/// A batch of changes to the keys listened on: each key's latest word (`true`: listen).
pub(crate) type Changes = Vec<(Arc<str>, bool)>;

/// What [`Ops::take`] found.
enum Taken {
    Closed,
    Nothing,
    Batch(Changes),
}

/// The subscriber's end of a [`Feed`].
#[derive(Debug)]
pub(crate) struct Ops {
    shared: Arc<Shared>,
}

impl Feed {
    /// A feed for the voter `name` and the end its subscriber reads.
    pub(crate) fn channel(name: &str) -> (Self, Ops) {
        let shared = Arc::new(Shared {
            pending: Mutex::default(),
            ready: Notify::new(),
            name: name.into(),
        });
        let ops = Ops {
            shared: shared.clone(),
        };
        (Self { shared }, ops)
    }

    /// Listen on `key` (no await: the subscriber does it in the background). `false` when
    /// [`QUEUE_CAPACITY`] keys are waiting already: not listened on here (nothing to undo).
    pub(crate) fn watch(&self, key: &Arc<str>) -> bool {
        let mut p = lock(&self.shared.pending);
        if p.gone {
            return false;
        }
        let queued = p.changes.len();
        match p.changes.get_mut(key) {
            Some(listen) => *listen = true,
            None if queued >= QUEUE_CAPACITY => {
                drop(p);
                crate::metrics::wake_queue_full(&self.shared.name);
                return false;
            }
            None => {
                p.changes.insert(key.clone(), true);
            }
        }
        drop(p);
        self.shared.ready.notify_one();
        true
    }

    /// Stop listening on `key`, which [`Feed::watch`] accepted. Never refused: a
    /// subscription is never left behind (at most one word per key is pending, so the
    /// queue holds at most the keys listened on besides [`QUEUE_CAPACITY`]).
    pub(crate) fn unwatch(&self, key: &Arc<str>) {
        let mut p = lock(&self.shared.pending);
        if !p.gone {
            p.changes.insert(key.clone(), false);
        }
        drop(p);
        self.shared.ready.notify_one();
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        lock(&self.shared.pending).closed = true;
        self.shared.ready.notify_one();
    }
}

impl Drop for Ops {
    fn drop(&mut self) {
        let mut p = lock(&self.shared.pending);
        p.gone = true;
        p.changes.clear();
    }
}

impl Ops {
    /// The changes asked for since the last call, at most `max` (the oldest words first is
    /// not promised: each key's latest word is), waiting for one; `None` once the feed is
    /// dropped.
    pub(crate) async fn next(&self, max: usize) -> Option<Changes> {
        loop {
            let ready = self.shared.ready.notified();
            match self.take(max) {
                Taken::Closed => return None,
                Taken::Batch(batch) => return Some(batch),
                Taken::Nothing => ready.await,
            }
        }
    }

    /// The changes pending now.
    fn take(&self, max: usize) -> Taken {
        let mut p = lock(&self.shared.pending);
        if p.closed {
            return Taken::Closed;
        }
        if p.changes.is_empty() {
            return Taken::Nothing;
        }
        let batch: Changes = if p.changes.len() <= max {
            p.changes.drain().collect()
        } else {
            let keys: Vec<Arc<str>> = p.changes.keys().take(max).cloned().collect();
            keys.into_iter()
                .filter_map(|k| p.changes.remove_entry(&k))
                .collect()
        };
        drop(p);
        if !self.is_empty() {
            // More than one batch: the next call need not wait.
            self.shared.ready.notify_one();
        }
        Taken::Batch(batch)
    }

    fn is_empty(&self) -> bool {
        lock(&self.shared.pending).changes.is_empty()
    }

    /// Whether `key`'s waiters have left and the subscriber has not taken that word yet: a
    /// subscription it would make now would be undone by the next batch. (Asked by the
    /// Cluster subscriber.)
    #[cfg_attr(not(feature = "cluster"), allow(dead_code))]
    pub(crate) fn leaving(&self, key: &str) -> bool {
        lock(&self.shared.pending).changes.get(key) == Some(&false)
    }

    /// How many keys wait for their (un)subscription.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        lock(&self.shared.pending).changes.len()
    }
}

/// The lock; a poisoned one is still the data (nothing here panics while holding it).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(i: usize) -> Arc<str> {
        format!("key-{i}").into()
    }

    /// A key whose waiters left is "leaving" until the subscriber takes that word, and not
    /// once it is wanted again.
    #[tokio::test]
    async fn a_key_is_leaving_from_its_unwatch_until_taken() {
        let (feed, ops) = Feed::channel("voter");
        assert!(feed.watch(&key(1)));
        assert!(!ops.leaving("key-1"), "wanted");
        ops.next(8).await.expect("a batch");
        feed.unwatch(&key(1));
        assert!(ops.leaving("key-1"));
        assert!(!ops.leaving("key-2"), "never watched");
        assert!(feed.watch(&key(1)));
        assert!(!ops.leaving("key-1"), "wanted again");
        feed.unwatch(&key(1));
        ops.next(8).await.expect("a batch");
        assert!(!ops.leaving("key-1"), "taken");
    }

    /// The queue holds at most [`QUEUE_CAPACITY`] keys to listen on: the next is refused
    /// (it polls there); a key already pending, and every unwatch, is always taken; a key
    /// that came and went is one word.
    #[tokio::test]
    async fn the_queue_is_bounded_and_coalesces() {
        let (feed, ops) = Feed::channel("voter");
        for i in 0..QUEUE_CAPACITY {
            assert!(feed.watch(&key(i)));
        }
        assert!(!feed.watch(&key(QUEUE_CAPACITY)), "full");
        assert!(feed.watch(&key(7)), "already pending");
        feed.unwatch(&key(7));
        assert_eq!(ops.len(), QUEUE_CAPACITY);
        let first = ops.next(1_000).await.unwrap();
        assert_eq!(first.len(), 1_000);
        let mut taken = first;
        while !ops.is_empty() {
            taken.extend(ops.next(1_000).await.unwrap());
        }
        assert_eq!(taken.len(), QUEUE_CAPACITY);
        assert!(taken.contains(&(key(7), false)), "the latest word");
        // Room again; an unwatch of a listened key is never refused.
        for i in 0..QUEUE_CAPACITY {
            assert!(feed.watch(&key(i + QUEUE_CAPACITY)));
        }
        feed.unwatch(&key(1));
        assert_eq!(ops.len(), QUEUE_CAPACITY + 1);
        drop(feed);
        assert!(ops.next(10).await.is_none(), "the feed is gone");
    }

    /// A subscriber that ended (it could not start) takes no key: none is queued, none
    /// counted as refused for a full queue.
    #[test]
    fn a_feed_without_its_subscriber_takes_nothing() {
        let (feed, ops) = Feed::channel("voter");
        assert!(feed.watch(&key(1)));
        drop(ops);
        assert!(!feed.watch(&key(2)));
        feed.unwatch(&key(1));
        assert!(lock(&feed.shared.pending).changes.is_empty());
    }
}
