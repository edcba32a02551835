//! Waking waiters on release (`RedlockBuilder::wake_waiters`): the client's side.
//!
//! A caller whose try failed waits before it tries again. Without the wake-up it sleeps the retry
//! policy's pause (a poll). With it, the polls keep their schedule and their count (the policy's
//! budget is unchanged), and a release in between makes the waiter try at once. The waiter
//! registers its interest in the key. The voters' subscribers (`node::wake`, one connection per
//! voter) listen on the key's channel. The waiter tries again as soon as a quorum of the voters
//! reported the key released since its last try began. A release is a hint, never a grant: the
//! waiter tries, and a try decides as before. A quorum, not one voter: a holder holds a quorum. The
//! partial locks a losing try gives back are never a quorum while someone holds the key. They must
//! not wake its own taker, nor anyone, into a loop of tries. (While nobody holds it, split losers
//! can give back a quorum between them: the lock loop pauses at random before a woken try after two
//! splits in a row.)
//!
//! **Fairness.** Within one client, one waiter per key waits for releases at a time. That is the
//! *turn*, a FIFO queue: tokio's semaphore is fair, and a queued waiter keeps its place across its
//! polls. The others queue in arrival order, a new caller that may wait behind them. A queued
//! waiter tries at the turn (the one before it left: the key's state is news) and at each of its
//! own polls, as without the wake-up. It never tries on another waiter's schedule. A key freed
//! without a message (a holder that does not publish, an expiry without keyspace events) is found
//! by whichever waiter polls first. Across clients a release wakes one waiter in each, and they
//! race for the quorum.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{AcquireError, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::lock::telemetry::hashed;
use crate::node::wake::{Feed, Listener};
use crate::node::AnyNode;

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
    /// The feeds (by position) that took the key: only they are told when it goes.
    watched: u64,
}

/// One key's waiters in this client.
struct KeyWake {
    /// Woken on every release heard (a waiter then counts the voters).
    notify: Notify,
    /// The voters that reported a release of the key (or subscribed to it again after a
    /// reconnection) since the turn's last try began.
    heard: AtomicU64,
    /// The turn to try: one waiter at a time, in arrival order.
    turn: Arc<Semaphore>,
}

impl Wakes {
    /// Starts the wake-up on every node that has one; `None` when fewer than a quorum have
    /// (their deleting scripts still publish, for the other clients).
    pub(crate) fn start(nodes: &mut [AnyNode], quorum: usize) -> Option<Self> {
        let shared = Arc::new_cyclic(|weak: &Weak<Shared>| {
            let feeds = nodes
                .iter_mut()
                .enumerate()
                .filter_map(|(index, node)| {
                    let listener = VoterListener {
                        shared: weak.clone(),
                        bit: 1u64 << index,
                        name: node.name().to_owned(),
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
        // Fewer voters that listen than a quorum: no release could ever wake a waiter, and a
        // queue would only hold waiters back from their polls.
        if shared.feeds.len() < quorum {
            tracing::warn!(
                listening = shared.feeds.len(),
                quorum,
                "wake: fewer voters can listen for releases than a quorum: waiters poll"
            );
            return None;
        }
        Some(Self { shared })
    }

    /// Whether this client has waiters for `key` (a new caller queues behind them).
    pub(crate) fn has_waiters(&self, key: &str) -> bool {
        lock(&self.shared.keys).contains_key(key)
    }

    /// Registers a waiter for `key` (the first one has the voters listen on it).
    pub(crate) fn interest(&self, key: &Arc<str>) -> Interest {
        let mut keys = lock(&self.shared.keys);
        let entry = keys.entry(key.clone()).or_insert_with(|| {
            let watched = (self.shared.feeds.iter().enumerate())
                .filter(|(_, feed)| feed.watch(key))
                .fold(0, |m, (i, _)| m | 1u64 << i);
            Entry {
                watched,
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
            queued: None,
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
    /// The place in the key's queue, kept across waits.
    queued: Option<Queued>,
}

type Queued = Pin<Box<dyn Future<Output = Result<OwnedSemaphorePermit, AcquireError>> + Send>>;

/// Why a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Woken {
    /// A quorum of the voters reported the key released, or the turn came: a try between
    /// polls.
    Early,
    /// The poll came (or the queue's time ran out): the try the policy counts.
    Poll,
}

impl Interest {
    /// A try begins: with the turn, the releases heard before it are spent (a waiter that
    /// tries without the turn leaves them to the turn's).
    pub(crate) fn before_try(&self) {
        if self.turn.is_some() {
            self.key.heard.store(0, Ordering::Relaxed);
        }
    }

    /// Waits for this waiter's turn among the client's waiters of the key: at once when it
    /// is free or already held, else queued until its own `poll` (then it tries as a poll,
    /// keeping its place). `Early`: the turn.
    pub(crate) async fn queue(&mut self, poll: Instant) -> Woken {
        if self.take_free_turn() {
            return Woken::Early;
        }
        let turn = &self.key.turn;
        let queued = self
            .queued
            .get_or_insert_with(|| Box::pin(turn.clone().acquire_owned()));
        match tokio::time::timeout_at(poll, queued).await {
            Ok(Ok(permit)) => {
                self.queued = None;
                self.turn = Some(permit);
                // The one before left: it holds the key, found the work completed, or gave
                // up — the key's state is news.
                Woken::Early
            }
            Ok(Err(_)) => {
                self.queued = None;
                Woken::Poll
            }
            Err(_) => Woken::Poll,
        }
    }

    /// Whether this waiter has the turn, taking it if it is free and the waiter is not
    /// queued for it (a queued waiter's place comes first).
    fn take_free_turn(&mut self) -> bool {
        if self.turn.is_none() && self.queued.is_none() {
            self.turn = self.key.turn.clone().try_acquire_owned().ok();
        }
        self.turn.is_some()
    }

    /// Waits to try again, at the latest at `poll`: for this waiter's turn ([`Interest::queue`];
    /// a free turn is taken at once), then, with the turn, for a quorum of the voters to
    /// report the key released.
    pub(crate) async fn wait(&mut self, poll: Instant) -> Woken {
        self.offer_again();
        if !self.take_free_turn() {
            return self.queue(poll).await;
        }
        loop {
            let notified = self.key.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.key.heard.load(Ordering::Relaxed).count_ones() >= self.shared.quorum {
                return Woken::Early;
            }
            tokio::select! {
                () = notified => {}
                () = tokio::time::sleep_until(poll) => return Woken::Poll,
            }
        }
    }
}

impl Interest {
    /// Offers the key again to the voters whose subscriber refused it (a full queue): the
    /// queue may have room now.
    fn offer_again(&self) {
        let all = u64::MAX >> (64 - self.shared.feeds.len().clamp(1, 64));
        let mut keys = lock(&self.shared.keys);
        let Some(entry) = keys.get_mut(&self.name) else {
            return;
        };
        if entry.watched & all == all {
            return;
        }
        for (i, feed) in self.shared.feeds.iter().enumerate() {
            let bit = 1u64 << i;
            if entry.watched & bit == 0 && feed.watch(&self.name) {
                entry.watched |= bit;
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
                let watched = entry.watched;
                keys.remove(&self.name);
                for (i, feed) in self.shared.feeds.iter().enumerate() {
                    if watched & (1u64 << i) != 0 {
                        feed.unwatch(&self.name);
                    }
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

    fn refused(&self, key: &str) {
        if !self.warned.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                voter = %self.name,
                key = %hashed(key),
                "wake: the voter refuses the wake-up's channels (ACL): its waiters poll; \
                 allow them with `&<key prefix>*` (and `&__keyspace@*` for expiries)"
            );
        }
    }
}

/// The pause of a waiter woken after `splits` split tries in a row (2 or more) before it
/// tries again: random, up to 2, 4, 8, 16 then 20 ms as the streak grows, never past its
/// poll (`until_poll` away).
pub(crate) fn split_pause(splits: u32, until_poll: Duration) -> Duration {
    const MAX_MS: u64 = 20;
    let ms = (1u64 << splits.saturating_sub(1).min(5)).min(MAX_MS);
    Duration::from_micros(fastrand::u64(0..=ms * 1000)).min(until_poll)
}

/// The map's lock; a poisoned map is still a map (nothing here panics while holding it).
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A registry without voters, and the listener of its voter `index`.
    fn wakes(quorum: u32) -> Wakes {
        Wakes {
            shared: Arc::new(Shared {
                keys: Mutex::default(),
                feeds: Vec::new(),
                quorum,
            }),
        }
    }

    fn voter(w: &Wakes, index: usize) -> VoterListener {
        VoterListener {
            shared: Arc::downgrade(&w.shared),
            bit: 1 << index,
            name: format!("voter-{index}"),
            warned: AtomicBool::new(false),
        }
    }

    fn key(k: &str) -> Arc<str> {
        Arc::from(k)
    }

    /// A wait with the turn ends at a quorum of the voters' releases, not at one (a losing
    /// try's own cleanup is never a quorum while someone holds the key), else at the poll.
    #[tokio::test(start_paused = true)]
    async fn a_quorum_of_releases_ends_the_wait_one_does_not() {
        let w = wakes(2);
        let k = key("job");
        let mut i = w.interest(&k);
        i.before_try();
        let poll = Instant::now() + Duration::from_secs(10);
        let (a, b) = (voter(&w, 0), voter(&w, 1));
        let waiting = async {
            let started = Instant::now();
            (i.wait(poll).await, started.elapsed())
        };
        let releases = async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            a.released("job");
            a.released("job"); // the same voter twice is still one voter
            tokio::time::sleep(Duration::from_secs(1)).await;
            b.released("job");
        };
        let ((woken, after), ()) = tokio::join!(waiting, releases);
        assert_eq!(woken, Woken::Early);
        assert_eq!(
            after,
            Duration::from_secs(2),
            "woken at the second voter's release"
        );
        // Spent by the next try: the poll ends the next wait.
        i.before_try();
        a.released("other-key");
        assert_eq!(
            i.wait(Instant::now() + Duration::from_secs(3)).await,
            Woken::Poll
        );
    }

    /// A key a voter's full queue refused is offered again at the waiter's next wait, and
    /// taken once the queue has room: a storm's refusals do not last the key's contention.
    #[tokio::test(start_paused = true)]
    async fn a_refused_key_is_offered_again_at_the_next_wait() {
        use crate::node::wake::QUEUE_CAPACITY;
        let (feed, ops) = Feed::channel("voter-0");
        for i in 0..QUEUE_CAPACITY {
            assert!(feed.watch(&key(&format!("filler-{i}"))));
        }
        let w = Wakes {
            shared: Arc::new(Shared {
                keys: Mutex::default(),
                feeds: vec![feed],
                quorum: 1,
            }),
        };
        let k = key("job");
        let mut i = w.interest(&k);
        let watched = |w: &Wakes| lock(&w.shared.keys)["job"].watched;
        assert_eq!(watched(&w), 0, "refused: the queue is full");
        let poll = || Instant::now() + Duration::from_millis(10);
        assert_eq!(i.wait(poll()).await, Woken::Poll);
        assert_eq!(watched(&w), 0, "still full");
        let fillers = ops.next(usize::MAX).await.unwrap();
        assert_eq!(fillers.len(), QUEUE_CAPACITY, "the subscriber took them");
        assert_eq!(i.wait(poll()).await, Woken::Poll);
        assert_eq!(watched(&w), 1, "taken once there is room");
        drop(i);
        let last = ops.next(usize::MAX).await.unwrap();
        assert_eq!(last, vec![(k, false)], "its unwatch, since it was taken");
    }

    /// The split pause grows with the streak, never over 20 ms, never past the poll.
    #[test]
    fn a_split_pause_is_at_most_20_ms_and_never_past_the_poll() {
        let ms = Duration::from_millis;
        for _ in 0..200 {
            assert!(split_pause(2, ms(100)) <= ms(2));
            assert!(split_pause(4, ms(100)) <= ms(8));
            for splits in [6, 7, 40, u32::MAX] {
                assert!(split_pause(splits, ms(100)) <= ms(20));
                assert!(split_pause(splits, ms(3)) <= ms(3));
                assert_eq!(split_pause(splits, Duration::ZERO), Duration::ZERO);
            }
        }
        // Random, not a constant: the streak's pauses spread out.
        let pauses: std::collections::HashSet<_> =
            (0..50).map(|_| split_pause(6, ms(100))).collect();
        assert!(pauses.len() > 10, "{pauses:?}");
    }

    /// Within a client, the turn goes in arrival order; a queued waiter keeps its place
    /// across its polls, tries at each of its own polls (never on the turn holder's
    /// schedule), and is told when its turn comes.
    #[tokio::test(start_paused = true)]
    async fn the_turn_goes_in_arrival_order_and_a_place_survives_a_poll() {
        let w = wakes(1);
        let k = key("job");
        let (mut a, mut b, mut c) = (w.interest(&k), w.interest(&k), w.interest(&k));
        let poll = || Instant::now() + Duration::from_secs(1);
        // `a` takes the turn and waits for a release; `b`, then `c`, queue.
        let a_waits = tokio::time::timeout(Duration::from_millis(10), a.wait(poll()));
        assert!(
            a_waits.await.is_err(),
            "a has the turn: it waits for a release"
        );
        let asked = Instant::now();
        assert_eq!(b.wait(poll()).await, Woken::Poll, "b queued until its poll");
        assert_eq!(asked.elapsed(), Duration::from_secs(1), "b's own poll");
        let short = Instant::now() + Duration::from_millis(50);
        assert_eq!(c.wait(short).await, Woken::Poll, "c queued until its poll");
        assert_eq!(
            asked.elapsed(),
            Duration::from_millis(1_050),
            "c's own poll"
        );
        // Both keep their places: when `a` leaves, `b` (queued first) gets the turn.
        drop(a);
        let later = || Instant::now() + Duration::from_secs(60);
        assert_eq!(b.wait(later()).await, Woken::Early, "b's turn");
        let c_waits = tokio::time::timeout(Duration::from_secs(5), c.wait(later()));
        assert!(c_waits.await.is_err(), "c still queued behind b");
        drop(b);
        assert_eq!(c.wait(later()).await, Woken::Early, "c's turn");
        // The last waiter gone, the key is forgotten.
        drop(c);
        assert!(!w.has_waiters("job"));
        // A newcomer that finds the turn free takes it at once (no wait: it has not tried).
        let mut newcomer = w.interest(&k);
        let asked = Instant::now();
        assert_eq!(newcomer.queue(poll()).await, Woken::Early);
        assert_eq!(asked.elapsed(), Duration::ZERO);
    }
}
