//! The classic lane: one fault at a time on one or two bare masters — frozen, partitioned,
//! slowed, reset, restarted empty — each healed after a few hundred ms.

use crate::proxy::Fault;

use super::super::clock;
use super::{ms, Ctx};

/// Injects one fault at a time on one or two bare masters (a restarted master counts as
/// affected while it abstains under delayed-restart protection) and heals it, until told to
/// stop. Every fault is healed before this returns.
pub(super) fn lane(ctx: &Ctx<'_>) {
    let masters = &ctx.topology.masters;
    let proxies = &ctx.topology.proxies;
    let abstention = ctx.settings.abstention();
    let mut rng = fastrand::Rng::new();
    // Let the workers warm up and take their first locks undisturbed.
    if ctx.pause(std::time::Duration::from_millis(300)) {
        return;
    }
    loop {
        // A restart (6) forgets completion records: not in the replay workload.
        let choice = rng.u8(0..if ctx.settings.restarts() { 7 } else { 6 });
        let n = if matches!(choice, 1 | 3) { 2 } else { 1 };
        let Some(v) = ctx.take(&mut rng, n, |i| ctx.is_bare(i)) else {
            return;
        };
        let (a, b) = (v[0], v[n - 1]);
        let hold = ms(&mut rng, 150..=450);
        let from_ns = clock::now_ns();
        let mut back_after = std::time::Duration::ZERO;
        let stopped = match choice {
            0 => {
                masters[a].freeze();
                let stopped = ctx.pause(hold);
                masters[a].thaw();
                ctx.add("freeze", &[a], from_ns, String::new());
                stopped
            }
            1 => {
                masters[a].freeze();
                masters[b].freeze();
                let stopped = ctx.pause(hold);
                masters[a].thaw();
                masters[b].thaw();
                ctx.add("freeze-two", &[a, b], from_ns, String::new());
                stopped
            }
            2 => {
                proxies[a].set(Fault::BlackHole);
                let stopped = ctx.pause(hold);
                proxies[a].set(Fault::Pass);
                ctx.add("partition", &[a], from_ns, String::new());
                stopped
            }
            3 => {
                // One master frozen, another partitioned: two different stalls at once.
                masters[a].freeze();
                proxies[b].set(Fault::BlackHole);
                let stopped = ctx.pause(hold);
                masters[a].thaw();
                proxies[b].set(Fault::Pass);
                let detail = format!("{a} frozen, {b} partitioned");
                ctx.add("freeze+partition", &[a, b], from_ns, detail);
                stopped
            }
            4 => {
                // Slow, sometimes slower than the node timeout (then: answers arrive late).
                let latency = ms(&mut rng, 5..=250);
                proxies[a].set(Fault::Latency(latency));
                let stopped = ctx.pause(hold);
                proxies[a].set(Fault::Pass);
                ctx.add("latency", &[a], from_ns, format!("+{latency:?}"));
                stopped
            }
            5 => {
                proxies[a].set(Fault::Reset);
                let stopped = ctx.pause(ms(&mut rng, 20..=200));
                proxies[a].set(Fault::Pass);
                ctx.add("reset", &[a], from_ns, String::new());
                stopped
            }
            _ => {
                // Killed, down a moment, back empty: it abstains for a while (delayed-restart
                // protection), during which it counts as affected.
                let stopped = restart(ctx, &mut rng, a, "restart", from_ns);
                back_after = abstention;
                stopped
            }
        };
        ctx.budget.free_after(&v, back_after);
        if stopped || ctx.pause(ms(&mut rng, 100..=400)) {
            return;
        }
    }
}

/// Kills bare master `a`, keeps it down 50–300 ms, starts it again empty (with the same
/// clock offset), counts the fault as `kind` and puts its abstention on the timeline.
/// Whether told to stop meanwhile (it is restarted anyway).
pub(super) fn restart(
    ctx: &Ctx<'_>,
    rng: &mut fastrand::Rng,
    a: usize,
    kind: &'static str,
    from_ns: i64,
) -> bool {
    let master = &ctx.topology.masters[a];
    master.stop();
    let stopped = ctx.pause(ms(rng, 50..=300));
    master.restart();
    let us = ctx.topology.offsets_us[a];
    let detail = match us {
        0 => String::new(),
        us => format!("clock {:+.1} ms", us as f64 / 1000.0),
    };
    ctx.add(kind, &[a], from_ns, detail);
    let back_ns = clock::now_ns();
    let abstention = clock::nanos(ctx.settings.abstention());
    ctx.span(
        "abstaining",
        &[a],
        back_ns,
        back_ns + abstention,
        String::new(),
    );
    stopped
}
