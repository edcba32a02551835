//! The size and tunables of one run: defaults for CI and soak runs, and their overrides.

use std::time::Duration;

use super::nemesis::Kind;

/// What the workers do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// Lock a few shared resources, record each critical section, release
    /// ([`Redlock::lock_with`](tower_redlock::Redlock::lock_with)).
    Lock,
    /// Claim keys of a key space with
    /// [`Redlock::lock_unless_completed`](tower_redlock::Redlock::lock_unless_completed), run
    /// the "handler" (recorded), then [`Lease::complete`](tower_redlock::Lease::complete);
    /// duplicates of a key race across processes, and none may run twice.
    Replay,
}

impl Workload {
    fn parse(s: &str) -> Self {
        match s {
            "lock" => Self::Lock,
            "replay" => Self::Replay,
            other => panic!("unknown workload {other:?}: lock or replay"),
        }
    }

    /// Its name, as `--workload` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Lock => "lock",
            Self::Replay => "replay",
        }
    }
}

/// A deliberately broken client, for the negative control: the checker must see it fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Broken {
    /// Each worker locks on ONE master only (a different one per worker where there are
    /// enough): a quorum of 1 of the 5 voters.
    Quorum1,
    /// Each section of the lock workload blocks its runtime's thread (`std::thread::sleep`,
    /// a blocking call in async code) until half a ttl past its lease's deadline: late exits
    /// whose process was not starved, which the checker must not take for paused ones.
    Blocking,
    /// With `--store postgres`: each write reads its row with a plain `SELECT` and checks the
    /// token only in the write (`UPDATE … WHERE fence <= $token`) — the pattern that loses a
    /// paused reader's acknowledged write once the next holder has read.
    UnclaimedRead,
    /// The durable mode's negative control: the handler commits the work first and the key's
    /// row after it, in a transaction of its own — a crash between the two, or a duplicate
    /// let in by flushed masters before the row, runs the work twice.
    RowOutsideTx,
}

impl Broken {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "" | "none" | "0" => None,
            "quorum1" => Some(Self::Quorum1),
            "block" => Some(Self::Blocking),
            "unclaimed-read" => Some(Self::UnclaimedRead),
            "row-outside-tx" => Some(Self::RowOutsideTx),
            other => panic!(
                "unknown broken client {other:?}: quorum1, block, unclaimed-read, \
                 row-outside-tx (or none)"
            ),
        }
    }

    /// Its name, as `--broken` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Quorum1 => "quorum1",
            Self::Blocking => "block",
            Self::UnclaimedRead => "unclaimed-read",
            Self::RowOutsideTx => "row-outside-tx",
        }
    }
}

/// Where the workers' critical sections also write, with their fencing tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// One throwaway PostgreSQL server (the testkit's `PostgresServer`): each section makes
    /// a read-modify-write of its resource's row — the row claimed with the token
    /// (`FencedTable::claim`), its count read and written back plus one, a history row —
    /// in one transaction; now and then a writer pauses past its lease's ttl before its
    /// read or between its read and its write (see `worker/lock.rs`, `store/`). With the
    /// replay workload, its durable mode: the key rows and the business rows there
    /// (`durable/`).
    Postgres,
}

impl Store {
    fn parse(s: &str) -> Option<Self> {
        match s {
            "" | "none" => None,
            "postgres" => Some(Self::Postgres),
            other => panic!("unknown store {other:?}: postgres (or none)"),
        }
    }

    /// Its name, as `--store` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Postgres => "postgres",
        }
    }
}

/// The size and tunables of one run.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Worker processes.
    pub processes: usize,
    /// Lock-taking tasks per process.
    pub tasks: usize,
    /// Successful acquisitions to reach, over all processes (the replay workload: claims
    /// answered, runs and replays).
    pub acquisitions: u64,
    /// Shared resources everyone fights over (the lock workload).
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
    /// The nemesis kinds the run mixes (see `nemesis/mod.rs`); [`Kind::Classic`] alone by
    /// default.
    pub nemesis: Vec<Kind>,
    /// What the workers do.
    pub workload: Workload,
    /// The replay workload's handler sleeps up to this long (random) after its busy work:
    /// claims straddle the faults.
    pub handler: Duration,
    /// The `skew` nemesis offsets each bare master's clock by up to this fraction of the ttl,
    /// in percent, ahead or behind: any two masters differ by at most twice that (below 50:
    /// by less than the ttl, the library's bound after a lost counter).
    pub skew_percent: u32,
    /// The workers keep going past their share until every nemesis kind of the run has
    /// injected at least this many faults (0: they stop at their share).
    pub min_faults: u64,
    /// A deliberately broken client (the negative control), or none.
    pub broken: Option<Broken>,
    /// A fenced store the sections write to (the lock workload, fencing on), or none.
    pub store: Option<Store>,
}

impl Settings {
    /// A CI-sized run: about 100 s alone on an idle 2-core machine (103 acquisitions/s).
    /// Beside the other checker tests and a CPU hog on every core (`scripts/stress-tests.sh`)
    /// the classic run makes 33–41 acquisitions/s, so 10,000 take up to about five minutes:
    /// the time limit (600 s) is the bound of a run that stopped making progress, not a speed
    /// to keep — past it, the acquisitions missing are "could not set up the scenario".
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
            time_limit: Duration::from_secs(600),
            fencing: true,
            nemesis: vec![Kind::Classic],
            workload: Workload::Lock,
            handler: Duration::from_millis(60),
            skew_percent: 45,
            min_faults: 0,
            broken: None,
            store: None,
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

    /// The replay workload's ttl unless one is set: long enough for the `records` nemesis
    /// to thaw masters after a completion's patience (10 node timeouts) but inside the ttl.
    pub const REPLAY_TTL: Duration = Duration::from_millis(3000);

    /// The lost-lease and durable modes' ttl unless one is set: short, so that the handlers
    /// that overrun it (see `worker/lost.rs`) do not hold their task long, and a killed
    /// worker's locks (durable mode) do not hold their keys long.
    pub const LOST_TTL: Duration = Duration::from_millis(1000);

    /// Overrides from `CHECKER_*` environment variables, then from `--flag value` pairs.
    /// Panics with what to fix on an unknown setting, a bad value or a combination that
    /// cannot run.
    pub fn with_overrides(mut self, args: &[String]) -> Self {
        let mut ttl_set = false;
        for name in NAMES {
            let var = format!("CHECKER_{}", name.replace('-', "_").to_uppercase());
            if let Ok(v) = std::env::var(&var) {
                self.set(name, v.trim());
                ttl_set |= name == "ttl-ms";
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
            self.set(name, value);
            ttl_set |= name == "ttl-ms";
        }
        if self.workload == Workload::Replay && !ttl_set {
            self.ttl = if self.lost_leases() || self.durable() {
                Self::LOST_TTL
            } else {
                Self::REPLAY_TTL
            };
        }
        self.validate();
        self
    }

    fn set(&mut self, name: &str, value: &str) {
        let n = || -> u64 {
            value
                .parse()
                .unwrap_or_else(|_| panic!("--{name} must be a whole number, not {value:?}"))
        };
        let us = |n: u64| usize::try_from(n).expect("fits usize");
        match name {
            "acquisitions" => self.acquisitions = n(),
            "processes" => self.processes = us(n()).max(1),
            "tasks" => self.tasks = us(n()).max(1),
            "resources" => self.resources = us(n()).max(1),
            "ttl-ms" => self.ttl = Duration::from_millis(n()),
            "time-limit-s" => self.time_limit = Duration::from_secs(n()),
            "work-us" => self.work = Duration::from_micros(n()),
            "fencing" => self.fencing = n() != 0,
            "nemesis" => self.nemesis = Kind::parse_list(value),
            "workload" => self.workload = Workload::parse(value),
            "handler-ms" => self.handler = Duration::from_millis(n()),
            "skew-percent" => self.skew_percent = u32::try_from(n()).unwrap_or(u32::MAX),
            "min-faults" => self.min_faults = n(),
            "broken" => self.broken = Broken::parse(value),
            "store" => self.store = Store::parse(value),
            other => panic!("unknown setting --{other} (see the soak binary's --help)"),
        }
    }

    fn validate(&self) {
        let has = |k| self.nemesis.contains(&k);
        assert!(
            self.skew_percent < 50,
            "--skew-percent {} would let two masters' clocks differ by {}% of the ttl: keep it \
             below 50, so that any two differ by less than the ttl (the library's bound)",
            self.skew_percent,
            2 * self.skew_percent
        );
        if self.store.is_some() {
            assert!(
                self.workload == Workload::Replay || self.fencing,
                "--store with the lock workload needs fencing on (--fencing 1)"
            );
        }
        if self.durable() {
            assert!(
                self.nemesis
                    .iter()
                    .all(|k| matches!(k, Kind::Crash | Kind::Classic | Kind::ReplyReset)),
                "the durable mode (--workload replay --store postgres) mixes the crash, classic \
                 and reply-reset nemesis kinds only"
            );
        }
        if has(Kind::Crash) {
            assert!(
                self.durable(),
                "the crash nemesis needs the durable mode (--workload replay --store postgres)"
            );
        }
        if self.broken == Some(Broken::RowOutsideTx) {
            assert!(
                self.durable(),
                "--broken row-outside-tx is the durable mode's negative control: add \
                 --workload replay --store postgres"
            );
        }
        if self.broken == Some(Broken::UnclaimedRead) {
            assert!(
                self.store.is_some(),
                "--broken unclaimed-read is a store's negative control: add --store postgres"
            );
        }
        if has(Kind::Lost) {
            if !cfg!(feature = "middleware") {
                panic!(
                    "the lost nemesis drives the middleware: build the testkit with \
                     --features middleware"
                );
            }
            assert!(
                self.workload == Workload::Replay,
                "the lost nemesis needs the replay workload (--workload replay)"
            );
            assert!(
                !has(Kind::Records) && !has(Kind::Sentinel) && !has(Kind::Cluster),
                "the lost nemesis needs five bare masters and the middleware's claims: not \
                 with records, sentinel or cluster"
            );
        }
        if has(Kind::Operator) {
            assert!(
                self.workload == Workload::Lock,
                "the operator nemesis needs the lock workload (--workload lock)"
            );
        }
        if has(Kind::Evict) {
            assert!(
                self.workload == Workload::Lock,
                "the evict nemesis needs the lock workload (--workload lock): a completion \
                 record stored before the change stays exposed to eviction (docs/safety.md)"
            );
        }
        if has(Kind::Records) {
            assert!(
                self.workload == Workload::Replay,
                "the records nemesis needs the replay workload (--workload replay)"
            );
            assert!(
                !has(Kind::Sentinel) && !has(Kind::Cluster),
                "the records nemesis needs five bare masters: not with sentinel or cluster"
            );
            let need = self.node_timeout * 10 + self.handler + Duration::from_millis(1200);
            assert!(
                self.ttl >= need,
                "the records nemesis thaws masters past a completion's patience (10 node \
                 timeouts) but at least 1 s inside the ttl: --ttl-ms must be at least {} ms",
                need.as_millis()
            );
        }
    }

    /// How long a restarted master abstains under delayed-restart protection: until Redis
    /// reports an uptime (whole seconds, rounded down) of at least 1 s + the ttl.
    pub(super) fn abstention(&self) -> Duration {
        Duration::from_secs(1 + self.ttl.as_secs_f64().ceil() as u64) + Duration::from_millis(500)
    }

    /// Whether the nemesis may restart a master empty (or fail a Sentinel group over): not
    /// in the replay workload, whose completion records the masters here keep in memory
    /// only — a master that forgets one may let its key run again, which the library
    /// documents (keep record masters persistent) rather than prevents; but in its durable
    /// mode, where the key's row in PostgreSQL is the truth.
    pub(super) fn restarts(&self) -> bool {
        self.workload == Workload::Lock || self.durable()
    }

    /// Whether the replay workload runs in its durable mode (`--store postgres`): claims
    /// through the middleware with the key's row in PostgreSQL (`durable/`), which may
    /// restart and flush masters — the row is the truth.
    pub fn durable(&self) -> bool {
        self.workload == Workload::Replay && self.store.is_some()
    }

    /// Whether the replay workload runs in its lost-lease mode (`--nemesis lost`): claims
    /// through the middleware, handlers that overrun their lease now and then.
    pub fn lost_leases(&self) -> bool {
        self.nemesis.contains(&Kind::Lost)
    }

    /// The largest clock offset the `skew` nemesis gives a master.
    pub(super) fn max_skew(&self) -> Duration {
        self.ttl * self.skew_percent / 100
    }

    /// The nemesis kinds, as `--nemesis` takes them.
    pub fn nemesis_names(&self) -> String {
        let names: Vec<&str> = self.nemesis.iter().map(|k| k.name()).collect();
        names.join(",")
    }
}

/// Every setting, as a flag without its `--` (the variable is `CHECKER_` and the name in
/// capitals, `-` as `_`).
const NAMES: [&str; 15] = [
    "acquisitions",
    "processes",
    "tasks",
    "resources",
    "ttl-ms",
    "time-limit-s",
    "work-us",
    "fencing",
    "nemesis",
    "workload",
    "handler-ms",
    "skew-percent",
    "min-faults",
    "broken",
    "store",
];
