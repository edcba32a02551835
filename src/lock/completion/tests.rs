//! A completion's tally against scripted nodes.
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::node::{
    Acquire, AcquireRequest, CallError, Capabilities, CompleteRequest, ExtendRequest, MemoryNode,
    Node, NodeFuture, ReleaseRequest,
};
use crate::{Claim, Redlock, Retry};

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
    fn name(&self) -> String {
        "scripted".to_owned()
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
    let redlock = nodes
        .iter()
        .fold(Redlock::builder(), |b, n| b.node(n.clone()))
        .node_timeout(Duration::from_millis(500))
        .retry(Retry::never())
        .build()
        .unwrap();
    let ttl = Duration::from_secs(30);
    let Claim::Locked(lease) = redlock
        .lock_unless_completed("tally", ttl, Retry::never())
        .await
        .unwrap()
    else {
        panic!("nothing was completed yet");
    };
    let stored = lease.complete("done", Duration::from_secs(60)).await;
    stored.expect("the record is on a quorum (nodes 0 and 2): the completion succeeded");
    let completed = |n: &Scripted| n.inner.get("tally").is_none();
    assert!(
        completed(&nodes[0]) && completed(&nodes[2]),
        "stored on 0 and 2"
    );
}
