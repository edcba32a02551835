//! A Redis master as a node.

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig, MultiplexedConnection};
use redis::{Client, Cmd, RedisResult, Value};

use self::scripts::{Script, ACQUIRE_GUARDED, EXTEND, RELEASE};
use super::{Acquire, Node, NodeFailure, NodeFuture};

mod records;
mod scripts;

/// Connection settings of a [`RedisNode`].
///
/// The defaults suit masters on the same network: connect within 1 s, reconnect in the
/// background with exponential backoff from 10 ms up to 1 s, and no response timeout of the
/// connection's own: the client's per-node timeout
/// ([`RedlockBuilder::node_timeout`](crate::RedlockBuilder::node_timeout), 50 ms by
/// default) already bounds every request, and a second timer per request measurably costs
/// throughput (`bench/benches/profile.rs`). Set one with [`RedisNodeOptions::response_timeout`]
/// when the node is also used outside a [`Redlock`](crate::Redlock) client.
#[derive(Debug, Clone)]
pub struct RedisNodeOptions {
    connect_timeout: Duration,
    response_timeout: Option<Duration>,
    reconnect_min_delay: Duration,
    reconnect_max_delay: Duration,
    reconnect_retries: usize,
    restart_protection: Option<Duration>,
}

impl Default for RedisNodeOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(1),
            response_timeout: None,
            reconnect_min_delay: Duration::from_millis(10),
            reconnect_max_delay: Duration::from_secs(1),
            reconnect_retries: 3,
            restart_protection: None,
        }
    }
}

impl RedisNodeOptions {
    /// The default settings.
    pub fn new() -> Self {
        Self::default()
    }

    /// How long one connection attempt may take.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long the connection itself waits for any one response (default: no limit of its
    /// own; every request of a [`Redlock`](crate::Redlock) client is bounded by its node
    /// timeout anyway). A timed-out response does not make redis-rs reconnect.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = Some(timeout);
        self
    }

    /// The backoff between reconnection attempts: from `min` growing exponentially up to
    /// `max`, at most `retries` attempts per reconnection.
    pub fn reconnect_backoff(mut self, min: Duration, max: Duration, retries: usize) -> Self {
        self.reconnect_min_delay = min;
        self.reconnect_max_delay = max;
        self.reconnect_retries = retries;
        self
    }
}

impl RedisNodeOptions {
    /// Delayed-restart protection: the node does not vote "free" while its dataset is
    /// younger than `max_ttl` (the longest ttl any client uses on it).
    ///
    /// A master that restarts without persistence forgets its keys; if a lock it held is
    /// still valid on other masters, a second client could otherwise gain a quorum with the
    /// forgetful master's vote. With protection on, the acquire script itself checks — in
    /// one atomic step, on the master's own clock — a marker key holding since when the
    /// dataset is known; a restart without persistence or a flush loses it. A master whose
    /// dataset is younger than `max_ttl` abstains (counts as failed), starting the clock when
    /// the marker is missing.
    ///
    /// Trade-offs: after a restart, a `FLUSHALL`, or the first use of protection on a master,
    /// that master is out of the quorum for `max_ttl`, so fewer failures are tolerated
    /// meanwhile; a client refuses locks with a ttl above `max_ttl` (an invalid-input error);
    /// each master keeps one marker key per `max_ttl` (`tower-redlock:restart-guard:<ms>`). A
    /// restart *with* persistence that lost recent writes (RDB, AOF `everysec`) keeps an old
    /// marker and is not covered: use AOF with `fsync always`, or restart late.
    ///
    /// Needs Redis ≥ 5: the script writes after reading `TIME` (effects replication; older
    /// masters refuse such a script).
    pub fn restart_protection(mut self, max_ttl: Duration) -> Self {
        self.restart_protection = Some(max_ttl);
        self
    }
}

impl RestartGuard {
    fn new(max_ttl: Duration) -> Self {
        Self {
            max_ttl,
            key: format!("tower-redlock:restart-guard:{}", max_ttl.as_millis()),
        }
    }
}

#[derive(Clone)]
enum Conn {
    Manager(ConnectionManager),
    Multiplexed(MultiplexedConnection),
}

/// A Redis master as a voting node.
///
/// It keeps one multiplexed, auto-reconnecting connection (redis-rs'
/// [`ConnectionManager`]): every lock request shares it, no TCP connection is opened per
/// lock, and a lost connection is re-established in the background. The connection is made
/// lazily, so a master that is down when the client is built costs nothing until it is
/// needed, and the client can still reach a quorum without it.
///
/// Scripts run with `EVALSHA` and fall back to `EVAL` when the master answers `NOSCRIPT`
/// (after a restart or `SCRIPT FLUSH`).
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
}

impl std::fmt::Debug for RedisNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisNode")
            .field("addr", &self.name)
            .finish()
    }
}

impl RedisNode {
    /// A node for the master at `url` (`redis://[user:password@]host:port[/db]`, or
    /// `rediss://…` with the `tls` feature), with default [`RedisNodeOptions`].
    ///
    /// The connection is made lazily, in the background. Must be called inside a Tokio
    /// runtime.
    pub fn open(url: &str) -> crate::Result<Self> {
        Self::open_with(url, &RedisNodeOptions::default())
    }

    /// Like [`RedisNode::open`], with explicit connection settings.
    pub fn open_with(url: &str, options: &RedisNodeOptions) -> crate::Result<Self> {
        if url.starts_with("rediss://") && !cfg!(feature = "tls") {
            return Err(crate::Error::invalid(format!(
                "`{}` asks for TLS: enable the `tls` feature of tower-redlock",
                redact(url)
            )));
        }
        let client = Client::open(url).map_err(|e| {
            crate::Error::invalid(format!("invalid Redis URL `{}`: {e}", redact(url)))
        })?;
        Self::from_client(client, options)
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
    pub fn from_client(client: Client, options: &RedisNodeOptions) -> crate::Result<Self> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(crate::Error::invalid(
                "a RedisNode must be created inside a Tokio runtime",
            ));
        }
        let name = client.get_connection_info().addr().to_string();
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(options.response_timeout)
            .set_min_delay(options.reconnect_min_delay)
            .set_max_delay(options.reconnect_max_delay)
            .set_number_of_retries(options.reconnect_retries);
        let manager = ConnectionManager::new_lazy_with_config(client, config).map_err(|e| {
            crate::Error::invalid(format!("cannot set up a connection to {name}: {e}"))
        })?;
        Ok(Self {
            conn: Conn::Manager(manager),
            name,
            guard: options.restart_protection.map(RestartGuard::new),
        })
    }

    /// A node over an existing auto-reconnecting [`ConnectionManager`].
    pub fn from_connection_manager(manager: ConnectionManager, name: impl Into<String>) -> Self {
        Self {
            conn: Conn::Manager(manager),
            name: name.into(),
            guard: None,
        }
    }

    /// A node over an existing [`MultiplexedConnection`]. It does not reconnect by itself:
    /// prefer [`RedisNode::open`] or [`RedisNode::from_connection_manager`].
    pub fn from_multiplexed(conn: MultiplexedConnection, name: impl Into<String>) -> Self {
        Self {
            conn: Conn::Multiplexed(conn),
            name: name.into(),
            guard: None,
        }
    }

    /// Runs `script` with `KEYS = keys`, `ARGV[1] = token` and, when given,
    /// `ARGV[2] = ttl_ms` and `ARGV[3] = extra`: `EVALSHA`, then `EVAL` if the master lost
    /// its script cache.
    /// With `prepared`, the `EVALSHA` packed once for every master of a fan-out.
    async fn run(
        &self,
        script: &Script,
        keys: &[&str],
        token: &str,
        ttl_ms: Option<u64>,
        extra: Option<u64>,
        prepared: Option<&Cmd>,
    ) -> RedisResult<Value> {
        // Scoped so that nothing of the first request is kept across the fallback's await:
        // this future is allocated for every request, and stays about the size of redis-rs'.
        {
            let mut conn = self.conn.clone();
            let own;
            let cmd = match prepared {
                Some(cmd) => cmd,
                None => {
                    own = script_cmd("EVALSHA", script.sha1(), keys, token, ttl_ms, extra);
                    &own
                }
            };
            match query(&mut conn, cmd).await {
                Err(e)
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {}
                r => return r,
            }
        }
        // The master lost its script cache (a restart, `SCRIPT FLUSH`): send the source.
        Box::pin(async move {
            let mut conn = self.conn.clone();
            let cmd = script_cmd("EVAL", script.source(), keys, token, ttl_ms, extra);
            query(&mut conn, &cmd).await
        })
        .await
    }

    /// `SET key token NX PX ttl`. A plain `SET` costs a master about a fifth less CPU than a
    /// script doing the same (`bench/benches/profile.rs`). A held key answers without the
    /// holder's ttl: the client asks one node for it ([`RedisNode::remaining_ttl`]) when a
    /// contended error is returned, not every node on every try. With delayed-restart
    /// protection, the guarded script (which returns the holder's ttl at once).
    ///
    /// With `prepared` ([`RedisNode::set_cmd`]), the `SET` packed once for every master of a
    /// fan-out (measured in `bench/benches/profile.rs`: a command per node cost about a tenth of the
    /// throughput at five masters).
    pub(crate) async fn acquire_key(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        prepared: Option<&Cmd>,
    ) -> Result<Acquire, NodeFailure> {
        // The rare paths are boxed, so that the common one's future (allocated per request)
        // stays small.
        if let Some(guard) = &self.guard {
            let v = Box::pin(self.acquire_guarded(guard, key, token, ttl)).await?;
            // The script answers -3 when it set the key, else the holder's PTTL.
            return Ok(match int(&v)? {
                -3 => Acquire::Acquired,
                ms => held(ms),
            });
        }
        let mut conn = self.conn.clone();
        let own;
        let cmd = match prepared {
            Some(cmd) => cmd,
            None => {
                own = Self::set_cmd(key, token, ttl);
                &own
            }
        };
        match query(&mut conn, cmd).await? {
            Value::Okay => Ok(Acquire::Acquired),
            // The holder's ttl is asked only if the caller needs it (`remaining_ttl`), from
            // one node: a contended try costs each master one command, as an uncontended one.
            Value::Nil => Ok(Acquire::Held { remaining: None }),
            other => Err(NodeFailure::new(format!(
                "unexpected reply to SET NX PX: {other:?}"
            ))),
        }
    }

    /// The remaining ttl of `key` (`PTTL`): `None` when it has no expiry or is gone.
    pub(crate) async fn remaining_ttl(&self, key: &str) -> Result<Option<Duration>, NodeFailure> {
        let mut conn = self.conn.clone();
        let mut cmd = Cmd::with_capacity(2, 4 + key.len());
        cmd.arg("PTTL").arg(key);
        match held(int(&query(&mut conn, &cmd).await?)?) {
            Acquire::Held { remaining } => Ok(remaining),
            Acquire::Acquired | Acquire::Completed { .. } => Ok(None),
        }
    }

    /// `SET key token NX PX ttl`, packed: the same for every master of a fan-out.
    pub(crate) fn set_cmd(key: &str, token: &str, ttl: Duration) -> Cmd {
        let mut cmd = Cmd::with_capacity(6, 3 + key.len() + token.len() + 2 + 2 + 20);
        cmd.arg("SET")
            .arg(key)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms(ttl));
        cmd
    }

    /// The release's `EVALSHA`, packed: the same for every master of a fan-out.
    pub(crate) fn release_cmd(key: &str, token: &str) -> Cmd {
        script_cmd("EVALSHA", RELEASE.sha1(), &[key], token, None, None)
    }

    /// Whether this node acquires with the plain `SET` of [`RedisNode::set_cmd`] (not the
    /// restart-guarded script).
    pub(crate) fn plain_acquire(&self) -> bool {
        self.guard.is_none()
    }

    /// Compare-and-delete: whether `key` held `token` and was deleted. With `prepared`
    /// ([`RedisNode::release_cmd`]), the command packed once for the fan-out.
    pub(crate) async fn release_key(
        &self,
        key: &str,
        token: &str,
        prepared: Option<&Cmd>,
    ) -> Result<bool, NodeFailure> {
        let v = self
            .run(&RELEASE, &[key], token, None, None, prepared)
            .await?;
        Ok(int(&v)? == 1)
    }

    /// Compare-and-`PEXPIRE`: whether `key` held `token` and now has the ttl `ttl`.
    pub(crate) async fn extend_key(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<bool, NodeFailure> {
        let v = self
            .run(&EXTEND, &[key], token, Some(ttl_ms(ttl)), None, None)
            .await?;
        Ok(int(&v)? == 1)
    }

    /// The acquire script behind delayed-restart protection: a master whose dataset is
    /// younger than the longest ttl does not vote.
    async fn acquire_guarded(
        &self,
        guard: &RestartGuard,
        key: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<Value, NodeFailure> {
        if ttl > guard.max_ttl {
            return Err(NodeFailure::new(format!(
                "the ttl {ttl:?} exceeds the {:?} of delayed-restart protection; raise it",
                guard.max_ttl
            )));
        }
        let keys = [key, guard.key.as_str()];
        let max_ms = Some(ttl_ms(guard.max_ttl));
        let v = self
            .run(
                &ACQUIRE_GUARDED,
                &keys,
                token,
                Some(ttl_ms(ttl)),
                max_ms,
                None,
            )
            .await?;
        if int(&v)? == -4 {
            return Err(NodeFailure::new(format!(
                "dataset younger than {:?} (a restart, a flush, or the first use of \
                 protection): abstains (delayed-restart protection)",
                guard.max_ttl
            )));
        }
        Ok(v)
    }
}

/// Delayed-restart protection settings of one node.
#[derive(Debug, Clone)]
struct RestartGuard {
    max_ttl: Duration,
    /// The marker key: present while the master's dataset is known to be old enough.
    key: String,
}

async fn query(conn: &mut Conn, cmd: &Cmd) -> RedisResult<Value> {
    // The inherent methods: the `ConnectionLike` trait's boxes its future on every call
    // (measured in bench/benches/profile.rs: 0.79x -> 0.90x of the limit's throughput).
    let v = match conn {
        Conn::Manager(c) => c.send_packed_command(cmd).await?,
        Conn::Multiplexed(c) => c.send_packed_command(cmd).await?,
    };
    v.extract_error()
}

fn ttl_ms(ttl: Duration) -> u64 {
    // The client only passes whole-millisecond ttls of at least 1 ms.
    u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1)
}

fn int(v: &Value) -> Result<i64, NodeFailure> {
    match v {
        Value::Int(i) => Ok(*i),
        other => Err(NodeFailure::new(format!(
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

/// `EVALSHA sha …` or `EVAL source …` with the lock scripts' arguments, sized up front.
fn script_cmd(
    verb: &str,
    script: &str,
    keys: &[&str],
    token: &str,
    ttl_ms: Option<u64>,
    extra: Option<u64>,
) -> Cmd {
    let args = 4 + keys.len() + usize::from(ttl_ms.is_some()) + usize::from(extra.is_some());
    let data = verb.len()
        + script.len()
        + 2
        + keys.iter().map(|k| k.len()).sum::<usize>()
        + token.len()
        + 40;
    let mut cmd = Cmd::with_capacity(args, data);
    cmd.arg(verb)
        .arg(script)
        .arg(keys.len())
        .arg(keys)
        .arg(token)
        .arg(ttl_ms)
        .arg(extra);
    cmd
}

/// `scheme://user:password@host` → `scheme://***@host`, so URLs can go in error messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}***{}", &url[..s + 3], &url[at..]),
        _ => url.to_owned(),
    }
}

impl Node for RedisNode {
    fn name(&self) -> String {
        self.name.clone()
    }

    fn max_ttl(&self) -> Option<Duration> {
        self.guard.as_ref().map(|g| g.max_ttl)
    }

    fn acquire<'a>(
        &'a self,
        key: &'a str,
        token: &'a str,
        ttl: Duration,
    ) -> NodeFuture<'a, Acquire> {
        Box::pin(self.acquire_key(key, token, ttl, None))
    }

    fn release<'a>(&'a self, key: &'a str, token: &'a str) -> NodeFuture<'a, bool> {
        Box::pin(self.release_key(key, token, None))
    }

    fn extend<'a>(&'a self, key: &'a str, token: &'a str, ttl: Duration) -> NodeFuture<'a, bool> {
        Box::pin(self.extend_key(key, token, ttl))
    }

    fn acquire_unless_completed<'a>(
        &'a self,
        key: &'a str,
        record_key: &'a str,
        token: &'a str,
        ttl: Duration,
    ) -> NodeFuture<'a, Acquire> {
        Box::pin(self.acquire_unless_completed_key(key, record_key, token, ttl))
    }

    fn complete<'a>(
        &'a self,
        key: &'a str,
        record_key: &'a str,
        token: &'a str,
        record: &'a [u8],
        retention: Duration,
    ) -> NodeFuture<'a, bool> {
        Box::pin(self.complete_key(key, record_key, token, record, retention))
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
