//! Unit tests of the release (`mod.rs`).

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{FIRST_PAUSE, MAX_PAUSE, PATIENCE};

use crate::node::tests::Wrapped;
use crate::node::MemoryNode;
use crate::{Redlock, Retry};

/// A node that said "held" holds nothing of ours and is not asked to release — and it
/// counts as released: the lease's own quorum does not need every one of its nodes then.
#[tokio::test]
async fn a_node_that_said_held_counts_as_released() {
    let (held, free) = (MemoryNode::new(), MemoryNode::new());
    let slow = Wrapped {
        inner: MemoryNode::new(),
        hang_on_release: true,
        releases: Default::default(),
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

/// A client over two memory nodes and a node that never answers a release (suspension
/// off: no probe asks it meanwhile); and the count of the releases that node was asked.
fn with_a_silent_node() -> (Redlock, Arc<AtomicUsize>) {
    let slow = Wrapped {
        inner: MemoryNode::new(),
        hang_on_release: true,
        releases: Default::default(),
    };
    let calls = slow.releases.clone();
    let redlock = Redlock::builder()
        .node(MemoryNode::new())
        .node(MemoryNode::new())
        .node(slow)
        .node_timeout(NODE_TIMEOUT)
        .suspend_after(0)
        .retry(Retry::never())
        .build()
        .unwrap();
    (redlock, calls)
}

const NODE_TIMEOUT: Duration = Duration::from_millis(20);
/// How long the waits below give a state that comes in milliseconds: only a test that
/// fails waits it out.
const GENEROUS: Duration = Duration::from_secs(10);

/// Polls `done` every 10 ms until it is true; panics with `what` after [`GENEROUS`].
async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < GENEROUS,
            "not within {GENEROUS:?}: {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The background part of a release retries a node that does not answer for a bounded
/// time, not for the lock's ttl (an hour), and ends when the client is dropped.
///
/// Bounded: with the client alive, the retries end by themselves. The release is then owed to the
/// node (`owed.rs`), the retry loop's last act. The node was asked at most once plus the retries
/// that fit in the background's [`PATIENCE`] node timeouts. The pauses start from [`FIRST_PAUSE`],
/// doubling up to [`MAX_PAUSE`]: 10 + 20 + 40 + 80 ms fit in 200 ms, so 4. A count, not a time: a
/// loaded machine only makes it fewer.
///
/// Ends with the client: a second client is dropped as soon as its release returned (nothing runs
/// in between on this single-threaded runtime), while its background retries are under way. The
/// test waits until nothing holds the silent node any more (its count's only other owner is the
/// node), so it can never be asked again. The node was asked only the first round's request,
/// already handed to the background task: a retry needs the client. The 10 s waits are only the
/// failure's deadline.
#[tokio::test]
async fn background_release_retries_are_bounded_and_end_with_the_client() {
    let ttl = Duration::from_secs(3600);

    // Bounded: the client lives on.
    let (redlock, calls) = with_a_silent_node();
    let lease = redlock.try_lock("r", ttl).await.unwrap();
    lease
        .release()
        .await
        .expect("a quorum: the two memory nodes");
    let silent = redlock.inner.nodes[2].clone();
    wait_until(
        "the background retries end, and the release is owed to the silent node",
        || !silent.owed.is_empty(),
    )
    .await;
    let asked = calls.load(SeqCst);
    let patience = NODE_TIMEOUT * PATIENCE;
    let (mut retries, mut pauses, mut pause) = (0, Duration::ZERO, FIRST_PAUSE);
    while pauses + pause < patience {
        pauses += pause;
        pause = (pause * 2).min(MAX_PAUSE);
        retries += 1;
    }
    assert!(asked >= 1, "the silent node was asked");
    assert!(
        asked <= 1 + retries,
        "the silent node was asked {asked} times: more than the first round and the \
         {retries} retries that fit in {patience:?}"
    );
    drop(silent);
    drop(redlock);

    // Ends with the client: dropped while its background retries are under way.
    let (redlock, calls) = with_a_silent_node();
    let lease = redlock.try_lock("r", ttl).await.unwrap();
    lease
        .release()
        .await
        .expect("a quorum: the two memory nodes");
    drop(redlock);
    wait_until(
        "nothing holds the silent node once the client is dropped",
        || Arc::strong_count(&calls) == 1,
    )
    .await;
    let asked = calls.load(SeqCst);
    assert_eq!(
        asked, 1,
        "the silent node was asked {asked} times: the release kept retrying after the \
         client was dropped"
    );
}
