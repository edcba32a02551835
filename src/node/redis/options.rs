//! A Redis voter's connection settings and its tenure protection (restarts, failovers).

use std::time::Duration;

use redis::aio::ConnectionManagerConfig;

/// See [`RedisNodeOptions::DEFAULT_FAILOVER_MAX_TTL`].
pub(crate) const DEFAULT_FAILOVER_MAX_TTL: Duration = Duration::from_secs(60);

/// Room for this many commands between the callers and a connection's writer (redis-rs defaults to
/// 50). A request waits for room before it is written. A request whose node timeout fires while it
/// waits is never sent at all. Under a flood (hundreds of requests in flight on one replica), a
/// release or a completion that is never written leaves its lock held for the rest of the ttl.
/// Under such a flood, acquires also time out against healthy masters. Written late, a release
/// or a completion still takes effect. The room is a bound, not an allocation: slots are
/// allocated as commands queue.
const PIPELINE_BUFFER: usize = 4096;

/// Connection settings of a [`RedisNode`](super::RedisNode).
///
/// The defaults suit masters on the same network. A connection connects within 1 s and reconnects
/// in the background with exponential backoff from 10 ms up to 1 s. It has no response timeout of
/// its own. The client's per-node timeout
/// ([`RedlockBuilder::node_timeout`](crate::RedlockBuilder::node_timeout), 50 ms by default)
/// already bounds every request. A second timer per request measurably costs throughput
/// (`bench/benches/profile.rs`). Set one with [`RedisNodeOptions::response_timeout`] when the node
/// is also used outside a [`Redlock`](crate::Redlock) client.
///
/// Tenure protection ([`restart_protection`](Self::restart_protection)) is off by default
/// for a plain master and a Cluster, and on for a Sentinel group (with
/// [`RedisNodeOptions::DEFAULT_FAILOVER_MAX_TTL`]): failovers are what a Sentinel group is for.
///
/// # What the masters must run
///
/// A lock voter's master must keep every key until its ttl: **`maxmemory-policy
/// noeviction`** (or no `maxmemory`). A Redis shared with a cache (`allkeys-*`, or
/// `volatile-*`: locks and completion records have a ttl) evicts them under memory pressure,
/// and a second holder or a second run follows. Every acquire, extension and completion reads the
/// master's policy (`INFO memory`) inside its script, atomically with its write, and is
/// refused on a master that may evict; the voter also checks it on first use, after every
/// reconnection and every 30 s, and **abstains** while the master may evict (see
/// [`allow_eviction`](Self::allow_eviction));
/// [`NodeStatus`](crate::NodeStatus) shows the policy. Completion records that must outlive
/// a restart also need persistence: `appendonly yes` with `appendfsync always` (or
/// `everysec`, losing up to a second of them).
///
/// ```text
/// # redis.conf of a lock voter
/// maxmemory-policy noeviction
/// appendonly yes
/// appendfsync always
/// ```
#[derive(Debug, Clone)]
#[must_use = "options do nothing until given to a node"]
pub struct RedisNodeOptions {
    pub(super) connect_timeout: Duration,
    pub(super) response_timeout: Option<Duration>,
    reconnect_min_delay: Duration,
    reconnect_max_delay: Duration,
    reconnect_retries: usize,
    protection: Protection,
    pub(super) allow_eviction: bool,
}

/// Whether a voter keeps a master of a new tenure out of the quorum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protection {
    /// The voter kind's default.
    Default,
    Off,
    On(Duration),
}

impl Default for RedisNodeOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(1),
            response_timeout: None,
            reconnect_min_delay: Duration::from_millis(10),
            reconnect_max_delay: Duration::from_secs(1),
            reconnect_retries: 3,
            protection: Protection::Default,
            allow_eviction: false,
        }
    }
}

impl RedisNodeOptions {
    /// The longest lock ttl a Sentinel voter accepts by default (60 s): its failover
    /// protection keeps a newly promoted master out of the quorum for this long (see
    /// [`restart_protection`](Self::restart_protection)). Twice the HTTP layer's default ttl.
    pub const DEFAULT_FAILOVER_MAX_TTL: Duration = DEFAULT_FAILOVER_MAX_TTL;

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

    /// Tenure protection (delayed restart, failover): the voter does not vote "free" while
    /// the master serving it has held its dataset for less than `max_ttl` (the longest ttl
    /// any client uses on it).
    ///
    /// A master that restarts without persistence forgets its keys. A replica promoted by a
    /// failover may lack the newest ones (replication is asynchronous). Say a lock it should hold
    /// is still valid on other voters. A second client could otherwise gain a quorum with the
    /// forgetful master's vote. With protection on, the acquire script itself checks two marker
    /// keys, in one atomic step, on the master's own clock. One says *which server process* (its
    /// `run_id`) knows the dataset, and since when. The other says since when *this replication
    /// history* (its `master_replid`, new at every promotion) is served as master. The clock starts
    /// again on a restart (with or without persistence), a flush, or a promoted replica (the
    /// markers it replicated name the old master). It also starts again when a former master is
    /// demoted, re-synced and promoted again (the same process, a new history). A master whose
    /// tenure is younger than `max_ttl` abstains (counts as failed). Locks the old master granted
    /// were granted before that, with ttls up to `max_ttl`. They are gone everywhere when it votes
    /// again (`tests/voters/tenure.rs`, `tests/voters/sentinel.rs`).
    ///
    /// The markers are a format: `tower-redlock:restart-guard:<ms>` holds `<run_id>:<ms>`
    /// (read and written the same way by every version of this crate), and
    /// `tower-redlock:restart-guard:<ms>:repl` holds `TRT2:<master_replid>:<ms>`, which
    /// versions before it neither read nor touch. During a rolling deploy neither starts
    /// the other's clock again; a
    /// master promoted again while only earlier versions lock on it is not detected by them.
    ///
    /// Trade-offs: after a restart, a failover, a `FLUSHALL`, or the first use of protection
    /// on a master, that voter is out of the quorum for `max_ttl`, so fewer failures are
    /// tolerated meanwhile; a client refuses locks with a ttl above `max_ttl` (an
    /// invalid-input error); each master keeps two marker keys per `max_ttl` (on a
    /// Cluster, two per hash slot in use — each slot's first lock starts its clock, so keep
    /// it off there unless you need it); each guarded acquire reads `INFO server` and `INFO
    /// replication` inside its script.
    ///
    /// On by default for [`RedisNode::sentinel`](super::RedisNode::sentinel) voters (with
    /// [`DEFAULT_FAILOVER_MAX_TTL`](Self::DEFAULT_FAILOVER_MAX_TTL)); [`no_protection`](Self::no_protection) turns it off.
    /// Needs Redis ≥ 5: the script writes after reading `TIME` and `INFO` (effects
    /// replication; older masters refuse such a script).
    pub fn restart_protection(mut self, max_ttl: Duration) -> Self {
        self.protection = Protection::On(max_ttl);
        self
    }

    /// No tenure protection, not even a Sentinel voter's default (see
    /// [`restart_protection`](Self::restart_protection)): a failover or a restart may then
    /// let a second client gain a quorum while the first still holds the lock.
    pub fn no_protection(mut self) -> Self {
        self.protection = Protection::Off;
        self
    }

    /// Lets the voter vote while its master may evict keys (a `maxmemory` with a policy
    /// other than `noeviction`). By default such a voter **abstains**: its acquires and
    /// extensions fail at once (a failed vote) with a message naming the policy, and
    /// [`NodeStatus::is_abstaining`](crate::NodeStatus::is_abstaining) says so.
    ///
    /// An evicting master can drop a lock before its ttl, and then a second client can gain a
    /// quorum while the first still holds its lease; it can drop a completion record, and
    /// then the work runs again (`tests/voters/eviction/mod.rs` shows both). Allow it only where
    /// that is acceptable (locks for efficiency, not correctness); the voter then logs a
    /// warning when it sees the policy. The right fix is on the master:
    /// `CONFIG SET maxmemory-policy noeviction`, or a Redis of its own for the locks.
    ///
    /// Every acquire, extension and completion reads the policy with `INFO memory` (usually allowed
    /// where `CONFIG` is not) inside its own script, atomically with its write. Say a master was
    /// made a cache a moment ago (`CONFIG SET maxmemory-policy allkeys-lru`). The very next
    /// acquire, extension or completion there is refused, and the voter abstains from then on. A
    /// lease granted before the change keeps its key there, exposed, until its next extension
    /// (refused) or its end. A completion record stored before it stays there for its retention.
    /// The voter also checks the policy for [`NodeStatus`](crate::NodeStatus) and to refuse without
    /// sending. It checks on first use, beside the first acquires, whose answers count only if it
    /// lets the voter vote. It checks after every reconnection and after a Sentinel failover. It
    /// also checks in the background when a request or a status read finds the last check older
    /// than 30 s. That age is a second while the voter abstains, or after a check that got no
    /// answer or an error reply. Meanwhile the last verdict stands. No round trip is added to a
    /// lock; an allowed voter's scripts skip the read. `maxmemory 0` means no eviction (on 64-bit
    /// builds; a 32-bit build reports its implicit 3 GB limit with `noeviction`). A master whose
    /// `INFO` is denied (an ACL without `+info`) votes unchecked, with a warning (its scripts
    /// cannot read the policy either). On a Cluster every master's policy counts: one that evicts
    /// makes the voter abstain. This is best effort. While a master does not answer, the policy is
    /// unknown and the voter votes; it is asked again every second.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), tower_redlock::Error> {
    /// use tower_redlock::{node::RedisNodeOptions, Redlock};
    ///
    /// // A cache, known to evict: its votes may be lost under memory pressure.
    /// let cache = RedisNodeOptions::new().allow_eviction();
    /// let redlock = Redlock::builder()
    ///     .redis("redis://10.0.0.1:6379")
    ///     .redis("redis://10.0.0.2:6379")
    ///     .redis_with("redis://10.0.0.3:6379", &cache)
    ///     .build()?;
    /// # Ok(()) }
    /// ```
    pub fn allow_eviction(mut self) -> Self {
        self.allow_eviction = true;
        self
    }

    /// How long one eviction check may take: it may have to connect first.
    pub(super) fn eviction_check_timeout(&self) -> Duration {
        self.connect_timeout.saturating_mul(2)
    }

    /// The redis-rs settings of a master's auto-reconnecting connection.
    pub(super) fn manager_config(&self) -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(self.response_timeout)
            .set_min_delay(self.reconnect_min_delay)
            .set_max_delay(self.reconnect_max_delay)
            .set_number_of_retries(self.reconnect_retries)
            .set_pipeline_buffer_size(PIPELINE_BUFFER)
    }

    /// The guard of a voter whose kind protects by default with `default` (or not: `None`).
    pub(super) fn guard(&self, default: Option<Duration>) -> Option<RestartGuard> {
        match self.protection {
            Protection::Default => default.map(RestartGuard::new),
            Protection::Off => None,
            Protection::On(max_ttl) => Some(RestartGuard::new(max_ttl)),
        }
    }
}

/// Tenure protection settings of one node.
#[derive(Debug, Clone)]
pub(super) struct RestartGuard {
    /// The longest ttl accepted.
    pub(super) max_ttl: Duration,
    /// How old a tenure must be to vote: `max_ttl`, plus what the voter kind needs on top
    /// (a Sentinel voter's majority window: an old master it was cut from may have granted
    /// or extended locks that long after the failover).
    pub(super) window: Duration,
    /// The marker key: which server process knows the dataset since when (`run_id:ms`, the
    /// first format; versions of this crate before the second marker read only this one).
    pub(super) key: String,
    /// The second marker key: since when this dataset's replication history is served as
    /// master (`TRT2:master_replid:ms`).
    pub(super) repl_key: String,
}

impl RestartGuard {
    /// Refuses a ttl longer than the protection window (the client refuses it up front too).
    pub(super) fn check(&self, ttl: Duration) -> Result<(), crate::node::CallError> {
        if ttl > self.max_ttl {
            return Err(crate::node::CallError::new(format!(
                "the ttl {ttl:?} exceeds the {:?} of delayed-restart protection; raise it",
                self.max_ttl
            )));
        }
        Ok(())
    }

    fn new(max_ttl: Duration) -> Self {
        let key = format!("tower-redlock:restart-guard:{}", max_ttl.as_millis());
        Self {
            max_ttl,
            window: max_ttl,
            repl_key: format!("{key}:repl"),
            key,
        }
    }

    /// The same, voting only once the tenure is `extra` older.
    pub(super) fn widened(mut self, extra: Duration) -> Self {
        self.window = self.max_ttl.saturating_add(extra);
        self
    }
}
