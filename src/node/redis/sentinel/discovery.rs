//! The voter's connection to the current master, and the background discovery that finds it. A
//! majority of the sentinels is asked every refresh interval (and at once after a request failed
//! the way a failover does). The master is checked with `ROLE`, and each confirmation is dated for
//! the majority window.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use redis::aio::ConnectionManager;
use redis::{Cmd, RedisError, RedisResult, Value};
use tokio::sync::{watch, Notify};

use super::members::Members;
use super::{Sentinel, MIN_GAP};
use crate::node::redis::eviction::NewMaster;
use crate::node::redis::options::RedisNodeOptions;

/// The voter's connection: the current master's, as the background task last found it.
#[derive(Clone)]
pub(crate) struct SentinelConn {
    shared: Arc<Shared>,
}

struct Shared {
    state: watch::Sender<State>,
    /// Wakes the background task: a request failed in a way a failover explains.
    wake: Arc<Notify>,
    /// When a majority of the sentinels last named the current master: the moment the
    /// asking began, in ms after `epoch`, plus one (0: never).
    confirmed: AtomicU64,
    epoch: Instant,
    /// The voter votes only while the last confirmation is younger than this.
    window: Duration,
    /// Why the last discovery found no majority (for the abstentions' errors).
    why: std::sync::Mutex<Option<Arc<str>>>,
}

impl Shared {
    fn confirm(&self, asked: Instant) {
        let ms = asked.saturating_duration_since(self.epoch).as_millis() as u64 + 1;
        self.confirmed.fetch_max(ms, Ordering::Relaxed);
    }

    /// How long ago a majority last named the current master (`None`: never).
    fn confirmed_ago(&self) -> Option<Duration> {
        let ms = self.confirmed.load(Ordering::Relaxed).checked_sub(1)?;
        let at = self.epoch + Duration::from_millis(ms);
        Some(Instant::now().saturating_duration_since(at))
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        // Ends the background task now rather than at its next tick.
        self.wake.notify_one();
    }
}

#[derive(Clone)]
enum State {
    Discovering,
    Master {
        addr: String,
        conn: ConnectionManager,
        /// For the wake-up's subscriber (`redis/wake.rs`), which has a connection of its own.
        client: Arc<redis::Client>,
    },
    Failed(Arc<str>),
}

impl SentinelConn {
    /// Starts the background discovery; `new_master` is told of each master it adopts. Must
    /// be called inside a Tokio runtime.
    pub(crate) fn start(
        group: Sentinel,
        options: &RedisNodeOptions,
        new_master: NewMaster,
    ) -> crate::Result<Self> {
        if group.tls && !cfg!(feature = "tls") {
            return Err(crate::Error::invalid(format!(
                "{} asks for TLS: enable the `tls` feature of tower-redlock",
                group.name()
            )));
        }
        let sentinels = Members::listed(&group, options)?;
        let wake = Arc::new(Notify::new());
        let shared = Arc::new(Shared {
            state: watch::Sender::new(State::Discovering),
            wake: wake.clone(),
            confirmed: AtomicU64::new(0),
            epoch: Instant::now(),
            window: group.window(options),
            why: std::sync::Mutex::new(None),
        });
        let task = Discovery {
            group,
            options: options.clone(),
            sentinels,
            shared: Arc::downgrade(&shared),
            wake,
            new_master,
            failing: false,
        };
        tokio::spawn(task.run());
        Ok(Self { shared })
    }

    /// Sends `cmd` to the current master, waiting for the first discovery if it is under
    /// way (the client's node timeout bounds the wait). A failure a failover explains (the
    /// master gone, or demoted: `READONLY`) wakes the discovery.
    ///
    /// A request that `votes` (an acquire, an extension, a completion: anything but a release) is
    /// refused unless a majority of the sentinels named this master within the window (see
    /// [`Sentinel::refresh_interval`]). The voter then abstains. That is an answer, not an outage,
    /// so it does not count toward the voter's suspension.
    pub(crate) async fn query(&self, cmd: &Cmd, votes: bool) -> RedisResult<Value> {
        let mut conn = self.master().await?;
        if votes && !self.majority_is_recent() {
            self.shared.wake.notify_one();
            let ago = self.shared.confirmed_ago();
            let why = self
                .shared
                .why
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            return Err(crate::node::redis::conn::abstention(format!(
                "no majority of the sentinels named the master in the last {:?} (last: {}): \
                 the voter abstains{}",
                self.shared.window,
                ago.map_or("never".to_owned(), |a| format!("{a:?} ago")),
                why.map_or(String::new(), |why| format!("; the last discovery: {why}")),
            )));
        }
        let reply = conn.send_packed_command(cmd).await;
        let reply = match reply {
            Ok(v) => v.extract_error(),
            Err(e) => Err(e),
        };
        if let Err(e) = &reply {
            if crate::node::redis::conn::connection_lost(e)
                || matches!(e.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
            {
                self.shared.wake.notify_one();
            }
        }
        reply
    }

    /// Whether a majority of the sentinels named the master within the window: the voter
    /// votes (see [`SentinelConn::query`]).
    pub(crate) fn majority_is_recent(&self) -> bool {
        self.shared
            .confirmed_ago()
            .is_some_and(|ago| ago <= self.shared.window)
    }

    /// The current master's address and client, once the sentinels name one (waits as
    /// long as it takes: for the wake-up's subscriber, off every lock's path).
    pub(crate) async fn master_client(&self) -> (String, redis::Client) {
        let mut rx = self.shared.state.subscribe();
        loop {
            if let State::Master { addr, client, .. } = &*rx.borrow_and_update() {
                return (addr.clone(), redis::Client::clone(client));
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    /// Resolves once the current master is no longer `addr` (a failover, or none known).
    pub(crate) async fn master_changed(&self, addr: &str) {
        let mut rx = self.shared.state.subscribe();
        loop {
            match &*rx.borrow_and_update() {
                State::Master { addr: now, .. } if now == addr => {}
                _ => return,
            }
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    async fn master(&self) -> RedisResult<ConnectionManager> {
        let mut rx = self.shared.state.subscribe();
        loop {
            match &*rx.borrow_and_update() {
                State::Master { conn, .. } => return Ok(conn.clone()),
                State::Failed(why) => return Err(no_master(why)),
                State::Discovering => {}
            }
            if rx.changed().await.is_err() {
                return Err(no_master("the voter is shutting down"));
            }
        }
    }
}

/// "No master": an I/O error, so that the client counts the voter unreachable.
fn no_master(why: &str) -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        format!("no master: {why}"),
    ))
}

/// The background task: asks the sentinels for the master every `refresh`, and at once when
/// a request woke it (at most every `MIN_GAP`).
struct Discovery {
    group: Sentinel,
    options: RedisNodeOptions,
    sentinels: Members,
    shared: Weak<Shared>,
    wake: Arc<Notify>,
    /// Has each new master's `maxmemory-policy` checked before it votes.
    new_master: NewMaster,
    /// Whether the last discovery failed (a spell of failures is warned of once).
    failing: bool,
}

impl Discovery {
    async fn run(mut self) {
        let mut retry = MIN_GAP;
        loop {
            let Some(shared) = self.shared.upgrade() else {
                return;
            };
            let found = self.step(&shared).await;
            drop(shared);
            // A failed discovery is retried sooner (doubling up to the refresh period).
            let wait = if found {
                retry = MIN_GAP;
                self.group.refresh
            } else {
                retry = (retry * 2).min(self.group.refresh);
                retry
            };
            tokio::time::sleep(MIN_GAP).await;
            tokio::select! {
                _ = tokio::time::sleep(wait.saturating_sub(MIN_GAP)) => {}
                _ = self.wake.notified() => {}
            }
        }
    }

    /// One discovery; whether a majority of the sentinels named a master that is usable.
    async fn step(&mut self, shared: &Shared) -> bool {
        let current = match &*shared.state.borrow() {
            State::Master { addr, conn, .. } => Some((addr.clone(), conn.clone())),
            _ => None,
        };
        let asked = Instant::now();
        let (host, port) = match self.sentinels.ask(&self.group, &self.options).await {
            Ok(addr) => addr,
            Err(why) => {
                // No majority: the known master is kept (to vote again as soon as a majority
                // names it), but not confirmed — the voter abstains once its confirmation is
                // older than the window. Warned of once per spell (the abstentions say why).
                if self.failing {
                    tracing::debug!(voter = %self.group.name(), "{why}");
                } else {
                    tracing::warn!(voter = %self.group.name(), "{why}");
                }
                self.failing = true;
                let why: Arc<str> = why.into();
                *shared.why.lock().unwrap_or_else(|p| p.into_inner()) = Some(why.clone());
                if current.is_none() {
                    shared.state.send_replace(State::Failed(why));
                }
                return false;
            }
        };
        self.failing = false;
        *shared.why.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let addr = format!("{host}:{port}");
        if let Some((known, conn)) = &current {
            // The same master: kept unless it answers as a replica (a demoted master the
            // sentinels still name). No answer in time is not a reason to drop it.
            if *known == addr && self.role(conn.clone()).await != Some(false) {
                shared.confirm(asked);
                return true;
            }
        }
        let made = self
            .group
            .client(&host, port, &self.group.master)
            .and_then(|c| {
                let conn = ConnectionManager::new_lazy_with_config(
                    c.clone(),
                    self.options.manager_config(),
                )?;
                Ok((conn, c))
            });
        let (conn, client) = match made {
            Ok(made) => made,
            Err(e) => {
                let why = format!("cannot connect to the master {addr}: {e}");
                shared.state.send_replace(State::Failed(why.into()));
                return false;
            }
        };
        if self.role(conn.clone()).await != Some(true) {
            let why = format!(
                "the sentinels name {addr} the master of `{}`, but it does not answer as one \
                 (a failover under way?)",
                self.group.master_name
            );
            tracing::debug!(voter = %self.group.name(), "{why}");
            shared.state.send_replace(State::Failed(why.into()));
            return false;
        }
        match &current {
            Some((known, _)) if *known != addr => tracing::warn!(
                voter = %self.group.name(),
                from = %known,
                to = %addr,
                "the master changed (a failover): requests go to the new master"
            ),
            _ => tracing::info!(voter = %self.group.name(), master = %addr, "master found"),
        }
        // Before any request reaches it: the new master is checked before it votes.
        self.new_master.adopted();
        shared.confirm(asked);
        shared.state.send_replace(State::Master {
            addr,
            conn,
            client: Arc::new(client),
        });
        true
    }

    /// Whether the server behind `conn` answers `ROLE` as a master (`Some(true)`), as
    /// something else (`Some(false)`), or not in time (`None`).
    async fn role(&self, mut conn: ConnectionManager) -> Option<bool> {
        let mut cmd = Cmd::new();
        cmd.arg("ROLE");
        let limit = self.options.connect_timeout;
        match tokio::time::timeout(limit, conn.send_packed_command(&cmd)).await {
            Ok(Ok(Value::Array(items))) => Some(matches!(
                items.first(),
                Some(Value::BulkString(role)) if role == b"master"
            )),
            Ok(Ok(_)) => Some(false),
            _ => None,
        }
    }
}
