//! The `cluster` lane: one voter is a 3-node Redis Cluster, each node behind a proxy it
//! announces (so the workers' cluster connections go through the proxies). Its faults: a
//! node's next reply reset after its command ran (redis-rs sends the command again on a new
//! connection, and the second send finds the first one's effect), or a node partitioned from
//! the workers for 100–400 ms (less than the cluster's node timeout: the cluster itself
//! stays whole).

use std::time::Duration;

use crate::proxy::Fault;

use super::super::clock;
use super::reply::reset_next_reply;
use super::{ms, Ctx};

pub(super) fn lane(ctx: &Ctx<'_>) {
    let Some(cv) = ctx.topology.cluster.as_ref() else {
        return;
    };
    let mut rng = fastrand::Rng::new();
    if ctx.pause(Duration::from_millis(300)) {
        return;
    }
    loop {
        let Some(v) = ctx.take(&mut rng, 1, |i| i == cv.voter) else {
            return;
        };
        let node = rng.usize(..cv.proxies.len());
        let proxy = &cv.proxies[node];
        let from_ns = clock::now_ns();
        let mut stopped = false;
        if rng.u8(0..10) < 7 {
            if reset_next_reply(ctx, proxy) {
                ctx.add("cluster-reply-reset", &v, from_ns, format!("node {node}"));
            }
        } else {
            proxy.set(Fault::BlackHole);
            stopped = ctx.pause(ms(&mut rng, 100..=400));
            proxy.set(Fault::Pass);
            ctx.add("cluster-partition", &v, from_ns, format!("node {node}"));
        }
        ctx.budget.free(&v);
        if stopped || ctx.pause(ms(&mut rng, 50..=300)) {
            return;
        }
    }
}
