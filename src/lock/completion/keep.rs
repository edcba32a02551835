//! The background part of a completion that lacks its quorum. The nodes where the lease's lock may
//! still hold are asked again. The lock is extended where the write is refused with an error reply.
//! The completion is owed to the masters suspended meanwhile. All this goes on also when the caller
//! dropped the completion.

use std::sync::Weak;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use tracing::Instrument;

use super::{Completion, Progress};
use crate::lock::owed::{Debt, Owed};
use crate::lock::release::{self, FIRST_PAUSE, MAX_PAUSE};
use crate::lock::tally::{self, Skip};
use crate::lock::telemetry::{self, Background};
use crate::lock::Inner;
use crate::node::{CallError, ExtendRequest};

/// How long a completion that lacks its quorum is kept going, in ttls past the lease's
/// validity, at most (extensions of the lock where the write is refused included).
pub(super) const KEEP_TTLS: u32 = 10;

/// What the background part of a completion that lacks its quorum needs.
pub(super) struct Keep {
    pub(super) client: Weak<Inner>,
    pub(super) completion: Completion,
    pub(super) ttl: Duration,
    /// The completion is asked again until then: a ttl past the lease's validity, when its
    /// lock has expired on every node that did not answer (later, once it is extended).
    pub(super) until: Instant,
    /// Extensions never keep it going past this.
    pub(super) hard_until: Instant,
    /// After this no node can hold the lock any more: what a node was not given is owed to
    /// it until then.
    pub(super) gone: Instant,
    pub(super) quorum: usize,
    /// The nodes that may hold the lease's lock.
    pub(super) holders: u64,
}

impl Keep {
    /// Owes the completion to the nodes in `mask` until the lock is gone from them (see
    /// `owed.rs`).
    pub(super) fn owe(&self, inner: &Inner, mask: u64) {
        let c = &self.completion;
        release::each_voter(inner, mask, |voter| {
            let owed = Owed {
                key: c.key.clone(),
                token: c.token,
                fence: c.fence.clone(),
                debt: Debt::Complete {
                    record_key: c.record_key.clone(),
                    record: c.record.clone(),
                    retention: c.retention,
                },
                until: self.gone,
            };
            voter.owed.owe(owed);
        });
    }
}

/// Hands a completion whose future was dropped before the record was on a quorum to the
/// background ([`keep_completing`], every node asked again: the write is idempotent).
pub(super) struct KeepOnDrop(pub(super) Option<Keep>);

impl KeepOnDrop {
    pub(super) fn keep(&self) -> &Keep {
        self.0.as_ref().expect("armed until disarmed")
    }

    pub(super) fn disarm(&mut self) -> Keep {
        self.0.take().expect("disarmed once")
    }
}

impl Drop for KeepOnDrop {
    fn drop(&mut self) {
        let Some(keep) = self.0.take() else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                key = %telemetry::hashed(&keep.completion.key),
                "completion dropped outside a Tokio runtime: not asked again; the lock \
                 expires with its ttl where the record is missing"
            );
            return;
        };
        let progress = Progress {
            retry: keep.holders,
            ..Progress::default()
        };
        let sent = tally::Sent::<bool, std::future::Ready<Result<bool, CallError>>>::empty();
        let span = telemetry::background(Background::Completing);
        rt.spawn(keep_completing(keep, progress, sent).instrument(span));
    }
}

/// Asks the nodes that may still hold the lease's lock to store the record, again and again, until
/// each has it or can no longer take it. That is, it refused, or the lock has expired everywhere it
/// was not extended (`keep.until`). Until a quorum has it, a node that answers the write with an
/// error reply but holds the lock has it extended, so that it keeps refusing duplicates. Past the
/// quorum the others are still asked while their lock may be there (more copies of the record), no
/// longer extended. Ends early when the client is dropped. A completion that never reaches its
/// quorum is reported (warn, and `redlock_record_minority_total`).
pub(super) async fn keep_completing<F>(
    mut keep: Keep,
    mut progress: Progress,
    mut sent: tally::Sent<bool, F>,
) where
    F: std::future::Future<Output = Result<bool, CallError>>,
{
    while let Some(answer) = sent.next().await {
        progress.take(answer);
    }
    let mut pause = FIRST_PAUSE;
    // The nodes owed the completion already (while suspended).
    let mut owed = 0u64;
    let mut reported = false;
    // Past the quorum the nodes still without the record are asked on, while the lock may
    // be there (an idle client sends them nothing else: a debt would wait for an answer
    // that never comes), but no longer kept locked.
    while (progress.retry | progress.kept) != 0 && Instant::now() < keep.until {
        let stored = progress.stored() >= keep.quorum;
        if stored && !reported {
            reported = true;
            reached(&keep);
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
        let Some(inner) = keep.client.upgrade() else {
            // The application dropped its client (shutting down): nothing to report for it.
            tracing::debug!(
                key = %telemetry::hashed(&keep.completion.key),
                "the client was dropped: its completions in the background end"
            );
            return;
        };
        let pending = progress.retry | progress.kept;
        // A suspended node is owed the completion: paid the moment it answers again (its
        // probe), not a round later.
        let waiting = pending & release::suspended(&inner) & !owed;
        if waiting != 0 {
            keep.owe(&inner, waiting);
            owed |= waiting;
        }
        let ask = pending & !release::suspended(&inner);
        if ask == 0 {
            continue;
        }
        let mut sent = keep.completion.send(&inner, ask);
        let mut errored = 0u64;
        while let Some((i, answer)) = sent.next().await {
            if answer
                .as_ref()
                .is_err_and(|e| !e.is_transient() && !e.is_suspended())
            {
                errored |= 1 << i;
            }
            progress.take((i, answer));
        }
        if errored != 0 && !stored {
            keep_locked(&inner, &mut keep, &mut progress, errored).await;
        }
    }
    if progress.stored() >= keep.quorum {
        if !reported {
            reached(&keep);
        }
        // The nodes still without it may hold the lock: the completion is owed to them
        // (their lock goes, and the record has copies beyond its quorum: one lost on a
        // quorum's node, by a failover, is still found).
        if let Some(inner) = keep.client.upgrade() {
            keep.owe(&inner, progress.retry | progress.kept);
        }
        return;
    }
    let key = &keep.completion.key;
    crate::metrics::record_minority();
    tracing::warn!(
        key = %telemetry::hashed(key),
        stored_on = progress.stored(),
        quorum = keep.quorum,
        "the completion record never reached a quorum: once the lock expires where it is \
         missing, a duplicate can run the work again if every node with the record fails \
         to answer it"
    );
}

/// Logs that a completion in the background reached its quorum.
fn reached(keep: &Keep) {
    tracing::info!(
        key = %telemetry::hashed(&keep.completion.key),
        "the completion record reached its quorum after all"
    );
}

/// Extends the lease's lock on the nodes in `mask` (their write was refused with an error),
/// so that they keep refusing duplicates; pushes `keep.until` to a ttl past each success.
async fn keep_locked(inner: &Inner, keep: &mut Keep, progress: &mut Progress, mask: u64) {
    let (key, token, ttl) = (keep.completion.key.clone(), keep.completion.token, keep.ttl);
    let start = Instant::now();
    let mut sent = tally::send(
        &inner.nodes,
        mask,
        inner.config.node_timeout,
        Skip::Never,
        &|node| node.extend_now(&ExtendRequest::new(&key, token.as_str(), ttl)),
        |v| {
            let key = key.clone();
            async move {
                let request = ExtendRequest::new(&key, token.as_str(), ttl);
                v.node.extend(request).await
            }
        },
    );
    while let Some((i, answer)) = sent.next().await {
        match answer {
            Ok(true) => {
                keep.until = keep.until.max(start + ttl).min(keep.hard_until);
                keep.gone = keep.gone.max(start + ttl);
            }
            // Gone there: it will neither store the record nor refuse a duplicate.
            Ok(false) => {
                progress.kept &= !(1 << i);
                progress.refused |= 1 << i;
            }
            Err(_) => {}
        }
    }
}
