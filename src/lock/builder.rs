//! [`RedlockBuilder`]: a client's nodes and tunables, checked when it is built.

use std::sync::Arc;
use std::time::Duration;

use super::call::Voter;
use super::health::Health;
use super::options::Config;
use super::owed::Ledger;
use super::tally;
use super::wake::Wakes;
use super::{Inner, Redlock, Retry};
use crate::error::Error;
use crate::node::{AnyNode, Node, RedisNode, RedisNodeOptions};

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
#[must_use = "a builder does nothing until `build` is called"]
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
    /// The time is the node's, not this process's. When a request's timer fires late (a blocked or
    /// CPU-starved runtime), the request gets that time back before it may time out. It gets up to
    /// four node timeouts in all, a hundred while the node keeps answering other requests, and
    /// never more than 5 s. So an answer that sat unread meanwhile still counts. A try can last
    /// that much longer. So can a [`Retry::until`](crate::Retry::until) wait, which starts no try
    /// after its end but lets the last one finish.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.config.node_timeout = timeout;
        self
    }

    /// Fencing tokens (default off): every lease gets a number that grows with every new holder of
    /// its resource ([`Lease::fencing_token`](crate::Lease::fencing_token)). It serves storage that
    /// refuses a write carrying a smaller token than one it has seen. That is what keeps a holder
    /// paused past its validity from writing after the next one.
    ///
    /// The acquire bumps a counter per resource on each node in the same request (a script instead
    /// of a plain `SET`). The token is the largest counter among the nodes that granted the lock.
    /// Before the lease is handed out the token is *settled*. Where too few granting nodes carry it
    /// to share a node with every later quorum, their counters are raised to it. That is one more
    /// round trip, and rare: only after a node missed a grant or a release, or a counter expired.
    /// The release raises the counters to the lease's token too. So the next holder's token is
    /// larger with no clock involved. This assumes that the nodes keep their counters (a restart
    /// without persistence is covered by restart protection). It also assumes that their clocks
    /// differ by less than a counter's lifetime without use. A counter that expired or was lost
    /// restarts from the node's clock in microseconds, so tokens look like timestamps. Counters
    /// expire twice the ttl (at least 10 s) after their last bump or raise. Every client fencing
    /// the same resources must run this version: the scripts and the settling work together. Redis
    /// ≥ 5. Every node must support it. Redis nodes and `MemoryNode` do. A custom [`Node`] declares
    /// [`Capabilities::fencing`] and honours the `fence` of every request
    /// ([`AcquireRequest::fence`], …). A node without it fails every fenced request. Its vote is
    /// lost (the client then tolerates one failure fewer). Without enough votes left, a lock fails
    /// naming it. See the fencing guide (`tower_redlock::guide::fencing`) for the precise
    /// assumptions and their tests.
    ///
    /// [`Capabilities::fencing`]: crate::node::Capabilities::fencing
    /// [`AcquireRequest::fence`]: crate::node::AcquireRequest::fence
    pub fn fencing(mut self, on: bool) -> Self {
        self.config.fencing = on;
        self
    }

    /// Wake waiters on release (default off): a caller waiting for a busy key (a retry
    /// policy, the middleware's `.wait`, a duplicate waiting for a replay) tries again as
    /// soon as the holder releases it, not only at its polls.
    ///
    /// Every script that deletes a lock (a release, a completion, a failed try's cleanup, a forced
    /// release) then publishes `released` on the channel named as the lock's key. That is `PUBLISH`
    /// on a master or a Sentinel group's master, and `SPUBLISH` (Redis 7, the key's shard only) on
    /// a Cluster. Each Redis voter keeps one subscriber connection that listens on the keys this
    /// client's waiters wait for. It also listens on their keyspace channel: with
    /// `notify-keyspace-events Kx` on a master, an expiry wakes them too. A waiter tries again once
    /// a quorum of the voters reported the key released. A message is a hint: the try decides, as
    /// before. The retry policy's polls keep their schedule and their count (only they use up
    /// retries). So no waiter waits longer than without it for a release it did not hear, except in
    /// the queue below. Such a release may be a lost message, a crashed holder's expiry without
    /// keyspace notifications, or one by a client that does not publish.
    ///
    /// Within the client, one waiter per key waits for releases at a time; the others queue
    /// in arrival order (a new caller that may wait behind them). A queued waiter tries when
    /// its turn comes, and at each of its polls; with a deadline (`Retry::until`, the
    /// middleware's `.wait`) it stays queued until then: the price of the order. Costs:
    /// nothing on an uncontended lock but the release's `PUBLISH` to a channel without
    /// subscribers; per voter, one more connection, asked a `PING` when idle for 5 s; per
    /// release of a key with waiters, one message to each subscribed client on each voter
    /// (and, on a Cluster, to the shard's replicas); per contended key, a subscription on
    /// each voter. An ACL user needs the channels (`&<key prefix>*`, and `&__keyspace@*` for
    /// expiries): a refused key still releases, its waiters poll, and the client warns once
    /// per voter. Turn it on in every client of the keys: a client without it does not wake
    /// the others (they poll). A node over a connection of your own
    /// ([`RedisNode::from_connection_manager`](crate::node::RedisNode::from_connection_manager))
    /// publishes but does not listen. Build the client inside a Tokio runtime (the
    /// subscribers are spawned there). See the locks guide (`tower_redlock::guide::locks`,
    /// "Waiting").
    pub fn wake_waiters(mut self, on: bool) -> Self {
        self.config.wake_waiters = on;
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
    ///
    /// # Errors
    ///
    /// [`Error::is_invalid_input`](crate::Error::is_invalid_input), naming the setting, for any of:
    ///
    /// - a voter URL that does not parse (from [`redis`](Self::redis));
    /// - no node, or more than the client supports;
    /// - a node timeout of zero or over 60 s;
    /// - a drift factor outside `0.0..1.0`;
    /// - a key prefix longer than [`Redlock::MAX_RESOURCE_LEN`].
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
        if self.nodes.len() > tally::MAX_NODES {
            return Err(Error::invalid(format!(
                "a Redlock client supports at most {} nodes, not {}",
                tally::MAX_NODES,
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
        if c.key_prefix.len() > Redlock::MAX_RESOURCE_LEN {
            return Err(Error::invalid(format!(
                "the key prefix is longer than {} bytes",
                Redlock::MAX_RESOURCE_LEN
            )));
        }
        let mut config = self.config;
        config.max_ttl = self.nodes.iter().filter_map(|n| n.max_ttl()).min();
        let quorum = tally::quorum(self.nodes.len());
        let mut nodes = self.nodes;
        let wakes = if config.wake_waiters {
            if tokio::runtime::Handle::try_current().is_err() {
                return Err(Error::invalid(
                    "`wake_waiters(true)` starts a subscriber per voter: build the client \
                     inside a Tokio runtime",
                ));
            }
            Wakes::start(&mut nodes, quorum)
        } else {
            None
        };
        let nodes = nodes
            .into_iter()
            .map(|node| {
                let name: Arc<str> = node.name().into();
                Arc::new(Voter {
                    owed: Ledger::new(name.clone()),
                    name,
                    node,
                    health: Health::new(config.suspend_after, config.node_timeout),
                })
            })
            .collect::<Vec<_>>();
        crate::metrics::describe();
        for voter in &nodes {
            // Every node's series exists from the start, at 0.
            crate::metrics::node_series(&voter.name);
        }
        Ok(Redlock {
            inner: Arc::new(Inner {
                quorum,
                wakes,
                names: nodes.iter().map(|v| v.name.clone()).collect(),
                nodes,
                config,
            }),
        })
    }
}
