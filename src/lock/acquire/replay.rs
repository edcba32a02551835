//! The replay acquire ([`Redlock::lock_unless_completed`]): each node is asked for the
//! completion record first, and locks only without one. Any record found is the answer
//! ([`LockOrRecord::Completed`]); "not done yet" is concluded only from a quorum of locks, after
//! every asked node has answered. The record's key (beside the lock's) is named here.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use tracing::Instrument;

use crate::lock::call::Answer;
use crate::lock::lease::Lease;
use crate::lock::release::Release;
use crate::lock::tally::{self, Tally};
use crate::lock::telemetry::{self, Background};
use crate::lock::token::Token;
use crate::lock::Redlock;
use crate::node::Acquire;

/// The Redis key of `key`'s completion record: beside the lock, with a distinct suffix.
pub(crate) fn record_key(key: &str) -> Arc<str> {
    format!("{key}:record").into()
}

/// The replay acquire draws no conclusion before every asked node has answered (each
/// request is bounded by the node timeout; suspended nodes were not asked), unless a record
/// stored under a valid lease is on a quorum of them (see `records.rs` for the rest).
///
/// Bounded by `until` too (the try's first node timeout, and the lock's validity): a node
/// whose request is given time back for this process' stalls is not waited for beyond it.
pub(super) async fn await_every_answer<S>(
    sent: &mut S,
    tally: &mut Tally,
    quorum: usize,
    until: Instant,
) where
    S: Stream<Item = Answer<Acquire>> + Unpin,
{
    while tally.records.settled(quorum).is_none() {
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
    F: std::future::Future<Output = Result<Acquire, crate::node::CallError>> + Send + 'static,
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
///
/// Which record answers when nodes hold different ones (a lease lost while its work ran stored its
/// record "if free", beside another holder's). A record stored under a valid lease on a quorum of
/// nodes answers, wherever a caller finds it first. Records of lost leases that differ, and none
/// stored under a valid lease, answer [`LockOrRecord::OutcomeUnknown`] — never one or the other by
/// chance. Too few nodes answering to know is an unavailable error. A live holder beside a
/// minority's record is a contended one (its record may still come).
#[derive(Debug)]
#[must_use = "a LockOrRecord::Locked holds the lock: dropping it releases the lock at once"]
pub enum LockOrRecord {
    /// No node has a completion record, and the lock is ours: do the work, then
    /// [`Lease::complete`] it.
    Locked(Lease),
    /// The work is done: the record its holder stored with [`Lease::complete`]. Nothing was
    /// locked.
    Completed(Bytes),
    /// The work ran, under leases that were lost, and their records differ (each stored
    /// "if free" where the key was free, none under a valid lease on a quorum): which
    /// outcome counts is unknown. Answered only once every node answered (one missing could
    /// hold a record that outranks them: unavailable then).
    /// Nothing was locked.
    OutcomeUnknown,
}
