//! One voter in the quorum.
//!
//! A [`Node`] is one independent lock server: a Redis voter ([`RedisNode`]: one master, a
//! Sentinel-managed group ([`Sentinel`]) or a Redis Cluster (`Cluster`, feature `cluster`))
//! or an in-process map ([`MemoryNode`]). [`Redlock`](crate::Redlock) asks every node in parallel and counts
//! their votes; a node knows nothing of quorums, retries or HTTP.
//!
//! Implement [`Node`] yourself to vote with another store. It has one method per verb: acquire,
//! extend, release, and complete and operate if the node has them. Each is given a request value
//! ([`AcquireRequest`], …) whose optional parts — a completion record, a fencing counter — say
//! which form of the verb it is. Its [`Node::capabilities`] declares, in one place, which optional
//! verbs and forms the node knows and the longest ttl it takes. A failure is a [`CallError`],
//! marked as a timeout, an unreachable node or a kind of [`Refusal`] as the built-in voters' are.
//! The conformance kit ([`conformance`](crate::conformance), feature `conformance`) checks against
//! yours the semantics every node must keep, as the built-in voters pass them. These are owner-only
//! release and extend, expiry, an expired key never re-created by an extend, and records and
//! counters.

use std::fmt;
use std::future::{ready, Future};
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;

mod any;
mod error;
mod memory;
mod operate;
mod redis;
mod request;
pub(crate) mod wake;

pub(crate) use self::any::AnyNode;
pub(crate) use self::redis::{EvictionStatus, Packed};

pub use self::error::{CallError, Refusal};
pub use self::memory::MemoryNode;
pub use self::operate::{
    ForceReleaseRequest, Forced, HeldKey, InspectRequest, KeyState, Operated, Operation,
    RecordState,
};
#[cfg(feature = "cluster")]
#[cfg_attr(docsrs, doc(cfg(feature = "cluster")))]
pub use self::redis::Cluster;
pub use self::redis::{split_urls, RedisNode, RedisNodeOptions, Sentinel};
pub use self::request::{
    AcquireRequest, Capabilities, CompleteRequest, ExtendRequest, FenceBump, FenceFloor,
    ReleaseRequest,
};

/// The future a [`Node`] returns: boxed, `Send`, borrowing its arguments.
pub type NodeFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, CallError>> + Send + 'a>>;

/// A node's answer to an [`AcquireRequest`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Acquire {
    /// The key was absent and now holds our token with the requested ttl.
    Acquired,
    /// The key is held by **another** value; `remaining` is the holder's remaining ttl, or
    /// `None` when the node cannot tell (no expiry, or the key vanished before its ttl was
    /// read): only a live holder's ttl makes a `Retry-After`.
    ///
    /// The client relies on "another": it sends no release to a node that answered `Held`.
    /// A node that retries a request internally (its first `SET` landed, the answer was
    /// lost, the retry found the key taken) must answer [`Acquire::Acquired`] when the key
    /// holds this very token.
    Held {
        /// The holder's remaining time to live, when it has one.
        remaining: Option<Duration>,
    },
    /// Only to a request with a [`record_key`](AcquireRequest::record_key): the work is done,
    /// `record` is what [`Node::complete`] stored for it; nothing was locked.
    Completed {
        /// The stored completion record.
        record: Bytes,
    },
    /// As [`Acquire::Completed`], for a record stored by the "if free" completion
    /// ([`CompleteRequest::if_free`]), ranked below one stored under a valid lease. Required
    /// of a node that declares records (checked by `completion_if_free_*`).
    CompletedIfFree {
        /// The stored completion record.
        record: Bytes,
        /// Its time left (`None`: unknown): how long a copy lasts (docs/replay.md, rule 5).
        remaining: Option<Duration>,
    },
    /// Only to a request with a [`fence`](AcquireRequest::fence): as [`Acquire::Acquired`],
    /// and the resource's fencing counter on this node is now `fence`. (A fenced request
    /// answered [`Acquire::Acquired`] is not a vote: the client releases that key.)
    Fenced {
        /// The counter's new value.
        fence: u64,
    },
}

/// One lock server voting in the quorum: one method per verb, the verb's forms carried by its
/// request value.
///
/// Every method must be atomic on the node and must not re-create an absent key except in
/// [`Node::acquire`]. Implementations need not apply timeouts: the client wraps every call
/// in its per-node timeout.
///
/// **Capabilities.** Every optional ability is declared by [`Node::capabilities`], and only then
/// asked for. These are completion records ([`Node::complete`] and the record forms), fencing
/// counters (the fenced forms), operator calls ([`Node::operate`]), and a longest ttl
/// (delayed-restart protection: the client refuses longer locks up front).
///
/// **Forms.** A request with a completion record or a fencing counter reaches a node only if its
/// [`capabilities`](Node::capabilities) name them. For a node that does not, the client answers an
/// error in its place. Its vote is lost, and a release or completion falls back to the plain form,
/// so that a lock it holds is still freed. A node that declares a form must honour it. A fenced
/// request carried out without its counter, or a request with a record without the look, would
/// break the guarantees the forms exist for.
///
/// **Order.** The client stops polling an acquire's future once the lock's outcome is
/// decided without it (and drops it with the failed try, or with the lease), and may then
/// release the same key and token on the node. A node must keep
/// the two in order: a request whose future was dropped is either never carried out, or
/// carried out before any request made to the same node afterwards. A single connection or
/// queue per node gives this (redis-rs' multiplexed connection does: a request handed to it
/// is written before any later one, and one not yet handed over is never sent).
///
/// ```
/// use tower_redlock::node::{
///     Acquire, AcquireRequest, ExtendRequest, MemoryNode, Node, NodeFuture, ReleaseRequest,
/// };
///
/// /// A node of one's own, here over a `MemoryNode`: locks only (the default capabilities).
/// #[derive(Debug, Default)]
/// struct MyNode(MemoryNode);
///
/// impl Node for MyNode {
///     fn name(&self) -> &str {
///         "my-node"
///     }
///     fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> NodeFuture<'a, Acquire> {
///         self.0.acquire(request)
///     }
///     fn extend<'a>(&'a self, request: ExtendRequest<'a>) -> NodeFuture<'a, bool> {
///         self.0.extend(request)
///     }
///     fn release<'a>(&'a self, request: ReleaseRequest<'a>) -> NodeFuture<'a, bool> {
///         self.0.release(request)
///     }
/// }
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// let redlock = tower_redlock::Redlock::builder().node(MyNode::default()).build().unwrap();
/// let lease = redlock.try_lock("job", std::time::Duration::from_secs(5)).await.unwrap();
/// lease.release().await.unwrap();
/// # }
/// ```
pub trait Node: fmt::Debug + Send + Sync + 'static {
    /// A short name for errors and logs (`host:port`; never a password).
    fn name(&self) -> &str;

    /// What this node does beyond plain locks, and the longest ttl it accepts (see the
    /// trait's docs): [`Capabilities::LOCKS`] unless it says more.
    fn capabilities(&self) -> Capabilities {
        Capabilities::LOCKS
    }

    /// Set the key to the token, only if it is absent (see [`AcquireRequest`] for the forms).
    /// Answer [`Acquire::Held`] only when the key holds a different value (see there).
    fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> NodeFuture<'a, Acquire>;

    /// Set the key's time to live, only if it holds the token (see [`ExtendRequest`]). Returns
    /// whether it did; an absent (expired) key is never re-created. With a fence, the counter is
    /// raised in the same step: answer `true` only if it was. A node that extends without raising
    /// must answer an error instead. The client counts every `true` as a node carrying the lease's
    /// token. The conformance kit's `fencing_extend_raises_the_counter` checks it.
    fn extend<'a>(&'a self, request: ExtendRequest<'a>) -> NodeFuture<'a, bool>;

    /// Delete the key only if it holds the token (see [`ReleaseRequest`]). Returns whether it
    /// was deleted.
    fn release<'a>(&'a self, request: ReleaseRequest<'a>) -> NodeFuture<'a, bool>;

    /// Store a completion record and end the lock, only if the key holds the token (see
    /// [`CompleteRequest`]). Returns whether it did: `false` when the key no longer holds the
    /// token (the lease expired or was lost), so a stale answer is never stored. Idempotent:
    /// asked again with the same record after its answer was lost, it finds that record and
    /// answers `true` (deleting the key if it still holds the token); a different record
    /// already there answers `false`. With [`CompleteRequest::if_free`], store it also where
    /// the key is absent (never where it holds another value): a node that declares
    /// [`Capabilities::records`] must honour it, as the conformance kit's
    /// `completion_if_free_*` checks try.
    ///
    /// Asked only of a node that declares [`Capabilities::records`]; the default answers an
    /// error.
    fn complete<'a>(&'a self, request: CompleteRequest<'a>) -> NodeFuture<'a, bool> {
        let _ = request;
        Box::pin(ready(Err(CallError::no_records(self.name()))))
    }

    /// An operator's question or act ([`Operation`]: inspect a key, scan a prefix, force a
    /// release), answered by the [`Operated`] of the same kind; never asked by the lock
    /// itself, only by [`Redlock::inspect`](crate::Redlock::inspect),
    /// [`Redlock::scan`](crate::Redlock::scan) and
    /// [`Redlock::force_release`](crate::Redlock::force_release).
    ///
    /// Asked only of a node that declares [`Capabilities::operations`]; the default answers
    /// an error.
    fn operate<'a>(&'a self, operation: Operation<'a>) -> NodeFuture<'a, Operated> {
        let _ = operation;
        Box::pin(ready(Err(CallError::unsupported_by(
            self.name(),
            "operator calls",
        ))))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A node of the user's own: it goes through the trait's boxed futures. With
    /// `hang_on_release`, its releases never answer (a node that is slow for one request).
    #[derive(Debug, Clone, Default)]
    pub(crate) struct Wrapped {
        pub(crate) inner: MemoryNode,
        pub(crate) hang_on_release: bool,
        /// How many releases it was asked.
        pub(crate) releases: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    }

    impl Node for Wrapped {
        fn name(&self) -> &str {
            "wrapped"
        }
        fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> NodeFuture<'a, Acquire> {
            self.inner.acquire(request)
        }
        fn release<'a>(&'a self, request: ReleaseRequest<'a>) -> NodeFuture<'a, bool> {
            self.releases
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if self.hang_on_release {
                return Box::pin(std::future::pending());
            }
            self.inner.release(request)
        }
        fn extend<'a>(&'a self, request: ExtendRequest<'a>) -> NodeFuture<'a, bool> {
            self.inner.extend(request)
        }
    }

    /// A node that declares `caps` and notes every request it is sent: its verb, and
    /// whether it carried a record key or a fence.
    #[derive(Debug, Clone, Default)]
    struct Declaring {
        inner: MemoryNode,
        caps: Capabilities,
        asked: std::sync::Arc<std::sync::Mutex<Vec<Asked>>>,
    }

    /// A request's verb, and whether it carried a record key and a fence.
    type Asked = (&'static str, bool, bool);

    impl Declaring {
        fn note(&self, verb: &'static str, record: bool, fence: bool) {
            self.asked.lock().unwrap().push((verb, record, fence));
        }
    }

    impl Node for Declaring {
        fn name(&self) -> &str {
            "declaring"
        }
        fn capabilities(&self) -> Capabilities {
            self.caps
        }
        fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> NodeFuture<'a, Acquire> {
            let (record, fence) = (request.record_key.is_some(), request.fence.is_some());
            self.note("acquire", record, fence);
            self.inner.acquire(request)
        }
        fn extend<'a>(&'a self, request: ExtendRequest<'a>) -> NodeFuture<'a, bool> {
            self.note("extend", false, request.fence.is_some());
            self.inner.extend(request)
        }
        fn release<'a>(&'a self, request: ReleaseRequest<'a>) -> NodeFuture<'a, bool> {
            self.note("release", false, request.fence.is_some());
            self.inner.release(request)
        }
        fn complete<'a>(&'a self, request: CompleteRequest<'a>) -> NodeFuture<'a, bool> {
            self.note("complete", true, request.fence.is_some());
            self.inner.complete(request)
        }
        fn operate<'a>(&'a self, operation: Operation<'a>) -> NodeFuture<'a, Operated> {
            self.note("operate", false, false);
            self.inner.operate(operation)
        }
    }

    /// Operator calls reach a custom node only if it declares them: without, that voter's
    /// inspection is an error that says so (the node is not asked) and the others answer;
    /// with, its answer is the voter's.
    #[tokio::test]
    async fn a_custom_node_is_asked_operator_calls_only_if_it_declares_them() {
        for caps in [Capabilities::LOCKS, Capabilities::LOCKS.with_operations()] {
            let odd = Declaring {
                caps,
                ..Declaring::default()
            };
            let redlock = crate::Redlock::builder()
                .node(odd.clone())
                .node(MemoryNode::new())
                .node(MemoryNode::new())
                .build()
                .unwrap();
            let lease = redlock
                .try_lock("job", Duration::from_secs(5))
                .await
                .unwrap();
            let seen = redlock.inspect("job").await.unwrap();
            let voter = &seen.voters()[0];
            let operated = odd.asked.lock().unwrap().iter().any(|a| a.0 == "operate");
            assert_eq!(operated, caps.operations, "{caps:?}");
            if caps.operations {
                assert!(voter.key().unwrap().holder.is_some(), "{voter:?}");
            } else {
                let e = voter.error().expect("not asked: an error");
                assert!(e.to_string().contains("operator calls"), "{e}");
            }
            assert!(seen.voters()[1].key().unwrap().holder.is_some());
            lease.release().await.unwrap();
        }
    }

    /// A custom node reports the refusal kinds the built-in voters report: a `CallError`
    /// marked `Denied` is a `denied` vote, `Abstained` an abstention.
    #[tokio::test]
    async fn a_custom_nodes_refusal_is_reported_as_its_kind() {
        #[derive(Debug)]
        struct Refusing(Refusal);
        impl Node for Refusing {
            fn name(&self) -> &str {
                "refusing"
            }
            fn acquire<'a>(&'a self, _: AcquireRequest<'a>) -> NodeFuture<'a, Acquire> {
                Box::pin(ready(Err(CallError::new("no").with_refusal(self.0))))
            }
            fn extend<'a>(&'a self, _: ExtendRequest<'a>) -> NodeFuture<'a, bool> {
                Box::pin(ready(Ok(false)))
            }
            fn release<'a>(&'a self, _: ReleaseRequest<'a>) -> NodeFuture<'a, bool> {
                Box::pin(ready(Ok(false)))
            }
        }
        for (refusal, kind) in [
            (Refusal::Denied, crate::VoteKind::Denied),
            (Refusal::WrongType, crate::VoteKind::WrongType),
            (Refusal::Protected, crate::VoteKind::Protected),
            (Refusal::Abstained, crate::VoteKind::Abstained),
        ] {
            let redlock = crate::Redlock::builder()
                .node(Refusing(refusal))
                .retry(crate::Retry::never())
                .build()
                .unwrap();
            let e = redlock
                .try_lock("job", Duration::from_secs(5))
                .await
                .unwrap_err();
            assert_eq!(e.votes().next().unwrap().kind(), kind, "{e}");
        }
    }

    /// A custom node's longest ttl ([`Capabilities::max_ttl`]) bounds the client's locks: a
    /// longer one is refused up front, nothing asked.
    #[tokio::test]
    async fn a_custom_nodes_max_ttl_refuses_longer_locks() {
        let odd = Declaring {
            caps: Capabilities::LOCKS.with_max_ttl(Duration::from_secs(10)),
            ..Declaring::default()
        };
        let redlock = crate::Redlock::builder().node(odd.clone()).build().unwrap();
        let e = redlock
            .try_lock("job", Duration::from_secs(11))
            .await
            .unwrap_err();
        assert!(odd.asked.lock().unwrap().is_empty(), "asked: {e}");
        let lease = redlock.try_lock("job", Duration::from_secs(10)).await;
        lease
            .expect("within the node's longest ttl")
            .release()
            .await
            .unwrap();
    }

    /// The client sends a custom node only the forms its capabilities name. With fencing on, a node
    /// declaring locks only is never sent a fence. Its fenced acquire is refused in its place (its
    /// vote lost, the lock taken by the two others). The lease's release reaches it in the plain
    /// form. The same node declaring fencing is sent the fenced forms.
    #[tokio::test]
    async fn a_custom_node_is_sent_only_the_forms_it_declares() {
        let ttl = Duration::from_secs(5);
        for caps in [Capabilities::LOCKS, Capabilities::LOCKS.with_fencing()] {
            let odd = Declaring {
                caps,
                ..Declaring::default()
            };
            let redlock = crate::Redlock::builder()
                .node(MemoryNode::new())
                .node(MemoryNode::new())
                .node(odd.clone())
                .fencing(true)
                .build()
                .unwrap();
            let lease = redlock.try_lock("forms", ttl).await.unwrap();
            assert!(lease.fencing_token().is_some());
            lease.release().await.unwrap();
            let asked = odd.asked.lock().unwrap().clone();
            if caps.fencing {
                assert!(asked.contains(&("acquire", false, true)), "{asked:?}");
                assert!(asked.contains(&("release", false, true)), "{asked:?}");
            } else {
                assert!(asked.iter().all(|(_, _, fence)| !fence), "{asked:?}");
                assert!(asked.contains(&("release", false, false)), "{asked:?}");
            }
            assert!(odd.inner.is_empty(), "the odd node keeps a lock");
        }
    }

    /// Idempotent work on a custom node declaring locks only: it is never sent a record key
    /// or a completion; the two nodes that store records carry the work.
    #[tokio::test]
    async fn a_node_without_records_is_never_sent_one() {
        let odd = Declaring::default();
        let redlock = crate::Redlock::builder()
            .node(MemoryNode::new())
            .node(MemoryNode::new())
            .node(odd.clone())
            .build()
            .unwrap();
        let ttl = Duration::from_secs(5);
        let crate::LockOrRecord::Locked(lease) = redlock
            .lock_unless_completed("work", ttl, crate::Retry::never())
            .await
            .unwrap()
        else {
            panic!("not locked");
        };
        lease.complete(&b"done"[..], ttl).await.unwrap();
        let again = redlock
            .lock_unless_completed("work", ttl, crate::Retry::never())
            .await
            .unwrap();
        assert!(
            matches!(again, crate::LockOrRecord::Completed(_)),
            "{again:?}"
        );
        let asked = odd.asked.lock().unwrap().clone();
        assert!(asked.iter().all(|(_, record, _)| !record), "{asked:?}");
    }

    #[test]
    fn built_in_nodes_are_dispatched_statically() {
        assert!(matches!(
            AnyNode::new(MemoryNode::new()),
            AnyNode::Memory(_)
        ));
        let custom = AnyNode::new(Wrapped::default());
        assert!(matches!(custom, AnyNode::Custom(_)));
        assert_eq!(custom.name(), "wrapped");
    }

    #[tokio::test]
    async fn a_redis_node_given_as_a_node_is_dispatched_statically() {
        // Lazy: nothing connects to this port.
        let node = RedisNode::open("redis://127.0.0.1:9").unwrap();
        assert!(matches!(AnyNode::new(node), AnyNode::Redis(_)));
    }

    #[tokio::test]
    async fn a_custom_node_votes_through_the_trait() {
        let node = MemoryNode::new();
        let redlock = crate::Redlock::builder()
            .node(Wrapped {
                inner: node.clone(),
                hang_on_release: false,
                releases: Default::default(),
            })
            .build()
            .unwrap();
        let ttl = Duration::from_secs(5);
        let lease = redlock.try_lock("custom:1", ttl).await.unwrap();
        assert_eq!(node.get("custom:1").as_deref(), Some(lease.value()));
        assert!(redlock
            .try_lock("custom:1", ttl)
            .await
            .unwrap_err()
            .is_contended());
        lease.extend(ttl).await.unwrap();
        lease.release().await.unwrap();
        assert!(node.is_empty());
    }
}
