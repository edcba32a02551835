//! The wake-up bench's workloads (`benches/wake.rs`): waiters in several processes on one
//! key, polling (the wake-up off) or woken on release (`RedlockBuilder::wake_waiters`).
//!
//! A *waiter process* (this bench binary started again with `WAKE_BENCH_CHILD=1`) runs
//! `tasks` tasks on one client; each task loops for the duration: `lock_with(key, ttl,
//! Retry::until(5 s))` (the default 200 ms + 50 ms poll), then `work` of "work" (a sleep),
//! then `release()`. It prints one line per event with the wall clock in ns (one machine:
//! the processes share it): `G <task> <ns>` at a grant, `R <task> <ns>` just before the
//! `release()` call, `W <task> <wait ns> <ok|timeout>` per lock call. The parent merges
//! the processes' lines ([`Run::of`]).

use std::io::{BufRead, Write as _};
use std::process::{Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tower_redlock::{Redlock, Retry};

/// The environment variable that makes the bench binary a waiter process.
pub const CHILD: &str = "WAKE_BENCH_CHILD";

/// One waiter process's plan (passed in its environment).
#[derive(Debug, Clone)]
pub struct Plan {
    pub urls: Vec<String>,
    pub wake: bool,
    pub tasks: usize,
    pub key: String,
    pub work: Duration,
    pub duration: Duration,
    /// When to begin (wall clock, ns since the epoch): every process begins together.
    pub start_ns: u128,
    pub node_timeout: Duration,
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

impl Plan {
    fn env(&self) -> Vec<(String, String)> {
        vec![
            (CHILD.into(), "1".into()),
            ("WAKE_URLS".into(), self.urls.join(" ")),
            ("WAKE_ON".into(), u8::from(self.wake).to_string()),
            ("WAKE_TASKS".into(), self.tasks.to_string()),
            ("WAKE_KEY".into(), self.key.clone()),
            ("WAKE_WORK_US".into(), self.work.as_micros().to_string()),
            (
                "WAKE_DURATION_MS".into(),
                self.duration.as_millis().to_string(),
            ),
            ("WAKE_START_NS".into(), self.start_ns.to_string()),
            (
                "WAKE_NODE_TIMEOUT_MS".into(),
                self.node_timeout.as_millis().to_string(),
            ),
        ]
    }

    fn from_env() -> Self {
        let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("{k} is set"));
        let num = |k: &str| {
            var(k)
                .parse::<u128>()
                .unwrap_or_else(|_| panic!("{k}: a number"))
        };
        Self {
            urls: var("WAKE_URLS").split(' ').map(str::to_owned).collect(),
            wake: var("WAKE_ON") == "1",
            tasks: num("WAKE_TASKS") as usize,
            key: var("WAKE_KEY"),
            work: Duration::from_micros(num("WAKE_WORK_US") as u64),
            duration: Duration::from_millis(num("WAKE_DURATION_MS") as u64),
            start_ns: num("WAKE_START_NS"),
            node_timeout: Duration::from_millis(num("WAKE_NODE_TIMEOUT_MS") as u64),
        }
    }
}

/// A client of `urls`, with the wake-up when `wake`.
pub fn client(urls: &[String], node_timeout: Duration, wake: bool) -> Redlock {
    urls.iter()
        .fold(Redlock::builder(), |b, u| b.redis(u))
        .node_timeout(node_timeout)
        .wake_waiters(wake)
        .build()
        .expect("a valid client")
}

/// The waiter process: runs its plan, prints its events, exits.
pub fn run_child() {
    let plan = Plan::from_env();
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let lines = rt.block_on(async move {
        let redlock = client(&plan.urls, plan.node_timeout, plan.wake);
        // Connections up before the start.
        let warm = format!("{}:warm:{}", plan.key, std::process::id());
        if let Ok(l) = redlock.lock(&warm, Duration::from_secs(5)).await {
            let _ = l.release().await;
        }
        let wait = plan.start_ns.saturating_sub(now_ns());
        tokio::time::sleep(Duration::from_nanos(wait as u64)).await;
        let end = tokio::time::Instant::now() + plan.duration;
        let tasks: Vec<_> = (0..plan.tasks)
            .map(|t| {
                let redlock = redlock.clone();
                let key = plan.key.clone();
                let work = plan.work;
                tokio::spawn(async move {
                    let mut out = String::new();
                    while tokio::time::Instant::now() < end {
                        let asked = now_ns();
                        let retry = Retry::until(Duration::from_secs(5));
                        let got = redlock.lock_with(&key, Duration::from_secs(5), retry).await;
                        let granted = now_ns();
                        let ok = if got.is_ok() { "ok" } else { "timeout" };
                        out.push_str(&format!("W {t} {} {ok}\n", granted - asked));
                        if let Ok(lease) = got {
                            out.push_str(&format!("G {t} {granted}\n"));
                            tokio::time::sleep(work).await;
                            out.push_str(&format!("R {t} {}\n", now_ns()));
                            let _ = lease.release().await;
                        }
                    }
                    out
                })
            })
            .collect();
        let mut all = String::new();
        for t in tasks {
            all.push_str(&t.await.expect("a waiter task"));
        }
        all
    });
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(lines.as_bytes());
}

/// What the processes of one run saw, merged.
#[derive(Debug, Default)]
pub struct Run {
    /// Grants per (process, task).
    pub holds: Vec<usize>,
    /// From a `release()` call to the next grant, when that grant is another task's (a
    /// holder that takes the key again at once hands nothing over).
    pub handoffs: Vec<Duration>,
    /// Each hold, from its grant to its `release()` call: the work as it ran (a 2 ms sleep
    /// takes longer: the timer's granularity).
    pub holding: Vec<Duration>,
    /// Grants that followed a release by the same task (the releaser took the key again).
    pub regrants: usize,
    /// From such a release call to the same task's next grant.
    pub regrant_gaps: Vec<Duration>,
    /// Each lock call, from the call to its answer.
    pub waits: Vec<Duration>,
    pub timeouts: usize,
    pub grants: usize,
    /// From the first grant to the last release call.
    pub window: Duration,
}

impl Run {
    /// Starts `processes` waiter processes of `plan` (each with `plan.tasks` tasks) and
    /// merges what they print.
    pub fn of(plan: &Plan, processes: usize) -> Self {
        let exe = std::env::current_exe().expect("the bench binary");
        let children: Vec<_> = (0..processes)
            .map(|_| {
                Command::new(&exe)
                    .envs(plan.env())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::inherit())
                    .spawn()
                    .expect("a waiter process")
            })
            .collect();
        let mut run = Run::default();
        // (ns, is_grant, owner: process and task)
        let mut events: Vec<(u128, bool, (usize, usize))> = Vec::new();
        for (p, child) in children.into_iter().enumerate() {
            let out = child.wait_with_output().expect("the waiter process ends");
            let mut holds = vec![0usize; plan.tasks];
            for line in out.stdout.lines().map_while(Result::ok) {
                let f: Vec<&str> = line.split(' ').collect();
                match f.as_slice() {
                    ["G", t, ns] => {
                        let t = t.parse::<usize>().unwrap();
                        holds[t] += 1;
                        events.push((ns.parse().unwrap(), true, (p, t)));
                    }
                    ["R", t, ns] => {
                        events.push((ns.parse().unwrap(), false, (p, t.parse().unwrap())))
                    }
                    ["W", _, ns, ok] => {
                        run.waits.push(Duration::from_nanos(ns.parse().unwrap()));
                        run.timeouts += usize::from(*ok == "timeout");
                    }
                    _ => panic!("process {p}: unexpected line {line:?}"),
                }
            }
            run.holds.extend(holds);
        }
        events.sort_unstable();
        run.grants = events.iter().filter(|e| e.1).count();
        if let (Some(first), Some(last)) = (events.first(), events.last()) {
            run.window = Duration::from_nanos((last.0 - first.0) as u64);
        }
        for pair in events.windows(2) {
            match pair {
                [(g, true, a), (r, false, b)] if a == b => {
                    run.holding.push(Duration::from_nanos((r - g) as u64));
                }
                [(r, false, a), (g, true, b)] if a == b => {
                    run.regrants += 1;
                    run.regrant_gaps.push(Duration::from_nanos((g - r) as u64));
                }
                [(r, false, _), (g, true, _)] => {
                    run.handoffs.push(Duration::from_nanos((g - r) as u64));
                }
                _ => {}
            }
        }
        run
    }
}

/// Redis' `INFO stats` counters of one server: commands, bytes in and out.
pub async fn counters(server: &tower_redlock_testkit::RedisServer) -> [u64; 3] {
    let mut cmd = redis::cmd("INFO");
    cmd.arg("stats");
    let info: String = server.query(&cmd).await;
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    [
        field("total_commands_processed"),
        field("total_net_input_bytes"),
        field("total_net_output_bytes"),
    ]
}
