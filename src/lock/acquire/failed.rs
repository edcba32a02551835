//! A failed try's last steps: make a record answer last (copy it where the try locked),
//! release what the try may hold, and say why it failed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Try;
use crate::error::{Ballots, Error};
use crate::lock::records::Verdict;
use crate::lock::release::Release;
use crate::lock::tally::Tally;
use crate::lock::token::Token;
use crate::lock::Redlock;

impl Redlock {
    /// An answer from records stored "if free" alone (rule 5) is made to last: the record
    /// is copied where this try locked (`records.rs`), which ends our lock there (taken out of
    /// `holders`). A copy that did not reach every such node makes the answer unavailable
    /// (try again), never one that a later lost lease's record could change; the release of
    /// the rest then goes on in the background, so that the try still takes two rounds at
    /// most. Whether every copy landed (or none was needed).
    pub(super) async fn copy_answer(
        &self,
        key: &Arc<str>,
        token: Token,
        verdict: &mut Option<Verdict>,
        tally: &mut Tally,
        holders: &mut u64,
    ) -> bool {
        let Some(Verdict::Record(record)) = &verdict else {
            return true;
        };
        let copy = tally.records.copy_for(record);
        let Some(retention) = copy.filter(|_| tally.for_mask != 0) else {
            return true;
        };
        let mask = tally.for_mask;
        let copy = self.copy_free(key, token, record.clone(), retention, mask);
        // Boxed: a try's future (allocated per lock call) does not carry the copy's state.
        let (stored, errors) = Box::pin(copy).await;
        *holders &= !stored;
        if stored == mask {
            return true;
        }
        tally.errors.extend(errors);
        *verdict = Some(Verdict::Unavailable(
            "a lost lease's completion record answered, but its copy did not reach \
             every node this try locked within the node timeout: try again",
        ));
        false
    }

    /// Failed: release on every node that may hold our token (`holders`). Wait one round for
    /// the nodes that voted for (`for_mask`: they answered quickly), so that nothing of ours
    /// outlives this try; the others, and any retry, go on in the background while the lock
    /// could be valid — a try never waits longer than its node timeouts. (After a copy that
    /// missed a node, `copied` false, the release is all in the background: the copy took the
    /// round.)
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn release_failed(
        &self,
        key: &Arc<str>,
        token: Token,
        holders: u64,
        for_mask: u64,
        copied: bool,
        deadline: Instant,
        ttl: Duration,
    ) {
        if holders == 0 {
            return;
        }
        let needed = match copied {
            true => (for_mask & holders).count_ones() as usize,
            false => 0,
        };
        let release = Release {
            key: key.clone(),
            token,
            mask: holders,
            needed,
            patience: Instant::now(),
            until: deadline,
            gone: deadline + ttl,
            fence: None,
        };
        let _ = self.release_token(release).await;
    }

    /// What a failed try answers: a record (replay), an unknown outcome, or the error that
    /// says why, with each voter's answer (`settled`: the fenced grant's token, if it was not
    /// settled).
    pub(super) fn refusal(
        &self,
        mut tally: Tally,
        verdict: Option<Verdict>,
        settled: crate::Result<()>,
        ttl: Duration,
    ) -> crate::Result<Try> {
        let inner = &*self.inner;
        let n = inner.nodes.len();
        let unsettled = match verdict {
            Some(Verdict::Record(record)) => return Ok(Try::Completed(record)),
            Some(Verdict::Unknown) => return Ok(Try::Unknown),
            Some(Verdict::Unavailable(why)) => {
                Err(Error::unavailable(why, std::mem::take(&mut tally.errors)).with_records())
            }
            // A live holder beside records: contended, as any "held" answer makes it.
            Some(Verdict::Contended) | None => settled,
        };
        let ballots = Ballots {
            names: inner.names.clone(),
            granted: tally.for_mask,
            held: tally.not_ours & !tally.error_mask(),
            ttls: std::mem::take(&mut tally.held_ttls),
        };
        let err = if let Err(unsettled) = unsettled {
            unsettled
        } else if tally.for_ >= inner.quorum && !tally.records.any() {
            Error::unavailable(
                format!(
                    "a quorum answered, but too slowly to leave any validity of the {ttl:?} ttl"
                ),
                tally.errors,
            )
        } else if tally.against > 0 {
            // Any "held" answer makes it contended: the rule is stated on `Error`.
            let holder = tally.not_ours & !tally.error_mask();
            Error::contended(
                tally.against,
                tally.for_,
                n,
                tally.min_remaining,
                tally.errors,
            )
            .with_holder(holder.trailing_zeros() as usize)
        } else {
            Error::unavailable(
                format!(
                    "could not reach a quorum of {} of {n} nodes, and none said held",
                    inner.quorum
                ),
                tally.errors,
            )
        };
        Err(err.with_ballots(ballots))
    }
}
