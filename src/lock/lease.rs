//! The held lock.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::Instrument;

use super::state::LeaseState;
use super::{telemetry, Redlock};

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
/// assert!(lease.validity() > Duration::from_millis(1900));
/// println!("{lease}"); // {resource: "report:2024", value: "…", validity: 1977 ms}
/// lease.release().await?;
/// # Ok(()) }
/// ```
#[must_use = "a Lease is the held lock: dropping it releases the lock at once (in the background)"]
pub struct Lease {
    client: Redlock,
    state: Arc<LeaseState>,
    keep_alive: Option<tokio::task::JoinHandle<()>>,
    released: bool,
    /// The acquisition's requests still unanswered when the lock was granted, kept (not
    /// polled) until the release: one already handed to its connection is written — redis-rs
    /// skips a queued request whose caller is gone — so the lock lands on every master that
    /// is up; one never handed over is never sent. Dropped with the lease.
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

    /// Whether the lease is still held and valid.
    pub fn is_valid(&self) -> bool {
        self.state.is_valid()
    }

    /// How many times the lease was extended.
    pub fn extensions(&self) -> u32 {
        self.state.extensions()
    }

    /// A cheap, cloneable view of this lease for other tasks: its validity, and a future
    /// that resolves when it is lost. It does not keep the lock.
    pub fn handle(&self) -> LeaseHandle {
        LeaseHandle {
            state: self.state.clone(),
        }
    }

    /// Extends the lease to `ttl` from now on a quorum of nodes. See [`Redlock::extend`].
    pub async fn extend(&self, ttl: Duration) -> crate::Result<()> {
        self.client.extend_state(&self.state, ttl).await
    }

    /// Keeps the lease alive in the background: it is extended to its ttl about every
    /// ttl/3, until it is released or dropped, the extension cap is reached, or an
    /// extension finds the lock lost ([`LeaseHandle::lost`] then resolves).
    ///
    /// Calling it again does nothing. Must be called inside a Tokio runtime.
    pub fn keep_alive(&mut self) {
        self.keep_alive_from(Instant::now() + self.state.ttl() / 3);
    }

    /// [`Lease::keep_alive`] with the first extension at `first` (at once if it is past).
    pub(crate) fn keep_alive_from(&mut self, first: Instant) {
        if self.keep_alive.is_none() && !self.released {
            let client = self.client.clone();
            let state = self.state.clone();
            let span = telemetry::keep_alive_span(state.key(), state.span());
            let task = keep_alive(client, state, first).instrument(span);
            self.keep_alive = Some(tokio::spawn(task));
        }
    }

    /// Releases the lock on every node that may hold it (compare-and-delete with this
    /// lease's token). Returns once a quorum of nodes has released it (or holds nothing of
    /// ours) — the lock can then be taken by the next client — while the slower nodes'
    /// releases finish in the background, so a dead minority costs nothing here.
    ///
    /// Nodes that fail or do not answer in time are asked again, with a short backoff,
    /// until a quorum is reached, the lease's validity ends, or ten node timeouts have
    /// passed. Errors (and logs at warn) when no quorum was reached by then; the lock then
    /// still expires after its ttl.
    pub async fn release(mut self) -> crate::Result<()> {
        self.stop_keep_alive();
        let held = self.state.end();
        let result = self.client.release_state(&self.state, held).await;
        // Only now: if this future is dropped before, `Drop` spawns the release.
        self.released = true;
        result
    }

    /// Completes the work this lease guarded (see [`Redlock::lock_unless_completed`]):
    /// stores `record` as the resource's completion record for `retention`, on every node
    /// where the lease still holds, and ends the lock there — one atomic step per node.
    /// From then on [`Redlock::lock_unless_completed`] answers
    /// [`Claim::Completed`](crate::Claim::Completed) with `record`.
    ///
    /// A record over [`Lease::MAX_RECORD_LEN`](crate::Lease::MAX_RECORD_LEN), or a retention of zero or
    /// over [`Lease::MAX_RECORD_RETENTION`](crate::Lease::MAX_RECORD_RETENTION), is refused ([`Error::is_invalid_input`]) and the lease released: nothing was stored.
    /// `Ok` once a quorum stored it. Otherwise an error — [`Error::is_lost`] when the lease
    /// expired or was lost (nothing stale is stored where it no longer holds),
    /// [`Error::is_unavailable`] when too few nodes answered — and the lock is **not**
    /// released early: the record is asked again, in the background, where the lock still
    /// holds (and the lock extended where the write is refused with an error reply), until a
    /// quorum has it or the lock has expired there, so duplicates are refused rather than
    /// run a second time. The same holds if this future is dropped midway. See the crate's
    /// Safety docs for the one case left open.
    ///
    /// [`Error::is_lost`]: crate::Error::is_lost
    /// [`Error::is_invalid_input`]: crate::Error::is_invalid_input
    /// [`Error::is_unavailable`]: crate::Error::is_unavailable
    pub async fn complete(
        mut self,
        record: impl Into<bytes::Bytes>,
        retention: std::time::Duration,
    ) -> crate::Result<()> {
        let record = record.into();
        let invalid = if record.len() > crate::Lease::MAX_RECORD_LEN {
            Some(format!(
                "the completion record is {} bytes; the maximum is {}",
                record.len(),
                crate::Lease::MAX_RECORD_LEN
            ))
        } else if retention < std::time::Duration::from_millis(1)
            || retention > crate::Lease::MAX_RECORD_RETENTION
        {
            Some(format!(
                "the retention of a completion record must be between 1 ms and {:?}",
                crate::Lease::MAX_RECORD_RETENTION
            ))
        } else {
            None
        };
        if let Some(why) = invalid {
            // Refused before anything was stored: the work may run again, so release.
            let _ = self.release().await;
            return Err(crate::Error::invalid(why));
        }
        self.stop_keep_alive();
        // From here the lock is never released early, not even if this future is dropped.
        self.released = true;
        let state = &*self.state;
        let end = telemetry::Ending::start(state.key(), state.span(), || state.deadline(), true);
        let valid = state.is_valid();
        let completion = self
            .client
            .complete_state(state, record, retention, end.span.as_ref());
        let result = telemetry::within(&end.span, completion).await;
        // Still held: the lease had expired, and nothing was stored. A loss found by the
        // completion itself (its token gone from a quorum) counts too, once.
        let ended = state.end();
        if let Err(e) = &result {
            if e.is_lost() && (valid || ended) {
                telemetry::lost(state.key(), "found by its completion");
            }
        }
        end.done(state.started(), &result);
        result
    }

    fn stop_keep_alive(&mut self) {
        if let Some(task) = self.keep_alive.take() {
            task.abort();
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.stop_keep_alive();
        let held = self.state.end();
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let client = self.client.clone();
                let state = self.state.clone();
                // `release_state` runs in a `redlock.release` span linked to the lease's,
                // and logs a release that failed at warn.
                rt.spawn(async move {
                    let _ = client.release_state(&state, held).await;
                });
            }
            Err(_) => tracing::warn!(
                key = %telemetry::hashed(self.key()),
                "lease dropped outside a Tokio runtime: not released; the lock expires with its ttl"
            ),
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
            .field("extensions", &self.extensions())
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
    /// extension.
    pub fn is_lost(&self) -> bool {
        !self.state.is_valid()
    }

    /// How many times the lease was extended.
    pub fn extensions(&self) -> u32 {
        self.state.extensions()
    }

    /// Resolves when the lease is no longer held: its validity ran out without an
    /// extension, an extension found it lost, or it was released. Cancel-safe.
    pub async fn lost(&self) {
        loop {
            let notified = self.state.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let deadline = {
                let s = self.state.status();
                if !s.held || Instant::now() >= s.deadline {
                    return;
                }
                s.deadline
            };
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(deadline.into()) => {}
            }
        }
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

/// Extends the lease at `first`, then about every ttl/3, until it ends.
async fn keep_alive(client: Redlock, state: Arc<LeaseState>, first: Instant) {
    let period = state.ttl() / 3;
    let mut next = first;
    loop {
        tokio::time::sleep_until(next.into()).await;
        match client.extend_state(&state, state.ttl()).await {
            Ok(()) => next = Instant::now() + period,
            Err(e) if e.is_unavailable() => {
                // Transient: try again soon, while the lease is still valid.
                let left = state.deadline().saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                tracing::debug!(error = %e, "keep-alive extension failed; retrying");
                next = Instant::now() + (left / 4).min(period).max(Duration::from_millis(1));
            }
            Err(e) if e.is_extension_limit() => {
                // The lease now runs out at its deadline; `lost()` fires then.
                tracing::debug!(error = %e, "keep-alive stopped at the extension cap");
                return;
            }
            Err(e) => {
                // A loss was counted and logged at warn by the extension.
                tracing::debug!(error = %e, "keep-alive stopped");
                break;
            }
        }
    }
    state.lose("the keep-alive could not extend it before its validity ran out");
}
