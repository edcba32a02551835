//! The shipped conformance kit as its users run it (`conformance::check`): it passes the
//! built-in nodes, skips what a node does not declare, and fails each node that gets a
//! promise wrong (its self-test), naming the check.

use std::panic::AssertUnwindSafe;

use futures_util::FutureExt;
use tower_redlock::conformance::{self, Peek, PeekFuture, Report};
use tower_redlock::node::{MemoryNode, Node, RedisNode};

use super::support::{self, Masters};

/// The store of a node over a [`MemoryNode`].
struct Memory(MemoryNode);

impl Peek for Memory {
    fn peek<'a>(&'a self, key: &'a str) -> PeekFuture<'a> {
        Box::pin(async move { self.0.get(key) })
    }
}

/// A master of its own (stopped when dropped), read with `GET`.
struct Master(Masters);

impl Peek for Master {
    fn peek<'a>(&'a self, key: &'a str) -> PeekFuture<'a> {
        Box::pin(self.0[0].get(key))
    }

    fn own_token_acquired(&self) -> bool {
        true
    }
}

/// The kit's run of `node` (over the `MemoryNode` it returns), or the failed check's panic
/// message.
async fn run<N: Node>(node: impl Fn(MemoryNode) -> N) -> Result<Report, String> {
    let ran = AssertUnwindSafe(conformance::check(|| {
        let store = MemoryNode::new();
        let node = node(store.clone());
        async move { (node, Memory(store)) }
    }))
    .catch_unwind()
    .await;
    ran.map_err(|panic| {
        (panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(a panic without a message)".to_owned())
    })
}

/// A `MemoryNode` passes every check; a node declaring locks only passes the lock checks and
/// skips the others.
#[tokio::test]
async fn kit_passes_the_memory_node_and_skips_what_a_node_does_not_declare() {
    let all = run(|store| store).await.expect("a MemoryNode passes");
    assert_eq!(all.passed().len(), conformance::names().count());
    assert!(all.skipped().is_empty(), "{all:?}");

    let bare = run(support::nodes::BareNode)
        .await
        .expect("a locks-only node passes");
    assert!(bare.passed().contains(&"extend_expired_key"), "{bare:?}");
    assert!(bare.skipped().contains(&"records_expire"), "{bare:?}");
    assert!(
        bare.skipped()
            .contains(&"fencing_extend_raises_the_counter"),
        "{bare:?}"
    );
    assert_eq!(
        bare.passed().len() + bare.skipped().len(),
        conformance::names().count()
    );
}

/// A `RedisNode` over a real master passes every check (a fresh master per check).
#[tokio::test]
async fn kit_passes_a_redis_master() {
    let report = conformance::check(|| async {
        let masters = tokio::task::spawn_blocking(|| Masters::start(1))
            .await
            .expect("a master");
        let node = RedisNode::open(&masters[0].url()).expect("a valid url");
        (node, Master(masters))
    })
    .await;
    assert_eq!(report.passed().len(), conformance::names().count());
}

/// The self-test: each node that gets a promise wrong fails the kit, at the check that
/// catches it.
#[tokio::test]
async fn kit_fails_each_node_that_gets_a_promise_wrong() {
    let wrong: [(&str, Result<Report, String>, &str); 4] = [
        (
            "a fenced acquire answered as a plain one",
            run(|store| support::nodes::LyingFencingNode(support::nodes::BareNode(store))).await,
            "fencing_starts_from_the_clock_and_grows",
        ),
        (
            "an extension that drops the fence",
            run(support::nodes::FenceDroppingNode).await,
            "fencing_extend_raises_the_counter",
        ),
        (
            "an \"if free\" completion sent as the plain one",
            run(|inner| support::nodes::FreeMisreadingNode {
                inner,
                overreach: false,
            })
            .await,
            "completion_if_free_stores_where_the_key_expired",
        ),
        (
            "an \"if free\" completion that clears another holder's lock",
            run(|inner| support::nodes::FreeMisreadingNode {
                inner,
                overreach: true,
            })
            .await,
            "completion_if_free_never_takes_another_holders_lock",
        ),
    ];
    for (what, outcome, check) in wrong {
        let failed = outcome.expect_err(&format!("the kit passed a node with {what}"));
        assert!(
            failed.starts_with(&format!("conformance check {check} failed")),
            "{what}: {failed}"
        );
    }
}

/// A node that never answers fails the kit (each check is bounded, a minute) instead of
/// hanging it. Tokio's clock is paused: the bound passes at once once nothing else can run.
#[tokio::test(start_paused = true)]
async fn kit_fails_a_node_that_never_answers() {
    use tower_redlock::node::{Acquire, AcquireRequest, ExtendRequest, NodeFuture, ReleaseRequest};

    #[derive(Debug)]
    struct Silent;
    impl Node for Silent {
        fn name(&self) -> &str {
            "silent"
        }
        fn acquire<'a>(&'a self, _: AcquireRequest<'a>) -> NodeFuture<'a, Acquire> {
            Box::pin(std::future::pending())
        }
        fn extend<'a>(&'a self, _: ExtendRequest<'a>) -> NodeFuture<'a, bool> {
            Box::pin(std::future::pending())
        }
        fn release<'a>(&'a self, _: ReleaseRequest<'a>) -> NodeFuture<'a, bool> {
            Box::pin(std::future::pending())
        }
    }

    let failed = run(|_| Silent)
        .await
        .expect_err("the kit passed a silent node");
    assert!(
        failed.starts_with("conformance check acquire_free_key failed: no end within"),
        "{failed}"
    );
}
