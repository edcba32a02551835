//! The backend conformance suite: the checks of the shipped conformance kit
//! (`tower_redlock::conformance`, written once against the [`Node`] trait) run against a
//! `RedisNode` (a real redis-server), a `MemoryNode`, a `RedisNode` over a Redis Cluster
//! (feature `cluster`) and one over a Sentinel group; the kit's self-test (nodes that get a
//! promise wrong fail it).
//!
//! Each check gets a `&dyn Node` and a kit `Peek` ([`First`]: the backend's first node) that
//! reads the backend's raw state (the value stored at a key, bypassing the node). The
//! Redlock-level flow runs the same quorum and contention scenario over three nodes of each
//! backend.
//!
//! Layout: `flow.rs` the flow over three, `backends.rs` the backends, `kit.rs` the kit's
//! whole run and its self-test; here the traits, the wiring and the Redis-only tests.

use tower_redlock_testkit as support;

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use support::{eventually, Masters};
use tower_redlock::conformance::{self, Peek};
use tower_redlock::node::{Acquire, AcquireRequest, CompleteRequest, MemoryNode, Node, RedisNode};

mod backends;
mod flow;
mod kit;

#[cfg(feature = "cluster")]
use backends::Cluster;
use backends::{Memory, Redis, Sentinel};

/// A future returned by [`PeekAt::peek_at`].
type PeekFuture<'a> = Pin<Box<dyn Future<Output = Option<String>> + Send + 'a>>;

/// Reads a backend's raw state: the value stored at `key` on node `i`, if any.
trait PeekAt: Send + Sync {
    fn peek_at<'a>(&'a self, i: usize, key: &'a str) -> PeekFuture<'a>;

    /// Whether the nodes' acquire answers "acquired" for the holder's own token (see
    /// `Acquire::Held`): a Redis voter's, whose acquire is a script that finds it (every
    /// voter that checks eviction; a Cluster's, whose connection may send a request twice),
    /// not the in-process node's.
    fn own_token_acquired(&self) -> bool {
        false
    }
}

/// The kit's `Peek` of a backend's first node (the node checks run on it).
struct First<'a, B>(&'a B);

impl<B: PeekAt> Peek for First<'_, B> {
    fn peek<'a>(&'a self, key: &'a str) -> PeekFuture<'a> {
        self.0.peek_at(0, key)
    }

    fn own_token_acquired(&self) -> bool {
        self.0.own_token_acquired()
    }
}

/// A set of nodes of one kind, and a way to peek at them.
trait Backend: PeekAt + Sized {
    type Node: Node + Clone;

    fn start(n: usize) -> Self;

    /// Waits until the nodes are ready for the checks (connected, their master found).
    fn ready(&self) -> impl Future<Output = ()> {
        async {}
    }

    /// Empties every node's store: a backend run with `conformance_in_turn!` must (its checks
    /// share one backend).
    fn flush(&self) -> impl Future<Output = ()> {
        async {}
    }

    fn node(&self, i: usize) -> Self::Node;

    fn len(&self) -> usize;
}

const LONG: Duration = Duration::from_secs(10);
const T1: &str = "00000000000000000000000000000001";

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
                    backend.ready().await;
                    let node = backend.node(0);
                    conformance::check_one(stringify!($name), &node, &First(&backend)).await;
                }
            )*

            #[tokio::test]
            async fn lock_is_sent_to_every_node() {
                let backend = <super::$backend as Backend>::start(3);
                backend.ready().await;
                flow::lock_reaches_every_node(&backend).await;
            }

            #[tokio::test]
            async fn redlock_quorum_and_contention() {
                let backend = <super::$backend as Backend>::start(3);
                backend.ready().await;
                flow::redlock_flow(&backend).await;
            }
        }
    };
}

/// For a backend whose nodes are topologies of processes (a Cluster, a Sentinel group: some
/// 2.5 s to start each, mostly waiting), two `#[tokio::test]`s: every check in turn on one
/// node, then both flows on three, the data flushed before each. (One topology set per test,
/// 43 topologies for the two backends, took 42 s on two cores; these 8 take some 6 s.) A
/// failure's output names the check.
macro_rules! conformance_in_turn {
    ($module:ident => $backend:ident: $($name:ident),* $(,)?) => {
        mod $module {
            use super::*;

            #[tokio::test]
            async fn node_checks() {
                let backend = <super::$backend as Backend>::start(1);
                backend.ready().await;
                let node = backend.node(0);
                $(
                    eprintln!("check {}", stringify!($name));
                    backend.flush().await;
                    conformance::check_one(stringify!($name), &node, &First(&backend)).await;
                )*
            }

            #[tokio::test]
            async fn lock_is_sent_to_every_node_and_redlock_quorum_and_contention() {
                let backend = <super::$backend as Backend>::start(3);
                backend.ready().await;
                eprintln!("lock_is_sent_to_every_node");
                flow::lock_reaches_every_node(&backend).await;
                eprintln!("redlock_quorum_and_contention");
                backend.flush().await;
                flow::redlock_flow(&backend).await;
            }
        }
    };
}

/// Every node check, listed once: `every_check!(m!(args:))` is `m!(args: check, …)`.
macro_rules! every_check {
    ($then:ident!($($head:tt)*)) => {
        $then!($($head)*
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
            fencing_starts_from_the_clock_and_grows,
            fencing_counts_up_from_a_raised_counter,
            fencing_release_is_owner_only,
            fencing_raise_of_an_absent_counter_starts_from_the_clock,
            fencing_counters_expire_and_restart_from_the_clock,
            fencing_never_overwrites_a_lock_named_like_the_counter,
            fencing_with_records,
            fencing_extend_raises_the_counter,
            completion_if_free_stores_where_the_key_expired,
            completion_if_free_ends_our_lock,
            completion_if_free_never_takes_another_holders_lock,
            completion_if_free_never_takes_a_lock_for_a_record,
            completion_if_free_fenced_raises_the_counter,
            completion_if_free_is_told_apart_from_a_valid_one,
        );
    };
}

every_check!(conformance!(memory => Memory:));

every_check!(conformance!(redis => Redis:));

// A Cluster stores a record in its lock key's slot, at `{tag}<record key>`: a lock of a
// resource named like the record key is another key there, so
// `records_never_take_a_lock_for_one` (which locks `rec:record` and expects the completion
// of `rec` to collide with it) does not apply, nor its "if free" form
// (`completion_if_free_never_takes_a_lock_for_a_record`). tests/voters/cluster.rs runs its
// Cluster form: a lock at the record's real key is never taken for a record.
#[cfg(feature = "cluster")]
conformance_in_turn!(cluster => Cluster:
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
    a_first_record_is_never_overwritten,
    fencing_starts_from_the_clock_and_grows,
    fencing_counts_up_from_a_raised_counter,
    fencing_release_is_owner_only,
    fencing_raise_of_an_absent_counter_starts_from_the_clock,
    fencing_counters_expire_and_restart_from_the_clock,
    fencing_never_overwrites_a_lock_named_like_the_counter,
    fencing_with_records,
    fencing_extend_raises_the_counter,
    completion_if_free_stores_where_the_key_expired,
    completion_if_free_ends_our_lock,
    completion_if_free_never_takes_another_holders_lock,
    completion_if_free_fenced_raises_the_counter,
    completion_if_free_is_told_apart_from_a_valid_one,
);

every_check!(conformance_in_turn!(sentinel => Sentinel:));

/// The check of the fenced extension can fail: a node that declares fencing but extends
/// without the fence (answering `true`, its counter left as it was) fails it.
#[tokio::test]
async fn fencing_extend_check_catches_a_node_that_drops_the_fence() {
    let peek = <Memory as Backend>::start(1);
    let check = tokio::spawn(async move {
        let node = support::nodes::FenceDroppingNode::default();
        conformance::check_one("fencing_extend_raises_the_counter", &node, &First(&peek)).await;
    });
    let outcome = check.await;
    assert!(
        outcome.as_ref().is_err_and(|e| e.is_panic()),
        "the check passed a node that never raises the counter on extend: {outcome:?}"
    );
}

/// The checks of the "if free" completion can fail: a node that sends it as the plain
/// completion fails the first (it refuses where the lock is absent), and one that clears the
/// lock first fails the second (it stores over another client's lock).
#[tokio::test]
async fn completion_if_free_checks_catch_a_node_that_misreads_it() {
    for overreach in [false, true] {
        let peek = <Memory as Backend>::start(1);
        let node = support::nodes::FreeMisreadingNode {
            inner: peek.node(0),
            overreach,
        };
        let check = tokio::spawn(async move {
            if overreach {
                conformance::check_one(
                    "completion_if_free_never_takes_another_holders_lock",
                    &node,
                    &First(&peek),
                )
                .await;
            } else {
                conformance::check_one(
                    "completion_if_free_stores_where_the_key_expired",
                    &node,
                    &First(&peek),
                )
                .await;
            }
        });
        let outcome = check.await;
        assert!(
            outcome.as_ref().is_err_and(|e| e.is_panic()),
            "the check passed a node that misreads \"if free\" (overreach: {overreach}): \
             {outcome:?}"
        );
    }
}

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
    // A 2 s ttl behind 3 s of protection: the reads after the acquire have the ttl to spare
    // on a loaded machine.
    let opts = RedisNodeOptions::new().restart_protection(Duration::from_secs(3));
    let node = RedisNode::open_with(&masters[0].url(), &opts).unwrap();
    let ttl = Duration::from_secs(2);
    let young = node
        .acquire(AcquireRequest::new("k", T1, ttl).unless_completed("k:record"))
        .await;
    assert!(young.is_err(), "{young:?}");
    assert_eq!(masters[0].get("k").await, None);
    eventually(
        "the dataset is old enough to vote",
        Duration::from_secs(10),
        || async {
            node.acquire(AcquireRequest::new("k", T1, ttl).unless_completed("k:record"))
                .await
                .is_ok()
        },
    )
    .await;
    assert_eq!(masters[0].get("k").await.as_deref(), Some(T1));
    assert!(node
        .complete(CompleteRequest::new("k", "k:record", T1, b"done", ttl))
        .await
        .unwrap());
    let replay = node
        .acquire(AcquireRequest::new("k", T1, ttl).unless_completed("k:record"))
        .await;
    assert_eq!(
        replay.unwrap(),
        Acquire::Completed {
            record: b"done"[..].into()
        }
    );
}

/// The fenced acquire keeps delayed-restart protection: a dataset too young to be trusted
/// abstains (no lock, no counter), and votes once it is old enough — its counter above the
/// clock it restarted at.
#[tokio::test]
async fn redis_fencing_acquire_keeps_restart_protection() {
    use tower_redlock::node::RedisNodeOptions;
    let masters = Masters::start(1);
    // A 2 s ttl behind 3 s of protection: the reads after the acquire have the ttl to spare
    // on a loaded machine.
    let opts = RedisNodeOptions::new().restart_protection(Duration::from_secs(3));
    let node = RedisNode::open_with(&masters[0].url(), &opts).unwrap();
    let (ttl, retain) = (Duration::from_secs(2), Duration::from_secs(10));
    let young = node
        .acquire(AcquireRequest::new("k", T1, ttl).fenced("k:fence", retain))
        .await;
    assert!(young.is_err(), "{young:?}");
    assert_eq!(masters[0].get("k").await, None);
    assert_eq!(masters[0].get("k:fence").await, None);
    eventually(
        "the dataset is old enough to vote",
        Duration::from_secs(10),
        || async {
            node.acquire(AcquireRequest::new("k", T1, ttl).fenced("k:fence", retain))
                .await
                .is_ok()
        },
    )
    .await;
    assert_eq!(masters[0].get("k").await.as_deref(), Some(T1));
    let raw = masters[0].get("k:fence").await.unwrap();
    let counter: u64 = raw.strip_prefix("TRF1:").unwrap().parse().unwrap();
    // Too long a ttl for the protection window: refused before anything is sent.
    let long = node
        .acquire(AcquireRequest::new("k2", T1, Duration::from_secs(5)).fenced("k2:fence", retain))
        .await;
    assert!(long.is_err(), "{long:?}");
    assert!(
        counter > 1_600_000_000_000_000,
        "{counter} is not from the clock"
    );
}
