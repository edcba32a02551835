//! The `skew` lane. The skew itself is in the topology: every bare master runs with its wall
//! clock really offset (`RedisServer::start_with_clock_offset`), within ±`skew-percent` of
//! the ttl — one at each end, the others between — so any two differ by at most twice that,
//! less than the ttl. A fencing counter that lives on never reads the clock again; this
//! lane makes the clocks matter: now and then it restarts one of the masters empty (its
//! counters lost, its offset kept), and once it votes again (delayed-restart protection:
//! after more than a ttl) its counters start again from its own, skewed, clock.

use std::time::Duration;

use super::super::clock;
use super::classic::restart;
use super::{ms, Ctx};

/// Counts the offset masters (a `skew` fault each, spanning the run on the timeline), then
/// restarts one of them at a time until told to stop.
pub(super) fn lane(ctx: &Ctx<'_>) {
    let started_ns = clock::now_ns();
    let mut rng = fastrand::Rng::new();
    let skewed: Vec<usize> = (0..ctx.topology.masters.len())
        .filter(|&i| ctx.topology.offsets_us[i] != 0)
        .collect();
    ctx.count("skew", skewed.len() as u64);
    // One at a time, never back to back: a restart costs the quorum a voter for seconds.
    // (None in the replay workload: a restart forgets completion records.)
    let mut stopped = ctx.pause(Duration::from_millis(500));
    if !ctx.settings.restarts() {
        while !stopped {
            stopped = ctx.pause(Duration::from_secs(1));
        }
    }
    while !stopped {
        let Some(v) = ctx.take(&mut rng, 1, |i| skewed.contains(&i)) else {
            break;
        };
        stopped = restart(ctx, &mut rng, v[0], "skew-restart", clock::now_ns());
        ctx.budget.free_after(&v, ctx.settings.abstention());
        stopped = stopped || ctx.pause(ms(&mut rng, 500..=2000));
    }
    for &i in &skewed {
        let us = ctx.topology.offsets_us[i];
        let detail = format!("clock {:+.1} ms", us as f64 / 1000.0);
        ctx.span("skew", &[i], started_ns, clock::now_ns(), detail);
    }
}
