//! The replay workload's task: claim a key with `lock_unless_completed`; if it locked, run
//! the "handler" (recorded as a run), then complete it with a record naming that run; if
//! it was completed, record the replay and the run its record names.
//!
//! Keys are numbered in windows of the shared clock ([`SLOT`] long, [`KEYS_PER_SLOT`]
//! keys each, counted from the run's start), so duplicates race across processes: half
//! the claims go to the current window's keys (first runs racing), a third to the last
//! [`RECENT_SLOTS`] windows' (duplicates after the first run's lock is gone — what the
//! `records` nemesis aims at), the rest to any key of the run so far.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tower_redlock::{LockOrRecord, Redlock};

use super::super::clock::{self, nanos, shared_ns, Starvation};
use super::super::log::{Completion, Replay, Run, Section};
use super::lock::{spin, WORK_MARGIN};
use super::{Shared, WorkerConfig};

/// How long one window of keys is current.
pub(super) const SLOT: Duration = Duration::from_millis(200);
/// Keys per window.
pub(super) const KEYS_PER_SLOT: u64 = 32;
/// How many windows back a claim for a recent key may go (5 s).
pub(super) const RECENT_SLOTS: u64 = 25;

/// One task: claim keys, run and complete or replay; until the process's share of claims
/// is reached (and the parent does not hold it) or the time is up.
pub(super) async fn claim_loop(
    task: usize,
    redlock: &Redlock,
    shared: &Shared,
    config: &WorkerConfig,
    stop_at: Instant,
) -> (Vec<Run>, Vec<Replay>) {
    let (mut runs, mut replays) = (Vec::new(), Vec::new());
    let mut rng = fastrand::Rng::new();
    // Records outlive the run: a late duplicate must still find them.
    let retention = config.time_limit + Duration::from_secs(600);
    while shared.go_on(config.target, stop_at) {
        let key = pick_key(&mut rng, config.epoch_ns);
        let name = format!("{}{key}", config.key_prefix);
        match redlock
            .lock_unless_completed(&name, config.ttl, config.retry)
            .await
        {
            Ok(LockOrRecord::Locked(lease)) => {
                // The evidence of starvation is read before the section is entered: its own
                // reads of /proc (a directory, every thread's schedstat) can block or be
                // preempted, and inside the section they once made one that entered 3 µs
                // before its deadline leave 21 ms after it, with no wait seen.
                let mut starvation = Starvation::begin();
                let enter_ns = clock::now_ns();
                let deadline_ns = shared_ns(lease.deadline());
                let token = lease.fencing_token();
                // The handler: busy work, then a random wait, so that runs straddle faults —
                // only with the validity to cover it and the lock workload's margin for the
                // yield and the timer, as an application checks (else it completes at once).
                let wait = rng.u64(0..=config.handler.as_millis() as u64);
                let planned = config.work + Duration::from_millis(wait) + WORK_MARGIN;
                let checked = Instant::now();
                let mut plan_ns = enter_ns;
                if lease.deadline().saturating_duration_since(checked) >= planned {
                    plan_ns = shared_ns(checked + planned);
                    Starvation::own_code_done(&mut starvation);
                    tokio::task::yield_now().await;
                    spin(config.work);
                    tokio::time::sleep(Duration::from_millis(wait)).await;
                }
                // Validity first: a lease not valid at the exit then left at or after its
                // deadline.
                let valid = lease.is_valid();
                let leave_ns = clock::now_ns();
                let starved = Starvation::end(starvation);
                let record = format!("{key} {} {task} {enter_ns}", config.id);
                let completion = match lease.complete(record, retention).await {
                    _ if !valid => Completion::Expired,
                    Ok(()) => Completion::Stored,
                    Err(e) if e.is_unavailable() => Completion::Minority,
                    Err(e) if e.is_lost() => Completion::Lost,
                    Err(e) => {
                        shared.sample(&e);
                        Completion::Failed
                    }
                };
                runs.push(Run {
                    section: Section {
                        resource: key as usize,
                        enter_ns,
                        leave_ns,
                        deadline_ns,
                        plan_ns,
                        starved_ns: starved,
                        valid,
                        worker: config.id,
                        task,
                        token,
                    },
                    completion,
                });
                shared.acquisitions.fetch_add(1, Ordering::Relaxed);
                shared.done.fetch_add(1, Ordering::Relaxed);
            }
            Ok(LockOrRecord::Completed(record)) => {
                match parse_record(&record) {
                    Some((named, run_worker, run_task, run_enter_ns)) => replays.push(Replay {
                        // A record of another key shows as a phantom replay.
                        key: if named == key {
                            key as usize
                        } else {
                            usize::MAX
                        },
                        worker: config.id,
                        run_worker,
                        run_task,
                        run_enter_ns,
                    }),
                    None => {
                        shared.other.fetch_add(1, Ordering::Relaxed);
                        shared.sample(&format!(
                            "{name}: an unreadable completion record {:?}",
                            String::from_utf8_lossy(&record)
                        ));
                    }
                }
                shared.done.fetch_add(1, Ordering::Relaxed);
            }
            // Only records stored "if free" can differ that way, and this workload stores
            // none: reported as unexpected.
            Ok(LockOrRecord::OutcomeUnknown) => {
                shared.other.fetch_add(1, Ordering::Relaxed);
                shared.sample(&format!(
                    "{name}: outcome unknown, with no lost lease's record"
                ));
                shared.done.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => shared.count(&e),
        }
    }
    (runs, replays)
}

/// A key's number: from the current window, a recent one or any (see the module docs).
pub(super) fn pick_key(rng: &mut fastrand::Rng, epoch_ns: i64) -> u64 {
    let now = u64::try_from((clock::now_ns() - epoch_ns).max(0)).unwrap_or(0);
    let current = now / nanos(SLOT) as u64;
    let slot = match rng.u8(0..100) {
        0..50 => current,
        50..85 => current.saturating_sub(rng.u64(0..=RECENT_SLOTS)),
        _ => rng.u64(0..=current),
    };
    slot * KEYS_PER_SLOT + rng.u64(0..KEYS_PER_SLOT)
}

/// `key worker task enter_ns`.
fn parse_record(record: &[u8]) -> Option<(u64, usize, usize, i64)> {
    let text = std::str::from_utf8(record).ok()?;
    let mut f = text.split(' ');
    let out = (
        f.next()?.parse().ok()?,
        f.next()?.parse().ok()?,
        f.next()?.parse().ok()?,
        f.next()?.parse().ok()?,
    );
    f.next().is_none().then_some(out)
}
