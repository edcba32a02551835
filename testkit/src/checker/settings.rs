//! The size and tunables of one run: defaults for CI and soak runs, and their overrides.

use std::time::Duration;

/// The size and tunables of one run.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Worker processes.
    pub processes: usize,
    /// Lock-taking tasks per process.
    pub tasks: usize,
    /// Successful acquisitions to reach, over all processes.
    pub acquisitions: u64,
    /// Shared resources everyone fights over.
    pub resources: usize,
    /// The lock ttl (also the masters' delayed-restart protection window).
    pub ttl: Duration,
    /// The client's per-node timeout.
    pub node_timeout: Duration,
    /// Busy work inside each critical section.
    pub work: Duration,
    /// Retries of each `lock_with` call.
    pub retries: u32,
    /// The base delay between those retries.
    pub retry_delay: Duration,
    /// The random jitter added to each delay.
    pub retry_jitter: Duration,
    /// Workers stop on their own after this; the parent kills them a little later.
    pub time_limit: Duration,
    /// Fencing tokens on ([`RedlockBuilder::fencing`]): every section must carry one, and
    /// they must grow strictly per resource.
    ///
    /// [`RedlockBuilder::fencing`]: tower_redlock::RedlockBuilder::fencing
    pub fencing: bool,
}

impl Settings {
    /// A CI-sized run: a few tens of seconds on a shared 2-core machine.
    pub fn ci() -> Self {
        Self {
            processes: 3,
            tasks: 8,
            acquisitions: 10_000,
            resources: 3,
            ttl: Duration::from_millis(400),
            node_timeout: Duration::from_millis(150),
            work: Duration::from_micros(200),
            retries: 5,
            retry_delay: Duration::from_millis(2),
            retry_jitter: Duration::from_millis(8),
            time_limit: Duration::from_secs(240),
            fencing: true,
        }
    }

    /// A long local run.
    pub fn soak() -> Self {
        Self {
            processes: 4,
            acquisitions: 100_000,
            time_limit: Duration::from_secs(1800),
            ..Self::ci()
        }
    }

    /// Overrides from `CHECKER_*` environment variables, then from `--flag value` pairs.
    pub fn with_overrides(mut self, args: &[String]) -> Self {
        let mut set = |name: &str, value: &str| {
            let n: u64 = value
                .parse()
                .unwrap_or_else(|_| panic!("{name} must be a whole number, not {value:?}"));
            let us = |n: u64| usize::try_from(n).expect("fits usize");
            match name {
                "acquisitions" => self.acquisitions = n,
                "processes" => self.processes = us(n).max(1),
                "tasks" => self.tasks = us(n).max(1),
                "resources" => self.resources = us(n).max(1),
                "ttl-ms" => self.ttl = Duration::from_millis(n),
                "time-limit-s" => self.time_limit = Duration::from_secs(n),
                "work-us" => self.work = Duration::from_micros(n),
                "fencing" => self.fencing = n != 0,
                other => panic!("unknown setting {other}"),
            }
        };
        for name in [
            "acquisitions",
            "processes",
            "tasks",
            "resources",
            "ttl-ms",
            "time-limit-s",
            "work-us",
            "fencing",
        ] {
            let var = format!("CHECKER_{}", name.replace('-', "_").to_uppercase());
            if let Ok(v) = std::env::var(&var) {
                set(name, v.trim());
            }
        }
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let Some(name) = a.strip_prefix("--") else {
                panic!("unexpected argument {a:?}");
            };
            let value = it
                .next()
                .unwrap_or_else(|| panic!("--{name} needs a value"));
            set(name, value);
        }
        self
    }

    /// How long a restarted master abstains under delayed-restart protection: until Redis
    /// reports an uptime (whole seconds, rounded down) of at least 1 s + the ttl.
    pub(super) fn abstention(&self) -> Duration {
        Duration::from_secs(1 + self.ttl.as_secs_f64().ceil() as u64) + Duration::from_millis(500)
    }
}
