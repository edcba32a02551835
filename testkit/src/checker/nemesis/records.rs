//! The `records` lane (replay workload, five bare masters): completion records on a
//! minority, then expiry. One scenario holds every voter (no other lane injects meanwhile),
//! masters `A`…`E` drawn at random:
//!
//! 0. A quiet ttl with every voter healthy: every lease granted before — maybe by a bare
//!    quorum, under an earlier fault — has completed or expired, so the scenario catches
//!    only leases it means to.
//! 1. `A` and `B` reset (every connection dropped, none let in) for 300–600 ms: claims lock
//!    on `C`, `D` and `E` only.
//! 2. `C` and `D` frozen too (four voters out: nothing can be locked now, and freezes and
//!    resets lose nothing). The completions of the claims locked just before (their
//!    handlers straddle the switch) store their record on `E` alone and give up waiting
//!    after their patience (10 node timeouts): records on a minority.
//! 3. Past that patience — but well inside the ttl, at least 1 s before the locks of those
//!    claims expire on `C` and `D` — `C` and `D` thaw and `A` and `B` heal, and `E`, the one
//!    master with the records, is paused for the ttl and 0.5–1.5 s more. The library's
//!    background completion must store the records on `C` and `D` while its lock still
//!    holds there; duplicates claiming meanwhile must be answered with them (or refused).
//!    Had the records stayed on `E` alone, the locks on `C` and `D` expire during the pause
//!    and a duplicate gets a quorum of `A`–`D`: the work runs a second time.
//!
//! No lock of the scenario's claims is lost to a master unreachable until (or until just
//! before) it expired, so the library's promise covers every one of them: a double run is
//! a violation. (Without step 0, a lease granted by a bare quorum of three under a classic
//! fault just before could lose two of its holders to steps 1–2 until 50–300 ms before its
//! lock expired there: 17 double runs in a 30-minute run — the library's background
//! completion does not reach masters back that late; see the nemesis commit notes.)

use std::time::Duration;

use crate::proxy::Fault;

use super::super::clock;
use super::{ms, Ctx};

/// The bound of the wait for the other lanes to heal before a scenario.
const QUIET_WITHIN: Duration = Duration::from_secs(15);

pub(super) fn lane(ctx: &Ctx<'_>) {
    let masters = &ctx.topology.masters;
    let proxies = &ctx.topology.proxies;
    assert_eq!(
        masters.len(),
        5,
        "the records nemesis needs five bare masters"
    );
    let settings = ctx.settings;
    let patience = settings.node_timeout * 10;
    let mut rng = fastrand::Rng::new();
    if ctx.pause(Duration::from_millis(500)) {
        return;
    }
    loop {
        let Some(all) = ctx.budget.exclusive(ctx.stop, QUIET_WITHIN) else {
            if ctx.stop.is_set() {
                return;
            }
            continue;
        };
        // Every lease of before the scenario gone (completed, or expired).
        if ctx.pause(settings.ttl) {
            return;
        }
        let mut order: Vec<usize> = (0..5).collect();
        rng.shuffle(&mut order);
        let [a, b, c, d, e] = order[..] else {
            unreachable!("five masters")
        };

        let from_ns = clock::now_ns();
        proxies[a].set(Fault::Reset);
        proxies[b].set(Fault::Reset);
        let mut stopped = ctx.pause(ms(&mut rng, 300..=600));

        let frozen_ns = clock::now_ns();
        masters[c].freeze();
        masters[d].freeze();
        // Past a completion's patience (of one that began as they froze, after a handler
        // that straddled it), inside the ttl of the locks taken just before.
        let hold = patience + settings.handler + ms(&mut rng, 100..=250);
        stopped = stopped || ctx.pause(hold);

        let paused_ns = clock::now_ns();
        masters[e].freeze();
        masters[c].thaw();
        masters[d].thaw();
        proxies[a].set(Fault::Pass);
        proxies[b].set(Fault::Pass);
        ctx.span("records-reset", &[a, b], from_ns, paused_ns, String::new());
        ctx.span(
            "records-frozen",
            &[c, d],
            frozen_ns,
            paused_ns,
            format!("{hold:?} (patience {patience:?})"),
        );
        let pause = settings.ttl + ms(&mut rng, 500..=1500);
        stopped = stopped || ctx.pause(pause);
        masters[e].thaw();
        ctx.span(
            "records-paused",
            &[e],
            paused_ns,
            clock::now_ns(),
            format!("{pause:?}"),
        );
        let detail = format!("reset {a},{b}; froze {c},{d}; paused {e}");
        ctx.add("records", &[a, b, c, d, e], from_ns, detail);
        drop(all);
        if stopped || ctx.pause(ms(&mut rng, 1000..=3000)) {
            return;
        }
    }
}
