//! The parent: masters, proxies and worker processes; the fault schedule beside them; the
//! logs merged and checked.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::proxy::FaultProxy;
use crate::Masters;

use super::faults::fault_schedule;
use super::log::WorkerLog;
use super::report::Report;
use super::settings::Settings;
use super::verdict::check;
use super::{MASTERS, WORKER_ENV};

/// Runs the checker: starts [`MASTERS`] masters with a [`FaultProxy`] in front of each,
/// spawns `settings.processes` workers (each from `worker_command()`, with the worker
/// environment added), injects faults on a minority of masters until every worker is done,
/// then merges the logs and checks them. Panics only on a broken harness; the verdict is in
/// the report.
pub fn run(settings: &Settings, worker_command: impl Fn() -> Command) -> Report {
    let started = Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("parent runtime");
    let masters = Masters::start(MASTERS);
    // Workers reach the masters only through the proxies, so a partition cuts them all off.
    let proxies: Vec<FaultProxy> = rt.block_on(async {
        let mut out = Vec::new();
        for m in masters.iter() {
            let upstream: SocketAddr = m.addr().parse().expect("a socket address");
            out.push(FaultProxy::start(upstream).await);
        }
        out
    });

    let run_id = format!("{}-{}", std::process::id(), fastrand::u32(..));
    let dir = std::env::temp_dir().join(format!("tower-redlock-checker-{run_id}"));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {dir:?}: {e}"));
    let urls: Vec<String> = proxies.iter().map(FaultProxy::url).collect();
    let resources: Vec<String> = (0..settings.resources)
        .map(|r| format!("checker:{run_id}:r{r}"))
        .collect();
    let share = settings.acquisitions.div_ceil(settings.processes as u64);

    let mut workers = Workers::default();
    for id in 0..settings.processes {
        let log = dir.join(format!("worker-{id}.log"));
        let out = std::fs::File::create(dir.join(format!("worker-{id}.out"))).expect("out file");
        let err = out.try_clone().expect("clone out file");
        let mut cmd = worker_command();
        cmd.env(WORKER_ENV, "1")
            .env("CHECKER_WORKER_ID", id.to_string())
            .env("CHECKER_URLS", urls.join(","))
            .env("CHECKER_RESOURCE_NAMES", resources.join(","))
            .env("CHECKER_TARGET", share.to_string())
            .env("CHECKER_TASKS", settings.tasks.to_string())
            .env("CHECKER_TTL_MS", settings.ttl.as_millis().to_string())
            .env(
                "CHECKER_NODE_TIMEOUT_MS",
                settings.node_timeout.as_millis().to_string(),
            )
            .env("CHECKER_WORK_US", settings.work.as_micros().to_string())
            .env("CHECKER_RETRIES", settings.retries.to_string())
            .env(
                "CHECKER_RETRY_DELAY_US",
                settings.retry_delay.as_micros().to_string(),
            )
            .env(
                "CHECKER_RETRY_JITTER_US",
                settings.retry_jitter.as_micros().to_string(),
            )
            .env(
                "CHECKER_TIME_LIMIT_MS",
                settings.time_limit.as_millis().to_string(),
            )
            .env("CHECKER_FENCING", u8::from(settings.fencing).to_string())
            .env("CHECKER_LOG", &log)
            .stdin(Stdio::piped())
            .stdout(out)
            .stderr(err);
        let child = cmd.spawn().expect("spawn a worker process");
        workers.children.push((id, Some(child), log));
    }

    // The fault schedule runs on its own thread until the workers are done.
    let (stop, stopped) = mpsc::channel::<()>();
    let abstention = settings.abstention();
    let faults = std::thread::scope(|s| {
        let (masters, proxies) = (&masters, &proxies);
        let schedule = s.spawn(move || fault_schedule(masters, proxies, &stopped, abstention));
        // Workers stop themselves at the time limit; past it (and a grace period) they are
        // killed.
        let statuses = workers.wait(settings.time_limit + Duration::from_secs(20));
        drop(stop);
        let faults = schedule
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        (faults, statuses)
    });
    let (faults, statuses) = faults;
    // Beside the worker logs, kept with them on failure.
    let timeline = dir.join("faults.log");
    faults
        .write_timeline(&timeline)
        .unwrap_or_else(|e| panic!("write {timeline:?}: {e}"));

    let mut logs = Vec::new();
    let mut failed_workers = Vec::new();
    for (id, status, log) in statuses {
        let output =
            std::fs::read_to_string(dir.join(format!("worker-{id}.out"))).unwrap_or_default();
        match status {
            Some(s) if s.success() => match WorkerLog::read(&log, id) {
                Ok(l) => logs.push(l),
                Err(e) => failed_workers.push(format!("worker {id}: {e}")),
            },
            Some(s) => failed_workers.push(format!("worker {id} exited with {s}: {output}")),
            None => failed_workers.push(format!(
                "worker {id} overran its time limit and was killed: {output}"
            )),
        }
    }
    let verdict = check(
        logs.iter()
            .flat_map(|l| l.sections.iter().copied())
            .collect(),
    );
    drop(proxies);
    drop(masters);
    drop(rt);
    let report = Report {
        settings: settings.clone(),
        logs,
        failed_workers,
        faults,
        verdict,
        elapsed: started.elapsed(),
        dir,
    };
    if report.problems().is_empty() {
        let _ = std::fs::remove_dir_all(&report.dir);
    }
    report
}

/// The worker processes; any still running when this is dropped is killed (by its pid).
#[derive(Default)]
struct Workers {
    children: Vec<(usize, Option<Child>, PathBuf)>,
}

type Statuses = Vec<(usize, Option<ExitStatus>, PathBuf)>;

impl Workers {
    /// Waits for every worker until `within` has passed, then kills the rest. Returns each
    /// worker's exit status (`None`: killed).
    fn wait(&mut self, within: Duration) -> Statuses {
        let deadline = Instant::now() + within;
        let mut done: Vec<Option<ExitStatus>> = vec![None; self.children.len()];
        loop {
            for (i, (_, child, _)) in self.children.iter_mut().enumerate() {
                if let (None, Some(c)) = (done[i], child.as_mut()) {
                    done[i] = c.try_wait().expect("poll a worker");
                }
            }
            if done.iter().all(Option::is_some) || Instant::now() >= deadline {
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

impl Drop for Workers {
    fn drop(&mut self) {
        self.kill_all();
    }
}
