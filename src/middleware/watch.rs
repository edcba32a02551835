//! The watch of a request's lease while its handler runs (and while a body holding the lease
//! streams): it applies the policy's rule for a lost lease (`lost.rs`) once, the moment the
//! loss is known, and says when to stop.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::policy::{LostLease, LostRule, OnLost};
use crate::rejection::Wire;
use crate::LeaseHandle;

/// Watches a request's lease for its loss and applies the rule, once.
pub(crate) struct LossWatch {
    handle: LeaseHandle,
    rule: LostRule,
    /// The lease's `lost()`, made the first time the guarded work is pending.
    lost: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    /// The rule's decision, once made.
    decided: Option<OnLost>,
    /// The lease ended without a loss (released): nothing more to watch.
    ended: bool,
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
            ended: false,
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
            let decision = self.rule.answer(&lost);
            tracing::debug!(key = %lost.key_hash(), reason = loss.why, ?decision, "lease lost while its request ran");
            self.decided = Some(decision);
        }
        self.decided
    }

    /// Call while the guarded work is pending: `Ready` when the lease is lost and the
    /// rule says [`OnLost::Abort`]. Watches only when the rule may abort; once it decided
    /// to finish, it never wakes again.
    pub(crate) fn poll_abort(&mut self, cx: &mut Context<'_>, streaming: bool) -> Poll<()> {
        if self.decided.is_some() || self.ended || !self.rule.may_abort() {
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
            Some(OnLost::Finish) => Poll::Pending,
            None => {
                self.ended = true;
                Poll::Pending
            }
        }
    }
}

/// The outcome of work watched by a [`LossWatch`].
pub(crate) enum Watched<T> {
    Done(T),
    /// The lease was lost and the rule said abort: the work was dropped.
    Aborted,
}

/// `fut`, stopped when `watch` (if any) says abort.
#[pin_project::pin_project]
pub(crate) struct WatchedFuture<'w, F> {
    #[pin]
    fut: F,
    watch: Option<&'w mut LossWatch>,
}

impl<'w, F: Future> WatchedFuture<'w, F> {
    pub(crate) fn new(fut: F, watch: Option<&'w mut LossWatch>) -> Self {
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
        match this.watch {
            Some(watch) => watch.poll_abort(cx, false).map(|()| Watched::Aborted),
            None => Poll::Pending,
        }
    }
}
