//! A Redis master as a node.

use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::{Client, Cmd, RedisResult, Value};

use self::conn::{query, Conn};
use self::eviction::Eviction;
use self::options::RestartGuard;
use self::scripts::Script;
use self::wake::Source;
use super::{Acquire, CallError};

#[cfg(feature = "cluster")]
mod cluster;
pub(super) mod conn;
mod eviction;
mod fencing;
mod lock;
mod node;
mod operate;
mod options;
mod records;
mod scripts;
mod sentinel;
mod url;
mod wake;

#[cfg(feature = "cluster")]
pub use self::cluster::Cluster;
pub use self::options::RedisNodeOptions;
use self::options::DEFAULT_FAILOVER_MAX_TTL;
pub use self::sentinel::Sentinel;
pub use self::url::split_urls;

pub(crate) use self::eviction::{refusal as eviction_refusal, EvictionStatus};
pub(crate) use self::lock::Packed;

/// A Redis voter: one master, a Sentinel-managed master group
/// ([`RedisNode::sentinel`]), or a Redis Cluster ([`RedisNode::cluster`], feature `cluster`).
/// Each is one voter of the quorum — one independent failure domain.
///
/// Over one master, it keeps one multiplexed, auto-reconnecting connection (redis-rs'
/// [`ConnectionManager`]): every lock request shares it, no TCP connection is opened per
/// lock, and a lost connection is re-established in the background. The connection is made
/// lazily, so a master that is down when the client is built costs nothing until it is
/// needed, and the client can still reach a quorum without it.
///
/// Scripts run with `EVALSHA` and fall back to `EVAL` when the master answers `NOSCRIPT`
/// (after a restart or `SCRIPT FLUSH`).
///
/// The master must not evict keys (`maxmemory-policy noeviction`): the voter reads its
/// policy on first use and after every reconnection, and abstains while it may evict (see
/// [`RedisNodeOptions::allow_eviction`]).
///
/// ```no_run
/// # fn main() -> Result<(), tower_redlock::Error> {
/// use tower_redlock::{node::RedisNode, Redlock};
///
/// let redlock = Redlock::builder()
///     .node(RedisNode::open("redis://127.0.0.1:7777")?)
///     .node(RedisNode::open("redis://:secret@127.0.0.1:7778/0")?)
///     .node(RedisNode::open("redis://127.0.0.1:7779")?)
///     .build()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedisNode {
    conn: Conn,
    name: String,
    guard: Option<RestartGuard>,
    eviction: Eviction,
    /// Where the wake-up's subscriber connects (`None`: a node over a connection of the
    /// caller's, which polls).
    wake_source: Option<std::sync::Arc<(Source, wake::Limits)>>,
    /// The wake-up's channel kind its deleting scripts are given, once the client wakes
    /// waiters ([`RedisNode::start_wake`]): `P` or `S`.
    pub(in crate::node) wake: Option<&'static str>,
}

impl std::fmt::Debug for RedisNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisNode")
            .field("addr", &self.name)
            .finish()
    }
}

impl RedisNode {
    /// A voter by URL, with default [`RedisNodeOptions`]:
    ///
    /// | URL | voter |
    /// |---|---|
    /// | `redis://[user:password@]host:port[/db]` | one master |
    /// | `redis+sentinel://[user:password@]host:port[,host:port…]/master-name[/db][?sentinel_username=…&sentinel_password=…]` | a Sentinel group ([`RedisNode::sentinel`]): the sentinels' addresses, the master's name; the credentials before `@` are the master's |
    /// | `redis+cluster://[user:password@]host:port[,host:port…]` | a Redis Cluster ([`RedisNode::cluster`], feature `cluster`): some of its nodes |
    ///
    /// `rediss`, `rediss+sentinel` and `rediss+cluster` ask for TLS (feature `tls`). The
    /// Sentinel and Cluster forms take `?protection=<ms>` (tenure protection for ttls up to
    /// that, see [`RedisNodeOptions::restart_protection`]) or `?protection=off`, over
    /// `options`. A
    /// list of voters in one string (the examples' `REDLOCK_URLS`) is split with
    /// [`split_urls`](crate::node::split_urls), which keeps a Sentinel's or a Cluster's
    /// comma-separated hosts together.
    ///
    /// The connection is made lazily, in the background. Must be called inside a Tokio
    /// runtime.
    ///
    /// # Errors
    ///
    /// [`Error::is_invalid_input`](crate::Error::is_invalid_input): a URL that does not parse
    /// (the message says what), or no Tokio runtime.
    pub fn open(url: &str) -> crate::Result<Self> {
        Self::open_with(url, &RedisNodeOptions::default())
    }

    /// Like [`RedisNode::open`], with explicit connection settings.
    ///
    /// # Errors
    ///
    /// As [`RedisNode::open`].
    pub fn open_with(url: &str, options: &RedisNodeOptions) -> crate::Result<Self> {
        let (voter, protection) = url::parse(url)?;
        let options = match protection {
            None => options.clone(),
            Some(None) => options.clone().no_protection(),
            Some(Some(max_ttl)) => options.clone().restart_protection(max_ttl),
        };
        match voter {
            url::Voter::Master => {}
            url::Voter::Sentinel(group) => return Self::sentinel(*group, &options),
            #[cfg(feature = "cluster")]
            url::Voter::Cluster(cluster) => return Self::cluster(cluster, &options),
        }
        if url.starts_with("rediss://") && !cfg!(feature = "tls") {
            return Err(crate::Error::invalid(format!(
                "`{}` asks for TLS: enable the `tls` feature of tower-redlock",
                redact(url)
            )));
        }
        let client = Client::open(url).map_err(|e| {
            crate::Error::invalid(format!("invalid Redis URL `{}`: {e}", redact(url)))
        })?;
        Self::from_client(client, &options)
    }

    /// A node over an already configured redis-rs [`Client`]: for example TLS with a private
    /// CA or client certificates (feature `tls`).
    ///
    /// ```no_run
    /// # #[cfg(feature = "tls")]
    /// # fn f() -> Result<(), Box<dyn std::error::Error>> {
    /// use tower_redlock::node::{RedisNode, RedisNodeOptions};
    ///
    /// let client = redis::Client::build_with_tls(
    ///     "rediss://redis-a.internal:6380",
    ///     redis::TlsCertificates {
    ///         client_tls: None,
    ///         root_cert: Some(std::fs::read("/etc/redis/ca.pem")?),
    ///     },
    /// )?;
    /// let node = RedisNode::from_client(client, &RedisNodeOptions::default())?;
    /// # Ok(()) }
    /// ```
    ///
    /// Must be called inside a Tokio runtime.
    ///
    /// # Errors
    ///
    /// [`Error::is_invalid_input`](crate::Error::is_invalid_input): no Tokio runtime.
    pub fn from_client(client: Client, options: &RedisNodeOptions) -> crate::Result<Self> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(crate::Error::invalid(
                "a RedisNode must be created inside a Tokio runtime",
            ));
        }
        let name = client.get_connection_info().addr().to_string();
        let source = wake::Source::Master(client.clone());
        let manager = ConnectionManager::new_lazy_with_config(client, options.manager_config())
            .map_err(|e| {
                crate::Error::invalid(format!("cannot set up a connection to {name}: {e}"))
            })?;
        Ok(Self {
            conn: Conn::Manager(manager),
            eviction: eviction(&name, options),
            name,
            guard: options.guard(None),
            wake_source: Some(std::sync::Arc::new((source, limits(options)))),
            wake: None,
        })
    }

    /// A voter that is a Sentinel-managed master group, with default [`RedisNodeOptions`]:
    /// failover protection on, for ttls up to
    /// [`RedisNodeOptions::DEFAULT_FAILOVER_MAX_TTL`].
    ///
    /// The master is discovered through the sentinels (the answer of a majority of the group,
    /// checked with `ROLE`). It is re-checked every [`Sentinel::refresh_interval`], and at once
    /// after a request fails in a way a failover explains (the master gone, or `READONLY`). So
    /// after a failover the voter follows the new master without a new client. Until the first
    /// discovery ends, requests wait for it (bounded by the client's node timeout). While no master
    /// is known they fail at once, as an unreachable master does. The voter votes only while a
    /// majority of its sentinels has named its master within its majority window (two refresh
    /// intervals plus two connect timeouts). Otherwise it abstains (see
    /// [`Sentinel::refresh_interval`]).
    ///
    /// **The group, not the list.** The voter asks every sentinel listed and every one the group
    /// names (`SENTINEL SENTINELS`), and counts each once (`SENTINEL MYID`). It counts its majority
    /// over the largest of: the sentinels listed, the group the sentinels report
    /// (`num-other-sentinels` + 1), and the largest group it has seen. Two of three listed
    /// sentinels of a group of five — one side of a zone split — are no majority. A sentinel
    /// removed from the group still counts until `SENTINEL RESET` is sent to every remaining
    /// sentinel. While fewer than a majority answer, the voter abstains and warns naming the reset.
    /// The group a client saw shrinks only when more than half of it answers reporting the smaller
    /// group. (A sentinel restarted without its configuration reports a small group too.) After
    /// removing half or more of a group, reset the rest and restart the clients. List each sentinel
    /// once, by one address, and take removed ones out of the list: each listed address counts.
    /// Learned sentinels are reached at the address they announce (under TLS, their certificates
    /// must name it). The sentinels' user needs `+sentinel|get-master-addr-by-name +sentinel|myid
    /// +sentinel|master +sentinel|sentinels` (Redis 6.2 or later). A sentinel that cannot say who
    /// it is or how large its group is gives no vote.
    ///
    /// **Failover protection** ([`RedisNodeOptions::restart_protection`]): replication is
    /// asynchronous, so a promoted replica may lack a lock its old master granted; the new
    /// master abstains until its tenure is as old as the longest ttl plus the majority
    /// window. Without it, a failover can let a second client win a lock the first still
    /// holds (`tests/voters/sentinel.rs` shows both). Must be called inside a Tokio runtime.
    ///
    /// `options` apply to the sentinels and the master ([`RedisNodeOptions::default`] for
    /// the defaults).
    ///
    /// # Errors
    ///
    /// [`Error::is_invalid_input`](crate::Error::is_invalid_input): no Tokio runtime, or
    /// settings the sentinels' client refuses.
    #[doc(alias = "sentinel_with")]
    pub fn sentinel(group: Sentinel, options: &RedisNodeOptions) -> crate::Result<Self> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(crate::Error::invalid(
                "a RedisNode must be created inside a Tokio runtime",
            ));
        }
        let name = group.name();
        let window = group.window(options);
        let eviction = eviction(&name, options);
        let conn = sentinel::SentinelConn::start(group, options, eviction.clone())?;
        Ok(Self {
            wake_source: Some(std::sync::Arc::new((
                Source::Sentinel(conn.clone()),
                limits(options),
            ))),
            wake: None,
            conn: Conn::Sentinel(conn),
            name,
            guard: options
                .guard(Some(DEFAULT_FAILOVER_MAX_TTL))
                .map(|g| g.widened(window)),
            eviction,
        })
    }

    /// A voter that is a Redis Cluster (feature `cluster`) (by default no failover
    /// protection: see
    /// [`RedisNodeOptions::restart_protection`] for what it costs on a Cluster).
    ///
    /// Each request goes to the master of its key's hash slot; redis-rs' cluster connection follows
    /// `MOVED`/`ASK` and refreshes the slot map. Keys a script uses next to the lock (a completion
    /// record, the protection's marker) are put in the lock key's slot. The whole cluster is
    /// **one** voter. It answers for a key only while that key's slot is served (with
    /// `cluster-require-full-coverage yes`, Redis' default, while every slot is). Its health is the
    /// voter's, not a shard's. While one shard is down and the others answer, a request to the down
    /// shard in a process that stalls is given back the stall as for a node that keeps answering
    /// (see [`RedlockBuilder::node_timeout`](crate::RedlockBuilder::node_timeout)). That is up to 5
    /// s instead of four node timeouts. Must be called inside a Tokio runtime; nothing connects
    /// until the first request.
    ///
    /// `options`: the connection settings ([`RedisNodeOptions::default`] for the defaults).
    ///
    /// # Errors
    ///
    /// [`Error::is_invalid_input`](crate::Error::is_invalid_input): no Tokio runtime, or
    /// settings the cluster client refuses.
    #[cfg(feature = "cluster")]
    #[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
    #[doc(alias = "cluster_with")]
    pub fn cluster(cluster: Cluster, options: &RedisNodeOptions) -> crate::Result<Self> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(crate::Error::invalid(
                "a RedisNode must be created inside a Tokio runtime",
            ));
        }
        let name = cluster.name();
        Ok(Self {
            conn: Conn::Cluster(cluster::ClusterConn::start(&cluster, options)?),
            eviction: eviction(&name, options),
            name,
            guard: options.guard(None),
            wake_source: Some(std::sync::Arc::new((
                Source::Cluster(cluster::ClusterWake::new(&cluster, options)),
                limits(options),
            ))),
            wake: None,
        })
    }

    /// A node over an existing auto-reconnecting [`ConnectionManager`], with the default
    /// [`RedisNodeOptions`]' eviction check (a reconnection made by a command of your own is
    /// noticed at the next periodic check).
    pub fn from_connection_manager(manager: ConnectionManager, name: impl Into<String>) -> Self {
        let name = name.into();
        Self {
            conn: Conn::Manager(manager),
            eviction: eviction(&name, &RedisNodeOptions::default()),
            name,
            guard: None,
            wake_source: None,
            wake: None,
        }
    }

    /// Starts the wake-up (`RedlockBuilder::wake_waiters`): its deleting scripts publish
    /// from now on, and a subscriber of its own tells `listener` the releases it hears. A
    /// node over a connection of the caller's ([`RedisNode::from_connection_manager`]: a
    /// master's) publishes but has no subscriber (`None`):
    /// its releases wake other clients, its own waiters poll.
    pub(crate) fn start_wake(
        &mut self,
        listener: std::sync::Arc<dyn super::wake::Listener>,
    ) -> Option<super::wake::Feed> {
        let Some((source, limits)) = self.wake_source.as_deref() else {
            self.wake = Some("P");
            return None;
        };
        self.wake = Some(source.kind());
        Some(wake::start(
            source.clone(),
            self.name.clone(),
            *limits,
            listener,
        ))
    }

    /// The voter's eviction state, for [`Redlock::node_status`](crate::Redlock::node_status);
    /// a Sentinel voter without a recent majority abstains too.
    pub(crate) fn eviction_status(&self) -> EvictionStatus {
        let mut status = self.eviction.status(&self.conn);
        if let Conn::Sentinel(c) = &self.conn {
            status.abstains |= !c.majority_is_recent();
        }
        status
    }

    /// A [`query`]'s reply, noted: a lost connection has the next acquires and extensions
    /// checked again for eviction (the new connection may reach another server). Not an
    /// `async` wrapper: the request's future (allocated per request) stays as small.
    fn noted(&self, reply: RedisResult<Value>) -> RedisResult<Value> {
        if let Err(e) = &reply {
            self.eviction.failed(e);
        }
        reply
    }

    /// Runs `script` with `KEYS = keys`, `ARGV[1] = token` and, when given, `[ttl_ms, extra]` and
    /// `wake` as the next arguments. `wake` is the wake-up's channel kind, for a script that
    /// deletes a lock. It sends `EVALSHA`, then `EVAL` if the master lost its script cache; an
    /// acquire sends `EVAL` at once ([`Script::whole`]). With `prepared`, the command packed once
    /// for every master of a fan-out (a release's `EVALSHA`, an acquire's `EVAL`). A vote script is
    /// sent with its eviction check unless the voter allows eviction ([`Script::for_voter`]).
    async fn run(
        &self,
        script: &Script,
        keys: &[&str],
        token: &str,
        [ttl_ms, extra]: [Option<u64>; 2],
        wake: Option<&str>,
        prepared: Option<&Cmd>,
    ) -> RedisResult<Value> {
        let script = script.for_voter(self.eviction.allows());
        // An acquire is sent whole: one request, whatever the master's script cache holds.
        let (verb, body) = if script.whole() {
            ("EVAL", script.source())
        } else {
            ("EVALSHA", script.sha1())
        };
        // Scoped so that nothing of the first request is kept across the fallback's await:
        // this future is allocated for every request, and stays about the size of redis-rs'.
        {
            let mut conn = self.conn.clone();
            let own;
            let cmd = match prepared {
                Some(cmd) => cmd,
                None => {
                    own = script_cmd(verb, body, keys, token, [ttl_ms, extra], wake);
                    &own
                }
            };
            match self.noted(query(&mut conn, cmd, script.votes()).await) {
                Err(e)
                    if !script.whole()
                        && e.kind()
                            == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {}
                r => return r,
            }
        }
        // The master lost its script cache (a restart, `SCRIPT FLUSH`): send the source.
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let cmd = script_cmd("EVAL", script.source(), keys, token, [ttl_ms, extra], wake);
            self.noted(query(&mut conn, &cmd, script.votes()).await)
        })
        .await
    }
}

/// The wake-up subscriber's timeouts with `options`.
fn limits(options: &RedisNodeOptions) -> wake::Limits {
    wake::Limits {
        connect: options.connect_timeout,
        response: options
            .response_timeout
            .unwrap_or(std::time::Duration::from_secs(1)),
    }
}

/// The eviction check of the voter `name` with `options`.
fn eviction(name: &str, options: &RedisNodeOptions) -> Eviction {
    Eviction::new(
        name,
        options.allow_eviction,
        options.eviction_check_timeout(),
    )
}

fn ttl_ms(ttl: Duration) -> u64 {
    // The client only passes whole-millisecond ttls of at least 1 ms.
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn int(v: &Value) -> Result<i64, CallError> {
    match v {
        Value::Int(i) => Ok(*i),
        other => Err(CallError::new(format!(
            "unexpected reply from the lock script: {other:?}"
        ))),
    }
}

/// A "held" answer from the holder's `PTTL`. Only a live holder (`PTTL` ≥ 0) reports a
/// remaining ttl: -1 (no expiry) and -2 (the key vanished between the two requests — free
/// now, but this try did not get it) say nothing of how long to wait.
fn held(pttl_ms: i64) -> Acquire {
    Acquire::Held {
        remaining: u64::try_from(pttl_ms).ok().map(Duration::from_millis),
    }
}

/// `EVALSHA sha …` or `EVAL source …` with the lock scripts' arguments (the token, then the
/// numbers and the wake-up's channel kind that are given), sized up front.
fn script_cmd(
    verb: &str,
    script: &str,
    keys: &[&str],
    token: &str,
    [ttl_ms, extra]: [Option<u64>; 2],
    wake: Option<&str>,
) -> Cmd {
    let args = 4
        + keys.len()
        + usize::from(ttl_ms.is_some())
        + usize::from(extra.is_some())
        + usize::from(wake.is_some());
    let data = verb.len()
        + script.len()
        + 2
        + keys.iter().map(|k| k.len()).sum::<usize>()
        + token.len()
        + 42;
    let mut cmd = Cmd::with_capacity(args, data);
    cmd.arg(verb)
        .arg(script)
        .arg(keys.len())
        .arg(keys)
        .arg(token)
        .arg(ttl_ms)
        .arg(extra)
        .arg(wake);
    cmd
}

/// `scheme://user:password@host` → `scheme://***@host`, so URLs can go in error messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}***{}", &url[..s + 3], &url[at..]),
        _ => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn pttl_answers_map_to_the_holders_remaining_ttl() {
        use super::{held, Acquire};
        use std::time::Duration;
        let remaining = |ms| match held(ms) {
            Acquire::Held { remaining } => remaining,
            other => panic!("a PTTL answer is always \"held\", not {other:?}"),
        };
        assert_eq!(remaining(1500), Some(Duration::from_millis(1500)));
        // No expiry.
        assert_eq!(remaining(-1), None);
        // Expired between the SET and the PTTL: free now, though this try did not get it.
        // It must not shorten a live holder's Retry-After to zero.
        assert_eq!(remaining(-2), None);
        assert_eq!(remaining(0), Some(Duration::ZERO));
    }

    #[test]
    fn redacts_credentials() {
        assert_eq!(redact("redis://u:p@h:1/0"), "redis://***@h:1/0");
        assert_eq!(redact("redis://h:1"), "redis://h:1");
    }
}
