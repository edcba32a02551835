//! The backend conformance suite: one set of semantic checks, written once against the
//! [`Node`] trait, run against a `RedisNode` (a real redis-server) and a `MemoryNode`.
//!
//! Each check gets a `&dyn Node` and a [`Peek`] that reads the backend's raw state (the
//! value stored at a key, bypassing the node). The Redlock-level flow runs the same quorum
//! and contention scenario over three nodes of each backend.

use tower_redlock_testkit as support;

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use support::{eventually, Masters, NODE_TIMEOUT};
use tower_redlock::node::Acquire;
use tower_redlock::node::{MemoryNode, Node, RedisNode};
use tower_redlock::{Redlock, Retry};

/// A future returned by [`Peek::peek`].
type PeekFuture<'a> = Pin<Box<dyn Future<Output = Option<String>> + Send + 'a>>;

/// Reads a backend's raw state: the value stored at `key` on node `i`, if any.
trait Peek: Send + Sync {
    fn peek<'a>(&'a self, i: usize, key: &'a str) -> PeekFuture<'a>;
}

/// A set of nodes of one kind, and a way to peek at them.
trait Backend: Peek + Sized {
    type Node: Node + Clone;

    fn start(n: usize) -> Self;

    fn node(&self, i: usize) -> Self::Node;

    fn len(&self) -> usize;
}

// --- the memory backend ----------------------------------------------------------------------

struct Memory {
    nodes: Vec<MemoryNode>,
}

impl Peek for Memory {
    fn peek<'a>(&'a self, i: usize, key: &'a str) -> PeekFuture<'a> {
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

struct Redis {
    masters: Masters,
    nodes: Vec<RedisNode>,
}

impl Peek for Redis {
    fn peek<'a>(&'a self, i: usize, key: &'a str) -> PeekFuture<'a> {
        Box::pin(self.masters[i].get(key))
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

// --- the node checks -------------------------------------------------------------------------

const LONG: Duration = Duration::from_secs(10);
const T1: &str = "00000000000000000000000000000001";
const T2: &str = "00000000000000000000000000000002";

/// The checks of one node (index 0 of the backend).
mod check {
    use super::*;

    pub async fn names_itself(node: &dyn Node, _: &dyn Peek) {
        assert!(!node.name().is_empty());
    }

    pub async fn acquire_free_key(node: &dyn Node, peek: &dyn Peek) {
        assert_eq!(
            node.acquire("free", T1, LONG).await.unwrap(),
            Acquire::Acquired
        );
        assert_eq!(peek.peek(0, "free").await.as_deref(), Some(T1));
    }

    pub async fn acquire_held_key(node: &dyn Node, peek: &dyn Peek) {
        assert_eq!(
            node.acquire("held", T1, LONG).await.unwrap(),
            Acquire::Acquired
        );
        match node
            .acquire("held", T2, Duration::from_secs(5))
            .await
            .unwrap()
        {
            // A node may leave the holder's ttl out (the Redis node does: the client asks
            // one node for it when it returns a contended error); if given, it is right.
            Acquire::Held { remaining: Some(r) } => {
                assert!(r <= LONG, "remaining {r:?} > ttl {LONG:?}");
                assert!(r > LONG / 2, "remaining {r:?} far below the ttl {LONG:?}");
            }
            Acquire::Held { remaining: None } => {}
            other => panic!("expected Held, got {other:?}"),
        }
        // NX semantics even for the holder's own token: acquire never overwrites.
        assert!(matches!(
            node.acquire("held", T1, LONG).await.unwrap(),
            Acquire::Held { .. }
        ));
        assert_eq!(peek.peek(0, "held").await.as_deref(), Some(T1));
    }

    pub async fn release_wrong_token(node: &dyn Node, peek: &dyn Peek) {
        node.acquire("rw", T1, LONG).await.unwrap();
        assert!(!node.release("rw", T2).await.unwrap());
        assert_eq!(peek.peek(0, "rw").await.as_deref(), Some(T1));
        // Releasing an absent key is a plain "no".
        assert!(!node.release("never-set", T1).await.unwrap());
        assert_eq!(peek.peek(0, "never-set").await, None);
    }

    pub async fn release_right_token(node: &dyn Node, peek: &dyn Peek) {
        node.acquire("rr", T1, LONG).await.unwrap();
        assert!(node.release("rr", T1).await.unwrap());
        assert_eq!(peek.peek(0, "rr").await, None);
        assert!(!node.release("rr", T1).await.unwrap(), "second release");
        // Free again for anyone.
        assert_eq!(
            node.acquire("rr", T2, LONG).await.unwrap(),
            Acquire::Acquired
        );
        assert_eq!(peek.peek(0, "rr").await.as_deref(), Some(T2));
    }

    pub async fn extend_right_token_shortens(node: &dyn Node, peek: &dyn Peek) {
        node.acquire("es", T1, LONG).await.unwrap();
        assert!(node
            .extend("es", T1, Duration::from_millis(150))
            .await
            .unwrap());
        assert_eq!(peek.peek(0, "es").await.as_deref(), Some(T1));
        // The new, shorter ttl applies: gone long before the original 10 s.
        let took = eventually(
            "the extended key expires",
            Duration::from_secs(3),
            || async { peek.peek(0, "es").await.is_none() },
        )
        .await;
        assert!(took < Duration::from_secs(3));
    }

    pub async fn extend_right_token_lengthens(node: &dyn Node, peek: &dyn Peek) {
        // Two keys with the same short ttl; only one is extended.
        node.acquire("el", T1, Duration::from_millis(150))
            .await
            .unwrap();
        node.acquire("el-control", T1, Duration::from_millis(150))
            .await
            .unwrap();
        assert!(node.extend("el", T1, LONG).await.unwrap());
        eventually(
            "the control key expires",
            Duration::from_secs(3),
            || async { peek.peek(0, "el-control").await.is_none() },
        )
        .await;
        assert_eq!(peek.peek(0, "el").await.as_deref(), Some(T1));
        match node.acquire("el", T2, LONG).await.unwrap() {
            Acquire::Held { remaining: Some(r) } => {
                assert!(r > Duration::from_secs(5) && r <= LONG, "remaining {r:?}")
            }
            Acquire::Held { remaining: None } => {}
            other => panic!("expected Held, got {other:?}"),
        }
    }

    pub async fn extend_wrong_token(node: &dyn Node, peek: &dyn Peek) {
        node.acquire("ew", T1, Duration::from_millis(150))
            .await
            .unwrap();
        assert!(!node.extend("ew", T2, LONG).await.unwrap());
        assert_eq!(peek.peek(0, "ew").await.as_deref(), Some(T1));
        // The ttl did not change: the key still expires on its own schedule.
        eventually(
            "the key expires despite the wrong-token extend",
            Duration::from_secs(3),
            || async { peek.peek(0, "ew").await.is_none() },
        )
        .await;
    }

    pub async fn extend_absent_key(node: &dyn Node, peek: &dyn Peek) {
        assert!(!node.extend("ea", T1, LONG).await.unwrap());
        assert_eq!(peek.peek(0, "ea").await, None, "extend re-created a key");
    }

    pub async fn extend_expired_key(node: &dyn Node, peek: &dyn Peek) {
        node.acquire("ee", T1, Duration::from_millis(50))
            .await
            .unwrap();
        eventually("the key expires", Duration::from_secs(3), || async {
            peek.peek(0, "ee").await.is_none()
        })
        .await;
        assert!(!node.extend("ee", T1, LONG).await.unwrap());
        assert_eq!(
            peek.peek(0, "ee").await,
            None,
            "extend re-created an expired key"
        );
        assert_eq!(
            node.acquire("ee", T2, LONG).await.unwrap(),
            Acquire::Acquired
        );
    }

    pub async fn expiry(node: &dyn Node, peek: &dyn Peek) {
        let start = Instant::now();
        assert_eq!(
            node.acquire("ex", T1, Duration::from_millis(50))
                .await
                .unwrap(),
            Acquire::Acquired
        );
        let took = eventually(
            "the key can be acquired again",
            Duration::from_secs(3),
            || async { node.acquire("ex", T2, LONG).await.unwrap() == Acquire::Acquired },
        )
        .await;
        let since_acquire = start.elapsed();
        assert!(
            since_acquire >= Duration::from_millis(45),
            "re-acquired after {since_acquire:?}, before the 50 ms ttl ran out"
        );
        assert!(took < Duration::from_secs(3));
        assert_eq!(peek.peek(0, "ex").await.as_deref(), Some(T2));
    }

    // --- completion records (idempotent work) ---

    const REC: &str = "rec:record";
    const BLOB: &[u8] = b"status 200\x00\xff\r\n binary body";

    async fn completed(node: &dyn Node, key: &str, token: &str) -> Option<Vec<u8>> {
        match node
            .acquire_unless_completed(key, REC, token, LONG)
            .await
            .unwrap()
        {
            Acquire::Completed { record } => Some(record.to_vec()),
            _ => None,
        }
    }

    pub async fn records_replay_instead_of_locking(node: &dyn Node, peek: &dyn Peek) {
        let got = node.acquire_unless_completed("rec", REC, T1, LONG).await;
        assert_eq!(got.unwrap(), Acquire::Acquired);
        assert_eq!(peek.peek(0, "rec").await.as_deref(), Some(T1));
        // Another request meanwhile: held, no record yet.
        assert!(matches!(
            node.acquire_unless_completed("rec", REC, T2, LONG)
                .await
                .unwrap(),
            Acquire::Held { .. }
        ));
        assert!(node.complete("rec", REC, T1, BLOB, LONG).await.unwrap());
        // The record ended the lock, and answers every later request, byte for byte,
        // without locking anything.
        assert_eq!(peek.peek(0, "rec").await, None);
        assert_eq!(completed(node, "rec", T2).await.as_deref(), Some(BLOB));
        assert_eq!(completed(node, "rec", T2).await.as_deref(), Some(BLOB));
        assert_eq!(peek.peek(0, "rec").await, None);
    }

    pub async fn records_are_fenced_by_the_token(node: &dyn Node, peek: &dyn Peek) {
        node.acquire("rec", T1, LONG).await.unwrap();
        // Not the holder: nothing stored, the holder's lock untouched.
        assert!(!node.complete("rec", REC, T2, BLOB, LONG).await.unwrap());
        assert_eq!(peek.peek(0, "rec").await.as_deref(), Some(T1));
        assert_eq!(completed(node, "rec", T2).await, None);
        // A lease that expired before it stored: nothing stored, and the key is free.
        node.acquire("gone", T1, Duration::from_millis(30))
            .await
            .unwrap();
        eventually("the lock expires", LONG, || async {
            peek.peek(0, "gone").await.is_none()
        })
        .await;
        assert!(!node.complete("gone", REC, T1, BLOB, LONG).await.unwrap());
        assert_eq!(completed(node, "gone", T2).await, None);
    }

    pub async fn records_never_take_a_lock_for_one(node: &dyn Node, peek: &dyn Peek) {
        // Someone locks a resource that happens to be named like a record key.
        node.acquire(REC, T1, LONG).await.unwrap();
        let got = node.acquire_unless_completed("rec", REC, T2, LONG).await;
        assert_eq!(got.unwrap(), Acquire::Acquired, "a lock taken for a record");
        // And the completion does not overwrite it: nothing stored, the lock kept.
        assert!(!node.complete("rec", REC, T2, BLOB, LONG).await.unwrap());
        assert_eq!(peek.peek(0, REC).await.as_deref(), Some(T1));
        assert_eq!(peek.peek(0, "rec").await.as_deref(), Some(T2));
    }

    pub async fn a_first_record_is_never_overwritten(node: &dyn Node, _: &dyn Peek) {
        node.acquire_unless_completed("rec", REC, T1, LONG)
            .await
            .unwrap();
        assert!(node.complete("rec", REC, T1, b"first", LONG).await.unwrap());
        // A plain lock of the same resource (not the replay acquire) and a second record.
        node.acquire("rec", T2, LONG).await.unwrap();
        assert!(!node
            .complete("rec", REC, T2, b"second", LONG)
            .await
            .unwrap());
        assert_eq!(
            completed(node, "rec", T1).await.as_deref(),
            Some(&b"first"[..])
        );
    }

    pub async fn records_expire(node: &dyn Node, peek: &dyn Peek) {
        node.acquire("rec", T1, LONG).await.unwrap();
        let retention = Duration::from_millis(50);
        assert!(node
            .complete("rec", REC, T1, BLOB, retention)
            .await
            .unwrap());
        // Gone: the first request that finds no record locks (and would run) again.
        eventually("the record expires", LONG, || async {
            completed(node, "rec", T2).await.is_none()
        })
        .await;
        assert_eq!(peek.peek(0, "rec").await.as_deref(), Some(T2));
    }
}

// --- the Redlock-level flow over three nodes -------------------------------------------------

async fn peek_all<P: Peek>(backend: &P, key: &str) -> Vec<Option<String>> {
    let mut out = Vec::new();
    for i in 0..3 {
        out.push(backend.peek(i, key).await);
    }
    out
}

async fn redlock_flow<B: Backend>(backend: &B) {
    assert_eq!(backend.len(), 3);
    let build = || {
        (0..3)
            .fold(Redlock::builder(), |b, i| b.node(backend.node(i)))
            .node_timeout(NODE_TIMEOUT)
            .retry(Retry::never())
            .build()
            .unwrap()
    };
    let a = build();
    let b = build();
    assert_eq!(a.quorum(), 2);
    let ttl = Duration::from_secs(10);

    // Free: A locks; the value is on (at least) a quorum of nodes and nothing else is
    // stored; B is contended. (That the value reaches *every* free node is checked by
    // `lock_is_sent_to_every_node`.)
    let lease = a.try_lock("flow", ttl).await.unwrap();
    let value = lease.value().to_owned();
    let now = peek_all(backend, "flow").await;
    assert!(
        now.iter()
            .filter(|v| v.as_deref() == Some(value.as_str()))
            .count()
            >= 2,
        "{now:?}"
    );
    assert!(
        now.iter()
            .all(|v| v.is_none() || v.as_deref() == Some(value.as_str())),
        "{now:?}"
    );
    let err = b.try_lock("flow", ttl).await.unwrap_err();
    assert!(err.is_contended(), "{err:?}");
    assert!(err.held_by() >= 2, "{err:?}");
    let ra = err.retry_after().expect("a retry-after");
    assert!(ra <= ttl && ra > Duration::ZERO, "{ra:?}");

    // Every subset of nodes pre-held by a foreign value.
    for mask in 0u32..8 {
        let key = format!("flow-subset-{mask}");
        let key = key.as_str();
        let held: Vec<usize> = (0..3).filter(|i| mask & (1 << i) != 0).collect();
        for &i in &held {
            assert_eq!(
                backend.node(i).acquire(key, "foreign", ttl).await.unwrap(),
                Acquire::Acquired
            );
        }
        let free = 3 - held.len();
        match a.try_lock(key, ttl).await {
            Ok(l) => {
                assert!(
                    free >= 2,
                    "locked with only {free} free nodes (mask {mask:03b})"
                );
                let v = l.value().to_owned();
                let now = peek_all(backend, key).await;
                let ours = now
                    .iter()
                    .filter(|x| x.as_deref() == Some(v.as_str()))
                    .count();
                assert!(ours >= 2, "mask {mask:03b}: {now:?}");
                for i in 0..3 {
                    if held.contains(&i) {
                        assert_eq!(now[i].as_deref(), Some("foreign"), "mask {mask:03b}");
                    } else {
                        assert!(
                            now[i].is_none() || now[i].as_deref() == Some(v.as_str()),
                            "mask {mask:03b}: {now:?}"
                        );
                    }
                }
                l.release().await.unwrap();
            }
            Err(e) => {
                assert!(
                    free < 2,
                    "failed with {free} free nodes (mask {mask:03b}): {e:?}"
                );
                assert!(e.is_contended(), "{e:?}");
                assert!(e.held_by() >= 2 && e.held_by() <= held.len(), "{e:?}");
            }
        }
        // Nothing of ours is left; the foreign holds are untouched. (A failed try releases
        // the nodes that had not answered yet in the background, so this is awaited.)
        eventually(
            format!("mask {mask:03b}: only the foreign holds are left"),
            Duration::from_secs(1),
            || async {
                let now = peek_all(backend, key).await;
                (0..3).all(|i| {
                    let want = held.contains(&i).then_some("foreign");
                    if want.is_some() {
                        assert_eq!(now[i].as_deref(), want, "node {i}, mask {mask:03b}");
                    }
                    now[i].as_deref() == want
                })
            },
        )
        .await;
    }

    // Extension goes through the nodes.
    lease.extend(Duration::from_secs(20)).await.unwrap();
    assert_eq!(lease.extensions(), 1);
    assert!(lease.validity() > ttl);

    // Release frees a quorum before it returns and every node soon after (a node that had
    // not answered yet is released in the background); B then gets the lock.
    a.unlock(lease).await.unwrap();
    let free = |now: Vec<Option<String>>| now.iter().filter(|v| v.is_none()).count();
    assert!(free(peek_all(backend, "flow").await) >= 2);
    let all_free = || async { free(peek_all(backend, "flow").await) == 3 };
    eventually("every node is released", Duration::from_secs(5), all_free).await;
    let lb = b.try_lock("flow", ttl).await.unwrap();
    assert_ne!(lb.value(), value);
    lb.release().await.unwrap();
    eventually("every node is released", Duration::from_secs(5), all_free).await;
}

/// Redlock sends `SET NX PX` to **all** nodes (DESIGN §2), deciding early but not
/// withholding the request from the nodes that had not answered yet: a lock taken on all
/// three free nodes survives the loss of any one of them.
async fn lock_reaches_every_node<B: Backend>(backend: &B) {
    let client = (0..3)
        .fold(Redlock::builder(), |b, i| b.node(backend.node(i)))
        .node_timeout(NODE_TIMEOUT)
        .retry(Retry::never())
        .build()
        .unwrap();
    // Every node runs each call once first (for Redis: the client's connections, shared
    // with these node handles, are up and the scripts are cached), so this checks the
    // fan-out itself. Redis-specific late-node cases are in tests/redlock.rs.
    for i in 0..3 {
        let node = backend.node(i);
        assert_eq!(
            node.acquire("warm-up", T1, LONG).await.unwrap(),
            Acquire::Acquired
        );
        assert!(node.extend("warm-up", T1, LONG).await.unwrap());
        assert!(node.release("warm-up", T1).await.unwrap());
    }
    for round in 0..3 {
        let key = format!("everywhere-{round}");
        let lease = client
            .try_lock(&key, Duration::from_secs(10))
            .await
            .unwrap();
        let value = lease.value().to_owned();
        eventually(
            format!("round {round}: the lease is on every node"),
            Duration::from_secs(2),
            || async {
                peek_all(backend, &key)
                    .await
                    .iter()
                    .all(|v| v.as_deref() == Some(value.as_str()))
            },
        )
        .await;
        lease.release().await.unwrap();
    }
}

// --- wiring ----------------------------------------------------------------------------------

/// One `#[tokio::test]` per check and backend.
macro_rules! conformance {
    ($module:ident => $backend:ident: $($name:ident),* $(,)?) => {
        mod $module {
            use super::*;
            $(
                #[tokio::test]
                async fn $name() {
                    let backend = <super::$backend as Backend>::start(1);
                    let node = backend.node(0);
                    check::$name(&node, &backend).await;
                }
            )*

            #[tokio::test]
            async fn lock_is_sent_to_every_node() {
                let backend = <super::$backend as Backend>::start(3);
                lock_reaches_every_node(&backend).await;
            }

            #[tokio::test]
            async fn redlock_quorum_and_contention() {
                let backend = <super::$backend as Backend>::start(3);
                redlock_flow(&backend).await;
            }
        }
    };
}

conformance!(memory => Memory:
    names_itself,
    acquire_free_key,
    acquire_held_key,
    release_wrong_token,
    release_right_token,
    extend_right_token_shortens,
    extend_right_token_lengthens,
    extend_wrong_token,
    extend_absent_key,
    extend_expired_key,
    expiry,
    records_replay_instead_of_locking,
    records_are_fenced_by_the_token,
    records_expire,
    records_never_take_a_lock_for_one,
    a_first_record_is_never_overwritten,
);

conformance!(redis => Redis:
    names_itself,
    acquire_free_key,
    acquire_held_key,
    release_wrong_token,
    release_right_token,
    extend_right_token_shortens,
    extend_right_token_lengthens,
    extend_wrong_token,
    extend_absent_key,
    extend_expired_key,
    expiry,
    records_replay_instead_of_locking,
    records_are_fenced_by_the_token,
    records_expire,
    records_never_take_a_lock_for_one,
    a_first_record_is_never_overwritten,
);

#[tokio::test]
async fn redis_node_name_is_host_and_port() {
    let masters = Masters::start(1);
    let node = RedisNode::open(&masters[0].url()).unwrap();
    assert_eq!(node.name(), masters[0].addr());
    assert_eq!(MemoryNode::new().name(), "memory");
}

/// The replay acquire keeps delayed-restart protection: a dataset too young to be trusted
/// cannot say "no record" (it abstains), and votes once it is old enough.
#[tokio::test]
async fn redis_replay_acquire_keeps_restart_protection() {
    use tower_redlock::node::RedisNodeOptions;
    let masters = Masters::start(1);
    let opts = RedisNodeOptions::new().restart_protection(Duration::from_millis(300));
    let node = RedisNode::open_with(&masters[0].url(), &opts).unwrap();
    let ttl = Duration::from_millis(200);
    let young = node
        .acquire_unless_completed("k", "k:record", T1, ttl)
        .await;
    assert!(young.is_err(), "{young:?}");
    assert_eq!(masters[0].get("k").await, None);
    eventually(
        "the dataset is old enough to vote",
        Duration::from_secs(10),
        || async {
            node.acquire_unless_completed("k", "k:record", T1, ttl)
                .await
                .is_ok()
        },
    )
    .await;
    assert_eq!(masters[0].get("k").await.as_deref(), Some(T1));
    assert!(node
        .complete("k", "k:record", T1, b"done", ttl)
        .await
        .unwrap());
    let replay = node
        .acquire_unless_completed("k", "k:record", T1, ttl)
        .await;
    assert_eq!(
        replay.unwrap(),
        Acquire::Completed {
            record: b"done"[..].into()
        }
    );
}
