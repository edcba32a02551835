//! The limit: Redlock written directly on redis-rs (see [`Limit`]), and its switches for the
//! ablation (`bench/benches/profile.rs`, see [`Extras`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::Either;
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use redis::aio::{
    ConnectionLike, ConnectionManager, ConnectionManagerConfig, MultiplexedConnection,
};
use redis::{AsyncConnectionConfig, Cmd, Value};

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
