//! The middleware's keep-alive, started only for handlers that outlive a third of the ttl.
//!
//! Spawning a keep-alive task for every request, to abort it a few microseconds later, was
//! half of the layer's own cost (criterion `layer/oneshot`, memory node: 5.8 µs with it,
//! 2.8 µs without). Instead the response future carries a timer, registered only when the
//! handler is still pending when first polled, that starts the keep-alive task at ttl/3 —
//! extending at once, then every ttl/3, exactly as [`Lease::keep_alive`] would have by then.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use pin_project::pin_project;
use tokio::time::Sleep;

use crate::Lease;

/// Starts a lease's keep-alive once the lease has been held for ttl/3.
#[pin_project]
pub(crate) struct KeepAliveTimer {
    #[pin]
    sleep: Option<Sleep>,
    /// When to start the keep-alive; `None` when it is off or already started.
    due: Option<Instant>,
}

impl KeepAliveTimer {
    /// A timer that starts the keep-alive at `due` (none: keep-alive off).
    pub(crate) fn new(due: Option<Instant>) -> Self {
        Self { sleep: None, due }
    }

    /// Call while the guarded work is pending: arms the timer on the first call, and starts
    /// the keep-alive of `lease` when it fires.
    pub(crate) fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>, lease: Option<&mut Lease>) {
        let mut this = self.project();
        let Some(due) = *this.due else {
            return;
        };
        if this.sleep.is_none() {
            this.sleep.set(Some(tokio::time::sleep_until(due.into())));
        }
        if let Some(sleep) = this.sleep.as_mut().as_pin_mut() {
            if sleep.poll(cx).is_ready() {
                *this.due = None;
                this.sleep.set(None);
                if let Some(lease) = lease {
                    lease.keep_alive_from(Instant::now());
                }
            }
        }
    }
}

/// `fut`, with `lease` kept alive while it runs when it outlives ttl/3.
#[pin_project]
pub(crate) struct KeptAlive<'a, F> {
    #[pin]
    fut: F,
    #[pin]
    timer: KeepAliveTimer,
    lease: &'a mut Lease,
}

impl<'a, F: Future> KeptAlive<'a, F> {
    /// `fut`, the keep-alive of `lease` started at `due` (ttl/3 after the lock was taken)
    /// if `fut` is still running then; `None`: keep-alive off.
    pub(crate) fn new(fut: F, lease: &'a mut Lease, due: Option<Instant>) -> Self {
        Self {
            fut,
            timer: KeepAliveTimer::new(due),
            lease,
        }
    }
}

impl<F: Future> Future for KeptAlive<'_, F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        match this.fut.poll(cx) {
            Poll::Ready(out) => Poll::Ready(out),
            Poll::Pending => {
                this.timer.poll(cx, Some(&mut **this.lease));
                Poll::Pending
            }
        }
    }
}
