//! A completion's tally against scripted nodes.
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

use crate::node::{
    Acquire, AcquireRequest, CallError, Capabilities, CompleteRequest, ExtendRequest, MemoryNode,
    Node, NodeFuture, ReleaseRequest,
};
use crate::{LockOrRecord, Redlock, Retry};

/// What a [`Scripted`] node does with one completion request.
#[derive(Debug, Clone, Copy)]
enum Step {
    /// Store it (the memory node's completion).
    Store,
    /// No reply: the request is lost on the way (nothing stored).
    Unreachable,
    /// Answer "not stored" at once.
    Refuse,
    /// Store it, answering after this delay.
    StoreAfter(Duration),
}

/// A node whose completions follow a script, one step per request (then `Store`).
#[derive(Debug, Clone)]
struct Scripted {
    inner: MemoryNode,
    steps: Arc<Mutex<VecDeque<Step>>>,
}

impl Scripted {
    fn new(steps: &[Step]) -> Self {
        Self {
            inner: MemoryNode::new(),
            steps: Arc::new(Mutex::new(steps.iter().copied().collect())),
        }
    }
}

impl Node for Scripted {
    fn name(&self) -> &str {
        "scripted"
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::LOCKS.with_records()
    }
    fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> NodeFuture<'a, Acquire> {
        self.inner.acquire(request)
    }
    fn release<'a>(&'a self, request: ReleaseRequest<'a>) -> NodeFuture<'a, bool> {
        self.inner.release(request)
    }
    fn extend<'a>(&'a self, request: ExtendRequest<'a>) -> NodeFuture<'a, bool> {
        self.inner.extend(request)
    }
    fn complete<'a>(&'a self, request: CompleteRequest<'a>) -> NodeFuture<'a, bool> {
        let step = self
            .steps
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or(Step::Store);
        Box::pin(async move {
            match step {
                Step::Store => {}
                Step::Unreachable => {
                    return Err(CallError::new("connection reset").with_unreachable())
                }
                Step::Refuse => return Ok(false),
                Step::StoreAfter(d) => tokio::time::sleep(d).await,
            }
            self.inner.complete(request).await
        })
    }
}

/// A completion's retry round counts every answer it gets: a node that refuses first
/// does not hide the store a slower node answers after it. Here the record reaches node 0
/// in the first round and node 2 in the retry (node 1 refusing at once): a quorum of
/// three stored it, and the completion says so.
#[tokio::test]
async fn completion_tally_counts_a_retry_rounds_stores_after_a_refusal() {
    let nodes = [
        Scripted::new(&[Step::Store]),
        Scripted::new(&[Step::Unreachable, Step::Refuse]),
        Scripted::new(&[
            Step::Unreachable,
            Step::StoreAfter(Duration::from_millis(30)),
        ]),
    ];
    let redlock = scripted_client(&nodes);
    let lease = scripted_lease(&redlock, "tally").await;
    let stored = lease.complete("done", Duration::from_secs(60)).await;
    stored.expect("the record is on a quorum (nodes 0 and 2): the completion succeeded");
    let completed = |n: &Scripted| n.inner.get("tally").is_none();
    assert!(
        completed(&nodes[0]) && completed(&nodes[2]),
        "stored on 0 and 2"
    );
}

// --- the completion of a lease that may be lost (`lost.rs`) ---

const DAY: Duration = Duration::from_secs(86_400);
const PATIENCE: Duration = Duration::from_secs(2);

fn client_of(nodes: &[MemoryNode], fencing: bool) -> Redlock {
    nodes
        .iter()
        .fold(Redlock::builder(), |b, n| b.node(n.clone()))
        .fencing(fencing)
        .retry(Retry::never())
        .build()
        .unwrap()
}

/// A lease for `key`, taken with a ttl of 200 ms, once its lock has expired on every node
/// (its validity is over then too: it ends before the ttl). (200 ms, not 50: the validity is
/// the ttl less the acquisition's time, and a test thread preempted on a loaded machine may
/// eat 50 ms; the expiry is awaited anyway.)
async fn expired_lease(redlock: &Redlock, nodes: &[MemoryNode], key: &str) -> crate::Lease {
    let ttl = Duration::from_millis(200);
    let LockOrRecord::Locked(lease) = redlock
        .lock_unless_completed(key, ttl, Retry::never())
        .await
        .unwrap()
    else {
        panic!("nothing was completed yet");
    };
    let start = std::time::Instant::now();
    while nodes.iter().any(|n| n.get(key).is_some()) {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the lock never expired"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        !lease.is_valid(),
        "the validity ends before the lock expires"
    );
    lease
}

/// `complete_lost` stores the record where the lease's lock has expired (the "if free"
/// completion; with fencing too, then fenced), and a duplicate then gets the record instead
/// of a lock; the lease ends. The plain completion of such a lease stores nothing.
#[tokio::test]
async fn complete_lost_stores_where_the_lock_expired() {
    for fencing in [false, true] {
        let nodes = [MemoryNode::new(), MemoryNode::new(), MemoryNode::new()];
        let redlock = client_of(&nodes, fencing);
        // The plain completion of an expired lease: refused, nothing stored.
        let lease = expired_lease(&redlock, &nodes, "plain").await;
        assert!(lease.complete("no", DAY).await.unwrap_err().is_lost());
        let again = redlock.lock_unless_completed("plain", DAY, Retry::never());
        assert!(matches!(again.await.unwrap(), LockOrRecord::Locked(_)));

        let lease = expired_lease(&redlock, &nodes, "lost").await;
        let handle = lease.handle();
        let record = Bytes::from_static(b"outcome unknown");
        let stored = lease.complete_lost(record.clone(), DAY, PATIENCE).await;
        stored.unwrap_or_else(|e| panic!("fencing {fencing}: not stored: {e}"));
        assert!(handle.is_lost(), "the lease ended");
        let claim = redlock.lock_unless_completed("lost", DAY, Retry::never());
        match claim.await.unwrap() {
            LockOrRecord::Completed(got) => assert_eq!(got, record),
            other => panic!("fencing {fencing}: a duplicate got {other:?}"),
        }
        assert!(
            nodes.iter().all(|n| n.get("lost").is_none()),
            "no lock left"
        );
    }
}

/// Where another client took the lock after the lease expired — on a quorum — the record is
/// refused there: `complete_lost` answers lost, and the other holder keeps its lock (the
/// record lands only on the node that was free).
#[tokio::test]
async fn complete_lost_never_takes_another_holders_lock() {
    let nodes = [MemoryNode::new(), MemoryNode::new(), MemoryNode::new()];
    let redlock = client_of(&nodes, false);
    let lease = expired_lease(&redlock, &nodes, "taken").await;
    let other = client_of(&nodes[..2], false);
    let theirs = other.lock("taken", DAY).await.unwrap();
    let stored = lease
        .complete_lost(Bytes::from_static(b"mine"), DAY, PATIENCE)
        .await;
    let err = stored.expect_err("two of three nodes are held by another client");
    assert!(err.is_lost(), "{err}");
    for n in &nodes[..2] {
        assert_eq!(n.get("taken").as_deref(), Some(theirs.value()));
    }
    let on_free = nodes[2]
        .acquire_now(&AcquireRequest::new("taken", "x", DAY).unless_completed("taken:record"));
    // Marked as stored "if free": a record stored under a valid lease outranks it. With
    // what it has left (at most its retention).
    let Acquire::CompletedIfFree { record, remaining } = on_free else {
        panic!("{on_free:?} is not a record stored \"if free\"");
    };
    assert_eq!(record, Bytes::from_static(b"mine"));
    assert!(
        remaining.is_some_and(|r| r <= DAY && r > DAY / 2),
        "{remaining:?}"
    );
    theirs
        .release()
        .await
        .expect("the other holder's lock is intact");
}

fn scripted_client(nodes: &[Scripted]) -> Redlock {
    nodes
        .iter()
        .fold(Redlock::builder(), |b, n| b.node(n.clone()))
        .node_timeout(Duration::from_millis(500))
        .retry(Retry::never())
        .build()
        .unwrap()
}

async fn scripted_lease(redlock: &Redlock, key: &str) -> crate::Lease {
    let claim = redlock.lock_unless_completed(key, Duration::from_secs(30), Retry::never());
    let LockOrRecord::Locked(lease) = claim.await.unwrap() else {
        panic!("nothing was completed yet");
    };
    lease
}

/// Nodes that give no answer are asked again until a quorum stored the record.
#[tokio::test]
async fn complete_lost_asks_again_until_a_quorum_stored_it() {
    let nodes = [
        Scripted::new(&[Step::Store]),
        Scripted::new(&[Step::Unreachable, Step::Unreachable, Step::Store]),
        Scripted::new(&[Step::Unreachable; 1000]),
    ];
    let redlock = scripted_client(&nodes);
    let lease = scripted_lease(&redlock, "retried").await;
    let stored = lease
        .complete_lost(Bytes::from_static(b"done"), DAY, PATIENCE)
        .await;
    stored.expect("stored on nodes 0 and 1, node 1 on its third try");
    assert!(nodes[0].inner.get("retried").is_none() && nodes[1].inner.get("retried").is_none());
}

/// Nodes that never answer: once the patience has passed, unavailable (not lost: they may
/// store it yet).
#[tokio::test]
async fn complete_lost_is_unavailable_once_its_patience_ran_out() {
    let nodes = [
        Scripted::new(&[Step::Store]),
        Scripted::new(&[Step::Unreachable; 1000]),
        Scripted::new(&[Step::Unreachable; 1000]),
    ];
    let redlock = scripted_client(&nodes);
    let lease = scripted_lease(&redlock, "silent").await;
    let start = std::time::Instant::now();
    let patience = Duration::from_millis(300);
    let stored = lease
        .complete_lost(Bytes::from_static(b"done"), DAY, patience)
        .await;
    let err = stored.expect_err("only one node of three answers");
    assert!(err.is_unavailable(), "{err}");
    assert!(
        start.elapsed() >= Duration::from_millis(100),
        "gave up at once"
    );
    assert!(
        start.elapsed() < Duration::from_secs(2),
        "past its patience"
    );
}

/// A record over the limit is refused before anything is sent, and the lease released.
#[tokio::test]
async fn complete_lost_refuses_an_invalid_record() {
    let nodes = [MemoryNode::new()];
    let redlock = client_of(&nodes, false);
    let claim = redlock.lock_unless_completed("big", DAY, Retry::never());
    let LockOrRecord::Locked(lease) = claim.await.unwrap() else {
        panic!("nothing was completed yet");
    };
    let big = Bytes::from(vec![0u8; crate::Lease::MAX_RECORD_LEN + 1]);
    let err = lease.complete_lost(big, DAY, PATIENCE).await.unwrap_err();
    assert!(err.is_invalid_input(), "{err}");
    assert_eq!(nodes[0].get("big"), None, "released");
    let claim = redlock.lock_unless_completed("big", DAY, Retry::never());
    assert!(
        matches!(claim.await.unwrap(), LockOrRecord::Locked(_)),
        "nothing stored"
    );
}

/// The middleware's completion (`Lease::complete_or_free`) of a lease that was valid when the write
/// started and ran out before the node answered. The plain completion comes too late (refused where
/// the lock expired), and the "if free" one stores the record: the duplicate gets it. A lease lost
/// before the write goes straight to the "if free" form.
#[tokio::test]
async fn replay_a_record_is_stored_even_when_the_lease_ran_out_during_the_write() {
    let node = Scripted::new(&[Step::StoreAfter(Duration::from_millis(700))]);
    let redlock = scripted_client(std::slice::from_ref(&node));
    let claim =
        redlock.lock_unless_completed("late-write", Duration::from_millis(150), Retry::never());
    let LockOrRecord::Locked(lease) = claim.await.unwrap() else {
        panic!("nothing was completed yet");
    };
    let record = Bytes::from_static(b"the response");
    let wait = Duration::from_secs(5);
    lease
        .complete_or_free(record.clone(), DAY, PATIENCE, wait)
        .await
        .expect("stored by the if-free completion");
    let again = redlock.lock_unless_completed("late-write", Duration::from_secs(1), Retry::never());
    match again.await.unwrap() {
        LockOrRecord::Completed(got) => assert_eq!(got, record),
        other => panic!("the work would run again: {other:?}"),
    }

    let lost = expired_lease(&redlock, std::slice::from_ref(&node.inner), "lost-before").await;
    assert!(!lost.is_valid());
    lost.complete_or_free(record.clone(), DAY, PATIENCE, wait)
        .await
        .expect("stored where the lock expired");
    let again =
        redlock.lock_unless_completed("lost-before", Duration::from_secs(1), Retry::never());
    assert!(matches!(again.await.unwrap(), LockOrRecord::Completed(_)));
}

/// A replay acquire that answers with a lost lease's record (rule 5 of `records.rs`) copies
/// it where it locked; a copy that misses one of those nodes (an error, or no answer within
/// the node timeout) answers unavailable — with that node's error, transient, so worth
/// another try — never the record, and its lock there is released; a refusal is final (no
/// error to name, not transient). The next try answers with the record.
#[tokio::test]
async fn replay_a_copy_that_misses_a_locked_node_is_unavailable_and_released() {
    let late = Step::StoreAfter(Duration::from_secs(2));
    let cases = [
        ("unreachable", Step::Unreachable, true),
        ("silent", late, true),
        ("refused", Step::Refuse, false),
    ];
    for (case, miss, transient) in cases {
        let nodes = [
            Scripted::new(&[]),
            Scripted::new(&[Step::Store]),
            Scripted::new(&[miss]),
        ];
        let redlock = scripted_client(&nodes);
        let (key, record) = (
            "copy-misses",
            Bytes::from_static(b"the lost lease's response"),
        );
        let record_key = super::record_key(key);
        // The lost lease's "if free" record, on the first node alone.
        let lost = CompleteRequest::new(key, &record_key, "lost", &record, DAY).or_if_free();
        assert!(nodes[0].inner.complete(lost).await.unwrap());

        let claim = redlock.lock_unless_completed(key, Duration::from_secs(30), Retry::never());
        let e = claim.await.expect_err("the copy missed the third node");
        assert!(e.is_unavailable() && e.found_records(), "{case}: {e}");
        let named: Vec<usize> = e.node_errors().iter().map(|e| e.node()).collect();
        let expected: &[usize] = if transient { &[2] } else { &[] };
        assert_eq!(named, expected, "{case}: the node the copy missed: {e}");
        assert_eq!(Retry::is_transient_failure(&e), transient, "{case}: {e}");
        // The lock the try took on the third node goes (released in the background, or
        // ended by the late copy).
        let start = std::time::Instant::now();
        while nodes[2].inner.get(key).is_some() {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "{case}: the lock was left"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(
            nodes[1].inner.get(key).is_none(),
            "{case}: the copy ended the lock"
        );

        let again = redlock.lock_unless_completed(key, Duration::from_secs(30), Retry::never());
        match again.await.unwrap() {
            LockOrRecord::Completed(got) => assert_eq!(got, record, "{case}"),
            other => panic!("{case}: the work would run again: {other:?}"),
        }
        assert!(nodes.iter().all(|n| n.inner.get(key).is_none()), "{case}");
    }
}
