//! The Redlock algorithm: quorum locks over N independent nodes.
//!
//! [`Redlock`] is the client. It knows nothing of HTTP: the middleware in this crate is
//! built on it, and it is as useful on its own (cron jobs, queue consumers, migrations).
//!
//! # How a lock is taken
//!
//! 1. A fresh token (128 random bits) is sent to **all** nodes **in parallel** as
//!    `SET key token NX PX ttl`, each request bounded by the per-node timeout.
//! 2. Votes are counted as they arrive; the outcome is decided as soon as it is certain
//!    (a quorum of `N/2 + 1` said yes, or too few nodes are left to reach it).
//! 3. The validity is `ttl − elapsed − drift`, with `drift = ttl · 0.01 + 2 ms` and the
//!    elapsed time on the monotonic clock. The lock counts only with a quorum **and** a
//!    validity above zero.
//! 4. Otherwise whatever was taken is released on every node that may hold it, and — for
//!    [`Redlock::lock`] — the client waits a random delay and tries again, a bounded number
//!    of times.
//!
//! Release and extension are compare-and-delete and compare-and-`PEXPIRE` scripts: only the
//! token's owner can release or extend, and an expired lock is never re-created.
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_redlock::Error> {
//! use std::time::Duration;
//! use tower_redlock::Redlock;
//!
//! let redlock = Redlock::in_memory(); // or Redlock::new(["redis://127.0.0.1:7777", …])?
//! let total = redlock
//!     .with_lock("ledger:42", Duration::from_secs(5), |lease| async move {
//!         // only one holder of "ledger:42" runs this at a time
//!         assert!(!lease.is_lost());
//!         40 + 2
//!     })
//!     .await?;
//! assert_eq!(total, 42);
//! # Ok(()) }
//! ```

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use self::health::Health;
use self::lease::{LeaseState, Token};
use self::options::Config;
use self::quorum::{Skip, Vote, Voter};
use self::release::Release;
use crate::error::Error;
use crate::node::{Acquire, AnyNode, MemoryNode, Node, RedisNode, RedisNodeOptions};

mod health;
mod lease;
mod options;
mod quorum;
mod release;
pub(crate) mod scripts;

pub use self::health::NodeStatus;
pub use self::lease::{Lease, LeaseHandle};
pub use self::options::{Retry, MAX_RESOURCE_LEN};

/// A Redlock client: locks resources on a quorum of independent nodes.
///
/// Cheap to clone (an `Arc` inside) and `Send + Sync`: build one at start-up and share it
/// with every task. See the [module docs](crate::lock) for the algorithm.
#[derive(Clone)]
pub struct Redlock {
    inner: Arc<Inner>,
}

struct Inner {
    nodes: Vec<Arc<Voter>>,
    quorum: usize,
    config: Config,
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

/// Builds a [`Redlock`] client: its nodes and tunables.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_redlock::Error> {
/// use std::time::Duration;
/// use tower_redlock::{Redlock, Retry};
///
/// let redlock = Redlock::builder()
///     .redis("redis://127.0.0.1:7777")
///     .redis("redis://127.0.0.1:7778")
///     .redis("redis://127.0.0.1:7779")
///     .node_timeout(Duration::from_millis(20))
///     .retry(Retry::times(5).delay(Duration::from_millis(100)))
///     .key_prefix("redlock:")
///     .build()?; // connects lazily, in the background
/// assert_eq!(redlock.quorum(), 2);
/// # Ok(()) }
/// ```
#[derive(Default)]
pub struct RedlockBuilder {
    nodes: Vec<AnyNode>,
    problems: Vec<String>,
    config: Config,
}

impl std::fmt::Debug for RedlockBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedlockBuilder")
            .field("nodes", &self.nodes)
            .field("config", &self.config)
            .finish()
    }
}

impl RedlockBuilder {
    /// Adds a node.
    pub fn node(mut self, node: impl Node) -> Self {
        self.nodes.push(AnyNode::new(node));
        self
    }

    /// Adds a Redis master by URL (see [`RedisNode::open`]). A bad URL is reported by
    /// [`RedlockBuilder::build`].
    pub fn redis(self, url: &str) -> Self {
        self.redis_with(url, &RedisNodeOptions::default())
    }

    /// Adds a Redis master by URL with explicit connection settings (see
    /// [`RedisNode::open_with`]), e.g. delayed-restart protection.
    pub fn redis_with(mut self, url: &str, options: &RedisNodeOptions) -> Self {
        match RedisNode::open_with(url, options) {
            Ok(node) => self.nodes.push(AnyNode::Redis(node)),
            Err(e) => self.problems.push(e.to_string()),
        }
        self
    }

    /// The longest a single node may take to answer one request (default 50 ms). Keep it
    /// well below your ttls: a node that does not answer in time counts as failed.
    ///
    /// The time is the node's, not this process's: when a request's timer fires late (a
    /// blocked or CPU-starved runtime), the request gets that time back — up to four node
    /// timeouts in all, a hundred while the node keeps answering other requests — before it
    /// may time out, so an answer that sat unread meanwhile still counts.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.config.node_timeout = timeout;
        self
    }

    /// The retry policy of [`Redlock::lock`] (default: [`Retry::default`], 3 retries of
    /// 200 ms + up to 50 ms jitter).
    pub fn retry(mut self, retry: Retry) -> Self {
        self.config.retry = retry;
        self
    }

    /// The clock drift factor (default 0.01): the validity is shortened by `ttl · factor +
    /// 2 ms`. Must be in `0.0..1.0`.
    pub fn drift_factor(mut self, factor: f64) -> Self {
        self.config.drift_factor = factor;
        self
    }

    /// A prefix for every Redis key (default none: the key is the resource name, as the
    /// Ruby, Node and Go clients do, so their locks and ours exclude each other). Set it to
    /// interoperate with clients that prefix, e.g. `"redlock:"`.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.config.key_prefix = prefix.into();
        self
    }

    /// The most times one lease may be extended (default 100), so that a runaway holder
    /// cannot keep a lock forever.
    pub fn max_extensions(mut self, max: u32) -> Self {
        self.config.max_extensions = max;
        self
    }

    /// Suspend a node after this many timeouts in a row (default 3; 0 never suspends) that
    /// span at least one node timeout without a single answer from it.
    ///
    /// A suspended node is not asked to lock or extend: it counts as a failed vote at once,
    /// as its timeout would have, so a dead or partitioned master costs a lock no wait. A
    /// burst of requests that timed out together (queued behind this process's own work)
    /// does not suspend a master that answers: its next answer ends the streak. A suspended
    /// node gets a probe of its own (a no-op compare-and-delete) after 100 ms, then every
    /// 200 ms; its first answer restores the node, so a master that is back votes again
    /// within about 200 ms. Releases are always sent. [`Redlock::node_status`] shows which
    /// nodes are suspended.
    pub fn suspend_after(mut self, timeouts: u32) -> Self {
        self.config.suspend_after = timeouts;
        self
    }

    /// Builds the client, or says what to fix.
    pub fn build(self) -> crate::Result<Redlock> {
        if let Some(p) = self.problems.into_iter().next() {
            return Err(Error::invalid(p));
        }
        if self.nodes.is_empty() {
            return Err(Error::invalid(
                "a Redlock client needs at least one node: add Redis masters with \
                 `.redis(url)` or nodes with `.node(..)`",
            ));
        }
        if self.nodes.len() > quorum::MAX_NODES {
            return Err(Error::invalid(format!(
                "a Redlock client supports at most {} nodes, not {}",
                quorum::MAX_NODES,
                self.nodes.len()
            )));
        }
        let c = &self.config;
        if c.node_timeout.is_zero() || c.node_timeout > Duration::from_secs(60) {
            return Err(Error::invalid(
                "the node timeout must be greater than zero and at most 60 s",
            ));
        }
        if !(c.drift_factor.is_finite() && (0.0..1.0).contains(&c.drift_factor)) {
            return Err(Error::invalid(format!(
                "the drift factor must be in 0.0..1.0, not {}",
                c.drift_factor
            )));
        }
        if c.key_prefix.len() > MAX_RESOURCE_LEN {
            return Err(Error::invalid(format!(
                "the key prefix is longer than {MAX_RESOURCE_LEN} bytes"
            )));
        }
        let mut config = self.config;
        config.max_ttl = self.nodes.iter().filter_map(|n| n.max_ttl()).min();
        let nodes = self
            .nodes
            .into_iter()
            .map(|node| {
                Arc::new(Voter {
                    name: node.name().into(),
                    node,
                    health: Health::new(config.suspend_after, config.node_timeout),
                })
            })
            .collect::<Vec<_>>();
        Ok(Redlock {
            inner: Arc::new(Inner {
                quorum: quorum::quorum(nodes.len()),
                nodes,
                config,
            }),
        })
    }
}

impl Redlock {
    /// A client for the Redis masters at `urls`, with the default settings.
    ///
    /// Connections are made lazily in the background, so this succeeds while masters are
    /// down; it fails only on a malformed URL or an empty list. Must be called inside a
    /// Tokio runtime.
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

    /// How many nodes vote.
    pub fn node_count(&self) -> usize {
        self.inner.nodes.len()
    }

    /// Each node's state, in the order the nodes were added: its name, whether it is
    /// suspended after repeated timeouts (see [`RedlockBuilder::suspend_after`]), and its
    /// timeouts in a row. For health checks: a client with fewer than
    /// [`Redlock::quorum`] nodes not suspended cannot lock.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let redlock = tower_redlock::Redlock::in_memory();
    /// let status = redlock.node_status();
    /// assert_eq!(status[0].name(), "memory");
    /// assert!(!status[0].is_suspended());
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
            })
            .collect()
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
    /// On success the [`Lease`] holds the token and the validity. On failure the error
    /// says whether the resource is held by someone else ([`Error::is_contended`], with
    /// [`Error::held_by`] and [`Error::retry_after`]), the quorum was unreachable
    /// ([`Error::is_unavailable`], with each node's error), or the input was bad
    /// ([`Error::is_invalid_input`]). After a failed try nothing of ours is left locked.
    pub async fn lock(&self, resource: &str, ttl: Duration) -> crate::Result<Lease> {
        self.lock_with(resource, ttl, self.inner.config.retry).await
    }

    /// Tries once to lock `resource` for `ttl`, without retrying.
    pub async fn try_lock(&self, resource: &str, ttl: Duration) -> crate::Result<Lease> {
        self.lock_with(resource, ttl, Retry::never()).await
    }

    /// Locks `resource` for `ttl` with an explicit retry policy.
    pub async fn lock_with(
        &self,
        resource: &str,
        ttl: Duration,
        retry: Retry,
    ) -> crate::Result<Lease> {
        options::check_resource(resource)?;
        let ttl = self.inner.config.check_ttl(ttl)?;
        let prefix = &self.inner.config.key_prefix;
        let key: Arc<str> = if prefix.is_empty() {
            resource.into()
        } else {
            format!("{prefix}{resource}").into()
        };

        let started = Instant::now();
        let deadline = retry.max_wait().and_then(|w| started.checked_add(w));
        let mut attempt = 0u32;
        loop {
            attempt = attempt.saturating_add(1);
            // A try decided without I/O (every node suspended, in-process nodes) must still
            // let other tasks run: a loop of tries would otherwise starve its runtime.
            tokio::task::consume_budget().await;
            let token = Token::new();
            match self.try_once(&key, token, ttl).await {
                Ok(Granted { deadline, holders }) => {
                    tracing::debug!(resource, attempt, elapsed = ?started.elapsed(), "lock acquired");
                    let state = LeaseState::new(key, prefix.len(), token, ttl, deadline, holders);
                    return Ok(Lease::new(self.clone(), state));
                }
                Err(e) => {
                    let pause = retry.next_delay();
                    // A try takes at most two node timeouts: the requests, then the releases
                    // of a failed try.
                    let more = attempt <= retry.retry_count()
                        && Retry::fits(
                            deadline,
                            pause,
                            self.inner.config.node_timeout.saturating_mul(2),
                        );
                    if !more {
                        let e = self.ask_holder_ttl(&key, e).await;
                        tracing::debug!(resource, attempt, contended = e.is_contended(), error = %e, "lock not acquired");
                        return Err(e.with_attempts(attempt));
                    }
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }

    /// One try: returns the grant, or an error after releasing what it took.
    ///
    /// At the decision, the requests still unanswered are dropped: one never polled was never
    /// sent, and one already handed to its node's connection is followed there, in order, by
    /// any release sent later — so no SET of ours can land after our release (the `Node`
    /// contract), and nothing is left running once the outcome is known.
    async fn try_once(
        &self,
        key: &Arc<str>,
        token: Token,
        ttl: Duration,
    ) -> crate::Result<Granted> {
        let inner = &*self.inner;
        let n = inner.nodes.len();
        let timeout = inner.config.node_timeout;
        let start = Instant::now();
        // If this future is dropped from here on (a cancelled caller), the guard releases
        // the token everywhere in the background — after the requests, dropped first.
        let deadline = start + ttl - inner.config.drift(ttl);
        let guard = CancelGuard {
            client: Some(self.clone()),
            key: key.clone(),
            token,
            deadline,
        };
        // The `SET`, packed once for every Redis master.
        let set = (inner.nodes.iter().any(|v| v.node.uses_prepared(true)))
            .then(|| Arc::new(RedisNode::set_cmd(key, token.as_str(), ttl)));
        let mut sent = quorum::send(
            &inner.nodes,
            quorum::all(n),
            timeout,
            Skip::Suspended,
            &|node| node.acquire_now(key, token.as_str(), ttl),
            |v| {
                let (key, set) = (key.clone(), set.clone());
                async move {
                    v.node
                        .acquire(&key, token.as_str(), ttl, set.as_deref())
                        .await
                }
            },
        );
        let mut tally = quorum::count(&mut sent, n, inner.quorum, |a| match a {
            Acquire::Acquired => Vote::For,
            Acquire::Held { remaining } => Vote::Against(remaining),
        })
        .await;
        // The answers that came meanwhile need no release if they hold nothing of ours.
        quorum::drain_ready(&mut sent, |(i, answer)| {
            tally.answered |= 1 << i;
            match answer {
                Ok(Acquire::Acquired) => tally.for_mask |= 1 << i,
                Ok(Acquire::Held { remaining }) => tally.held(i, remaining),
                Err(e) => tally.errors.push(e),
            }
        });
        let holders = (tally.answered & !tally.not_ours) | sent.started();
        drop(sent);
        guard.disarm();
        if tally.for_ >= inner.quorum && Instant::now() < deadline {
            return Ok(Granted { deadline, holders });
        }

        // Failed: release on every node that may hold our token. Wait one round for the
        // nodes that voted for (they answered quickly), so that nothing of ours outlives this
        // try; the others, and any retry, go on in the background while the lock could be
        // valid — a try never waits longer than its node timeouts.
        if holders != 0 {
            let release = Release {
                key: key.clone(),
                token,
                mask: holders,
                needed: (tally.for_mask & holders).count_ones() as usize,
                patience: Instant::now(),
                until: deadline,
            };
            let _ = self.release_token(release).await;
        }
        let err = if tally.for_ >= inner.quorum {
            Error::unavailable(
                format!(
                    "a quorum answered, but too slowly to leave any validity of the {ttl:?} ttl"
                ),
                tally.errors,
            )
        } else if tally.against > 0 {
            // Any "held" answer makes it contended: the rule is stated on `Error`.
            let holder = tally.not_ours & !tally.error_mask();
            Error::contended(
                tally.against,
                tally.for_,
                n,
                tally.min_remaining,
                tally.errors,
            )
            .with_holder(holder.trailing_zeros() as usize)
        } else {
            Error::unavailable(
                format!(
                    "could not reach a quorum of {} of {n} nodes, and none said held",
                    inner.quorum
                ),
                tally.errors,
            )
        };
        Err(err)
    }

    /// Completes a contended error that is about to be returned with the holder's remaining
    /// ttl, asked from one node that said "held" (bounded by the node timeout), when no node
    /// reported it with its answer. Asked once per returned error, not on every try.
    async fn ask_holder_ttl(&self, key: &str, mut e: Error) -> Error {
        let Some(i) = e.holder_to_ask() else {
            return e;
        };
        let Some(voter) = self.inner.nodes.get(i) else {
            return e;
        };
        let Some(ask) = voter.node.remaining_ttl(key) else {
            return e;
        };
        if let Ok(Ok(Some(remaining))) =
            tokio::time::timeout(self.inner.config.node_timeout, ask).await
        {
            e.set_retry_after(remaining);
        }
        e
    }

    /// Extends `lease` to `ttl` from now, on a quorum of nodes (compare-and-`PEXPIRE`).
    ///
    /// Fails with [`Error::is_lost`] when the lease's validity is already over or the
    /// nodes no longer carry its token (an expired lock is never re-created), with
    /// [`Error::is_extension_limit`] at the extension cap, and with
    /// [`Error::is_unavailable`] when too few nodes answered — the lease then keeps its
    /// previous validity.
    pub async fn extend(&self, lease: &Lease, ttl: Duration) -> crate::Result<()> {
        lease.extend(ttl).await
    }

    pub(crate) async fn extend_state(
        &self,
        state: &LeaseState,
        ttl: Duration,
    ) -> crate::Result<()> {
        let inner = &*self.inner;
        let ttl = inner.config.check_ttl(ttl)?;
        if !state.is_valid() {
            return Err(Error::lost(
                "the lease expired or was released; it cannot be extended",
            ));
        }
        if state.extensions() >= inner.config.max_extensions {
            return Err(Error::extension_limit(inner.config.max_extensions));
        }
        let start = Instant::now();
        let n = inner.nodes.len();
        let (key, token) = (state.key_arc(), state.token_copy());
        let mut sent = quorum::send(
            &inner.nodes,
            quorum::all(n),
            inner.config.node_timeout,
            Skip::Suspended,
            &|node| node.extend_now(&key, token.as_str(), ttl),
            |v| {
                let key = key.clone();
                async move { v.node.extend(&key, token.as_str(), ttl).await }
            },
        );
        let tally = quorum::count(&mut sent, n, inner.quorum, |ok| {
            if ok {
                Vote::For
            } else {
                Vote::Against(None)
            }
        })
        .await;
        quorum::finish_in_background(sent);
        let deadline = start + ttl - inner.config.drift(ttl);
        if tally.for_ >= inner.quorum && Instant::now() < deadline {
            state.extended(deadline);
            return Ok(());
        }
        if n - tally.against < inner.quorum {
            state.end();
            return Err(Error::lost(format!(
                "{} of {n} nodes no longer hold the lease's token",
                tally.against
            )));
        }
        Err(Error::unavailable(
            format!(
                "could not extend on a quorum of {} of {n} nodes",
                inner.quorum
            ),
            tally.errors,
        ))
    }

    /// Releases `lease` on every node. The same as [`Lease::release`].
    pub async fn unlock(&self, lease: Lease) -> crate::Result<()> {
        lease.release().await
    }

    pub(crate) async fn release_state(&self, state: &LeaseState) -> crate::Result<()> {
        let n = self.inner.nodes.len();
        // The nodes that hold none of our tokens need no release, and count as released: a
        // quorum of released-or-never-ours nodes means the lock can no longer be held.
        let holders = state.holders() & quorum::all(n);
        if holders == 0 {
            return Ok(());
        }
        let not_ours = n - holders.count_ones() as usize;
        let release = Release {
            key: state.key_arc(),
            token: state.token_copy(),
            mask: holders,
            needed: self.inner.quorum.saturating_sub(not_ours).max(1),
            patience: self.patience(state.deadline()),
            until: state.deadline(),
        };
        self.release_token(release).await
    }

    /// Runs `work` while holding the lock on `resource`, and always releases it: on
    /// success, on error, and when the returned future is dropped (cancellation; the release
    /// is then spawned in the background).
    ///
    /// The lock is taken with the client's retry policy; if it cannot be taken, `work` does
    /// not run and the error is returned — the Rust form of the Ruby gem's `lock!`. `work`
    /// gets a [`LeaseHandle`] to check the validity. For auto-extension and abort on loss,
    /// see [`Redlock::scope`].
    pub async fn with_lock<F, Fut, T>(
        &self,
        resource: &str,
        ttl: Duration,
        work: F,
    ) -> crate::Result<T>
    where
        F: FnOnce(LeaseHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        self.scope(resource, ttl).run(work).await
    }

    /// A configurable scoped lock: like [`Redlock::with_lock`], with auto-extension,
    /// abort-on-loss and an explicit retry policy.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_redlock::Error> {
    /// use std::time::Duration;
    /// use tower_redlock::Redlock;
    ///
    /// let redlock = Redlock::in_memory();
    /// let done = redlock
    ///     .scope("nightly-export", Duration::from_millis(300))
    ///     .keep_alive() // extended about every 100 ms while the work runs
    ///     .abort_on_loss() // if the lock is lost, stop the work and return an error
    ///     .run(|lease| async move {
    ///         tokio::time::sleep(Duration::from_millis(500)).await; // outlives the ttl
    ///         lease.extensions()
    ///     })
    ///     .await?;
    /// assert!(done >= 1);
    /// # Ok(()) }
    /// ```
    pub fn scope<'a>(&'a self, resource: &'a str, ttl: Duration) -> Scope<'a> {
        Scope {
            client: self,
            resource,
            ttl,
            retry: self.inner.config.retry,
            keep_alive: false,
            abort_on_loss: false,
        }
    }
}

/// A successful try.
struct Granted {
    /// The end of the validity.
    deadline: Instant,
    /// The nodes that may hold our token.
    holders: u64,
}

/// Releases a try's token on every node when the try is cancelled mid-flight (its future
/// dropped): requests already handed to a connection are followed by the release on the
/// same connection; requests not yet handed over are never sent.
struct CancelGuard {
    client: Option<Redlock>,
    key: Arc<str>,
    token: Token,
    /// The end of the try's validity: no retry of the release after it.
    deadline: Instant,
}

impl CancelGuard {
    fn disarm(mut self) {
        self.client = None;
    }
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else {
            return;
        };
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (key, token, deadline) = (self.key.clone(), self.token, self.deadline);
        rt.spawn(async move {
            let inner = &*client.inner;
            let all = quorum::all(inner.nodes.len());
            // Every node may hold it; a quorum released means it is no longer ours.
            let release = Release {
                key,
                token,
                mask: all,
                needed: inner.quorum,
                patience: client.patience(deadline),
                until: deadline,
            };
            let _ = client.release_token(release).await;
        });
    }
}

/// A scoped lock being configured; see [`Redlock::scope`].
#[derive(Debug)]
#[must_use = "a scope does nothing until `.run(work)` is awaited"]
pub struct Scope<'a> {
    client: &'a Redlock,
    resource: &'a str,
    ttl: Duration,
    retry: Retry,
    keep_alive: bool,
    abort_on_loss: bool,
}

impl Scope<'_> {
    /// Keeps the lock alive while the work runs (see [`Lease::keep_alive`]).
    pub fn keep_alive(mut self) -> Self {
        self.keep_alive = true;
        self
    }

    /// Stops the work (drops its future) as soon as the lock is lost, and returns an error
    /// for which [`Error::is_lost`] is true.
    pub fn abort_on_loss(mut self) -> Self {
        self.abort_on_loss = true;
        self
    }

    /// The retry policy for taking the lock.
    pub fn retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }

    /// Takes the lock, runs `work`, and releases the lock.
    pub async fn run<F, Fut, T>(self, work: F) -> crate::Result<T>
    where
        F: FnOnce(LeaseHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        let mut lease = self
            .client
            .lock_with(self.resource, self.ttl, self.retry)
            .await?;
        if self.keep_alive {
            lease.keep_alive();
        }
        let handle = lease.handle();
        let out = if self.abort_on_loss {
            let watch = lease.handle();
            tokio::select! {
                biased;
                out = work(handle) => Some(out),
                _ = watch.lost() => None,
            }
        } else {
            Some(work(handle).await)
        };
        let resource = lease.resource().to_owned();
        let released = lease.release().await;
        match out {
            Some(out) => {
                if let Err(e) = released {
                    tracing::debug!(resource, error = %e, "release after scoped work failed; the lock expires with its ttl");
                }
                Ok(out)
            }
            None => Err(Error::lost(
                "the lock was lost while the work ran; the work was stopped",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::tests::Wrapped;

    /// A node that said "held" holds nothing of ours and is not asked to release — and it
    /// counts as released: the lease's own quorum does not need every one of its nodes then.
    #[tokio::test]
    async fn a_node_that_said_held_counts_as_released() {
        let (held, free) = (MemoryNode::new(), MemoryNode::new());
        let slow = Wrapped {
            inner: MemoryNode::new(),
            hang_on_release: true,
        };
        let other = Redlock::builder().node(held.clone()).build().unwrap();
        let _theirs = other.try_lock("r", Duration::from_secs(60)).await.unwrap();
        let redlock = Redlock::builder()
            .node(held.clone())
            .node(free.clone())
            .node(slow.clone())
            .node_timeout(Duration::from_millis(50))
            .retry(Retry::never())
            .build()
            .unwrap();
        let lease = redlock
            .try_lock("r", Duration::from_secs(60))
            .await
            .unwrap();
        let token = lease.value().to_owned();
        assert_eq!(free.get("r").as_deref(), Some(token.as_str()));
        assert_ne!(held.get("r").as_deref(), Some(token.as_str()));
        // Released on the free node; the slow one would have made it wait and fail.
        lease
            .release()
            .await
            .expect("a quorum: the free node and the one that said held");
        assert_eq!(free.get("r"), None);
        assert!(
            held.get("r").is_some(),
            "the other holder's lock is untouched"
        );
    }
}
