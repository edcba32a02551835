//! Shared by the benchmarks: the raw limit (Redlock written directly on redis-rs), adapters
//! for this crate and the peer crates, the workloads, and the statistics.
//!
//! Everything here is measurement code: none of it is part of the crate. The benches of this
//! workspace member (`bench/benches/`) use it as `use tower_redlock_bench as common;`.

pub mod counting;
pub mod stall;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::Either;
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::{AsyncConnectionConfig, Cmd, Value};
use tower_redlock::{Lease, Redlock, Retry};

/// The lock ttl of every benchmark: long enough that no lock expires while it is measured.
pub const TTL: Duration = Duration::from_secs(10);

/// The standard compare-and-delete release script (the Redlock page's).
pub const RELEASE_LUA: &str = r#"if redis.call("get",KEYS[1]) == ARGV[1] then
    return redis.call("del",KEYS[1])
else
    return 0
end"#;

/// This crate's acquire script (`SET NX PX`, else the holder's `PTTL`), for the ablation
/// that swaps the limit's plain `SET` for it. Copied from `src/node/redis/scripts.rs`.
pub const ACQUIRE_LUA: &str = r#"if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return -3
end
return redis.call('pttl', KEYS[1])
"#;

// ---------------------------------------------------------------------------------------------
// The limit

/// A 128-bit random token as 32 hex digits (uuid v4, as this crate's), without allocating.
#[derive(Clone, Copy)]
pub struct Token([u8; 32]);

impl Token {
    pub fn new() -> Self {
        let mut buf = [0u8; 32];
        uuid::Uuid::new_v4().simple().encode_lower(&mut buf);
        Self(buf)
    }

    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl Default for Token {
    fn default() -> Self {
        Self::new()
    }
}

/// One connection of the limit: a plain multiplexed connection (the limit), or — for the
/// ablation — the auto-reconnecting `ConnectionManager` this crate uses.
#[derive(Clone)]
pub enum Conn {
    Mux(MultiplexedConnection),
    /// `true`: the inherent `send_packed_command`; `false`: as this crate calls it
    /// (`ConnectionLike::req_packed_command`, a boxed future).
    Manager(ConnectionManager, bool),
}

/// One request: a command, or a pipeline of commands in one write (its answers as an array).
#[derive(Clone)]
pub enum Req {
    One(Cmd),
    Pipe(redis::Pipeline, usize),
}

impl Conn {
    async fn query(mut self, req: Arc<Req>) -> redis::RedisResult<Value> {
        match (&mut self, &*req) {
            (Conn::Mux(c), Req::One(cmd)) => c.send_packed_command(cmd).await,
            (Conn::Manager(c, true), Req::One(cmd)) => c.send_packed_command(cmd).await,
            (Conn::Manager(c, false), Req::One(cmd)) => c.req_packed_command(cmd).await,
            (Conn::Mux(c), Req::Pipe(p, n)) => {
                c.send_packed_commands(p, 0, *n).await.map(Value::Array)
            }
            (Conn::Manager(c, true), Req::Pipe(p, n)) => {
                c.send_packed_commands(p, 0, *n).await.map(Value::Array)
            }
            (Conn::Manager(c, false), Req::Pipe(p, n)) => {
                c.req_packed_commands(p, 0, *n).await.map(Value::Array)
            }
        }
    }
}

/// What the limit does beyond the minimum, one switch per suspected cost of this crate's
/// client (used by the ablation in `bench/benches/profile.rs`; all off = the limit).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Extras {
    /// Use redis-rs' `ConnectionManager` (this crate's reconnect settings) instead of a
    /// plain multiplexed connection, called as this crate calls it: through
    /// `ConnectionLike::req_packed_command`, which boxes the request's future.
    pub manager: bool,
    /// With `manager`: call the inherent `ConnectionManager::send_packed_command` instead
    /// (no box).
    pub manager_inherent: bool,
    /// Give the connection (plain or manager) redis-rs' own 1 s response timeout, as this
    /// crate does: a second timer per request, inside the node timeout.
    pub response_timeout: bool,
    /// Build the command in every node's request (as `RedisNode::run` does) instead of once
    /// per fan-out.
    pub cmd_per_node: bool,
    /// Acquire with `EVALSHA` of this crate's acquire script instead of `SET NX PX`.
    pub script_acquire: bool,
    /// Acquire with a pipeline of `SET NX PX` and `PTTL` (one write, one round trip): the
    /// holder's remaining ttl on a contended answer, as the script gives, without Lua.
    pub set_pttl: bool,
    /// Box every node future (`Pin<Box<dyn Future>>`, as the `Node` trait does) and clone an
    /// `Arc<str>` key into each.
    pub boxed: bool,
    /// No effect (kept so that the ablation's variant list compiles; that variant now
    /// measures the limit itself). It used to make the release wait for the acquisition's
    /// `SET`s still in flight; the limit now drops them at the decision (see [`Limit`]), so
    /// nothing of the acquisition is in flight when the release starts.
    pub wait_in_flight: bool,
    /// No effect (kept so that the ablation's variant list compiles): the limit always
    /// drains the answers already there before it spawns a task for the rest of a release.
    pub drain_before_spawn: bool,
}

/// Redlock written directly on redis-rs, the strongest fair baseline: one plain multiplexed
/// connection per master (no reconnection logic), and per lock:
///
/// - acquire: `SET key token NX PX ttl` to every master at once, each bounded by the node
///   timeout; decided as soon as a quorum said `OK` or a quorum became impossible. At the
///   decision the `SET`s still unanswered are **dropped**: nothing keeps driving them.
/// - release (also after a failed acquire): the compare-and-delete script (`EVALSHA`) to
///   every master at once, decided at quorum; the answers already there are drained, and
///   only the requests still unanswered then finish in a spawned task.
///
/// Why dropping a late `SET` is safe (no `SET` can land after its release): a request on a
/// multiplexed connection is either not yet handed to the connection — it waits for a slot
/// in the connection's bounded queue — and dropping it then means it is never sent; or it is
/// already in that queue (or written), and then it stays ordered before every request
/// queued later on the same connection, the release included. (redis-rs even skips writing
/// a queued request whose caller has gone.) So the release that follows the decision always
/// reaches a master after that master's `SET`, if the `SET` reaches it at all, without a
/// task chaining one after the other. The caller never waits for a slow master beyond the
/// decision.
pub struct Limit {
    conns: Arc<[Conn]>,
    quorum: usize,
    timeout: Duration,
    release_sha: String,
    acquire_sha: String,
    extras: Extras,
}

/// A lock the limit holds: its token (nothing of the acquisition is left in flight).
pub struct LimitLock {
    token: Token,
}

type Answer = (usize, Option<Value>);

/// Sends `cmd` to every node in `mask` at once, each bounded by `timeout`.
fn send(
    conns: &[Conn],
    mask: u64,
    cmd: Req,
    key: &str,
    timeout: Duration,
    extras: Extras,
) -> FuturesUnordered<impl Future<Output = Answer> + Send + 'static> {
    let cmd = Arc::new(cmd);
    let key: Option<Arc<str>> = extras.boxed.then(|| Arc::from(key));
    conns
        .iter()
        .enumerate()
        .filter(|(i, _)| mask & (1 << i) != 0)
        .map(|(i, c)| {
            let conn = c.clone();
            let cmd = if extras.cmd_per_node {
                Arc::new((*cmd).clone())
            } else {
                cmd.clone()
            };
            if let Some(key) = &key {
                // As the `Node` trait does: a boxed `dyn` future per node call, inside the
                // per-node future, and an `Arc<str>` key clone.
                let key = key.clone();
                Either::Left(async move {
                    let inner: Pin<Box<dyn Future<Output = _> + Send>> = Box::pin(async move {
                        let _key = key;
                        conn.query(cmd).await
                    });
                    let answer = tokio::time::timeout(timeout, inner).await;
                    (i, answer.ok().and_then(Result::ok))
                })
            } else {
                Either::Right(async move {
                    let answer = tokio::time::timeout(timeout, conn.query(cmd)).await;
                    (i, answer.ok().and_then(Result::ok))
                })
            }
        })
        .collect()
}

fn release_cmd(sha: &str, key: &str, token: &Token) -> Req {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(sha).arg(1).arg(key).arg(token.as_str());
    Req::One(cmd)
}

fn all(n: usize) -> u64 {
    (1u64 << n) - 1
}

impl Limit {
    /// Connects to every master (and loads the scripts, so every `EVALSHA` hits the cache).
    pub async fn connect(urls: &[String], timeout: Duration, extras: Extras) -> Self {
        let mut conns = Vec::with_capacity(urls.len());
        for url in urls {
            let client = redis::Client::open(url.as_str()).expect("valid url");
            let response = extras.response_timeout.then_some(Duration::from_secs(1));
            let conn = if extras.manager {
                // This crate's settings (src/node/redis.rs).
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(Duration::from_secs(1)))
                    .set_response_timeout(response)
                    .set_min_delay(Duration::from_millis(10))
                    .set_max_delay(Duration::from_secs(1))
                    .set_number_of_retries(3);
                Conn::Manager(
                    ConnectionManager::new_with_config(client, config)
                        .await
                        .expect("connect"),
                    extras.manager_inherent,
                )
            } else {
                // The node timeout applies around every request: no second timer inside.
                let config = AsyncConnectionConfig::new()
                    .set_response_timeout(response)
                    .set_connection_timeout(Some(Duration::from_secs(1)));
                Conn::Mux(
                    client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await
                        .expect("connect"),
                )
            };
            conns.push(conn);
        }
        let mut release_sha = String::new();
        let mut acquire_sha = String::new();
        for c in &conns {
            for (src, sha) in [
                (RELEASE_LUA, &mut release_sha),
                (ACQUIRE_LUA, &mut acquire_sha),
            ] {
                let mut cmd = redis::cmd("SCRIPT");
                cmd.arg("LOAD").arg(src);
                match c
                    .clone()
                    .query(Arc::new(Req::One(cmd)))
                    .await
                    .expect("SCRIPT LOAD")
                {
                    Value::BulkString(b) => *sha = String::from_utf8(b).expect("sha"),
                    other => panic!("SCRIPT LOAD answered {other:?}"),
                }
            }
        }
        Self {
            quorum: conns.len() / 2 + 1,
            conns: conns.into(),
            timeout,
            release_sha,
            acquire_sha,
            extras,
        }
    }

    /// Counts answers until `quorum` said yes or it became impossible (a timeout or an
    /// error counts as no). Returns the yes count.
    async fn count<F: Future<Output = Answer>>(
        &self,
        sent: &mut FuturesUnordered<F>,
        asked: usize,
        yes: impl Fn(&Value) -> bool,
    ) -> usize {
        let (mut for_, mut against) = (0, 0);
        while let Some((_, answer)) = sent.next().await {
            if answer.as_ref().is_some_and(&yes) {
                for_ += 1;
            } else {
                against += 1;
            }
            if for_ >= self.quorum || asked - against < self.quorum {
                break;
            }
        }
        for_
    }

    /// Tries once to lock `key` for `ttl`.
    pub async fn acquire(&self, key: &str, ttl: Duration) -> Option<LimitLock> {
        let token = Token::new();
        let ttl_ms = ttl.as_millis() as u64;
        let n = self.conns.len();
        let start = Instant::now();
        let req = if self.extras.script_acquire {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(&self.acquire_sha)
                .arg(1)
                .arg(key)
                .arg(token.as_str())
                .arg(ttl_ms);
            Req::One(cmd)
        } else if self.extras.set_pttl {
            let mut p = redis::pipe();
            p.cmd("SET")
                .arg(key)
                .arg(token.as_str())
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms)
                .cmd("PTTL")
                .arg(key);
            Req::Pipe(p, 2)
        } else {
            let mut cmd = redis::cmd("SET");
            cmd.arg(key)
                .arg(token.as_str())
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms);
            Req::One(cmd)
        };
        let mut sent = send(&self.conns, all(n), req, key, self.timeout, self.extras);
        let (script, pipe) = (self.extras.script_acquire, self.extras.set_pttl);
        let for_ = self
            .count(&mut sent, n, |v| {
                if script {
                    matches!(v, Value::Int(-3))
                } else if pipe {
                    matches!(v, Value::Array(a) if matches!(a.first(), Some(Value::Okay)))
                } else {
                    matches!(v, Value::Okay)
                }
            })
            .await;
        // Decided: the `SET`s still unanswered are dropped (see [`Limit`] for why the
        // release below, or the lock's, cannot be overtaken by one of them).
        drop(sent);
        let drift = ttl / 100 + Duration::from_millis(2);
        let lock = LimitLock { token };
        if for_ >= self.quorum && start.elapsed() < ttl - drift {
            return Some(lock);
        }
        // Failed: release everywhere, as a lock is released.
        self.release(key, lock).await;
        None
    }

    /// Releases `lock` (compare-and-delete) on every master at once, decided at quorum; the
    /// answers already there are drained, and the requests still unanswered (a slow or dead
    /// master) finish in a spawned task, so the caller never waits for them.
    pub async fn release(&self, key: &str, lock: LimitLock) -> bool {
        let n = self.conns.len();
        let cmd = release_cmd(&self.release_sha, key, &lock.token);
        let mut sent = send(&self.conns, all(n), cmd, key, self.timeout, self.extras);
        let answered = self.count(&mut sent, n, |_| true).await;
        while let Some(Some(_)) = sent.next().now_or_never() {}
        if !sent.is_empty() {
            tokio::spawn(sent.for_each(|_| async {}));
        }
        answered >= self.quorum
    }
}

// ---------------------------------------------------------------------------------------------
// The clients under test

/// This crate's client as the benchmarks use it: one `.redis(url)` per master, no retries.
pub fn ours(urls: &[String], node_timeout: Duration) -> Redlock {
    urls.iter()
        .fold(Redlock::builder(), |b, u| b.redis(u))
        .node_timeout(node_timeout)
        .retry(Retry::never())
        .build()
        .expect("valid client")
}

/// rslock 0.10 over `urls`, one try per call (no retry, no pause).
pub fn rslock(urls: &[String]) -> rslock::LockManager {
    let mut m = rslock::LockManager::new(urls.to_vec());
    m.set_retry(1, Duration::from_millis(1));
    m
}

/// redlock-rs 2 over `urls`, one try per call. It is synchronous: every command opens a new
/// connection, the masters are asked one after the other, and there is no timeout.
pub fn redlock_rs(urls: &[String]) -> redlock::RedLock {
    let mut m = redlock::RedLock::new(urls.to_vec());
    // One try; after a failed try it sleeps `0..delay` ms, so 1 means no pause.
    m.set_retry(1, 1);
    m
}

/// An async client under test.
#[derive(Clone)]
pub enum Locker {
    Limit(Arc<Limit>),
    Ours(Redlock),
    Rslock(rslock::LockManager),
}

/// A lock one of them holds.
pub enum Held {
    Limit(LimitLock),
    Ours(Lease),
    Rslock(rslock::Lock),
}

impl Locker {
    /// One try to lock `key` for [`TTL`].
    pub async fn acquire(&self, key: &str) -> Option<Held> {
        match self {
            Locker::Limit(l) => l.acquire(key, TTL).await.map(Held::Limit),
            Locker::Ours(r) => r.try_lock(key, TTL).await.ok().map(Held::Ours),
            Locker::Rslock(m) => m.lock(key, TTL).await.ok().map(Held::Rslock),
        }
    }

    /// Releases `held`, waiting as long as the client makes its caller wait.
    pub async fn release(&self, key: &str, held: Held) {
        match (self, held) {
            (Locker::Limit(l), Held::Limit(h)) => {
                l.release(key, h).await;
            }
            (Locker::Ours(_), Held::Ours(lease)) => {
                let _ = lease.release().await;
            }
            (Locker::Rslock(m), Held::Rslock(lock)) => m.unlock(&lock).await,
            _ => unreachable!("a lock is released by the client that took it"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Workloads

/// Single-task lock + release cycles.
#[derive(Debug, Default)]
pub struct Latency {
    /// Time to a held lock, per successful cycle.
    pub acquire: Vec<Duration>,
    /// Time of the whole lock + release cycle, per successful cycle.
    pub cycle: Vec<Duration>,
    pub failures: usize,
    /// Set when one cycle took longer than the cap (the client hangs).
    pub hung: bool,
}

impl Latency {
    pub fn merge(&mut self, other: Latency) {
        self.acquire.extend(other.acquire);
        self.cycle.extend(other.cycle);
        self.failures += other.failures;
        self.hung |= other.hung;
    }
}

/// `cycles` lock + release cycles on `key`, one at a time, stopping early after `budget`, or
/// when one cycle takes longer than `cap`.
pub async fn latency(
    l: &Locker,
    key: &str,
    cycles: usize,
    budget: Duration,
    cap: Duration,
) -> Latency {
    let mut out = Latency::default();
    let started = Instant::now();
    for _ in 0..cycles {
        if started.elapsed() > budget {
            break;
        }
        let run = async {
            let t0 = Instant::now();
            let held = l.acquire(key).await;
            let t1 = Instant::now();
            match held {
                Some(h) => {
                    l.release(key, h).await;
                    Some((t1 - t0, t0.elapsed()))
                }
                None => None,
            }
        };
        match tokio::time::timeout(cap, run).await {
            Ok(Some((a, c))) => {
                out.acquire.push(a);
                out.cycle.push(c);
            }
            Ok(None) => out.failures += 1,
            Err(_) => {
                out.hung = true;
                break;
            }
        }
    }
    out
}

/// `count` acquisitions, each of a fresh key (`{prefix}:{i}`) and timed alone; each lock is
/// released by a spawned task, so the loop never idles (an idle runtime parks its workers,
/// and waking them costs more than a lock). Stops early after `budget`, or when one
/// acquisition takes longer than `cap`.
pub async fn acquire_hot(
    l: &Locker,
    prefix: &str,
    count: usize,
    budget: Duration,
    cap: Duration,
) -> Latency {
    let mut out = Latency::default();
    let started = Instant::now();
    for i in 0..count {
        if started.elapsed() > budget {
            break;
        }
        let key = format!("{prefix}:{i}");
        let t0 = Instant::now();
        match tokio::time::timeout(cap, l.acquire(&key)).await {
            Ok(Some(h)) => {
                out.acquire.push(t0.elapsed());
                let l = l.clone();
                tokio::spawn(async move { l.release(&key, h).await });
            }
            Ok(None) => out.failures += 1,
            Err(_) => {
                out.hung = true;
                break;
            }
        }
    }
    out
}

/// Cycles (or successes) counted over a fixed duration.
#[derive(Debug, Default, Clone, Copy)]
pub struct Rate {
    pub ok: u64,
    pub failed: u64,
    pub overlaps: u64,
    pub secs: f64,
}

impl Rate {
    pub fn per_sec(&self) -> f64 {
        self.ok as f64 / self.secs
    }
}

/// `tasks` tasks, each cycling on its own key (`{prefix}:{i}`) for `dur`; counts the cycles
/// that finished within `dur`.
pub async fn throughput(l: &Locker, prefix: &str, tasks: usize, dur: Duration) -> Rate {
    cycles(l, |i| format!("{prefix}:{i}"), tasks, dur, false).await
}

/// `tasks` tasks competing for ONE key for `dur`, each trying again at once after a failed
/// try. A holder marks itself in a counter while it holds the lock: finding the counter
/// non-zero is an overlap (two holders at once), which must never happen.
pub async fn one_key(l: &Locker, key: &str, tasks: usize, dur: Duration) -> Rate {
    cycles(l, |_| key.to_owned(), tasks, dur, true).await
}

/// Counts the overlaps of holders: one shared by the tasks of a contended workload.
#[derive(Default)]
struct Holders {
    inside: AtomicUsize,
    overlaps: AtomicU64,
}

impl Holders {
    /// Marks a holder in: finding another one inside is an overlap.
    fn enter(&self) {
        if self.inside.fetch_add(1, Ordering::SeqCst) != 0 {
            self.overlaps.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Marks a holder out.
    fn leave(&self) {
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

/// `tasks` tasks cycling on `key_of(task)` for `dur`; with `mark_holders`, each holder is
/// marked in [`Holders`] (and yields once while it holds the lock).
async fn cycles(
    l: &Locker,
    key_of: impl Fn(usize) -> String,
    tasks: usize,
    dur: Duration,
    mark_holders: bool,
) -> Rate {
    let ok = Arc::new(AtomicU64::new(0));
    let failed = Arc::new(AtomicU64::new(0));
    let holders = Arc::new(Holders::default());
    let deadline = Instant::now() + dur;
    let handles: Vec<_> = (0..tasks)
        .map(|i| {
            let (l, ok, failed, holders) = (l.clone(), ok.clone(), failed.clone(), holders.clone());
            let key = key_of(i);
            tokio::spawn(async move {
                while Instant::now() < deadline {
                    match l.acquire(&key).await {
                        Some(h) => {
                            if mark_holders {
                                // Hold for a moment, so that another holder could show up.
                                holders.enter();
                                tokio::task::yield_now().await;
                                holders.leave();
                            }
                            l.release(&key, h).await;
                            if Instant::now() <= deadline {
                                ok.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        None => {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.await.expect("task");
    }
    Rate {
        ok: ok.load(Ordering::Relaxed),
        failed: failed.load(Ordering::Relaxed),
        overlaps: holders.overlaps.load(Ordering::Relaxed),
        secs: dur.as_secs_f64(),
    }
}

// The same workloads for redlock-rs, which blocks: one OS thread per task.

/// Single-thread lock + release cycles of redlock-rs (call from a blocking thread).
pub fn latency_sync(m: &redlock::RedLock, key: &str, cycles: usize, budget: Duration) -> Latency {
    let mut out = Latency::default();
    let started = Instant::now();
    let ttl_ms = TTL.as_millis() as usize;
    for _ in 0..cycles {
        if started.elapsed() > budget {
            break;
        }
        let t0 = Instant::now();
        match m.lock(key.as_bytes(), ttl_ms) {
            Ok(Some(lock)) => {
                let t1 = Instant::now();
                m.unlock(&lock);
                out.acquire.push(t1 - t0);
                out.cycle.push(t0.elapsed());
            }
            _ => out.failures += 1,
        }
    }
    out
}

/// [`throughput`] for redlock-rs, on `tasks` threads.
pub fn throughput_sync(m: &redlock::RedLock, prefix: &str, tasks: usize, dur: Duration) -> Rate {
    cycles_sync(m, |i| format!("{prefix}:{i}"), tasks, dur, false)
}

/// [`one_key`] for redlock-rs, on `tasks` threads.
pub fn one_key_sync(m: &redlock::RedLock, key: &str, tasks: usize, dur: Duration) -> Rate {
    cycles_sync(m, |_| key.to_owned(), tasks, dur, true)
}

/// [`cycles`] for redlock-rs, on `tasks` threads.
fn cycles_sync(
    m: &redlock::RedLock,
    key_of: impl Fn(usize) -> String,
    tasks: usize,
    dur: Duration,
    mark_holders: bool,
) -> Rate {
    let ok = AtomicU64::new(0);
    let failed = AtomicU64::new(0);
    let holders = Holders::default();
    let deadline = Instant::now() + dur;
    let ttl_ms = TTL.as_millis() as usize;
    std::thread::scope(|s| {
        for i in 0..tasks {
            let (ok, failed, holders) = (&ok, &failed, &holders);
            let key = key_of(i);
            s.spawn(move || {
                while Instant::now() < deadline {
                    match m.lock(key.as_bytes(), ttl_ms) {
                        Ok(Some(lock)) => {
                            if mark_holders {
                                holders.enter();
                                std::thread::yield_now();
                                holders.leave();
                            }
                            m.unlock(&lock);
                            if Instant::now() <= deadline {
                                ok.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        _ => {
                            failed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    Rate {
        ok: ok.into_inner(),
        failed: failed.into_inner(),
        overlaps: holders.overlaps.into_inner(),
        secs: dur.as_secs_f64(),
    }
}

// ---------------------------------------------------------------------------------------------
// Statistics and formatting

/// The `p`-th percentile (0..=100) of `v`, nearest rank; `None` when empty.
pub fn percentile(v: &[Duration], p: f64) -> Option<Duration> {
    if v.is_empty() {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_unstable();
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    Some(s[rank.clamp(1, s.len()) - 1])
}

/// The median of `v` (0 when empty).
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let m = s.len() / 2;
    if s.len() % 2 == 1 {
        s[m]
    } else {
        (s[m - 1] + s[m]) / 2.0
    }
}

/// `87 µs`, `4.31 ms`, `1.02 s`.
pub fn fmt_dur(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us < 1000.0 {
        format!("{us:.0} µs")
    } else if us < 1e6 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{:.2} s", us / 1e6)
    }
}

/// `12.3k`, `950`.
pub fn fmt_rate(r: f64) -> String {
    if r >= 10_000.0 {
        format!("{:.1}k", r / 1000.0)
    } else {
        format!("{r:.0}")
    }
}
