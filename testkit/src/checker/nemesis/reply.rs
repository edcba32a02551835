//! The `reply-reset` lane: the proxy of a random bare master (or Cluster node) resets the
//! connection that carries the next reply — after its command was forwarded and ran — so a
//! client sees a dropped connection for a command that took effect.

use std::time::{Duration, Instant};

use crate::proxy::FaultProxy;

use super::super::clock;
use super::{ms, Ctx};

/// How long an armed reset may wait for a reply to drop (the workers send all the time).
const FIRE_WITHIN: Duration = Duration::from_secs(2);

/// Resets the next reply on a random bare master's proxy, or on a Cluster node's when the
/// run has a Cluster voter, one at a time, until told to stop.
pub(super) fn lane(ctx: &Ctx<'_>) {
    let mut rng = fastrand::Rng::new();
    let cluster = ctx.topology.cluster.as_ref();
    if ctx.pause(Duration::from_millis(300)) {
        return;
    }
    loop {
        let eligible = |i| ctx.is_bare(i) || cluster.is_some_and(|c| c.voter == i);
        let Some(v) = ctx.take(&mut rng, 1, eligible) else {
            return;
        };
        let voter = v[0];
        let (proxy, detail) = match cluster {
            Some(c) if c.voter == voter => {
                let node = rng.usize(..c.proxies.len());
                (&c.proxies[node], format!("cluster node {node}"))
            }
            _ => (&ctx.topology.proxies[voter], format!("master {voter}")),
        };
        let from_ns = clock::now_ns();
        let fired = reset_next_reply(ctx, proxy);
        if fired {
            ctx.add("reply-reset", &[voter], from_ns, detail);
        }
        ctx.budget.free(&v);
        if ctx.pause(ms(&mut rng, 20..=200)) {
            return;
        }
    }
}

/// Arms `proxy` to reset the connection of the next reply, and waits (bounded, polling the
/// proxy every ms) until it has; disarms it when it did not happen in time or on stop.
/// Whether a reply was dropped.
pub(super) fn reset_next_reply(ctx: &Ctx<'_>, proxy: &FaultProxy) -> bool {
    proxy.drop_next_reply();
    let deadline = Instant::now() + FIRE_WITHIN;
    loop {
        if proxy.reply_dropped() {
            return true;
        }
        if Instant::now() >= deadline || ctx.pause(Duration::from_millis(1)) {
            // It may fire between the check and the disarming: then it counts.
            return !proxy.cancel_drop_reply();
        }
    }
}
