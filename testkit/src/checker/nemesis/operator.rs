//! The `operator` lane: an operator's forced release run again after the key changed hands
//! (`operator-rerun`). The parent, through its own client of the bare masters, inspects a
//! held resource and notes its holder's token prefix; once another holder has the key (on a
//! quorum), it runs `force_release` naming the first holder — what an operator does who
//! re-runs `redlock unlock --force KEY --holder PREFIX` after a voter did not answer, or what
//! a connection that re-sends the script does.
//!
//! The re-run must spare the key's new holder: a lock of its that it deleted would let a
//! third worker in beside the second (an overlap the checker reports). It may delete what
//! the named holder left behind: a lock its release did not reach (a frozen or partitioned
//! master) or an acquire that landed late, on a minority — at most the faulty masters, never
//! a quorum while the new holder had one. The lane stops the run at once, loudly, when the
//! re-run deletes locks on a quorum; the leftovers it deleted are in the fault's detail.

use std::time::{Duration, Instant};

use tower_redlock::operate::ForceRelease;
use tower_redlock::{Redlock, Retry};

use super::super::clock;
use super::{ms, Ctx};

/// The bound of the wait for a held resource to change hands.
const CHANGE_WITHIN: Duration = Duration::from_secs(3);

pub(super) fn lane(ctx: &Ctx<'_>) {
    let mut rng = fastrand::Rng::new();
    let client = {
        let _entered = ctx.rt.enter();
        let builder = Redlock::builder()
            .node_timeout(ctx.settings.node_timeout)
            .retry(Retry::never());
        ctx.topology
            .proxies
            .iter()
            .fold(builder, |b, p| b.redis(&p.url()))
            .build()
            .expect("the operator's client of the bare masters")
    };
    if ctx.pause(Duration::from_millis(500)) {
        return;
    }
    loop {
        let key = &ctx.resources[rng.usize(..ctx.resources.len())];
        let from_ns = clock::now_ns();
        if let Some(first) = holder(ctx, &client, key) {
            let deadline = Instant::now() + CHANGE_WITHIN;
            let mut changed = false;
            while !changed && Instant::now() < deadline {
                if ctx.pause(Duration::from_millis(2)) {
                    return;
                }
                changed = holder(ctx, &client, key).is_some_and(|now| now != first);
            }
            if changed {
                let how = ForceRelease::by("checker-operator").holder(first.clone());
                let done = ctx.rt.block_on(client.force_release(key, how));
                let deleted = done.as_ref().map_or(0, |d| d.locks_deleted());
                let quorum = ctx.topology.proxies.len() / 2 + 1;
                assert!(
                    deleted < quorum,
                    "a forced release naming {first}, re-run after the key {key} changed \
                     hands, deleted locks on a quorum ({deleted} of {}): {done:?}",
                    ctx.topology.proxies.len()
                );
                ctx.add(
                    "operator-rerun",
                    &[],
                    from_ns,
                    format!(
                        "{key}: holder {first} named after it changed hands; {deleted} of \
                         its leftover locks deleted"
                    ),
                );
            }
        }
        if ctx.pause(ms(&mut rng, 50..=300)) {
            return;
        }
    }
}

/// The token prefix of `key`'s holder (on a quorum of the bare masters), if any.
fn holder(ctx: &Ctx<'_>, client: &Redlock, key: &str) -> Option<String> {
    let seen = ctx.rt.block_on(client.inspect(key)).ok()?;
    Some(seen.holder()?.token_prefix)
}
