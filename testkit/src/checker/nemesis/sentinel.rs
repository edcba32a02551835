//! The `sentinel` lane: one voter is a Sentinel group of five sentinels, of which each
//! worker lists three (it learns the other two from the group), reaching them through
//! proxies of its own (the master itself directly, at the address the sentinels name), as
//! an ACL user of its own. A cut switches the worker's user off on the sentinels it cuts
//! (its connections killed) and faults its proxies to those it lists: the voter also asks
//! the sentinels the group names, at their own addresses, which no proxy stands in front
//! of. Two faults:
//!
//! - `sentinel-cut`: some workers are cut from a majority (or all) of their sentinels for
//!   0.3–1.5 s — longer than the voter's majority window (2 × the refresh interval): they
//!   must abstain within it, though the master they know still answers.
//! - `sentinel-failover`: a failover (`SENTINEL FAILOVER`, through a sentinel the parent
//!   reaches directly) while some workers — never all — are cut off: cut before it, or the
//!   moment the first sentinel names the new master (the others still name the old one,
//!   which stays a writable master until the sentinels demote it, up to some 10 s later).
//!   The cut-off workers keep the old master and must abstain; the others follow the new
//!   one, whose tenure protection keeps it out for the window plus the ttl. The cut heals
//!   0.3–1.5 s after the failover; the group then settles (the old master a replica again)
//!   before the next failover.

use std::time::{Duration, Instant};

use tokio::runtime::Handle;

use crate::proxy::Fault;

use super::super::clock;
use super::super::topology::{SentinelVoter, GROUP_SENTINELS, SENTINEL_REFRESH};
use super::{ms, Ctx};

/// The bound of the wait for the first sentinel to name the new master.
const NAMED_WITHIN: Duration = Duration::from_secs(15);

pub(super) fn lane(ctx: &Ctx<'_>) {
    let Some(sv) = ctx.topology.sentinel.as_ref() else {
        return;
    };
    let mut rng = fastrand::Rng::new();
    let window = SENTINEL_REFRESH * 2;
    // After a failover the new master abstains for this long (tenure protection).
    let tenure = ctx.settings.ttl + window;
    if ctx.pause(Duration::from_millis(500)) {
        return;
    }
    // The first fault is a failover: the slowest, and the one a short run must not miss.
    // (None in the replay workload: a promoted replica may lack completion records.)
    let mut failover = ctx.settings.restarts();
    // A failover needs the group settled (the old master a replica again, after the
    // sentinels' next look at it: up to some 20 s): waited for before the next one only.
    let mut settled = true;
    for n in 0u64.. {
        if failover && !settled {
            ctx.rt.block_on(sv.group.settled());
            settled = true;
        }
        let Some(v) = ctx.take(&mut rng, 1, |i| i == sv.voter) else {
            return;
        };
        let from_ns = clock::now_ns();
        let stopped = if failover {
            let (stopped, detail) = failover_under_a_cut(ctx, sv, &mut rng);
            ctx.add("sentinel-failover", &v, from_ns, detail);
            ctx.budget
                .free_after(&v, tenure + Duration::from_millis(500));
            settled = false;
            stopped
        } else {
            let workers = pick_workers(&mut rng, sv.proxies.len(), true);
            let cut = cut(&ctx.rt, sv, &workers, &mut rng);
            let stopped = ctx.pause(ms(&mut rng, 300..=1500));
            heal(&ctx.rt, sv, &workers);
            ctx.add("sentinel-cut", &v, from_ns, cut);
            ctx.budget.free(&v);
            stopped
        };
        if stopped || ctx.pause(ms(&mut rng, 300..=1000)) {
            return;
        }
        // A failover first, then a cut, then either (mostly cuts: they are quick).
        failover = ctx.settings.restarts() && n >= 1 && rng.u8(0..10) < 3;
    }
}

/// One failover while some workers are cut from their sentinels; whether told to stop
/// meanwhile, and what happened.
fn failover_under_a_cut(
    ctx: &Ctx<'_>,
    sv: &SentinelVoter,
    rng: &mut fastrand::Rng,
) -> (bool, String) {
    let group = &sv.group;
    let (old, new) = (group.master_addr(), group.replica_addr());
    // Never every worker: someone must follow the new master.
    let workers = pick_workers(rng, sv.proxies.len(), false);
    let early = rng.bool();
    let mut what = String::new();
    if early {
        what = cut(&ctx.rt, sv, &workers, rng);
    }
    ctx.rt.block_on(group.start_failover());
    if !early {
        // The moment the first sentinel (the leader) names the new master.
        let deadline = Instant::now() + NAMED_WITHIN;
        while ctx.rt.block_on(group.sentinels_naming(&new)) == 0 {
            assert!(
                Instant::now() < deadline,
                "no sentinel named {new} the master within {NAMED_WITHIN:?} of SENTINEL FAILOVER"
            );
            ctx.pause(Duration::from_millis(5));
        }
        what = cut(&ctx.rt, sv, &workers, rng);
    }
    ctx.rt.block_on(group.await_failover());
    let stopped = ctx.pause(ms(rng, 300..=1500));
    heal(&ctx.rt, sv, &workers);
    let when = if early {
        "before it"
    } else {
        "as the first sentinel named the new master"
    };
    (stopped, format!("{old} -> {new}; cut {when}: {what}"))
}

/// `n` of the workers, at random: at least one, and all of them only if `all_allowed` (or
/// there is only one).
fn pick_workers(rng: &mut fastrand::Rng, workers: usize, all_allowed: bool) -> Vec<usize> {
    let most = if all_allowed || workers == 1 {
        workers
    } else {
        workers - 1
    };
    let n = rng.usize(1..=most);
    let mut all: Vec<usize> = (0..workers).collect();
    rng.shuffle(&mut all);
    all.truncate(n);
    all.sort_unstable();
    all
}

/// Cuts each of `workers` from a majority (three or all five, chosen at random) of the
/// group's sentinels — listed or not: cut from two of its three listed ones and one it
/// learned of, a worker still hears two listed of three, which is no majority of the group
/// — its user switched off there, and its proxy to a listed one black-holed or reset; what
/// was cut.
fn cut(rt: &Handle, sv: &SentinelVoter, workers: &[usize], rng: &mut fastrand::Rng) -> String {
    let mut out = Vec::new();
    for &w in workers {
        let proxies = &sv.proxies[w];
        let mut which: Vec<usize> = (0..GROUP_SENTINELS).collect();
        rng.shuffle(&mut which);
        which.truncate(if rng.bool() {
            GROUP_SENTINELS
        } else {
            GROUP_SENTINELS / 2 + 1
        });
        which.sort_unstable();
        let fault = if rng.bool() {
            Fault::BlackHole
        } else {
            Fault::Reset
        };
        let user = SentinelVoter::user(w);
        for &s in &which {
            rt.block_on(sv.group.cut_user(s, &user));
            if let Some(proxy) = proxies.get(s) {
                proxy.set(fault);
            }
        }
        out.push(format!("worker {w} from sentinels {which:?} ({fault:?})"));
    }
    out.join(", ")
}

fn heal(rt: &Handle, sv: &SentinelVoter, workers: &[usize]) {
    for &w in workers {
        let user = SentinelVoter::user(w);
        for s in 0..GROUP_SENTINELS {
            rt.block_on(sv.group.allow_user(s, &user, &user));
        }
        for p in &sv.proxies[w] {
            p.set(Fault::Pass);
        }
    }
}
