//! Releasing a lease ([`Lease::release`], or its drop) or a failed try's token:
//! compare-and-delete on every node that may hold it, retried.
//!
//! A release that does not reach enough nodes leaves the lock held for the rest of its ttl —
//! and the next request for the key is refused all that time. So a release is not one try
//! per node: the nodes that failed (an error, or no answer within the node timeout) are asked
//! again, with a short backoff, until enough of them have answered. The caller waits until
//! enough nodes released, or until its own patience (at most [`PATIENCE`] node timeouts, never
//! past the lock's validity) runs out; the rest is released, and retried for at most as long
//! again, in a background task that holds the client weakly. Only nodes that gave no answer
//! are asked again: a refusal would refuse again, and a suspended node is being probed.

use std::future::Future;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tracing::Instrument;

use super::call::Voter;
use super::fencing::Fence;
use super::lease::Lease;
use super::owed::{Debt, Owed};
use super::state::LeaseState;
use super::tally::{self, Vote};
use super::telemetry::{self, Background};
use super::token::Token;
use super::{Inner, Redlock};
use crate::error::{Error, NodeError};
use crate::node::{CallError, RedisNode, ReleaseRequest};

/// How long a caller waits for a release at most, in node timeouts (when the lock's
/// validity does not end sooner).
pub(crate) const PATIENCE: u32 = 10;

/// The first pause before a failed node is asked again; doubled up to [`MAX_PAUSE`].
pub(super) const FIRST_PAUSE: Duration = Duration::from_millis(10);
pub(super) const MAX_PAUSE: Duration = Duration::from_millis(200);

/// What to release, and how much of it the caller waits for.
pub(crate) struct Release {
    pub(crate) key: Arc<str>,
    pub(crate) token: Token,
    /// The nodes that may hold the token.
    pub(crate) mask: u64,
    /// How many of them must have answered before the caller goes on.
    pub(crate) needed: usize,
    /// The caller asks again until this instant at most (then the background goes on).
    pub(crate) patience: Instant,
    /// No retry after this instant (the lock expires by itself then).
    pub(crate) until: Instant,
    /// After this instant no node can hold the lock any more (a ttl past its validity): what
    /// the retries could not release is owed to the nodes until then (see `owed.rs`).
    pub(crate) gone: Instant,
    /// The lease's fencing token: the release raises the counters to it.
    pub(crate) fence: Option<Fence>,
}

/// How a release went: its result, the nodes that released (or answered), the nodes that
/// failed in its last round.
type Released = (crate::Result<()>, usize, usize);

impl Lease {
    /// Releases the lock on every node that may hold it (compare-and-delete with this lease's
    /// token). Returns once a quorum of nodes has released it (or holds nothing of ours): the lock
    /// can then be taken by the next client. The slower nodes' releases finish in the background,
    /// so a dead minority costs nothing here.
    ///
    /// Nodes that fail or do not answer in time are asked again, with a short backoff,
    /// until a quorum is reached, the lease's validity ends, or ten node timeouts have
    /// passed.
    ///
    /// # Errors
    ///
    /// [`Error::is_unavailable`](crate::Error::is_unavailable) (and a warning in the log)
    /// when no quorum released it by then; the lock still expires after its ttl.
    #[doc(alias = "unlock")]
    pub async fn release(mut self) -> crate::Result<()> {
        self.stop_keep_alive();
        self.state.finish();
        let result = self.client.release_state(&self.state).await;
        // Only now: if this future is dropped before, `Drop` spawns the release.
        self.released = true;
        result
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.stop_keep_alive();
        self.state.finish();
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                let client = self.client.clone();
                let state = self.state.clone();
                // `release_state` runs in a `redlock.release` span linked to the lease's,
                // and logs a release that failed at warn.
                rt.spawn(async move {
                    let _ = client.release_state(&state).await;
                });
            }
            Err(_) => tracing::warn!(
                key = %telemetry::hashed(self.key()),
                "lease dropped outside a Tokio runtime: not released; the lock expires with its ttl"
            ),
        }
    }
}

impl Redlock {
    /// Releases a lease's token on every node that may hold it, in a `redlock.release` span
    /// (linked to the lease's); its owner just ended it ([`LeaseState::finish`]).
    pub(crate) async fn release_state(&self, state: &LeaseState) -> crate::Result<()> {
        let end = telemetry::Ending::start(state.key(), state.span(), || state.deadline(), false);
        // The span is entered only when enabled, and the release awaited in place otherwise:
        // `telemetry::within` would move the release's future (measured: ~75 instructions a
        // release).
        let (result, released, failed) = match (self.lease_release(state), &end.span) {
            (None, _) => (Ok(()), 0, 0),
            (Some(r), None) => self.release_token(r).await,
            (Some(r), Some(span)) => self.release_token(r).instrument(span.clone()).await,
        };
        end.released(released, failed);
        end.done(state.started(), &result);
        result
    }

    /// What releasing a lease asks: `None` when no node may hold its token.
    fn lease_release(&self, state: &LeaseState) -> Option<Release> {
        let (now, deadline) = (Instant::now(), state.deadline());
        let n = self.inner.nodes.len();
        // The nodes that hold none of our tokens need no release, and count as released: a
        // quorum of released-or-never-ours nodes means the lock can no longer be held.
        let holders = state.holders() & tally::all(n);
        if holders == 0 {
            return None;
        }
        let not_ours = n - holders.count_ones() as usize;
        Some(Release {
            key: state.key_arc(),
            token: state.token_copy(),
            mask: holders,
            needed: self.inner.quorum.saturating_sub(not_ours).max(1),
            patience: self.patience_from(now, deadline),
            until: deadline,
            gone: now.max(deadline) + state.ttl(),
            fence: state.fence().cloned(),
        })
    }

    /// Releases `r.token` on the nodes in `r.mask`: waits until `r.needed` of them answered,
    /// asking the failed ones again until `r.patience`; the rest — and the retries after the
    /// caller's patience, until `r.until` — go on in the background. Fails (logged at warn)
    /// when too few nodes answered within the patience.
    pub(crate) async fn release_token(&self, r: Release) -> Released {
        let inner = &*self.inner;
        let timeout = inner.config.node_timeout;
        if r.needed == 0 {
            // Nothing to wait for: all of it in the background.
            let sent = send_release(
                &inner.nodes,
                r.mask,
                timeout,
                &r.key,
                r.token,
                r.fence.as_ref(),
            );
            self.release_in_background(r, sent, 0);
            return (Ok(()), 0, 0);
        }
        let (mut todo, mut released, mut pause) = (r.mask, 0, FIRST_PAUSE);
        loop {
            let mut sent = send_release(
                &inner.nodes,
                todo,
                timeout,
                &r.key,
                r.token,
                r.fence.as_ref(),
            );
            let asked = todo.count_ones() as usize;
            let needed = r.needed - released;
            // A round waits one node timeout at least (a lock past its validity still gets
            // its release), and never past the caller's patience beyond that (a node kept
            // waited for as it answers late, see `call.rs`, must not stretch it).
            let patience = Some(r.patience.min(r.until).max(Instant::now() + timeout));
            let tally = tally::count_until(&mut sent, asked, needed, |_| Vote::For, patience).await;
            released += tally.for_;
            let mut failed = transient(&tally.errors);
            if released >= r.needed {
                tally::drain_ready(&mut sent, |(i, answer)| {
                    if answer.is_err_and(|e| e.is_transient()) {
                        failed |= 1 << i;
                    }
                });
                let failures = failed.count_ones() as usize;
                if failed != 0 || !sent.is_empty() {
                    self.release_in_background(r, sent, failed);
                }
                return (Ok(()), released, failures);
            }
            // Too few: every node asked has answered (or timed out), or the round was cut
            // at the patience (requests still in flight: whatever the clocks say, no new
            // round drops them). Ask again those that gave no answer.
            todo = failed;
            if todo == 0 || !sent.is_empty() || Instant::now() + pause >= r.patience.min(r.until) {
                let failures = tally.errors.len();
                let err = release_failed(&r.key, released, r.needed, tally.errors);
                // Those still on their way, and those to ask again, go on in the background.
                if todo != 0 || !sent.is_empty() {
                    self.release_in_background(r, sent, todo);
                }
                return (Err(err), released, failures);
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }

    /// Hands the rest of a release to a task: the requests in flight (`sent`) finish, and the nodes
    /// that got no answer (`failed`) are asked again. They are not asked for the lock's whole ttl,
    /// but for at most [`PATIENCE`] more node timeouts. A suspended node, or one whose reply
    /// refused (it would refuse again), is never asked again. The task holds the client weakly:
    /// dropping the client ends it.
    fn release_in_background<F>(&self, mut r: Release, sent: tally::Sent<bool, F>, failed: u64)
    where
        F: std::future::Future<Output = Result<bool, CallError>> + Send + 'static,
    {
        let patience = self.inner.config.node_timeout.saturating_mul(PATIENCE);
        r.until = r.until.min(Instant::now() + patience);
        let client = Arc::downgrade(&self.inner);
        let span = telemetry::background(Background::ReleaseRest);
        tokio::spawn(release_rest(client, r, sent, failed).instrument(span));
    }

    /// The latest instant a caller waits for a release of a lock valid until `deadline`.
    pub(crate) fn patience(&self, deadline: Instant) -> Instant {
        self.patience_from(Instant::now(), deadline)
    }

    /// [`patience`](Self::patience) counted from `now`.
    fn patience_from(&self, now: Instant, deadline: Instant) -> Instant {
        let patience = self.inner.config.node_timeout.saturating_mul(PATIENCE);
        deadline.min(now + patience)
    }
}

/// The background part of a release (see `Redlock::release_in_background`).
async fn release_rest<F>(client: Weak<Inner>, r: Release, sent: tally::Sent<bool, F>, failed: u64)
where
    F: std::future::Future<Output = Result<bool, CallError>>,
{
    let (until, gone, key, token, fence) = (r.until, r.gone, r.key, r.token, r.fence);
    let resend = |inner: &Inner, mask| {
        let timeout = inner.config.node_timeout;
        send_release(&inner.nodes, mask, timeout, &key, token, fence.as_ref())
    };
    let owe = |inner: &Inner, mask| {
        each_voter(inner, mask, |voter| {
            let debt = Owed {
                key: key.clone(),
                token,
                fence: fence.clone(),
                debt: Debt::Release,
                until: gone,
            };
            voter.owed.owe(debt);
        })
    };
    if let Some(left) = retry_rest(client, until, sent, failed, resend, owe).await {
        tracing::debug!(
            key = %telemetry::hashed(&key),
            nodes = left.count_ones(),
            "nodes did not answer the release: it is owed to them, sent when they answer again"
        );
    }
}

/// Lets the requests in flight (`sent`) finish, then asks the nodes that gave no answer —
/// `failed`, and those of `sent` — again with `resend`, with a growing pause, until `until`
/// at most. Never a suspended node, nor one whose reply refused (it would refuse again).
/// What a suspended node, or one still without an answer at the end, did not get is handed
/// to `owe` (see `owed.rs`: paid when the node answers again). Holds the client weakly:
/// dropping it ends the retries. Returns the nodes owed (`None`: none, or the client is
/// gone).
pub(super) async fn retry_rest<F, G, R, O>(
    client: Weak<Inner>,
    until: Instant,
    mut sent: tally::Sent<bool, F>,
    mut failed: u64,
    resend: R,
    owe: O,
) -> Option<u64>
where
    F: Future<Output = Result<bool, CallError>>,
    G: Future<Output = Result<bool, CallError>>,
    R: Fn(&Inner, u64) -> tally::Sent<bool, G>,
    O: Fn(&Inner, u64),
{
    while let Some((i, answer)) = sent.next().await {
        if answer.is_err_and(|e| e.is_transient() || e.is_suspended()) {
            failed |= 1 << i;
        }
    }
    let mut owed = 0u64;
    let mut pause = FIRST_PAUSE;
    while failed != 0 && Instant::now() + pause < until {
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
        let inner = client.upgrade()?;
        // A suspended node is being probed: it is owed, and paid once it answers.
        let skipped = failed & suspended(&inner);
        if skipped != 0 {
            owe(&inner, skipped);
            owed |= skipped;
            failed &= !skipped;
        }
        let mut sent = resend(&inner, failed);
        failed = 0;
        while let Some((i, answer)) = sent.next().await {
            if answer.is_err_and(|e| e.is_transient() || e.is_suspended()) {
                failed |= 1 << i;
            }
        }
    }
    if failed != 0 {
        let inner = client.upgrade()?;
        owe(&inner, failed);
        owed |= failed;
    }
    (owed != 0).then_some(owed)
}

/// Each node in `mask`: `owe` is called with its voter.
pub(super) fn each_voter(inner: &Inner, mask: u64, mut owe: impl FnMut(&Voter)) {
    for (i, voter) in inner.nodes.iter().enumerate() {
        if mask & (1 << i) != 0 {
            owe(voter);
        }
    }
}

/// The nodes that are suspended now.
pub(super) fn suspended(inner: &Inner) -> u64 {
    inner
        .nodes
        .iter()
        .enumerate()
        .filter(|(_, v)| v.health.is_suspended())
        .fold(0, |m, (i, _)| m | 1 << i)
}

/// The nodes whose request got no answer (asking again may help).
pub(super) fn transient(errors: &[NodeError]) -> u64 {
    errors
        .iter()
        .filter(|e| e.is_transient())
        .fold(0, |m, e| m | 1 << e.node())
}

/// The error of a release that too few nodes answered, logged at warn: the lock stays held
/// on the others until its ttl, and the next request for it is refused meanwhile.
fn release_failed(key: &str, released: usize, needed: usize, errors: Vec<NodeError>) -> Error {
    let err = Error::unavailable(
        format!(
            "the release reached {released} of the {needed} nodes it needed in time; it is \
             retried in the background while the lock is valid, and the lock expires with \
             its ttl"
        ),
        errors,
    );
    tracing::warn!(key = %telemetry::hashed(key), error = %err, "release failed");
    err
}

/// Releases a try's token on every node when the try is cancelled mid-flight (its future
/// dropped): requests already handed to a connection are followed by the release on the
/// same connection; requests not yet handed over are never sent.
pub(crate) struct CancelGuard {
    pub(crate) client: Option<Redlock>,
    pub(crate) key: Arc<str>,
    pub(crate) token: Token,
    /// The end of the try's validity: no retry of the release after it.
    pub(crate) deadline: Instant,
    /// The try's ttl.
    pub(crate) ttl: Duration,
}

impl CancelGuard {
    pub(crate) fn disarm(mut self) {
        self.client = None;
    }
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (key, token, deadline, ttl) = (self.key.clone(), self.token, self.deadline, self.ttl);
        let span = telemetry::background(Background::Cancelled);
        let release = async move {
            let inner = &*client.inner;
            let all = tally::all(inner.nodes.len());
            // Every node may hold it; a quorum released means it is no longer ours.
            let release = Release {
                key,
                token,
                mask: all,
                needed: inner.quorum,
                patience: client.patience(deadline),
                until: deadline,
                gone: deadline + ttl,
                fence: None,
            };
            let _ = client.release_token(release).await;
        };
        rt.spawn(release.instrument(span));
    }
}

/// Sends the compare-and-delete of `token` at `key` to every node in `mask` — with `fence`,
/// the fenced release (the counters raised to the lease's token first).
fn send_release(
    nodes: &[Arc<Voter>],
    mask: u64,
    timeout: Duration,
    key: &Arc<str>,
    token: Token,
    fence: Option<&Fence>,
) -> tally::Sent<bool, impl Future<Output = Result<bool, CallError>> + Send + 'static> {
    let owned = key.clone();
    // The `EVALSHA`, packed once for every Redis master (of the first one's wake-up kind:
    // the masters and Sentinel groups share one, a Cluster's differs).
    let packed = nodes
        .iter()
        .find(|v| fence.is_none() && v.node.uses_prepared_release())
        .map(|v| {
            let wake = v.node.wake();
            Arc::new((wake, RedisNode::release_cmd(key, token.as_str(), wake)))
        });
    let fenced = fence.cloned();
    tally::send(
        nodes,
        mask,
        timeout,
        tally::Skip::Never,
        &|node| {
            let request = ReleaseRequest::new(key, token.as_str());
            node.release_now(&match fence {
                None => request,
                Some(f) => request.fenced(f.floor()),
            })
        },
        move |v| {
            let key = owned.clone();
            let packed = packed.clone();
            let fence = fenced.clone();
            async move {
                let plain = ReleaseRequest::new(&key, token.as_str());
                let Some(f) = fence else {
                    let packed = packed.as_deref().filter(|(wake, _)| *wake == v.node.wake());
                    return v.node.release(plain, packed.map(|(_, cmd)| cmd)).await;
                };
                match v.node.release(plain.fenced(f.floor()), None).await {
                    // A node without counters (it voted without one: no vote) may still hold
                    // our key: the plain release.
                    Err(e) if e.is_unsupported() => v.node.release(plain, None).await,
                    answer => answer,
                }
            }
        },
    )
}

#[cfg(test)]
mod tests;
