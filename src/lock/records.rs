//! Idempotent work on the quorum: [`Redlock::lock_unless_completed`] answers with the
//! completion record when the work is done, or with a lease to do it; [`Lease::complete`]
//! stores the record where the lease still holds, ending the lock there (`completion.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use tracing::Instrument;

use super::call::Answer;
use super::release::Release;
use super::tally::{self, Tally};
use super::telemetry::{self, Background};
use super::token::Token;
use super::{Redlock, Retry};
use crate::node::Acquire;
use crate::Lease;

/// The Redis key of `key`'s completion record: beside the lock, with a distinct suffix.
pub(crate) fn record_key(key: &str) -> Arc<str> {
    format!("{key}:record").into()
}

/// The replay acquire draws no conclusion before every asked node has answered (each
/// request is bounded by the node timeout; suspended nodes were not asked), unless with a
/// record: a record that survives on a single master is the answer, over locks and "held"
/// alike.
///
/// Bounded by `until` too (the try's first node timeout, and the lock's validity): a node
/// whose request is given time back for this process' stalls is not waited for beyond it.
pub(super) async fn await_every_answer<S>(sent: &mut S, tally: &mut Tally, until: Instant)
where
    S: Stream<Item = Answer<Acquire>> + Unpin,
{
    while tally.record.is_none() {
        let Ok(Some(answer)) = tokio::time::timeout_at(until.into(), sent.next()).await else {
            break;
        };
        tally.late_acquire(answer, true);
    }
}

/// A replay acquire found a record while requests were still in flight: they are awaited in
/// the background (each bounded by the node timeout), and only the nodes whose request
/// locked — or gave no answer — are released. A node that answered with a record or "held"
/// locked nothing, so a replay hit usually costs no release at all.
pub(super) fn settle_in_background<F>(
    client: Redlock,
    mut sent: tally::Sent<Acquire, F>,
    key: Arc<str>,
    token: Token,
    until: Instant,
    ttl: std::time::Duration,
) where
    F: std::future::Future<Output = Result<Acquire, crate::node::NodeFailure>> + Send + 'static,
{
    let settle = async move {
        let mut late = Tally::default();
        while let Some(answer) = sent.next().await {
            late.late_acquire(answer, true);
        }
        let mask = late.answered & !late.not_ours;
        if mask != 0 {
            let release = Release {
                key,
                token,
                mask,
                needed: 0,
                patience: Instant::now(),
                until,
                gone: until + ttl,
                fence: None,
            };
            let _ = client.release_token(release).await;
        }
    };
    tokio::spawn(settle.instrument(telemetry::background(Background::Settle)));
}

/// The answer of [`Redlock::lock_unless_completed`].
#[derive(Debug)]
#[must_use = "a Claim may hold the lock: dropping it releases the lock at once"]
pub enum Claim {
    /// No node has a completion record, and the lock is ours: do the work, then
    /// [`Lease::complete`] it.
    Locked(Lease),
    /// The work is done: the record its holder stored with [`Lease::complete`]. Nothing was
    /// locked.
    Completed(Bytes),
}

impl Redlock {
    /// Locks `resource` for work that must run **once**, unless it already ran: each node is
    /// asked, in one atomic step, for the resource's completion record, and locks only if it
    /// has none. Any record found is the answer ([`Claim::Completed`]: only a holder ever
    /// stores one); "not done yet" is concluded only from a quorum of locks
    /// ([`Claim::Locked`]). Contended and unavailable as [`Redlock::lock_with`]; a node
    /// that stores no records (a custom [`Node`](crate::node::Node) without them) counts as
    /// failed.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_redlock::Error> {
    /// use std::time::Duration;
    /// use tower_redlock::{Claim, Redlock, Retry};
    ///
    /// let redlock = Redlock::in_memory();
    /// let ttl = Duration::from_secs(10);
    /// let day = Duration::from_secs(86_400);
    /// match redlock.lock_unless_completed("payment:8e03", ttl, Retry::never()).await? {
    ///     Claim::Locked(lease) => lease.complete("charged: pay_1", day).await?,
    ///     Claim::Completed(_) => unreachable!("first time"),
    /// }
    /// // A retry of the same work gets the stored answer; nothing runs twice.
    /// match redlock.lock_unless_completed("payment:8e03", ttl, Retry::never()).await? {
    ///     Claim::Completed(record) => assert_eq!(&record[..], b"charged: pay_1"),
    ///     Claim::Locked(_) => unreachable!("already done"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn lock_unless_completed(
        &self,
        resource: &str,
        ttl: Duration,
        retry: Retry,
    ) -> crate::Result<Claim> {
        self.lock_inner(resource, ttl, retry, true).await
    }
}
