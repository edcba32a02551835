//! One voter in the quorum.
//!
//! A [`Node`] is one independent lock server: a Redis voter ([`RedisNode`]: one master, a
//! Sentinel-managed group ([`Sentinel`]) or a Redis Cluster (`Cluster`, feature `cluster`))
//! or an in-process map ([`MemoryNode`]). [`Redlock`](crate::Redlock) asks every node in parallel and counts
//! their votes; a node knows nothing of quorums, retries or HTTP.
//!
//! Implement [`Node`] yourself to vote with another store: one method per verb (acquire,
//! extend, release, complete), each given a request value ([`AcquireRequest`], …) whose
//! optional parts — a completion record, a fencing counter — say which form of the verb it
//! is, and [`Node::capabilities`] to say which forms the node knows. The conformance tests in
//! `tests/voters/conformance` show the semantics every node must keep (owner-only release and
//! extend, expiry, an expired key never re-created by an extend, records and counters).

use std::fmt;
use std::future::{ready, Future};
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;

mod any;
mod memory;
mod operate;
mod redis;
mod request;
pub(crate) mod wake;

pub(crate) use self::any::AnyNode;
pub(crate) use self::redis::{EvictionStatus, Packed};

pub use self::memory::MemoryNode;
pub use self::operate::{
    ForceReleaseRequest, Forced, HeldKey, InspectRequest, KeyState, RecordState,
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
/// **Forms.** A request with a completion record or a fencing counter reaches a node only if
/// its [`capabilities`](Node::capabilities) name them (for a node that does not, the client
/// answers an error in its place: its vote is lost, and a release or completion falls back
/// to the plain form, so that a lock it holds is still freed). A node that declares a form
/// must honour it: a fenced request carried out without its counter, or a request with a
/// record without the look, would break the guarantees the forms exist for.
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
///     fn name(&self) -> String {
///         "my-node".to_owned()
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
    fn name(&self) -> String;

    /// The longest ttl this node accepts, if it limits it (delayed-restart protection). The
    /// client refuses longer locks up front.
    fn max_ttl(&self) -> Option<Duration> {
        None
    }

    /// The forms of the verbs this node carries out (see the trait's docs):
    /// [`Capabilities::LOCKS`] unless it says more.
    fn capabilities(&self) -> Capabilities {
        Capabilities::LOCKS
    }

    /// Set the key to the token, only if it is absent (see [`AcquireRequest`] for the forms).
    /// Answer [`Acquire::Held`] only when the key holds a different value (see there).
    fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> NodeFuture<'a, Acquire>;

    /// Set the key's time to live, only if it holds the token (see [`ExtendRequest`]).
    /// Returns whether it did; an absent (expired) key is never re-created. With a fence, the
    /// counter is raised in the same step: answer `true` only if it was (a node that extends
    /// without raising must answer an error instead — the client counts every `true` as a
    /// node carrying the lease's token; `fencing_extend_raises_the_counter` in the
    /// conformance suite checks it).
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
    /// [`Capabilities::records`] must honour it, as the conformance suite's
    /// `completion_if_free_*` checks try.
    ///
    /// The default answers an error: a node that does not store records (see
    /// [`Capabilities::records`]) never stores one.
    fn complete<'a>(&'a self, request: CompleteRequest<'a>) -> NodeFuture<'a, bool> {
        let _ = request;
        Box::pin(ready(Err(CallError::no_records(&self.name()))))
    }

    /// Read what the node holds at the request's keys (see [`InspectRequest`]), writing
    /// nothing: for [`Redlock::inspect`](crate::Redlock::inspect), an operator's question,
    /// never asked by the lock itself.
    ///
    /// The default answers an error: the node cannot be inspected.
    fn inspect<'a>(&'a self, request: InspectRequest<'a>) -> NodeFuture<'a, KeyState> {
        let _ = request;
        Box::pin(ready(Err(CallError::unsupported_by(
            &self.name(),
            "inspection",
        ))))
    }

    /// List the locks whose key starts with `prefix` (at most `limit`; fencing counters and
    /// completion records beside them are not locks), reading only: for
    /// [`Redlock::scan`](crate::Redlock::scan), an operator's question.
    ///
    /// The default answers an error: the node cannot list its keys.
    fn scan<'a>(&'a self, prefix: &'a str, limit: usize) -> NodeFuture<'a, Vec<HeldKey>> {
        let _ = (prefix, limit);
        Box::pin(ready(Err(CallError::unsupported_by(
            &self.name(),
            "listing its keys",
        ))))
    }

    /// Delete the lock at the request's key if its token starts with the request's
    /// [`holder`](ForceReleaseRequest::holder) (whatever token it holds when none is named;
    /// [`ForceReleaseRequest::clears`] tells), and the completion record when asked — with a
    /// holder named, only together with that holder's lock. An implementation must honour
    /// the holder and read, compare and delete in one atomic step: a re-run must never
    /// delete a holder that took the key meanwhile, nor its record. Keeps the fencing
    /// counter: for
    /// [`Redlock::force_release`](crate::Redlock::force_release), an operator's act, never
    /// done by the lock itself.
    ///
    /// The default answers an error: the node cannot be cleared this way.
    fn force_release<'a>(&'a self, request: ForceReleaseRequest<'a>) -> NodeFuture<'a, Forced> {
        let _ = request;
        Box::pin(ready(Err(CallError::unsupported_by(
            &self.name(),
            "forced release",
        ))))
    }
}

/// Why a node call failed.
#[derive(Debug)]
pub struct CallError {
    timeout: bool,
    unreachable: bool,
    /// A default of the trait: the node does not do what was asked at all.
    unsupported: bool,
    /// The voter refused here, without asking the node (it abstains): neither a reply nor a
    /// silence of the node.
    local: bool,
    /// What kind of refusal an error reply was (for [`Error::votes`](crate::Error::votes)).
    refusal: Refusal,
    message: String,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

/// What kind of refusal a node's error was, as [`VoteKind`](crate::VoteKind) names it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// Any other failure.
    #[default]
    Other,
    /// `NOSCRIPT`: the script is not loaded, and could not be sent.
    NoScript,
    /// `WRONGTYPE`, or a key the voter will not overwrite: a key of another kind is there.
    WrongType,
    /// `NOAUTH`, `WRONGPASS`, `NOPERM`: the credentials or the ACL refuse the command.
    Denied,
    /// Delayed-restart (tenure) protection: the master is too young to vote.
    Protected,
    /// The voter refused on its own (a Sentinel group without a recent majority, a master
    /// that may evict).
    Abstained,
}

impl CallError {
    /// A failure with a message.
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            timeout: false,
            unreachable: false,
            unsupported: false,
            local: false,
            refusal: Refusal::Other,
            message: message.into(),
            source: None,
        }
    }

    /// A failure caused by `source`.
    pub fn from_error(source: impl std::error::Error + Send + Sync + 'static) -> Self {
        Self {
            timeout: false,
            unreachable: false,
            unsupported: false,
            local: false,
            refusal: Refusal::Other,
            message: source.to_string(),
            source: Some(Box::new(source)),
        }
    }

    /// A node without completion records: the default of [`Node::complete`], and the
    /// client's answer in the place of a node that does not declare them.
    fn no_records(name: &str) -> Self {
        Self::new(format!("{name} does not store completion records"))
    }

    /// A node without an operator's verb (the default of [`Node::inspect`] and
    /// [`Node::force_release`]).
    fn unsupported_by(name: &str, what: &str) -> Self {
        Self {
            unsupported: true,
            ..Self::new(format!("{name} does not support {what}"))
        }
    }

    /// A node without fencing counters: the client's answer to a fenced request in the place
    /// of a node that does not declare them (a release or completion falls back to the plain
    /// form on it).
    fn no_fencing(name: &str) -> Self {
        Self {
            unsupported: true,
            ..Self::new(format!("{name} does not keep fencing counters"))
        }
    }

    /// Whether the node does not keep fencing counters (see [`CallError::no_fencing`]).
    pub(crate) fn is_unsupported(&self) -> bool {
        self.unsupported
    }

    /// Marks the failure as the voter's own refusal, made without asking the node (it
    /// abstains): it says nothing of the node's health.
    pub(crate) fn abstaining(mut self) -> Self {
        self.local = true;
        self.refusal = Refusal::Abstained;
        self
    }

    /// Marks the failure as a refusal of this kind.
    pub(crate) fn refusing(mut self, refusal: Refusal) -> Self {
        self.refusal = refusal;
        self
    }

    /// What kind of refusal it was.
    pub(crate) fn refusal(&self) -> Refusal {
        self.refusal
    }

    /// Whether the voter refused without asking the node (see [`CallError::abstaining`]).
    pub(crate) fn is_local(&self) -> bool {
        self.local
    }

    /// Mark the failure as a timeout.
    pub fn with_timeout(mut self) -> Self {
        self.timeout = true;
        self
    }

    /// Whether the node did not answer in time.
    pub fn is_timeout(&self) -> bool {
        self.timeout
    }

    /// Mark the failure as "the node could not be reached" (connection refused, dropped,
    /// not yet made): no reply came from the node. Such failures count toward its
    /// suspension, like timeouts; a reply — even an error reply — shows the node is there.
    pub fn with_unreachable(mut self) -> Self {
        self.unreachable = true;
        self
    }

    /// Whether the node could not be reached (see [`CallError::with_unreachable`]).
    pub fn is_unreachable(&self) -> bool {
        self.unreachable
    }
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CallError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<::redis::RedisError> for CallError {
    fn from(e: ::redis::RedisError) -> Self {
        if let Some(abstains) = self::redis::eviction_refusal(&e) {
            return abstains;
        }
        let timeout = e.is_timeout();
        let unreachable = self::redis::conn::connection_lost(&e);
        let local = self::redis::conn::is_abstention(&e);
        let refusal = match e.code() {
            _ if local => Refusal::Abstained,
            _ if e.kind() == ::redis::ErrorKind::AuthenticationFailed => Refusal::Denied,
            Some("NOSCRIPT") => Refusal::NoScript,
            Some("WRONGTYPE") => Refusal::WrongType,
            Some("NOPERM" | "NOAUTH" | "WRONGPASS") => Refusal::Denied,
            _ => Refusal::Other,
        };
        let mut f = Self::from_error(e);
        f.timeout = timeout;
        f.unreachable = unreachable;
        f.local = local;
        f.refusal = refusal;
        f
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
        fn name(&self) -> String {
            "wrapped".to_owned()
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
        fn name(&self) -> String {
            "declaring".to_owned()
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
    }

    /// The client sends a custom node only the forms its capabilities name. With fencing
    /// on, a node declaring locks only is never sent a fence: its fenced acquire is refused
    /// in its place (its vote lost, the lock taken by the two others), and the lease's
    /// release reaches it in the plain form; the same node declaring fencing is sent the
    /// fenced forms.
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
        let crate::Claim::Locked(lease) = redlock
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
        assert!(matches!(again, crate::Claim::Completed(_)), "{again:?}");
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
