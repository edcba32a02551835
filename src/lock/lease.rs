//! The held lock: [`Lease`], what its owner holds (the resource, the token, the validity,
//! the fencing token), and [`LeaseHandle`], a view of it for other tasks. What they share
//! is in `state.rs`; the verbs that act on a lease are with the verbs: `extend.rs`
//! ([`Lease::extend`], [`Lease::keep_alive`]), `release.rs` ([`Lease::release`], and the
//! release on drop), `completion/` ([`Lease::complete`]).

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::state::LeaseState;
use super::Redlock;

/// A lock held on a quorum of nodes, returned by [`Redlock::lock`].
///
/// It carries what the Ruby gem's lock info carries — the resource, the value (token) and the
/// validity — and releases itself when dropped: the release is *spawned* on the Tokio
/// runtime, never blocking the dropping thread. Call [`Lease::release`] to release it and
/// wait for the nodes' answers.
///
/// The validity is counted on the monotonic clock from the moment the lock request was sent,
/// minus the clock drift allowance. Work that must not run unlocked should check
/// [`Lease::is_valid`] (or hold a [`LeaseHandle`] and watch [`LeaseHandle::lost`]) before
/// each step that needs the lock, or turn on [`Lease::keep_alive`].
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_redlock::Error> {
/// use std::time::Duration;
/// use tower_redlock::Redlock;
///
/// let redlock = Redlock::in_memory();
/// let lease = redlock.lock("report:2024", Duration::from_secs(2)).await?;
/// assert_eq!(lease.resource(), "report:2024");
/// assert_eq!(lease.value().len(), 32);
/// assert!(lease.is_valid() && lease.validity() <= Duration::from_secs(2));
/// println!("{lease}"); // {resource: "report:2024", value: "…", validity: 1977 ms}
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "a Lease is the held lock: dropping it releases the lock at once (in the background)"]
pub struct Lease {
    pub(super) client: Redlock,
    pub(super) state: Arc<LeaseState>,
    /// The keep-alive task (see `extend.rs`).
    pub(super) keep_alive: Option<tokio::task::JoinHandle<()>>,
    /// Whether the release (or the completion) took over the lock: `Drop` then releases
    /// nothing.
    pub(super) released: bool,
    /// The acquisition's requests still unanswered when the lock was granted, kept (not polled)
    /// until the release. One already handed to its connection is written (redis-rs skips a queued
    /// request whose caller is gone). So the lock lands on every master that is up and connected.
    /// One never handed over (to a connection still being made) is never sent. Dropped with the
    /// lease.
    _parked: Option<Parked>,
}

/// Requests kept alive, unpolled (see `Lease::_parked`).
pub(crate) struct Parked(#[allow(dead_code)] Mutex<Box<dyn Send>>);

impl Parked {
    pub(crate) fn new(requests: impl Send + 'static) -> Self {
        Self(Mutex::new(Box::new(requests)))
    }
}

impl Lease {
    /// The largest completion record [`Lease::complete`] stores (1 MiB): records live in the
    /// masters' memory, beside the locks.
    pub const MAX_RECORD_LEN: usize = 1 << 20;

    /// The longest a completion record is kept (one year).
    pub const MAX_RECORD_RETENTION: Duration = Duration::from_secs(365 * 86_400);

    pub(crate) fn new(client: Redlock, state: Arc<LeaseState>, parked: Option<Parked>) -> Self {
        Self {
            client,
            state,
            keep_alive: None,
            released: false,
            _parked: parked,
        }
    }

    /// The resource name the lock was taken for.
    pub fn resource(&self) -> &str {
        &self.state.key[self.state.prefix_len..]
    }

    /// The Redis key: the resource name behind the client's key prefix (none by default).
    pub fn key(&self) -> &str {
        self.state.key()
    }

    /// The fencing token ([`RedlockBuilder::fencing`](crate::RedlockBuilder::fencing)):
    /// larger than the token of every earlier holder of this resource. Pass it with every
    /// write to storage that can refuse a write whose token is smaller than one it has seen
    /// (a compare-and-set), so that this holder — if paused past its validity — cannot
    /// write after the next one. `None` without fencing.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_redlock::Error> {
    /// use std::time::Duration;
    /// use tower_redlock::{node::MemoryNode, Redlock};
    ///
    /// let redlock = Redlock::builder().node(MemoryNode::new()).fencing(true).build()?;
    /// let first = redlock.lock("ledger", Duration::from_secs(2)).await?;
    /// let a = first.fencing_token().expect("fencing is on");
    /// first.release().await?;
    /// let second = redlock.lock("ledger", Duration::from_secs(2)).await?;
    /// assert!(second.fencing_token().unwrap() > a);
    /// # Ok(()) }
    /// ```
    pub fn fencing_token(&self) -> Option<u64> {
        self.state.fence().map(|f| f.token)
    }

    /// The lock's value: the unguessable token only this lease's owner knows. Release and
    /// extension compare it on every node.
    pub fn value(&self) -> &str {
        self.state.token()
    }

    /// The ttl the lock was taken (and is extended) with.
    pub fn ttl(&self) -> Duration {
        self.state.ttl()
    }

    /// The remaining validity: zero once the lease expired, was released or was lost.
    pub fn validity(&self) -> Duration {
        self.handle().validity()
    }

    /// The instant the validity ends, on the monotonic clock.
    pub fn deadline(&self) -> Instant {
        self.state.deadline()
    }

    /// Whether the lease is still held and valid. A lease still held past its deadline is
    /// decided lost by this look (once: counted and logged, see
    /// [`LeaseHandle::lost`](super::LeaseHandle::lost)).
    pub fn is_valid(&self) -> bool {
        self.state.is_valid()
    }

    /// How many times the lease was extended.
    pub fn extension_count(&self) -> u32 {
        self.state.extension_count()
    }

    /// A cheap, cloneable view of this lease for other tasks: its validity, and a future
    /// that resolves when it is lost. It does not keep the lock.
    pub fn handle(&self) -> LeaseHandle {
        LeaseHandle {
            state: self.state.clone(),
        }
    }

    /// Stops the keep-alive task, if any.
    pub(super) fn stop_keep_alive(&mut self) {
        if let Some(task) = self.keep_alive.take() {
            task.abort();
        }
    }
}

impl fmt::Display for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{{resource: {:?}, value: {:?}, validity: {} ms}}",
            self.resource(),
            self.value(),
            self.validity().as_millis()
        )
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("resource", &self.resource())
            .field("value", &self.value())
            .field("validity", &self.validity())
            .field("extensions", &self.extension_count())
            .field("keep_alive", &self.keep_alive.is_some())
            .finish()
    }
}

/// A cloneable view of a [`Lease`]: what a task doing the locked work needs to know about
/// the lock (resource, validity, loss), without owning it.
#[derive(Clone)]
pub struct LeaseHandle {
    state: Arc<LeaseState>,
}

impl LeaseHandle {
    /// The resource name the lock was taken for.
    pub fn resource(&self) -> &str {
        &self.state.key[self.state.prefix_len..]
    }

    /// The remaining validity: zero once the lease expired, was released or was lost.
    pub fn validity(&self) -> Duration {
        self.state.validity()
    }

    /// The instant the validity ends, on the monotonic clock.
    pub fn deadline(&self) -> Instant {
        self.state.deadline()
    }

    /// The lease's fencing token (see [`Lease::fencing_token`]).
    pub fn fencing_token(&self) -> Option<u64> {
        self.state.fence().map(|f| f.token)
    }

    /// Whether the lease is no longer held: released, expired, or found lost by an
    /// extension. A lease still held past its deadline is decided lost by this look (once:
    /// counted in `redlock_lost_total` and logged at warn, see [`lost`](Self::lost)).
    pub fn is_lost(&self) -> bool {
        !self.state.is_valid()
    }

    /// How many times the lease was extended.
    pub fn extension_count(&self) -> u32 {
        self.state.extension_count()
    }

    /// Resolves when the lease is no longer held: its validity ran out without an
    /// extension, an extension found it lost, or it was released. Cancel-safe.
    ///
    /// A lease still held past its deadline is lost from the moment anything looks —
    /// this, [`is_lost`](Self::is_lost), an extension, the release — and counted once
    /// (`redlock_lost_total`, the `lost_after` field of its `redlock.lease` span).
    pub async fn lost(&self) {
        loop {
            let notified = self.state.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if !self.state.is_valid() {
                return;
            }
            let deadline = self.state.deadline();
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(deadline.into()) => {}
            }
        }
    }

    /// When the lease was lost, on the monotonic clock: the end of its validity, or when an
    /// extension found its token gone. `None` while it holds, and for a lease released or
    /// completed before it was lost. Decided once (see [`lost`](Self::lost)).
    pub fn lost_at(&self) -> Option<Instant> {
        self.state.loss().map(|l| l.at)
    }

    /// Why and when the lease was lost, if it was (not when it was released).
    #[cfg(any(feature = "tower", feature = "actix"))]
    pub(crate) fn loss(&self) -> Option<super::state::Loss> {
        self.state.loss()
    }

    /// The lock key (the prefixed resource).
    pub(crate) fn key(&self) -> &str {
        self.state.key()
    }

    /// When its lock request was sent.
    pub(crate) fn started(&self) -> Instant {
        self.state.started()
    }
}

impl fmt::Debug for LeaseHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseHandle")
            .field("resource", &self.resource())
            .field("validity", &self.validity())
            .finish()
    }
}
