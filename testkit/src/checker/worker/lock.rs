//! The lock workload's task: lock a random resource, record the section, release.
//!
//! With a fenced store (`--store`), the section also makes a read-modify-write of its
//! resource's row with the lease's token before it leaves: the read (the claim) first, then
//! the work, then the write and its commit. Every `PAUSE_EVERY`th write (`store/writer.rs`) of a process
//! pauses past the lease's ttl instead — alternately before its read and after it. The
//! section — what the lock covered — is recorded as left when the pause begins (its exit
//! and `is_valid` read then, still inside the validity, and checked like any other). A
//! pause before the read sleeps one and a half ttls (its lease expires a ttl after the pause
//! at the latest; the other tasks then have half a ttl to take the resource and write),
//! then reads and writes with its old token; a pause after the read keeps its transaction
//! open past the lease's deadline, alternately one and a half ttls — while the next holders
//! try the row: with the claim they find it busy — and up to a thirty-second of a ttl —
//! about when the next holder reads and writes: with the negative control's plain read,
//! the interleaving that loses a write — then writes.
//! The lock promises nothing after its deadline, so the late write is not a section: it is
//! what fencing must handle, counted as paused and checked from the store's history (refused
//! when a newer holder claimed first, and never a lost write). Leaving the
//! paused write out of the exclusion check rather than the whole section keeps the part the
//! lock did cover checked.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tower_redlock::Redlock;

use super::super::clock::{self, shared_ns, Starvation};
use super::super::log::Section;
use super::super::settings::Broken;
use super::super::store::{Open, Pause, Writer};
use super::{Shared, WorkerConfig};

/// One task: lock a random resource, record the section, release; until the process's share
/// of acquisitions is reached (and the parent does not hold it) or the time is up.
pub(super) async fn lock_loop(
    task: usize,
    redlock: &Redlock,
    shared: &Shared,
    config: &WorkerConfig,
    store: Option<&Writer>,
    stop_at: Instant,
) -> Vec<Section> {
    let mut sections = Vec::new();
    let mut rng = fastrand::Rng::new();
    while shared.go_on(config.target, stop_at) {
        let resource = rng.usize(..config.resources.len());
        match redlock
            .lock_with(&config.resources[resource], config.ttl, config.retry)
            .await
        {
            Ok(lease) => {
                // The evidence of starvation is read before the section is entered: its own
                // reads of /proc (a directory, every thread's schedstat) can block or be
                // preempted, and inside the section they once made one that entered 3 µs
                // before its deadline leave 21 ms after it, with no wait seen.
                let mut starvation = Starvation::begin();
                let enter_ns = clock::now_ns();
                let deadline_ns = shared_ns(lease.deadline());
                let token = lease.fencing_token();
                let name = &config.resources[resource];
                let mut pause = Pause::No;
                // A read whose write comes after the pause.
                let mut open: Option<Open<'_>> = None;
                // The plan: leave at once, or — with the validity for it — after the work.
                let mut plan_ns = enter_ns;
                // The "work": give the other tasks a turn, spin a little, once more — only
                // with the validity to cover it, as an application checks before it works
                // (a lease may come back with milliseconds left after a slow quorum; its
                // section is then entered and left at once, and still checked). With a
                // store, the read comes before the work and the write after it.
                let checked = Instant::now();
                if lease.deadline().saturating_duration_since(checked) >= WORK_MARGIN {
                    plan_ns = shared_ns(checked + WORK_MARGIN);
                    if config.broken == Some(Broken::Blocking) {
                        // The negative control's bug: a blocking call in async code holds
                        // the runtime's thread past the lease's deadline.
                        std::thread::sleep(lease.deadline() - checked + config.ttl / 2);
                    }
                    Starvation::own_code_done(&mut starvation);
                    if let Some(store) = store {
                        pause = store.pause_next();
                        if pause != Pause::BeforeRead {
                            let token = token.expect("the fenced store needs fencing on");
                            open = Some(store.read(name, token, task).await);
                        }
                    }
                    tokio::task::yield_now().await;
                    spin(config.work);
                    tokio::task::yield_now().await;
                    // Only an unpaused write finishes here: a read paused after is kept
                    // open until after its pause (`open.take()` in the match of a tuple
                    // would take it out whatever the pause, and drop its transaction).
                    if pause == Pause::No {
                        if let (Some(store), Some(read)) = (store, open.take()) {
                            store.finish(read, name, config.id, task, pause).await;
                        }
                    }
                }
                // Validity first: a lease not valid at the exit then left at or after its
                // deadline.
                let valid = lease.is_valid();
                let leave_ns = clock::now_ns();
                let starved = Starvation::end(starvation);
                sections.push(Section {
                    resource,
                    enter_ns,
                    leave_ns,
                    deadline_ns,
                    plan_ns,
                    starved_ns: starved,
                    valid,
                    worker: config.id,
                    task,
                    token,
                });
                let paused = pause != Pause::No;
                if let (true, Some(store), Some(token)) = (paused, store, token) {
                    // The pause: the lease expires meanwhile, and another holder may claim.
                    let read = match open.take() {
                        Some(read) => {
                            let hold = match pause {
                                Pause::AfterRead { long: true } => config.ttl.mul_f64(1.5),
                                _ => config.ttl.mul_f64(rng.f64() / 32.0),
                            };
                            tokio::time::sleep_until((lease.deadline() + hold).into()).await;
                            read
                        }
                        None => {
                            tokio::time::sleep(config.ttl * 3 / 2).await;
                            store.read(name, token, task).await
                        }
                    };
                    store.finish(read, name, config.id, task, pause).await;
                }
                shared.acquisitions.fetch_add(1, Ordering::Relaxed);
                shared.done.fetch_add(1, Ordering::Relaxed);
                // A paused holder's lease has expired: its release may find the lock gone.
                if lease.release().await.is_err() && !paused {
                    shared.release_errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e) => shared.count(&e),
        }
    }
    sections
}

/// The validity a section needs left to do its work: far more than a yield, the spin and
/// another yield take on a loaded runtime of eight tasks. A section still there at its
/// deadline after it checked for this margin was not run for the rest: a paused process.
pub(super) const WORK_MARGIN: Duration = Duration::from_millis(50);

/// Busy work for `d`.
pub(super) fn spin(d: std::time::Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}
