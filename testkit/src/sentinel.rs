//! A Redis Sentinel group on loopback: one master, one replica and three sentinels
//! (`redis-server --sentinel`), each a real process on a free port bound to 127.0.0.1,
//! killed by its own pid on drop (see [`RedisServer`]).
//!
//! The sentinels (three unless [`SentinelGroup::start_with`] says otherwise) monitor the
//! master with a majority of them as quorum, `down-after-milliseconds` of
//! [`DOWN_AFTER`] and `failover-timeout` of [`FAILOVER_TIMEOUT`]: a master frozen (or stopped)
//! for longer than `DOWN_AFTER` is failed over automatically; [`SentinelGroup::failover`]
//! forces one.
//!
//! Also the small helpers the topologies share (`block_on`, `ask`, `until`): every
//! wait is bounded and reports the last thing it saw when it gives up.

use std::collections::HashMap;
use std::fmt::Display;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::launch::{Launch, ScratchDir};
use crate::server::{describe, RedisServer};

/// `sentinel down-after-milliseconds`: how long a master may not answer before a sentinel
/// deems it down.
pub const DOWN_AFTER: Duration = Duration::from_millis(1000);
/// `sentinel failover-timeout` (a sentinel waits twice that before it retries a failover of
/// the same master on its own).
pub const FAILOVER_TIMEOUT: Duration = Duration::from_millis(5000);
/// How many sentinels a group has by default ([`SentinelGroup::start_with`] takes any
/// number); a majority of them must agree that the master is down.
const SENTINELS: usize = 3;
/// The bound of every wait of a group (start, failover, settling).
const SETTLE_DEADLINE: Duration = Duration::from_secs(20);
/// The bound of one command of the topology helpers (a frozen server never answers).
const ASK_TIMEOUT: Duration = Duration::from_secs(1);

/// One master, one replica of it and three (or [`SentinelGroup::start_with`]'s number of)
/// sentinels monitoring it under
/// [`SentinelGroup::master_name`]. Everything is killed (by pid) and its files removed on
/// drop, also when a test panics.
#[derive(Debug)]
pub struct SentinelGroup {
    name: String,
    // Field order is drop order: the sentinels go first, the directory of their config files
    // last.
    sentinels: Vec<RedisServer>,
    /// `[0]` started as the master, `[1]` as its replica; `master` is the index of the one
    /// the group last saw the sentinels report as master.
    servers: [RedisServer; 2],
    master: AtomicUsize,
    _dir: ScratchDir,
}

impl SentinelGroup {
    /// Starts the master and its replica, waits until the replica is in sync, starts three
    /// sentinels monitoring the master as `name`, and waits (bounded) until every sentinel
    /// reports the master, lists the replica as healthy and knows the other two sentinels.
    pub fn start(name: &str) -> Self {
        Self::start_with(name, SENTINELS)
    }

    /// [`SentinelGroup::start`] with `sentinels` sentinels (at least one), a majority of which
    /// is the quorum that deems the master down.
    pub fn start_with(name: &str, sentinels: usize) -> Self {
        assert!(sentinels >= 1, "a group needs a sentinel");
        let quorum = sentinels / 2 + 1;
        assert!(
            !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'),
            "a master name of letters, digits and '-': {name:?}"
        );
        let dir = ScratchDir::new("sentinel");
        // No diskless-sync delay (5 s by default): a replica, also the former master after a
        // failover, syncs at once.
        let server = || {
            RedisServer::start_launch(false, |_port| Launch {
                config: None,
                args: vec!["--repl-diskless-sync-delay".to_owned(), "0".to_owned()],
                env: Vec::new(),
            })
        };
        let (master, replica) = std::thread::scope(|s| {
            let master = s.spawn(server);
            let replica = s.spawn(server);
            (join(master), join(replica))
        });
        let master_port = master.port();
        let servers = [master, replica];
        block_on(async {
            let cmd = redis::cmd("REPLICAOF")
                .arg("127.0.0.1")
                .arg(master_port)
                .clone();
            ask::<String>(&servers[1].addr(), &cmd)
                .await
                .unwrap_or_else(|e| panic!("make the replica: {e}"));
            until("the replica is in sync", SETTLE_DEADLINE, || {
                replicating(&servers[1], &servers[0])
            })
            .await;
        });
        let sentinels = std::thread::scope(|s| {
            let handles: Vec<_> = (0..sentinels)
                .map(|i| {
                    let (dir, name) = (&dir, name);
                    s.spawn(move || {
                        RedisServer::start_launch(false, |_port| {
                            // Written afresh for each attempt: a sentinel rewrites its file.
                            let config = dir.path().join(format!("sentinel-{i}.conf"));
                            let text = format!(
                                "sentinel monitor {name} 127.0.0.1 {master_port} {quorum}\n\
                                 sentinel down-after-milliseconds {name} {}\n\
                                 sentinel failover-timeout {name} {}\n\
                                 sentinel parallel-syncs {name} 1\n",
                                DOWN_AFTER.as_millis(),
                                FAILOVER_TIMEOUT.as_millis(),
                            );
                            std::fs::write(&config, text)
                                .unwrap_or_else(|e| panic!("write {config:?}: {e}"));
                            Launch {
                                config: Some(config),
                                args: vec!["--sentinel".to_owned()],
                                env: Vec::new(),
                            }
                        })
                    })
                })
                .collect();
            handles.into_iter().map(join).collect()
        });
        let group = Self {
            name: name.to_owned(),
            sentinels,
            servers,
            master: AtomicUsize::new(0),
            _dir: dir,
        };
        block_on(group.settled());
        group
    }

    /// The name the sentinels monitor the master under.
    pub fn master_name(&self) -> &str {
        &self.name
    }

    /// `127.0.0.1:PORT` of every sentinel (also of those killed).
    pub fn sentinel_addrs(&self) -> Vec<String> {
        self.sentinels.iter().map(RedisServer::addr).collect()
    }

    /// Sentinel `i` (a [`RedisServer`] in sentinel mode: `query` sends it `SENTINEL ...`).
    pub fn sentinel(&self, i: usize) -> &RedisServer {
        &self.sentinels[i]
    }

    /// Adds (or switches back on) the ACL user `user` with `password` and every right on
    /// sentinel `i`: a client that asks the sentinels as that user can be cut from one of
    /// them with [`SentinelGroup::cut_user`], while the sentinels go on talking to one
    /// another (as their default users).
    pub async fn allow_user(&self, i: usize, user: &str, password: &str) {
        let () = self.sentinels[i]
            .query(
                redis::cmd("ACL")
                    .arg("SETUSER")
                    .arg(user)
                    .arg("on")
                    .arg(format!(">{password}"))
                    .arg("+@all"),
            )
            .await;
    }

    /// Switches the ACL user `user` off on sentinel `i` and kills its connections: a client
    /// asking as that user no longer reaches the sentinel (a zone split as that client sees
    /// it), though the sentinel keeps running and talking to its peers.
    pub async fn cut_user(&self, i: usize, user: &str) {
        let s = &self.sentinels[i];
        let () = s
            .query(redis::cmd("ACL").arg("SETUSER").arg(user).arg("off"))
            .await;
        let _: i64 = s
            .query(redis::cmd("CLIENT").arg("KILL").arg("USER").arg(user))
            .await;
    }

    /// Kills sentinel `i` (by pid). Two sentinels still make the quorum.
    pub fn kill_sentinel(&self, i: usize) {
        self.sentinels[i].stop();
    }

    /// The server the sentinels reported as master when the group last looked (at start,
    /// after [`SentinelGroup::failover`] or [`SentinelGroup::await_failover`]).
    pub fn master(&self) -> &RedisServer {
        &self.servers[self.master.load(Ordering::SeqCst)]
    }

    /// The other server: the replica (or, while a failover is under way, the master to be).
    pub fn replica(&self) -> &RedisServer {
        &self.servers[1 - self.master.load(Ordering::SeqCst)]
    }

    /// `127.0.0.1:PORT` of [`SentinelGroup::master`].
    pub fn master_addr(&self) -> String {
        self.master().addr()
    }

    /// `127.0.0.1:PORT` of [`SentinelGroup::replica`].
    pub fn replica_addr(&self) -> String {
        self.replica().addr()
    }

    /// Freezes the master (`SIGSTOP`, see [`RedisServer::freeze`]): after [`DOWN_AFTER`] the
    /// sentinels fail it over on their own ([`SentinelGroup::await_failover`] waits for it).
    pub fn freeze_master(&self) {
        self.master().freeze();
    }

    /// Resumes the server frozen by [`SentinelGroup::freeze_master`] (`SIGCONT`), even when
    /// the group has since seen a failover: the sentinels turn it into a replica.
    pub fn thaw_master(&self) {
        // Both: thawing a server that is not stopped is harmless.
        for s in &self.servers {
            if s.pid().is_some() {
                s.thaw();
            }
        }
    }

    /// The pids of every running process of the group (servers and sentinels).
    pub fn pids(&self) -> Vec<u32> {
        self.servers
            .iter()
            .chain(&self.sentinels)
            .filter_map(RedisServer::pid)
            .collect()
    }

    /// What a live sentinel answers to `SENTINEL get-master-addr-by-name` (`127.0.0.1:PORT`),
    /// from the first one that answers.
    pub async fn reported_master(&self) -> String {
        let mut last = String::from("no live sentinel");
        for s in self.live_sentinels() {
            match reported_master(s, &self.name).await {
                Ok(addr) => return addr,
                Err(e) => last = e,
            }
        }
        panic!("no sentinel reports the master of {}: {last}", self.name);
    }

    /// `SENTINEL FAILOVER <name>` on a live sentinel, then [`SentinelGroup::await_failover`]:
    /// on return every live sentinel reports the former replica as master, and it answers as
    /// one (writable).
    ///
    /// The former master is still a master then: the sentinels turn it into a replica of the
    /// new one only after their next `INFO` of it (they poll replicas every 10 s), so
    /// [`SentinelGroup::settled`] takes up to some 20 s after a failover. A second failover
    /// needs that replica: call `settled` before it.
    pub async fn failover(&self) {
        self.start_failover().await;
        self.await_failover().await;
    }

    /// `SENTINEL FAILOVER <name>` on a live sentinel (asked again, bounded, while none
    /// accepts it yet), without waiting for the failover to happen: the first half of
    /// [`SentinelGroup::failover`], for a caller that acts while it is under way (then
    /// calls [`SentinelGroup::await_failover`]).
    pub async fn start_failover(&self) {
        let cmd = redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(&self.name)
            .clone();
        until(
            format!("a sentinel accepts SENTINEL FAILOVER {}", self.name),
            SETTLE_DEADLINE,
            || async {
                // A sentinel that does not yet rate the replica good answers NOGOODSLAVE.
                let mut last = String::from("no live sentinel");
                for s in self.live_sentinels() {
                    match ask::<String>(&s.addr(), &cmd).await {
                        Ok(_) => return Ok(()),
                        Err(e) => last = e,
                    }
                }
                Err(last)
            },
        )
        .await;
    }

    /// How many live sentinels name `addr` (`127.0.0.1:PORT`) as the master right now (one
    /// that does not answer names nothing).
    pub async fn sentinels_naming(&self, addr: &str) -> usize {
        let mut n = 0;
        for s in self.live_sentinels() {
            if reported_master(s, &self.name)
                .await
                .is_ok_and(|a| a == addr)
            {
                n += 1;
            }
        }
        n
    }

    /// Waits (bounded) until every live sentinel reports the other server as master (after
    /// [`SentinelGroup::freeze_master`], a stopped master or a forced failover) and that
    /// server reports the master role, then takes it as [`SentinelGroup::master`].
    pub async fn await_failover(&self) {
        let next = 1 - self.master.load(Ordering::SeqCst);
        let want = self.servers[next].addr();
        until(
            format!("every sentinel reports {want} as master"),
            SETTLE_DEADLINE,
            || async {
                for s in self.live_sentinels() {
                    let got = reported_master(s, &self.name).await?;
                    if got != want {
                        return Err(format!("{} reports {got}", s.addr()));
                    }
                }
                let role: Vec<redis::Value> = ask(&want, &redis::cmd("ROLE")).await?;
                match role.first() {
                    Some(redis::Value::BulkString(r)) if r == b"master" => Ok(()),
                    other => Err(format!("{want} answers ROLE with {other:?}")),
                }
            },
        )
        .await;
        self.master.store(next, Ordering::SeqCst);
    }

    /// Waits (bounded) until the group is steady: the replica replicates from the master and
    /// its link is up, and every live sentinel reports the master, lists the replica as a
    /// healthy replica of it and knows the other sentinels. Quick after `start`; up to some
    /// 20 s after a failover (see [`SentinelGroup::failover`]).
    pub async fn settled(&self) {
        let (master, replica) = (self.master(), self.replica());
        until(
            format!("{} replicates {}", replica.addr(), master.addr()),
            SETTLE_DEADLINE,
            || replicating(replica, master),
        )
        .await;
        let others = self.sentinels.len() - 1;
        until(
            format!(
                "every sentinel sees master {} with replica {}",
                master.addr(),
                replica.addr()
            ),
            SETTLE_DEADLINE,
            || async {
                for s in self.live_sentinels() {
                    sentinel_sees(s, &self.name, master, replica, others).await?;
                }
                Ok(())
            },
        )
        .await;
    }

    fn live_sentinels(&self) -> impl Iterator<Item = &RedisServer> {
        self.sentinels.iter().filter(|s| s.pid().is_some())
    }
}

/// `SENTINEL get-master-addr-by-name` of one sentinel, as `ip:port`.
async fn reported_master(sentinel: &RedisServer, name: &str) -> Result<String, String> {
    let cmd = redis::cmd("SENTINEL")
        .arg("get-master-addr-by-name")
        .arg(name)
        .clone();
    match ask::<Option<(String, String)>>(&sentinel.addr(), &cmd).await? {
        Some((ip, port)) => Ok(format!("{ip}:{port}")),
        None => Err(format!("{} does not know {name}", sentinel.addr())),
    }
}

/// Whether `sentinel` reports `master`, lists `replica` as a replica of it with flags
/// `slave` only and its link up, and knows `others` other sentinels.
async fn sentinel_sees(
    sentinel: &RedisServer,
    name: &str,
    master: &RedisServer,
    replica: &RedisServer,
    others: usize,
) -> Result<(), String> {
    let at = sentinel.addr();
    let got = reported_master(sentinel, name).await?;
    if got != master.addr() {
        return Err(format!("{at} reports master {got}"));
    }
    let cmd = redis::cmd("SENTINEL").arg("MASTER").arg(name).clone();
    let info = pairs(ask::<Vec<String>>(&at, &cmd).await?);
    let field = |k: &str| info.get(k).map(String::as_str).unwrap_or("?");
    if field("flags") != "master" || field("num-other-sentinels") != others.to_string() {
        return Err(format!(
            "{at}: master flags {}, {} other sentinels",
            field("flags"),
            field("num-other-sentinels")
        ));
    }
    let cmd = redis::cmd("SENTINEL").arg("REPLICAS").arg(name).clone();
    let replicas = ask::<Vec<Vec<String>>>(&at, &cmd).await?;
    let want_port = replica.port().to_string();
    let seen = replicas.into_iter().map(pairs).find(|r| {
        r.get("ip").map(String::as_str) == Some("127.0.0.1") && r.get("port") == Some(&want_port)
    });
    match seen {
        Some(r)
            if r.get("flags").map(String::as_str) == Some("slave")
                && r.get("master-link-status").map(String::as_str) == Some("ok")
                && r.get("master-port") == Some(&master.port().to_string()) =>
        {
            Ok(())
        }
        Some(r) => Err(format!("{at} sees replica {}: {r:?}", replica.addr())),
        None => Err(format!("{at} does not list replica {}", replica.addr())),
    }
}

/// Whether `replica` is a replica of `master` with its link up and the initial sync done.
async fn replicating(replica: &RedisServer, master: &RedisServer) -> Result<(), String> {
    let cmd = redis::cmd("INFO").arg("replication").clone();
    let info: String = ask(&replica.addr(), &cmd).await?;
    let field = |k: &str| {
        info.lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix(':'))
            .map(str::trim)
            .unwrap_or("?")
    };
    let (role, port, link, sync) = (
        field("role"),
        field("master_port"),
        field("master_link_status"),
        field("master_sync_in_progress"),
    );
    if role == "slave" && port == master.port().to_string() && link == "up" && sync == "0" {
        Ok(())
    } else {
        Err(format!(
            "{}: role {role}, master_port {port}, link {link}, sync in progress {sync}",
            replica.addr()
        ))
    }
}

/// A flat `[k1, v1, k2, v2, ...]` reply as a map.
fn pairs(flat: Vec<String>) -> HashMap<String, String> {
    let mut out = HashMap::new();
    let mut it = flat.into_iter();
    while let (Some(k), Some(v)) = (it.next(), it.next()) {
        out.insert(k, v);
    }
    out
}

fn join<T>(handle: std::thread::ScopedJoinHandle<'_, T>) -> T {
    handle
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
}

// ---------------------------------------------------------------------------------------------
// Shared by the topologies (also `cluster`).

/// Runs `fut` to completion on a current-thread runtime of its own, on a scoped thread: a
/// synchronous constructor (`start`) may wait with the async helpers whether or not its
/// caller is inside a runtime. Panics are passed on.
pub(crate) fn block_on<F>(fut: F) -> F::Output
where
    F: Future + Send,
    F::Output: Send,
{
    std::thread::scope(|s| {
        join(s.spawn(move || {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime for the topology's waits")
                .block_on(fut)
        }))
    })
}

/// One command on a fresh connection to `addr` (`ip:port`), bounded by a second: never a
/// cached connection (it may belong to a runtime that is gone) and never a hang on a frozen
/// server. The error says which command on which server.
pub(crate) async fn ask<T: redis::FromRedisValue>(
    addr: &str,
    cmd: &redis::Cmd,
) -> Result<T, String> {
    let call = async {
        let client = redis::Client::open(format!("redis://{addr}")).map_err(|e| e.to_string())?;
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| format!("connect: {e}"))?;
        cmd.query_async::<T>(&mut conn)
            .await
            .map_err(|e| e.to_string())
    };
    match tokio::time::timeout(ASK_TIMEOUT, call).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(format!("{} on {addr}: {e}", describe(cmd))),
        Err(_) => Err(format!(
            "{} on {addr}: no answer within {ASK_TIMEOUT:?}",
            describe(cmd)
        )),
    }
}

/// Polls `check` every 50 ms until it is `Ok`; panics with `what` and the last error after
/// `within`. Returns how long it took.
pub(crate) async fn until<F, Fut>(what: impl Display, within: Duration, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<(), String>>,
{
    let start = Instant::now();
    loop {
        let last = match check().await {
            Ok(()) => return start.elapsed(),
            Err(e) => e,
        };
        if start.elapsed() > within {
            panic!("timed out after {within:?} waiting until {what}; last: {last}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
