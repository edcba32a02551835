//! The `lost` lane (replay workload, lost-lease mode): two bare masters cut off (their
//! proxies reset every connection and let none in) for 0.3–1.2 s at a time, with 0.2–0.8 s
//! of calm between. The workers' handlers overrun their lease now and then (see
//! `worker/lost.rs`), so a duplicate often locks the other three while two are cut off,
//! runs and stores its response there under a valid lease — and the lost lease's record,
//! stored "if free", lands on the two once they are back, where the key was free: records
//! that differ from voter to voter, the case every duplicate must still answer alike.

use crate::proxy::Fault;

use super::super::clock;
use super::{ms, Ctx};

pub(super) fn lane(ctx: &Ctx<'_>) {
    let proxies = &ctx.topology.proxies;
    let mut rng = fastrand::Rng::new();
    if ctx.pause(ms(&mut rng, 300..=600)) {
        return;
    }
    loop {
        let Some(cut) = ctx.take(&mut rng, 2, |i| ctx.is_bare(i)) else {
            return;
        };
        let from_ns = clock::now_ns();
        for &i in &cut {
            proxies[i].set(Fault::Reset);
        }
        let hold = ms(&mut rng, 300..=1200);
        let stopped = ctx.pause(hold);
        for &i in &cut {
            proxies[i].set(Fault::Pass);
        }
        ctx.add("lost-cut", &cut, from_ns, format!("{hold:?}"));
        ctx.budget.free(&cut);
        if stopped || ctx.pause(ms(&mut rng, 200..=800)) {
            return;
        }
    }
}
