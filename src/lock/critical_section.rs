//! Work run under a lock: [`Redlock::critical_section`](super::Redlock::critical_section)
//! runs work while holding a lock, and always releases it.

use std::future::Future;
use std::time::Duration;

use super::{LeaseHandle, Redlock, Retry};
use crate::error::Error;

/// A critical section being configured — the lock to take, and how to hold it while the
/// work runs; see [`Redlock::critical_section`].
#[derive(Debug)]
#[must_use = "a critical section does nothing until `.run(work)` is awaited"]
pub struct CriticalSection<'a> {
    client: &'a Redlock,
    resource: &'a str,
    ttl: Duration,
    retry: Retry,
    keep_alive: bool,
    abort_on_loss: bool,
}

impl<'a> CriticalSection<'a> {
    pub(crate) fn new(client: &'a Redlock, resource: &'a str, ttl: Duration, retry: Retry) -> Self {
        Self {
            client,
            resource,
            ttl,
            retry,
            keep_alive: false,
            abort_on_loss: false,
        }
    }

    /// Keeps the lock alive while the work runs (see [`Lease::keep_alive`](super::Lease::keep_alive)).
    pub fn keep_alive(mut self) -> Self {
        self.keep_alive = true;
        self
    }

    /// Stops the work (drops its future) as soon as the lock is lost, and returns an error
    /// for which [`Error::is_lost`] is true.
    pub fn abort_on_loss(mut self) -> Self {
        self.abort_on_loss = true;
        self
    }

    /// The retry policy for taking the lock.
    pub fn retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }

    /// Takes the lock, runs `work`, and releases the lock.
    ///
    /// # Errors
    ///
    /// As [`Redlock::lock`](crate::Redlock::lock) when the lock cannot be taken (`work`
    /// does not run); with [`abort_on_loss`](Self::abort_on_loss), [`Error::is_lost`] when
    /// the lock was lost while `work` ran (its future dropped).
    pub async fn run<F, Fut, T>(self, work: F) -> crate::Result<T>
    where
        F: FnOnce(LeaseHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        let mut lease = self
            .client
            .lock_with(self.resource, self.ttl, self.retry)
            .await?;
        if self.keep_alive {
            lease.keep_alive();
        }
        let handle = lease.handle();
        let out = if self.abort_on_loss {
            let watch = lease.handle();
            tokio::select! {
                biased;
                out = work(handle) => Some(out),
                _ = watch.lost() => None,
            }
        } else {
            Some(work(handle).await)
        };
        let released = lease.release().await;
        match out {
            Some(out) => {
                if let Err(e) = released {
                    // Logged at warn, with the hashed key, by the release itself.
                    tracing::debug!(error = %e, "release after scoped work failed; the lock expires with its ttl");
                }
                Ok(out)
            }
            None => Err(Error::lost(
                "the lock was lost while the work ran; the work was stopped",
            )),
        }
    }
}
