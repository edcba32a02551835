//! The backends the suite runs against: in-process maps, plain Redis masters, and (as one
//! voter each) Redis Clusters and Sentinel-managed master groups.

use std::time::Duration;

use tower_redlock::node::{MemoryNode, Node, RedisNode, RedisNodeOptions, ReleaseRequest};

use super::support::{eventually, Masters};
use super::{Backend, PeekAt, PeekFuture};

// --- the memory backend ----------------------------------------------------------------------

pub struct Memory {
    nodes: Vec<MemoryNode>,
}

impl PeekAt for Memory {
    fn peek_at<'a>(&'a self, i: usize, key: &'a str) -> PeekFuture<'a> {
        Box::pin(async move { self.nodes[i].get(key) })
    }
}

impl Backend for Memory {
    type Node = MemoryNode;

    fn start(n: usize) -> Self {
        Self {
            nodes: (0..n).map(|_| MemoryNode::new()).collect(),
        }
    }

    fn node(&self, i: usize) -> MemoryNode {
        self.nodes[i].clone()
    }

    fn len(&self) -> usize {
        self.nodes.len()
    }
}

// --- the Redis backend -----------------------------------------------------------------------

pub struct Redis {
    masters: Masters,
    nodes: Vec<RedisNode>,
}

impl PeekAt for Redis {
    fn peek_at<'a>(&'a self, i: usize, key: &'a str) -> PeekFuture<'a> {
        Box::pin(self.masters[i].get(key))
    }

    fn own_token_acquired(&self) -> bool {
        true
    }
}

impl Backend for Redis {
    type Node = RedisNode;

    fn start(n: usize) -> Self {
        let masters = Masters::start(n);
        let nodes = masters
            .iter()
            .map(|m| RedisNode::open(&m.url()).expect("valid url"))
            .collect();
        Self { masters, nodes }
    }

    fn node(&self, i: usize) -> RedisNode {
        self.nodes[i].clone()
    }

    fn len(&self) -> usize {
        self.nodes.len()
    }
}

/// Starts `n` topologies at once (each start mostly waits: for `redis-cli --cluster
/// create`, for the sentinels to agree).
fn start_each<T: Send>(n: usize, start: impl Fn(usize) -> T + Sync) -> Vec<T> {
    std::thread::scope(|s| {
        let start = &start;
        let handles: Vec<_> = (0..n).map(|i| s.spawn(move || start(i))).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

/// Waits until every node answers a request (not bounded by a node timeout: a request
/// through a fresh Cluster or Sentinel voter first connects, or discovers the master), so
/// that the checks and the client's 200 ms node timeout measure the requests themselves.
async fn answer_once(nodes: &[RedisNode]) {
    for node in nodes {
        let what = format!("{} answers", node.name());
        eventually(what, Duration::from_secs(10), || async {
            let answer = node.release(ReleaseRequest::new("conformance:warm-up", super::T1));
            let answer = tokio::time::timeout(Duration::from_secs(1), answer).await;
            matches!(answer, Ok(Ok(false)))
        })
        .await;
    }
}

// --- the Cluster backend: each node one Redis Cluster of three masters -----------------------

#[cfg(feature = "cluster")]
pub use self::cluster::Cluster;

#[cfg(feature = "cluster")]
mod cluster {
    use super::super::support::cluster::Cluster as Topology;
    use super::*;

    pub struct Cluster {
        clusters: Vec<Topology>,
        nodes: Vec<RedisNode>,
    }

    impl PeekAt for Cluster {
        /// The key as the master serving its slot in cluster `i` stores it.
        fn peek_at<'a>(&'a self, i: usize, key: &'a str) -> PeekFuture<'a> {
            Box::pin(async move {
                let cluster = &self.clusters[i];
                cluster[cluster.node_for_key(key).await].get(key).await
            })
        }

        fn own_token_acquired(&self) -> bool {
            true
        }
    }

    impl Backend for Cluster {
        type Node = RedisNode;

        fn start(n: usize) -> Self {
            let clusters = start_each(n, |_| Topology::start(3));
            let nodes = clusters
                .iter()
                .map(|c| {
                    let cluster = tower_redlock::node::Cluster::new(c.addrs()).expect("addresses");
                    RedisNode::cluster(cluster, &RedisNodeOptions::default())
                        .expect("a cluster voter")
                })
                .collect();
            Self { clusters, nodes }
        }

        async fn ready(&self) {
            answer_once(&self.nodes).await;
        }

        async fn flush(&self) {
            for server in self.clusters.iter().flat_map(Topology::iter) {
                let _: () = server.query(&redis::cmd("FLUSHALL")).await;
            }
        }

        fn node(&self, i: usize) -> RedisNode {
            self.nodes[i].clone()
        }

        fn len(&self) -> usize {
            self.nodes.len()
        }
    }
}

// --- the Sentinel backend: each node one Sentinel group (master, replica, 3 sentinels) -----

pub struct Sentinel {
    groups: Vec<super::support::sentinel::SentinelGroup>,
    nodes: Vec<RedisNode>,
}

impl PeekAt for Sentinel {
    /// The key as group `i`'s master stores it (no failover happens in these checks).
    fn peek_at<'a>(&'a self, i: usize, key: &'a str) -> PeekFuture<'a> {
        Box::pin(self.groups[i].master().get(key))
    }

    fn own_token_acquired(&self) -> bool {
        true
    }
}

impl Backend for Sentinel {
    type Node = RedisNode;

    fn start(n: usize) -> Self {
        use super::support::sentinel::SentinelGroup;
        use tower_redlock::node::{RedisNodeOptions, Sentinel};
        let groups = start_each(n, |i| SentinelGroup::start(&format!("tr-conformance-{i}")));
        // Without tenure protection: on by default for a Sentinel voter, it would keep these
        // fresh masters out of the quorum for 60 s (tests/voters/sentinel.rs checks it).
        let options = RedisNodeOptions::new().no_protection();
        let nodes = groups
            .iter()
            .map(|g| {
                let group = Sentinel::new(g.master_name(), g.sentinel_addrs()).expect("a group");
                RedisNode::sentinel(group, &options).expect("a sentinel voter")
            })
            .collect();
        Self { groups, nodes }
    }

    async fn ready(&self) {
        answer_once(&self.nodes).await;
    }

    async fn flush(&self) {
        for group in &self.groups {
            let _: () = group.master().query(&redis::cmd("FLUSHALL")).await;
        }
    }

    fn node(&self, i: usize) -> RedisNode {
        self.nodes[i].clone()
    }

    fn len(&self) -> usize {
        self.nodes.len()
    }
}
