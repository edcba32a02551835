//! The worker processes of a run: spawned, waited for, killed by their pid — and, in the
//! durable mode, SIGKILLed at random moments and started again.

use std::os::unix::process::ExitStatusExt as _;
use std::path::PathBuf;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

/// The worker processes; any still running when this is dropped is killed (by its pid).
pub(super) struct Workers<'a> {
    spawn: Box<dyn FnMut(usize) -> Child + 'a>,
    children: Vec<(usize, Option<Child>, PathBuf)>,
    /// Whether a worker killed by SIGKILL (by the parent, or by itself) is started again.
    respawn: bool,
    /// How many were.
    pub(super) respawned: u64,
}

pub(super) type Statuses = Vec<(usize, Option<ExitStatus>, PathBuf)>;

impl<'a> Workers<'a> {
    /// Spawns worker `id` for each `(id, log)` with `spawn(id)`.
    pub(super) fn start(
        logs: Vec<(usize, PathBuf)>,
        respawn: bool,
        mut spawn: impl FnMut(usize) -> Child + 'a,
    ) -> Self {
        let children = logs
            .into_iter()
            .map(|(id, log)| (id, Some(spawn(id)), log))
            .collect();
        Self {
            spawn: Box::new(spawn),
            children,
            respawn,
            respawned: 0,
        }
    }

    /// Waits for every worker until `within` has passed, or until `tick` (called every
    /// 20 ms) says no, then kills the rest. Returns each worker's exit status (`None`:
    /// killed). A worker that died of SIGKILL meanwhile is started again, with `respawn`.
    pub(super) fn wait(
        &mut self,
        within: Duration,
        mut tick: impl FnMut(&mut Self) -> bool,
    ) -> Statuses {
        let deadline = Instant::now() + within;
        let mut done: Vec<Option<ExitStatus>> = vec![None; self.children.len()];
        loop {
            for ((id, child, _), done) in self.children.iter_mut().zip(done.iter_mut()) {
                let (None, Some(c)) = (*done, child.as_mut()) else {
                    continue;
                };
                let status = c.try_wait().expect("poll a worker");
                match status {
                    Some(s) if self.respawn && s.signal() == Some(9) => {
                        *child = Some((self.spawn)(*id));
                        self.respawned += 1;
                    }
                    s => *done = s,
                }
            }
            if done.iter().all(Option::is_some) || Instant::now() >= deadline || !tick(self) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill_all();
        self.children
            .drain(..)
            .zip(done)
            .map(|((id, _, log), status)| (id, status, log))
            .collect()
    }

    /// SIGKILLs one running worker, picked at random (started again by [`wait`](Self::wait));
    /// its id.
    pub(super) fn kill_one(&mut self, rng: &mut fastrand::Rng) -> Option<usize> {
        let running: Vec<usize> = (0..self.children.len())
            .filter(|&i| {
                self.children[i]
                    .1
                    .as_mut()
                    .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
            })
            .collect();
        let i = *running.get(rng.usize(0..running.len().max(1)))?;
        let (id, child, _) = &mut self.children[i];
        child.as_mut()?.kill().ok()?;
        Some(*id)
    }

    fn kill_all(&mut self) {
        for (_, child, _) in &mut self.children {
            if let Some(mut c) = child.take() {
                if matches!(c.try_wait(), Ok(None)) {
                    let _ = c.kill();
                    let _ = c.wait();
                }
            }
        }
    }
}

impl Drop for Workers<'_> {
    fn drop(&mut self) {
        self.kill_all();
    }
}
