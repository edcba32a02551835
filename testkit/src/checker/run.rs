//! The parent: voters, proxies and worker processes; the nemesis beside them; the logs
//! merged and checked.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::clock;
use super::durable::{self, answers_path, Killer, Progress};
use super::faults::FaultCounts;
use super::log::{StoreCounts, WorkerLog};
use super::nemesis::{self, Budget, Ctx, Kind, Stop};
use super::report::Report;
use super::settings::{Settings, Store, Workload};
use super::store;
use super::topology::Topology;
use super::verdict::{check, check_lost_runs, check_runs};
use super::workers::{Statuses, Workers};
use super::{MAX_AFFECTED, WORKER_ENV};
use crate::PostgresServer;

/// Runs the checker: starts the [`MASTERS`](super::MASTERS) voters with a fault proxy in
/// front of each (see `topology.rs`), spawns `settings.processes` workers (each from
/// `worker_command()`, with the worker environment added), runs the nemesis on a minority
/// of the voters until every worker is done, then merges the logs and checks them. With a
/// fenced store (`--store postgres`), first one PostgreSQL server with its tables (see
/// `store.rs`), whose history is checked at the end. Panics
/// only on a broken harness; the verdict is in the report.
pub fn run(settings: &Settings, worker_command: impl Fn() -> Command) -> Report {
    let started = Instant::now();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("parent runtime");
    let run_id = format!("{}-{}", std::process::id(), fastrand::u32(..));
    let topology = Topology::start(settings, &rt, &run_id);
    let dir = std::env::temp_dir().join(format!("tower-redlock-checker-{run_id}"));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {dir:?}: {e}"));
    let resources: Vec<String> = (0..settings.resources)
        .map(|r| format!("checker:{run_id}:r{r}"))
        .collect();
    let share = settings.acquisitions.div_ceil(settings.processes as u64);
    let postgres = settings.store.map(|Store::Postgres| {
        let server = PostgresServer::start();
        if settings.durable() {
            rt.block_on(durable::setup(&server.url()));
        } else {
            rt.block_on(store::setup(&server.url(), &resources));
        }
        server
    });
    let store_url = postgres.as_ref().map_or(String::new(), PostgresServer::url);
    // While it exists, the workers go on past their share: the nemesis has not yet
    // injected `min_faults` of each kind. The durable mode's workers go on until it is gone:
    // killed and started again, they cannot count their share.
    let hold = (settings.min_faults > 0 || settings.durable()).then(|| dir.join("hold"));
    let share = if settings.durable() { 0 } else { share };
    if let Some(hold) = &hold {
        std::fs::write(hold, b"").unwrap_or_else(|e| panic!("create {hold:?}: {e}"));
    }
    let epoch_ns = clock::now_ns();
    let seed = fastrand::u64(..);

    let crash_one_in = if settings.durable() && settings.nemesis.contains(&Kind::Crash) {
        CRASH_ONE_IN
    } else {
        0
    };
    let spawn = |id: usize| {
        let log = dir.join(format!("worker-{id}.log"));
        // Appended to: a worker started again adds to what it printed before.
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("worker-{id}.out")))
            .expect("out file");
        let err = out.try_clone().expect("clone out file");
        let mut cmd = worker_command();
        let ms = |d: Duration| d.as_millis().to_string();
        let us = |d: Duration| d.as_micros().to_string();
        cmd.env(WORKER_ENV, "1")
            .env("CHECKER_WORKER_ID", id.to_string())
            .env("CHECKER_VOTERS", topology.worker_voters(id))
            .env("CHECKER_WORKLOAD", settings.workload.name())
            .env("CHECKER_RESOURCE_NAMES", resources.join(","))
            .env("CHECKER_KEY_PREFIX", format!("checker:{run_id}:k"))
            .env("CHECKER_EPOCH_NS", epoch_ns.to_string())
            .env("CHECKER_TARGET", share.to_string())
            .env("CHECKER_TASKS", settings.tasks.to_string())
            .env("CHECKER_TTL_MS", ms(settings.ttl))
            .env("CHECKER_NODE_TIMEOUT_MS", ms(settings.node_timeout))
            .env("CHECKER_WORK_US", us(settings.work))
            .env("CHECKER_HANDLER_MS", ms(settings.handler))
            .env("CHECKER_RETRIES", settings.retries.to_string())
            .env("CHECKER_RETRY_DELAY_US", us(settings.retry_delay))
            .env("CHECKER_RETRY_JITTER_US", us(settings.retry_jitter))
            .env("CHECKER_TIME_LIMIT_MS", ms(settings.time_limit))
            .env("CHECKER_FENCING", u8::from(settings.fencing).to_string())
            .env("CHECKER_BROKEN", settings.broken.map_or("", |b| b.name()))
            .env("CHECKER_LOST", u8::from(settings.lost_leases()).to_string())
            .env("CHECKER_SEED", seed.to_string())
            .env("CHECKER_STORE_URL", &store_url)
            .env("CHECKER_ANSWERS", answers_path(&dir, id))
            .env("CHECKER_CRASH_ONE_IN", crash_one_in.to_string())
            .env("CHECKER_LOG", &log)
            .stdin(Stdio::piped())
            .stdout(out)
            .stderr(err);
        match &hold {
            Some(hold) => cmd.env("CHECKER_HOLD", hold),
            None => cmd.env_remove("CHECKER_HOLD"),
        };
        cmd.spawn().expect("spawn a worker process")
    };
    let logs = (0..settings.processes)
        .map(|id| (id, dir.join(format!("worker-{id}.log"))))
        .collect();
    let mut workers = Workers::start(logs, settings.durable(), spawn);
    let mut progress = Progress::new(&dir, settings.processes);
    let mut killer = Killer::new();

    // The nemesis runs on threads of its own until the workers are done.
    let stop = Stop::default();
    let budget = Budget::new(topology.voters(), MAX_AFFECTED);
    let counts = Mutex::new(FaultCounts::default());
    let ctx = Ctx {
        topology: &topology,
        settings,
        resources: &resources,
        rt: rt.handle().clone(),
        stop: &stop,
        budget: &budget,
        counts: &counts,
    };
    let statuses = std::thread::scope(|s| {
        let lanes = s.spawn(|| nemesis::unleash(&ctx));
        // Workers stop themselves at the time limit; past it (and a grace period) they are
        // killed. The hold is lifted once every kind has injected enough.
        let statuses = workers.wait(settings.time_limit + Duration::from_secs(20), |w| {
            let mut answered = true;
            if settings.durable() {
                progress.poll(&counts, false);
                answered = progress.answered >= settings.acquisitions;
            }
            if let Some(hold) = &hold {
                if hold.exists() && answered && enough(settings, &counts.lock().unwrap()) {
                    let _ = std::fs::remove_file(hold);
                }
                // The parent's kills, while the workers still claim.
                if crash_one_in > 0 && hold.exists() && killer.due() {
                    let from_ns = clock::now_ns();
                    if let Some(id) = w.kill_one(killer.rng()) {
                        let mut counts = counts.lock().unwrap_or_else(|p| p.into_inner());
                        counts.add("kill", &[], from_ns, format!("worker {id}"));
                    }
                }
            }
            // Set early only by a lane that panicked: a broken harness.
            !stop.is_set()
        });
        stop.set();
        lanes
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p));
        statuses
    });
    drop(workers);
    if settings.durable() {
        // What the last workers wrote.
        progress.poll(&counts, true);
    }
    let mut faults = counts.into_inner().unwrap_or_else(|p| p.into_inner());
    faults.timeline.sort_by_key(|f| (f.from_ns, f.to_ns));
    // Beside the worker logs, kept with them on failure.
    let timeline = dir.join("faults.log");
    faults
        .write_timeline(&timeline)
        .unwrap_or_else(|e| panic!("write {timeline:?}: {e}"));

    let (logs, failed_workers) = read_logs(&dir, statuses);
    let mut verdict = match settings.workload {
        Workload::Lock => check(
            logs.iter()
                .flat_map(|l| l.sections.iter().copied())
                .collect(),
        ),
        Workload::Replay if settings.lost_leases() => {
            let replays: Vec<_> = logs
                .iter()
                .flat_map(|l| l.replays.iter().copied())
                .collect();
            let answers: Vec<_> = logs
                .iter()
                .flat_map(|l| l.answers.iter().copied())
                .collect();
            check_lost_runs(
                logs.iter().flat_map(|l| l.runs.iter().copied()).collect(),
                &replays,
                &answers,
            )
        }
        Workload::Replay => {
            let replays: Vec<_> = logs
                .iter()
                .flat_map(|l| l.replays.iter().copied())
                .collect();
            check_runs(
                logs.iter().flat_map(|l| l.runs.iter().copied()).collect(),
                &replays,
            )
        }
    };
    if let (Some(server), true) = (&postgres, settings.durable()) {
        let rows = rt.block_on(durable::read_business(&server.url()));
        let d = durable::check_durable(&rows, &progress.answers);
        verdict.runs = d.count(durable::Outcome::Run);
        verdict.replays = d.count(durable::Outcome::Replay);
        verdict.answers = d.answered();
        verdict.durable = Some(d);
    } else if let Some(server) = &postgres {
        let mut counts = StoreCounts::default();
        for l in &logs {
            counts.add(&l.store);
        }
        verdict.store = Some(rt.block_on(store::verdict(&server.url(), counts)));
    }
    if let Some(server) = &postgres {
        // The server's log beside the workers' (kept with them on failure): what an error a
        // worker saw looked like from the server's side.
        let log = dir.join("postgres.log");
        std::fs::write(&log, server.log()).unwrap_or_else(|e| panic!("write {log:?}: {e}"));
    }
    drop(postgres);
    let voters = topology.describe();
    drop(topology);
    drop(rt);
    let report = Report {
        settings: settings.clone(),
        voters,
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

/// The durable mode's fail points (with the `crash` nemesis) each kill their worker once
/// in this many passes.
const CRASH_ONE_IN: u64 = 150;

/// Whether every nemesis kind of the run has injected at least `min_faults` of each of its
/// faults.
fn enough(settings: &Settings, counts: &FaultCounts) -> bool {
    settings.nemesis.iter().all(|k| {
        k.evidence(settings.restarts())
            .iter()
            .all(|group| counts.count_of(group) >= settings.min_faults)
    })
}

/// The logs of the workers that exited cleanly, and what went wrong with the others.
fn read_logs(dir: &Path, statuses: Statuses) -> (Vec<WorkerLog>, Vec<String>) {
    let mut logs = Vec::new();
    let mut failed = Vec::new();
    for (id, status, log) in statuses {
        let output =
            std::fs::read_to_string(dir.join(format!("worker-{id}.out"))).unwrap_or_default();
        match status {
            Some(s) if s.success() => match WorkerLog::read(&log, id) {
                Ok(l) => logs.push(l),
                Err(e) => failed.push(format!("worker {id}: {e}")),
            },
            Some(s) => failed.push(format!("worker {id} exited with {s}: {output}")),
            None => failed.push(format!(
                "worker {id} overran its time limit (or the harness broke) and was killed: \
                 {output}"
            )),
        }
    }
    (logs, failed)
}
