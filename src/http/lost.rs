//! What a lease lost while its request runs does to the request: the policy's rule
//! ([`OnLost`], or a hook), and the watch that applies it while the handler runs and while a
//! body holding the lease streams. Public face: [`crate::policy`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use super::Wire;
use crate::lock::{hashed, Loss};
use crate::LeaseHandle;

/// The response header a request answered without its lock carries in
/// [`OnLost::Finish`]: `Lock-Lost: true`.
pub const LOCK_LOST_HEADER: &str = "lock-lost";

/// What a request does when its lease is lost while its handler runs (or while its body
/// streams, with [`ReleaseOn::BodyEnd`](super::ReleaseOn::BodyEnd)): its validity ran out
/// before an extension landed — a paused process, masters the keep-alive cannot reach — or
/// an extension found its token gone. Lost is decided once, by the lock's own rule
/// ([`LeaseHandle::lost`]), and counted once (`redlock_lost_total`).
///
/// Set with [`LockPolicyBuilder::on_lost`](crate::policy::LockPolicyBuilder::on_lost), or
/// per request with [`on_lost_with`](crate::policy::LockPolicyBuilder::on_lost_with).
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
    /// The handler is stopped — its future dropped — as soon as the loss is known, and the
    /// client gets `503` `/problems/lock-lost` with a `Retry-After` of at least the ttl (gRPC
    /// `UNAVAILABLE`). A body already streaming ends with an error instead (gRPC: trailers
    /// with `UNAVAILABLE`), never as a truncated success. With replay, the key is marked
    /// "outcome unknown" where it is still ours or free, and its later requests get `409`
    /// `/problems/idempotency-outcome-unknown` rather than a second run (unless
    /// [`repeatable_after_loss`](crate::policy::LockPolicyBuilder::repeatable_after_loss)).
    ///
    /// Safe only for handlers whose writes are fenced (checked by the storage against the
    /// fencing token) or idempotent: a handler stopped between two writes leaves the first.
    Abort,
}

/// A lease lost while its request ran, as the hook of
/// [`on_lost_with`](crate::policy::LockPolicyBuilder::on_lost_with) sees it.
pub struct LostLease<'a> {
    handle: &'a LeaseHandle,
    loss: Loss,
    streaming: bool,
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

/// The error a response body ends with when its lease was lost while it streamed and the
/// policy says [`OnLost::Abort`]: the server then breaks the response off (HTTP/1.1 closes
/// the connection before the body's end, HTTP/2 resets the stream), so the client sees a
/// broken response, never a truncated success. A gRPC response ends with `UNAVAILABLE` in
/// its trailers instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LockLostError;

impl LockLostError {
    /// The `grpc-message` of a gRPC response ended this way.
    pub(crate) const GRPC_MESSAGE: &'static str =
        "the lock of this call was lost while its response streamed";
}

impl fmt::Display for LockLostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the lock was lost while the response streamed: the response is broken off")
    }
}

impl std::error::Error for LockLostError {}

/// The hook of [`on_lost_with`](crate::policy::LockPolicyBuilder::on_lost_with).
pub(crate) type LostHook = Arc<dyn Fn(&LostLease<'_>) -> OnLost + Send + Sync>;

/// The policy's rule for a lost lease.
#[derive(Clone)]
pub(crate) enum LostRule {
    Always(OnLost),
    Hook(LostHook),
}

impl LostRule {
    /// Whether a lost lease may stop the request (then it is watched while it runs).
    pub(crate) fn may_abort(&self) -> bool {
        !matches!(self, Self::Always(OnLost::Finish))
    }

    fn decide(&self, lost: &LostLease<'_>) -> OnLost {
        match self {
            Self::Always(on) => *on,
            Self::Hook(hook) => hook(lost),
        }
    }
}

impl fmt::Debug for LostRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Always(on) => on.fmt(f),
            Self::Hook(_) => f.write_str("Hook"),
        }
    }
}

/// Watches a request's lease for its loss and applies the rule, once.
pub(crate) struct LossWatch {
    handle: LeaseHandle,
    rule: LostRule,
    /// The lease's `lost()`, made the first time the guarded work is pending.
    lost: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    /// The rule's decision, once made.
    decided: Option<OnLost>,
    /// How the client expects an abort mid-body (gRPC: trailers).
    wire: Wire,
}

impl LossWatch {
    pub(crate) fn new(handle: LeaseHandle, rule: LostRule, wire: Wire) -> Self {
        Self {
            handle,
            rule,
            lost: None,
            decided: None,
            wire,
        }
    }

    /// The client's wire.
    pub(crate) fn wire(&self) -> Wire {
        self.wire
    }

    /// The decision for a lease found lost, made once (`streaming`: the head was sent);
    /// `None` while the lease holds (or once it was released: not a loss).
    pub(crate) fn decide(&mut self, streaming: bool) -> Option<OnLost> {
        if self.decided.is_none() {
            // `is_lost` decides a lease held past its deadline lost (once, counted).
            if !self.handle.is_lost() {
                return None;
            }
            let loss = self.handle.loss()?;
            let lost = LostLease {
                handle: &self.handle,
                loss,
                streaming,
            };
            let decision = self.rule.decide(&lost);
            tracing::debug!(key = %lost.key_hash(), reason = loss.why, ?decision, "lease lost while its request ran");
            self.decided = Some(decision);
        }
        self.decided
    }

    /// Call while the guarded work is pending: `Ready` when the lease is lost and the
    /// rule says [`OnLost::Abort`]. Watches only when the rule may abort; once it decided
    /// to finish, it never wakes again.
    pub(crate) fn poll_abort(&mut self, cx: &mut Context<'_>, streaming: bool) -> Poll<()> {
        if self.decided.is_some() || !self.rule.may_abort() {
            return match self.decided {
                Some(OnLost::Abort) => Poll::Ready(()),
                _ => Poll::Pending,
            };
        }
        let lost = self.lost.get_or_insert_with(|| {
            let handle = self.handle.clone();
            Box::pin(async move { handle.lost().await })
        });
        if lost.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.lost = None;
        match self.decide(streaming) {
            Some(OnLost::Abort) => Poll::Ready(()),
            _ => Poll::Pending,
        }
    }
}

/// The outcome of work watched by a [`LossWatch`].
pub(crate) enum Watched<T> {
    Done(T),
    /// The lease was lost and the rule said abort: the work was dropped.
    Aborted,
}

/// `fut`, stopped when `watch` says abort.
#[pin_project::pin_project]
pub(crate) struct WatchedFuture<'w, F> {
    #[pin]
    fut: F,
    watch: &'w mut LossWatch,
}

impl<'w, F: Future> WatchedFuture<'w, F> {
    pub(crate) fn new(fut: F, watch: &'w mut LossWatch) -> Self {
        Self { fut, watch }
    }
}

impl<F: Future> Future for WatchedFuture<'_, F> {
    type Output = Watched<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if let Poll::Ready(out) = this.fut.poll(cx) {
            return Poll::Ready(Watched::Done(out));
        }
        this.watch.poll_abort(cx, false).map(|()| Watched::Aborted)
    }
}
