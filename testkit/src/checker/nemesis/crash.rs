//! The `crash` lane (the replay workload's durable mode): the Redis side of the crashes.
//! Every bare master FLUSHALLed at once (all their locks and records gone: duplicates of
//! running and completed keys lock again, and only the key rows in PostgreSQL stand between
//! them and a second run), or two masters restarted empty (they abstain under
//! delayed-restart protection, but their records are gone), with 0.3–1.2 s of calm between.
//! The other crashes — workers SIGKILLed by the parent and by their own fail points — are
//! the parent's (`run.rs`, `workers.rs`) and the workers' (`durable/`).

use std::time::Duration;

use super::super::clock;
use super::classic::restart;
use super::{ms, Ctx};

/// The bound of the wait for the other lanes to heal before a flush.
const QUIET_WITHIN: Duration = Duration::from_secs(15);

pub(super) fn lane(ctx: &Ctx<'_>) {
    let masters = &ctx.topology.masters;
    let mut rng = fastrand::Rng::new();
    if ctx.pause(ms(&mut rng, 300..=600)) {
        return;
    }
    loop {
        let stopped = if rng.bool() {
            let Some(all) = ctx.budget.exclusive(ctx.stop, QUIET_WITHIN) else {
                if ctx.stop.is_set() {
                    return;
                }
                continue;
            };
            let from_ns = clock::now_ns();
            ctx.rt.block_on(async {
                for m in masters {
                    m.query::<()>(&redis::cmd("FLUSHALL")).await;
                }
            });
            let every: Vec<usize> = (0..masters.len()).collect();
            ctx.add("flushall", &every, from_ns, String::new());
            drop(all);
            false
        } else {
            let Some(two) = ctx.take(&mut rng, 2, |i| ctx.is_bare(i)) else {
                return;
            };
            let from_ns = clock::now_ns();
            // One after the other, each down 50–300 ms.
            let mut stopped = restart(ctx, &mut rng, two[0], "redis-restart", from_ns);
            stopped |= restart(ctx, &mut rng, two[1], "redis-restart", clock::now_ns());
            ctx.budget.free_after(&two, ctx.settings.abstention());
            stopped
        };
        if stopped || ctx.pause(ms(&mut rng, 300..=1200)) {
            return;
        }
    }
}
