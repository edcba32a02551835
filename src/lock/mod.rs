//! The Redlock algorithm: quorum locks over N independent nodes. The client,
//! [`Redlock`], knows nothing of HTTP; its public items are re-exported at the crate root,
//! whose documentation describes how a lock is taken.

use std::sync::Arc;
use std::time::Duration;

pub(crate) use self::acquire::record_key;
pub(crate) use self::call::Voter;
pub(crate) use self::fencing::fence_key;
pub(crate) use self::options::check_resource;
use self::options::Config;
pub(crate) use self::state::Loss;
pub(crate) use self::telemetry::{hashed, KeyHash};
use crate::error::Error;
use crate::node::MemoryNode;

// The files of the lock core, bottom-up: each imports only files listed before it (this
// file, the client, sits on top).
//
// Leaves, importing no other lock module: the fencing token, a node's health, the settings,
// telemetry, the lock token, the waiters woken on release.
mod fencing;
mod health;
mod options;
mod telemetry;
mod token;
mod wake;
// What a node is owed: the releases and completions it missed.
mod owed;
// A voter, and one call to it (timeout, stall excuses, probes, paying what it is owed).
mod call;
// The completion records a replay acquire found, and the one answer they make.
mod records;
// Fan-out to every voter, and the vote count with its early decision.
mod tally;
// What a lease and its handles share.
mod state;
// The held lock.
mod lease;
// The verbs. Releasing a lease (or a failed try's token), retried.
mod release;
// Extending a lease, on demand or kept alive.
mod extend;
// Taking a lock: the lock loop, one try, the replay acquire.
mod acquire;
// Idempotent work: locking unless completed, and completing.
mod completion;
// The client's builder, and work run under a lock.
mod builder;
mod critical_section;

#[cfg(test)]
mod tests;

pub use self::acquire::LockOrRecord;
pub use self::builder::RedlockBuilder;
pub use self::critical_section::CriticalSection;
pub use self::health::NodeStatus;
pub use self::lease::{Lease, LeaseHandle};
pub use self::options::Retry;

/// A Redlock client: locks resources on a quorum of independent nodes.
///
/// Cheap to clone (an `Arc` inside) and `Send + Sync`: build one at start-up and share it
/// with every task. See the [crate docs](crate#how-a-lock-is-taken) for the algorithm.
#[derive(Clone)]
pub struct Redlock {
    inner: Arc<Inner>,
}

struct Inner {
    nodes: Vec<Arc<Voter>>,
    /// The voters' names, shared with every lock error (see [`Error::votes`]).
    names: Arc<[Arc<str>]>,
    quorum: usize,
    config: Config,
    /// The waiters woken on release, when the client wakes them
    /// ([`RedlockBuilder::wake_waiters`]).
    wakes: Option<wake::Wakes>,
}

impl std::fmt::Debug for Redlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redlock")
            .field(
                "nodes",
                &self.inner.nodes.iter().map(|v| &v.name).collect::<Vec<_>>(),
            )
            .field("quorum", &self.inner.quorum)
            .field("config", &self.inner.config)
            .finish()
    }
}

impl Redlock {
    /// The longest resource name, in bytes (and the longest key prefix).
    pub const MAX_RESOURCE_LEN: usize = 1024;

    /// A client for the Redis voters at `urls`, with the default settings: masters
    /// (`redis://…`), Sentinel groups (`redis+sentinel://…`) and Clusters
    /// (`redis+cluster://…`, feature `cluster`), see [`RedisNode::open`](crate::node::RedisNode::open).
    ///
    /// Connections are made lazily in the background, so this succeeds while masters are
    /// down; it fails only on a malformed URL or an empty list. Must be called inside a
    /// Tokio runtime.
    ///
    /// # Errors
    ///
    /// [`Error::is_invalid_input`](crate::Error::is_invalid_input): a URL that does not parse,
    /// no URL, or no Tokio runtime.
    pub fn new<I, S>(urls: I) -> crate::Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        urls.into_iter()
            .fold(Self::builder(), |b, url| b.redis(url.as_ref()))
            .build()
    }

    /// A client with one fresh in-process [`MemoryNode`]: mutual exclusion within this
    /// process only.
    ///
    /// # Panics
    ///
    /// Never in practice: one node with the default settings is a valid client (the `expect`
    /// states it).
    pub fn in_memory() -> Self {
        Self::builder()
            .node(MemoryNode::new())
            .build()
            .expect("the default configuration with one node is valid")
    }

    /// Starts building a client.
    pub fn builder() -> RedlockBuilder {
        RedlockBuilder::default()
    }

    /// How many nodes must agree: `N/2 + 1`.
    pub fn quorum(&self) -> usize {
        self.inner.quorum
    }

    /// Whether leases carry fencing tokens ([`RedlockBuilder::fencing`]).
    pub fn fencing_enabled(&self) -> bool {
        self.inner.config.fencing
    }

    /// How many nodes vote.
    pub fn node_count(&self) -> usize {
        self.inner.nodes.len()
    }

    /// Each node's state, in the order the nodes were added: its name, whether it is
    /// suspended after repeated timeouts (see [`RedlockBuilder::suspend_after`]), its
    /// timeouts in a row, and a Redis master's eviction policy (whether it abstains for it,
    /// see [`RedisNodeOptions::allow_eviction`](crate::node::RedisNodeOptions::allow_eviction)).
    /// For health checks: a client with fewer than [`Redlock::quorum`] nodes neither
    /// suspended nor abstaining cannot lock.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let redlock = tower_redlock::Redlock::in_memory();
    /// let status = redlock.node_status();
    /// assert_eq!(status[0].name(), "memory");
    /// assert!(!status[0].is_suspended());
    /// assert!(!status[0].is_abstaining());
    /// assert_eq!(status[0].eviction_policy(), None, "not a Redis master");
    /// # }
    /// ```
    pub fn node_status(&self) -> Vec<NodeStatus> {
        self.inner
            .nodes
            .iter()
            .map(|v| NodeStatus {
                name: v.name.to_string(),
                suspended: v.health.is_suspended(),
                timeouts: v.health.timeouts(),
                eviction: v.node.eviction(),
            })
            .collect()
    }

    /// The Redis key of `resource`: the client's [key
    /// prefix](crate::RedlockBuilder::key_prefix) and the resource. A lock's fencing counter
    /// and completion record sit beside it (`<key>:fence`, `<key>:record`; on a Redis Cluster
    /// in the key's hash slot).
    ///
    /// ```
    /// use tower_redlock::{node::MemoryNode, Redlock};
    ///
    /// let redlock = Redlock::builder().node(MemoryNode::new()).key_prefix("redlock:").build().unwrap();
    /// assert_eq!(redlock.redis_key("invoice:7"), "redlock:invoice:7");
    /// ```
    pub fn redis_key(&self, resource: &str) -> String {
        format!("{}{resource}", self.inner.config.key_prefix)
    }

    /// How `resource`'s Redis key appears in logs: its short hash, as on the lock's spans.
    pub(crate) fn key_hash<'a>(&'a self, resource: &'a str) -> KeyHash<'a> {
        telemetry::hashed_in(&self.inner.config.key_prefix, resource)
    }

    /// Checks that `ttl` is usable with this client's drift allowance.
    pub(crate) fn check_ttl(&self, ttl: Duration) -> crate::Result<Duration> {
        self.inner.config.check_ttl(ttl)
    }

    /// The retry policy [`Redlock::lock`] uses.
    pub fn default_retry(&self) -> Retry {
        self.inner.config.retry
    }

    /// Locks `resource` for `ttl`, retrying with the client's retry policy while it is
    /// contended or unavailable.
    ///
    /// On success the [`Lease`] holds the token and the validity.
    ///
    /// # Errors
    ///
    /// - [`Error::is_contended`]: another holder has the resource (with [`Error::held_by`]
    ///   and [`Error::retry_after`]), after the last try.
    /// - [`Error::is_unavailable`]: too few voters answered for a quorum (each voter's answer
    ///   in [`Error::votes`]).
    /// - [`Error::is_invalid_input`]: an empty or too long resource, a ttl of zero or longer
    ///   than a voter takes.
    ///
    /// After a failed try nothing of ours is left locked.
    pub async fn lock(&self, resource: &str, ttl: Duration) -> crate::Result<Lease> {
        self.lock_with(resource, ttl, self.inner.config.retry).await
    }

    /// Tries once to lock `resource` for `ttl`, without retrying.
    ///
    /// # Errors
    ///
    /// As [`Redlock::lock`], after its one try.
    pub async fn try_lock(&self, resource: &str, ttl: Duration) -> crate::Result<Lease> {
        self.lock_with(resource, ttl, Retry::never()).await
    }

    /// Locks `resource` for `ttl` with an explicit retry policy.
    ///
    /// # Errors
    ///
    /// As [`Redlock::lock`], once `retry` gives up.
    pub async fn lock_with(
        &self,
        resource: &str,
        ttl: Duration,
        retry: Retry,
    ) -> crate::Result<Lease> {
        match self.lock_inner(resource, ttl, retry, false).await? {
            LockOrRecord::Locked(lease) => Ok(lease),
            // A plain acquire counts a record as "held" (see `try_once`, `acquire/`): never here.
            LockOrRecord::Completed(_) | LockOrRecord::OutcomeUnknown => {
                Err(Error::invalid("a plain lock answered with a record"))
            }
        }
    }

    /// Runs work while holding the lock on `resource`, and always releases it: on success,
    /// on an error value, and when the returned future is dropped (cancellation; the release
    /// is then spawned in the background) — the Rust form of the Ruby gem's `lock!`: if the
    /// lock cannot be taken (with the client's retry policy, or
    /// [`CriticalSection::retry`]), the work does not run and the error is returned. The
    /// work gets a [`LeaseHandle`] to check the validity; auto-extension and abort-on-loss
    /// are options.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_redlock::Error> {
    /// use std::time::Duration;
    /// use tower_redlock::Redlock;
    ///
    /// let redlock = Redlock::in_memory();
    /// let done = redlock
    ///     .critical_section("nightly-export", Duration::from_secs(1))
    ///     .keep_alive() // extended about every 333 ms while the work runs
    ///     .abort_on_loss() // if the lock is lost, stop the work and return an error
    ///     .run(|lease| async move {
    ///         tokio::time::sleep(Duration::from_millis(1500)).await; // outlives the ttl
    ///         lease.extension_count()
    ///     })
    ///     .await?;
    /// assert!(done >= 1);
    /// # Ok(()) }
    /// ```
    #[doc(alias = "with_lock")]
    pub fn critical_section<'a>(&'a self, resource: &'a str, ttl: Duration) -> CriticalSection<'a> {
        CriticalSection::new(self, resource, ttl, self.inner.config.retry)
    }
}

// What the operator's calls (`crate::operate`) read of a client: they ask every voter.
impl Redlock {
    /// The voters, in the order of the names in every error.
    pub(crate) fn voters(&self) -> &[Arc<Voter>] {
        &self.inner.nodes
    }

    /// The bound on one call to one voter.
    pub(crate) fn node_timeout(&self) -> Duration {
        self.inner.config.node_timeout
    }
}
