//! What a lease lost while its request runs does to the request: the policy's rule
//! ([`OnLost`], or a hook). The watch that applies it while the handler runs and while a
//! body holding the lease streams is `watch.rs`. Public face: [`crate::policy`].

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::lock::{hashed, Loss};
use crate::LeaseHandle;

/// The response header a request answered without its lock carries in
/// [`OnLost::Finish`]: `Lock-Lost: true`.
pub const LOCK_LOST_HEADER: &str = "lock-lost";

/// What a request does when its lease is lost while its handler runs (or while its body streams,
/// with [`ReleaseOn::BodyEnd`](super::ReleaseOn::BodyEnd)). A lease is lost when its validity ran
/// out before an extension landed — a paused process, masters the keep-alive cannot reach. It is
/// also lost when an extension found its token gone. Lost is decided once, by the lock's own rule
/// ([`LeaseHandle::lost`]), and counted once (`redlock_lost_total`).
///
/// Set with [`LockPolicyBuilder::on_lost`](crate::policy::LockPolicyBuilder::on_lost), or
/// per request with a [`LostRule::decide`] hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnLost {
    /// The handler runs on (the default). Its response is sent with `Lock-Lost: true`
    /// ([`LOCK_LOST_HEADER`]) when the loss was known before the response head was; with
    /// replay, the response is stored where the key is still ours or free (never over
    /// another holder's lock). Another request with the key may run meanwhile: the lock
    /// no longer excludes it.
    #[default]
    Finish,
    /// The handler is stopped — its future dropped — the moment the loss is known, and the
    /// client gets `503` `/problems/lock-lost` with a `Retry-After` of at least the ttl (gRPC
    /// `UNAVAILABLE`). A body already streaming ends with an error instead when the server
    /// next polls it (gRPC: trailers with `UNAVAILABLE`): no chunk and no clean end follow a
    /// known loss. With replay, the key is marked "outcome unknown" where it is still ours or
    /// free; once the mark is on a quorum, its later requests get `409`
    /// `/problems/idempotency-outcome-unknown` rather than a second run (unless
    /// [`repeatable_after_loss`](crate::policy::LockPolicyBuilder::repeatable_after_loss)); a
    /// request that takes the expired key before the mark lands runs.
    ///
    /// Safe only for handlers whose writes are fenced (checked by the storage against the
    /// fencing token) or idempotent: a handler stopped between two writes leaves the first.
    Abort,
}

/// A lease lost while its request ran, as the hook of [`LostRule::decide`] sees it.
pub struct LostLease<'a> {
    pub(crate) handle: &'a LeaseHandle,
    pub(crate) loss: Loss,
    pub(crate) streaming: bool,
}

impl LostLease<'_> {
    /// The lock key's short hash, as the crate's logs show it (never the key itself).
    pub fn key_hash(&self) -> impl fmt::Display + '_ {
        hashed(self.handle.key())
    }

    /// Why the lease was lost, in words.
    pub fn reason(&self) -> &'static str {
        self.loss.why
    }

    /// The moment the lease stopped being held, on the monotonic clock: the end of its
    /// validity, or when an extension found its token gone. The rule is applied at once
    /// when the keep-alive or the validity's end tells the request.
    pub fn lost_at(&self) -> Instant {
        self.loss.at
    }

    /// How long after its lock request the lease was lost.
    pub fn held_for(&self) -> Duration {
        self.loss
            .at
            .saturating_duration_since(self.handle.started())
    }

    /// The lease's fencing token, with fencing on.
    pub fn fencing_token(&self) -> Option<u64> {
        self.handle.fencing_token()
    }

    /// How many times the lease was extended before it was lost.
    pub fn extension_count(&self) -> u32 {
        self.handle.extension_count()
    }

    /// Whether the response head was already sent (its body was streaming): aborting then
    /// ends the body with an error.
    pub fn streaming(&self) -> bool {
        self.streaming
    }
}

impl fmt::Debug for LostLease<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LostLease")
            .field("key_hash", &self.key_hash().to_string())
            .field("reason", &self.reason())
            .field("held_for", &self.held_for())
            .field("streaming", &self.streaming)
            .finish()
    }
}

/// The error a response body ends with when its lease was lost while it streamed and the policy
/// says [`OnLost::Abort`]. The server then breaks the response off: HTTP/1.1 closes the connection
/// before the body's end, HTTP/2 resets the stream. So the client sees a broken response, never a
/// truncated success. A gRPC response ends with `UNAVAILABLE` in its trailers instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockLostError;

impl fmt::Display for LockLostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the lock was lost while the response streamed: the response is broken off")
    }
}

impl std::error::Error for LockLostError {}

/// A hook deciding per request (see [`LostRule::decide`]).
type LostHook = Arc<dyn Fn(&LostLease<'_>) -> OnLost + Send + Sync>;

/// The policy's rule for a lost lease, given to
/// [`LockPolicyBuilder::on_lost`](crate::policy::LockPolicyBuilder::on_lost): one answer for
/// every request (an [`OnLost`], which converts into a rule), or one decided per request
/// ([`LostRule::decide`]).
#[derive(Clone)]
pub struct LostRule(Rule);

#[derive(Clone)]
enum Rule {
    Always(OnLost),
    Hook(LostHook),
}

impl From<OnLost> for LostRule {
    fn from(on: OnLost) -> Self {
        Self(Rule::Always(on))
    }
}

impl LostRule {
    /// Decide per request what a lost lease does, at the moment it is known: `hook` is
    /// called once per lost lease, on the request's task — keep it short and non-blocking
    /// (log, count, look at the [`LostLease`]).
    ///
    /// ```
    /// # fn main() -> Result<(), tower_redlock::Error> {
    /// use tower_redlock::policy::{LockPolicy, LostLease, LostRule, OnLost};
    /// use tower_redlock::Redlock;
    ///
    /// let policy = LockPolicy::idempotent(Redlock::in_memory())
    ///     .on_lost(LostRule::decide(|lost: &LostLease<'_>| {
    ///         tracing::warn!(key = %lost.key_hash(), reason = lost.reason(), "lock lost");
    ///         // A body already streaming is left to finish; anything else stops.
    ///         if lost.streaming() { OnLost::Finish } else { OnLost::Abort }
    ///     }))
    ///     .build()?;
    /// assert_eq!(policy.on_lost(), None);
    /// # Ok(()) }
    /// ```
    pub fn decide<F>(hook: F) -> Self
    where
        F: Fn(&LostLease<'_>) -> OnLost + Send + Sync + 'static,
    {
        Self(Rule::Hook(Arc::new(hook)))
    }

    /// The answer for every request, if the rule is not a hook.
    pub(crate) fn fixed(&self) -> Option<OnLost> {
        match self.0 {
            Rule::Always(on) => Some(on),
            Rule::Hook(_) => None,
        }
    }

    /// Whether a lost lease may stop the request (then it is watched while it runs).
    pub(crate) fn may_abort(&self) -> bool {
        !matches!(self.0, Rule::Always(OnLost::Finish))
    }

    /// What `lost` does to its request.
    pub(crate) fn answer(&self, lost: &LostLease<'_>) -> OnLost {
        match &self.0 {
            Rule::Always(on) => *on,
            Rule::Hook(hook) => hook(lost),
        }
    }
}

impl fmt::Debug for LostRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Rule::Always(on) => on.fmt(f),
            Rule::Hook(_) => f.write_str("Hook"),
        }
    }
}
