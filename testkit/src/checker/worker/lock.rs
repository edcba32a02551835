//! The lock workload's task: lock a random resource, record the section, release.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use tower_redlock::Redlock;

use super::super::clock::{self, shared_ns};
use super::super::log::Section;
use super::{Shared, WorkerConfig};

/// One task: lock a random resource, record the section, release; until the process's share
/// of acquisitions is reached (and the parent does not hold it) or the time is up.
pub(super) async fn lock_loop(
    task: usize,
    redlock: &Redlock,
    shared: &Shared,
    config: &WorkerConfig,
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
                let enter_ns = clock::now_ns();
                let deadline_ns = shared_ns(lease.deadline());
                let token = lease.fencing_token();
                // The "work": give the other tasks a turn, spin a little, once more — only
                // with the validity to cover it, as an application checks before it works
                // (a lease may come back with milliseconds left after a slow quorum; its
                // section is then entered and left at once, and still checked).
                if lease.deadline().saturating_duration_since(Instant::now()) >= WORK_MARGIN {
                    tokio::task::yield_now().await;
                    spin(config.work);
                    tokio::task::yield_now().await;
                }
                let leave_ns = clock::now_ns();
                let valid = lease.is_valid();
                sections.push(Section {
                    resource,
                    enter_ns,
                    leave_ns,
                    deadline_ns,
                    valid,
                    worker: config.id,
                    task,
                    token,
                });
                shared.acquisitions.fetch_add(1, Ordering::Relaxed);
                shared.done.fetch_add(1, Ordering::Relaxed);
                if lease.release().await.is_err() {
                    shared.release_errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e) => shared.count(&e),
        }
    }
    sections
}

/// The validity a section needs left to do its work: far more than a yield, the spin and
/// another yield take on a loaded runtime of eight tasks.
const WORK_MARGIN: Duration = Duration::from_millis(50);

/// Busy work for `d`.
pub(super) fn spin(d: std::time::Duration) {
    let until = Instant::now() + d;
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}
