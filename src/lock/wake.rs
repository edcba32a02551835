//! Waking waiters on release (`RedlockBuilder::wake_waiters`): the client's side.
//!
//! A caller whose try failed waits before it tries again. Without the wake-up it sleeps the
//! retry policy's pause (a poll). With it, it registers its interest in the key: the voters'
//! subscribers (`node::wake`, one connection per voter) listen on the key's channel, and the
//! waiter tries again as soon as a quorum of the voters reported the key released — or one
//! did and [`GRACE`] passed (a holder that held on fewer voters), or the pause ended (the
//! poll stays: a message lost on a reconnect, a holder that crashed and let its key expire,
//! a client that does not publish). A release is a hint, never a grant: the waiter tries, and
//! a try decides as before.
//!
//! **Fairness.** Within one client, one waiter per key waits to try at a time (the *turn*,
//! a FIFO queue: tokio's semaphore is fair); the others queue in arrival order, a new caller
//! behind them. Across clients a release wakes one waiter in each, and they race for the
//! quorum. The registration happens after a failed try: the subscription's confirmation
//! counts as a release, so a release between that try and the subscription is never missed
//! (the waiter tries once more when it is subscribed).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::node::wake::{Feed, Listener};
use crate::node::AnyNode;

/// How long a waiter that heard a release from some voters, but not yet from a quorum,
/// waits for the rest before it tries (the releases of one lock arrive within about one
/// round trip of each other; a lock held on fewer than all voters is released on fewer).
pub(crate) const GRACE: Duration = Duration::from_millis(5);

/// The client's waiters, by key, and the voters' feeds.
pub(crate) struct Wakes {
    shared: Arc<Shared>,
}

struct Shared {
    keys: Mutex<HashMap<Arc<str>, Entry>>,
    /// One per voter that wakes (a voter over a caller's connection, or not Redis, polls).
    feeds: Vec<Feed>,
    /// How many voters' releases make a waiter try at once.
    quorum: u32,
}

struct Entry {
    waiters: usize,
    key: Arc<KeyWake>,
}

/// One key's waiters in this client.
struct KeyWake {
    /// Woken on every release heard (a waiter then counts the voters).
    notify: Notify,
    /// The voters that reported a release of the key (or subscribed to it) since the last
    /// try began.
    heard: AtomicU64,
    /// The turn to try: one waiter at a time, in arrival order.
    turn: Arc<Semaphore>,
}

impl Wakes {
    /// Starts the wake-up on every node that has one; `None` when none has.
    pub(crate) fn start(nodes: &mut [AnyNode], quorum: usize) -> Option<Self> {
        let shared = Arc::new_cyclic(|weak: &Weak<Shared>| {
            let feeds = nodes
                .iter_mut()
                .enumerate()
                .filter_map(|(index, node)| {
                    let listener = VoterListener {
                        shared: weak.clone(),
                        bit: 1u64 << index,
                        name: node.name(),
                        warned: AtomicBool::new(false),
                    };
                    node.start_wake(Arc::new(listener))
                })
                .collect();
            Shared {
                keys: Mutex::default(),
                feeds,
                quorum: u32::try_from(quorum).unwrap_or(u32::MAX),
            }
        });
        (!shared.feeds.is_empty()).then_some(Self { shared })
    }

    /// Whether this client has waiters for `key` (a new caller queues behind them).
    pub(crate) fn has_waiters(&self, key: &str) -> bool {
        lock(&self.shared.keys).contains_key(key)
    }

    /// Registers a waiter for `key` (the first one has the voters listen on it).
    pub(crate) fn interest(&self, key: &Arc<str>) -> Interest {
        let mut keys = lock(&self.shared.keys);
        let entry = keys.entry(key.clone()).or_insert_with(|| {
            for feed in &self.shared.feeds {
                feed.watch(key);
            }
            Entry {
                waiters: 0,
                key: Arc::new(KeyWake {
                    notify: Notify::new(),
                    heard: AtomicU64::new(0),
                    turn: Arc::new(Semaphore::new(1)),
                }),
            }
        });
        entry.waiters += 1;
        Interest {
            shared: self.shared.clone(),
            name: key.clone(),
            key: entry.key.clone(),
            turn: None,
        }
    }
}

/// A waiter's registration for one key; dropped when its lock call ends (the last one has
/// the voters stop listening).
pub(crate) struct Interest {
    shared: Arc<Shared>,
    name: Arc<str>,
    key: Arc<KeyWake>,
    turn: Option<OwnedSemaphorePermit>,
}

impl Interest {
    /// A try begins: the releases heard before it are spent.
    pub(crate) fn before_try(&self) {
        self.key.heard.store(0, Ordering::Relaxed);
    }

    /// Waits to try again: for this waiter's turn among the client's waiters of the key (in
    /// the queue until `queue_until`, or for `pause` without one: then it tries at once);
    /// with the turn, at most `pause`, for a quorum of the voters to report the key released
    /// (or one, and [`GRACE`]).
    pub(crate) async fn wait(&mut self, pause: Duration, queue_until: Option<Instant>) {
        if self.turn.is_none() {
            let queued = self.key.turn.clone().acquire_owned();
            let limit = queue_until.unwrap_or_else(|| Instant::now() + pause);
            if let Ok(Ok(permit)) = tokio::time::timeout_at(limit, queued).await {
                self.turn = Some(permit);
            }
            // The turn came (the waiter before left: it has the lock, found the work
            // completed, or gave up — the key's state is news), or the wait ended in the
            // queue: try now, as a poll would.
            return;
        }
        let until = Instant::now() + pause;
        let mut first: Option<Instant> = None;
        loop {
            let notified = self.key.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let heard = self.key.heard.load(Ordering::Relaxed);
            if heard.count_ones() >= self.shared.quorum {
                return;
            }
            let mut wake_at = until;
            if heard != 0 {
                let at = *first.get_or_insert_with(Instant::now) + GRACE;
                wake_at = wake_at.min(at);
            }
            if Instant::now() >= wake_at {
                return;
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(wake_at) => return,
            }
        }
    }
}

impl Drop for Interest {
    fn drop(&mut self) {
        let mut keys = lock(&self.shared.keys);
        if let Some(entry) = keys.get_mut(&self.name) {
            entry.waiters -= 1;
            if entry.waiters == 0 {
                keys.remove(&self.name);
                for feed in &self.shared.feeds {
                    feed.unwatch(&self.name);
                }
            }
        }
    }
}

/// One voter's subscriber's news, for the client's waiters.
struct VoterListener {
    shared: Weak<Shared>,
    bit: u64,
    name: String,
    warned: AtomicBool,
}

impl VoterListener {
    fn heard(&self, key: &str) {
        let Some(shared) = self.shared.upgrade() else {
            return;
        };
        let keys = lock(&shared.keys);
        if let Some(entry) = keys.get(key) {
            entry.key.heard.fetch_or(self.bit, Ordering::Relaxed);
            entry.key.notify.notify_waiters();
        }
    }
}

impl Listener for VoterListener {
    fn released(&self, key: &str) {
        self.heard(key);
    }

    fn subscribed(&self, keys: &[Arc<str>]) {
        for key in keys {
            self.heard(key);
        }
    }

    fn refused(&self, why: &str) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                voter = %self.name,
                error = %why,
                "wake: the voter refuses the wake-up's channels (ACL): its waiters poll; \
                 allow them with `&<key prefix>*` (and `&__keyspace@*` for expiries)"
            );
        }
    }
}

/// The map's lock; a poisoned map is still a map (nothing here panics while holding it).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
