//! A node as the client holds it: the built-in nodes called directly, others through the
//! [`Node`] trait.

use std::any::Any;
use std::future::{ready, Future};
use std::time::Duration;

use futures_util::future::Either;

#[cfg(doc)]
use super::Capabilities;
use super::{
    Acquire, AcquireRequest, CallError, CompleteRequest, EvictionStatus, ExtendRequest,
    ForceReleaseRequest, Forced, HeldKey, InspectRequest, KeyState, MemoryNode, Node, NodeFuture,
    Operated, Operation, Packed, RedisNode, ReleaseRequest,
};

/// A node as the client holds it. The built-in nodes are called directly, so a request to
/// one costs no boxed future (measured in `bench/benches/profile.rs`: a box per request cost about
/// a tenth of the throughput); other nodes go through the [`Node`] trait.
#[derive(Debug)]
pub(crate) enum AnyNode {
    Redis(RedisNode),
    Memory(MemoryNode),
    Custom(Box<dyn Node>),
}

impl AnyNode {
    pub(crate) fn new<N: Node>(node: N) -> Self {
        let mut slot = Some(node);
        let any: &mut dyn Any = &mut slot;
        if let Some(n) = any
            .downcast_mut::<Option<RedisNode>>()
            .and_then(Option::take)
        {
            return Self::Redis(n);
        }
        if let Some(n) = any
            .downcast_mut::<Option<MemoryNode>>()
            .and_then(Option::take)
        {
            return Self::Memory(n);
        }
        match slot {
            Some(n) => Self::Custom(Box::new(n)),
            // `slot` is emptied only by a `take` above, which returns.
            None => unreachable!("a node moved out of its slot without being returned"),
        }
    }

    fn as_node(&self) -> &dyn Node {
        match self {
            Self::Redis(n) => n,
            Self::Memory(n) => n,
            Self::Custom(n) => &**n,
        }
    }

    /// [`Operation::Inspect`]: an operator's question (never on a hot path).
    pub(crate) async fn inspect(&self, request: InspectRequest<'_>) -> Result<KeyState, CallError> {
        match self.operate(Operation::Inspect(request)).await? {
            Operated::Inspected(state) => Ok(state),
            other => Err(self.wrong_answer("an inspection", &other)),
        }
    }

    /// [`Operation::Scan`]: an operator's question.
    pub(crate) async fn scan(&self, prefix: &str, limit: usize) -> Result<Vec<HeldKey>, CallError> {
        match self.operate(Operation::Scan { prefix, limit }).await? {
            Operated::Scanned(held) => Ok(held),
            other => Err(self.wrong_answer("a scan", &other)),
        }
    }

    /// [`Operation::ForceRelease`]: an operator's act.
    pub(crate) async fn force_release(
        &self,
        request: ForceReleaseRequest<'_>,
    ) -> Result<Forced, CallError> {
        match self.operate(Operation::ForceRelease(request)).await? {
            Operated::Forced(forced) => Ok(forced),
            other => Err(self.wrong_answer("a forced release", &other)),
        }
    }

    /// An operator call, to a node that declares them ([`Capabilities::operations`]).
    fn operate<'a>(&'a self, operation: Operation<'a>) -> NodeFuture<'a, Operated> {
        let node = self.as_node();
        if !node.capabilities().operations {
            return Box::pin(ready(Err(CallError::unsupported_by(
                node.name(),
                "operator calls",
            ))));
        }
        node.operate(operation)
    }

    /// A custom node's answer of another kind than the operation asked.
    fn wrong_answer(&self, asked: &str, answer: &Operated) -> CallError {
        let kind = match answer {
            Operated::Inspected(_) => "an inspection",
            Operated::Scanned(_) => "a scan",
            Operated::Forced(_) => "a forced release",
        };
        CallError::new(format!(
            "{} answered {asked} with {kind}",
            self.as_node().name()
        ))
    }

    pub(crate) fn name(&self) -> &str {
        self.as_node().name()
    }

    pub(crate) fn max_ttl(&self) -> Option<Duration> {
        self.as_node().capabilities().max_ttl
    }

    /// A Redis voter's eviction state (its master's `maxmemory-policy`); the default for
    /// other nodes.
    pub(crate) fn eviction(&self) -> EvictionStatus {
        match self {
            Self::Redis(n) => n.eviction_status(),
            _ => EvictionStatus::default(),
        }
    }

    /// The holder's remaining ttl at `key`, for a node whose "held" answer did not carry it:
    /// asked once per contended error, from one node. `None` for a custom node (it reports
    /// the ttl in [`Acquire::Held`] if it can).
    pub(crate) fn remaining_ttl<'a>(
        &'a self,
        key: &'a str,
    ) -> Option<impl Future<Output = Result<Option<Duration>, CallError>> + Send + 'a> {
        match self {
            Self::Redis(n) => Some(Either::Left(n.remaining_ttl(key))),
            Self::Memory(n) => Some(Either::Right(ready(Ok(n.remaining_now(key))))),
            Self::Custom(_) => None,
        }
    }

    /// Whether this node uses the release a fan-out packs once for all its Redis masters
    /// ([`RedisNode::release_cmd`]).
    pub(crate) fn uses_prepared_release(&self) -> bool {
        matches!(self, Self::Redis(_))
    }

    /// Which acquire a fan-out packs once for all its Redis masters this node sends
    /// ([`RedisNode::packed_acquire`]), if any.
    pub(crate) fn packed_acquire(&self) -> Option<Packed> {
        match self {
            Self::Redis(n) => n.packed_acquire(),
            _ => None,
        }
    }

    /// The wake-up's channel kind this node's deleting scripts are given (see
    /// `RedisNode::start_wake`), if any.
    pub(crate) fn wake(&self) -> Option<&'static str> {
        match self {
            Self::Redis(n) => n.wake,
            _ => None,
        }
    }

    /// Starts the wake-up on this node, if it has one (a Redis voter over a connection of its
    /// own); the others poll.
    pub(crate) fn start_wake(
        &mut self,
        listener: std::sync::Arc<dyn super::wake::Listener>,
    ) -> Option<super::wake::Feed> {
        match self {
            Self::Redis(n) => n.start_wake(listener),
            _ => None,
        }
    }

    /// An in-process node's answer to `request`, at once; `None` for a remote node.
    pub(crate) fn acquire_now(
        &self,
        request: &AcquireRequest<'_>,
    ) -> Option<Result<Acquire, CallError>> {
        match self {
            Self::Memory(n) => Some(Ok(n.acquire_now(request))),
            _ => None,
        }
    }

    /// Sends `request`; to a Redis master with `prepared` (what its
    /// [`AnyNode::packed_acquire`] names), the acquire packed once for the fan-out.
    pub(crate) fn acquire<'a>(
        &'a self,
        request: AcquireRequest<'a>,
        prepared: Option<&'a ::redis::Cmd>,
    ) -> impl Future<Output = Result<Acquire, CallError>> + Send + 'a {
        match self {
            Self::Redis(n) => Either::Left(n.acquire_request(request, prepared)),
            Self::Memory(n) => Either::Right(Either::Left(ready(Ok(n.acquire_now(&request))))),
            Self::Custom(n) => Either::Right(Either::Right(
                match refusal(&**n, request.record_key.is_some(), request.fence.is_some()) {
                    Some(refused) => Box::pin(ready(Err(refused))),
                    None => n.acquire(request),
                },
            )),
        }
    }

    /// An in-process node's answer to `request`, at once.
    pub(crate) fn extend_now(
        &self,
        request: &ExtendRequest<'_>,
    ) -> Option<Result<bool, CallError>> {
        match self {
            Self::Memory(n) => Some(Ok(n.extend_now(request))),
            _ => None,
        }
    }

    /// Sends `request`.
    pub(crate) fn extend<'a>(
        &'a self,
        request: ExtendRequest<'a>,
    ) -> impl Future<Output = Result<bool, CallError>> + Send + 'a {
        match self {
            Self::Redis(n) => Either::Left(n.extend_request(request)),
            Self::Memory(n) => Either::Right(Either::Left(ready(Ok(n.extend_now(&request))))),
            Self::Custom(n) => Either::Right(Either::Right(
                match refusal(&**n, false, request.fence.is_some()) {
                    Some(refused) => Box::pin(ready(Err(refused))),
                    None => n.extend(request),
                },
            )),
        }
    }

    /// An in-process node's answer to `request`, at once.
    pub(crate) fn release_now(
        &self,
        request: &ReleaseRequest<'_>,
    ) -> Option<Result<bool, CallError>> {
        match self {
            Self::Memory(n) => Some(Ok(n.release_now(request))),
            _ => None,
        }
    }

    /// Sends `request`; to a Redis master with `prepared` ([`RedisNode::release_cmd`]), the
    /// plain release packed once for the fan-out.
    pub(crate) fn release<'a>(
        &'a self,
        request: ReleaseRequest<'a>,
        prepared: Option<&'a ::redis::Cmd>,
    ) -> impl Future<Output = Result<bool, CallError>> + Send + 'a {
        match self {
            Self::Redis(n) => Either::Left(n.release_request(request, prepared)),
            Self::Memory(n) => Either::Right(Either::Left(ready(Ok(n.release_now(&request))))),
            Self::Custom(n) => Either::Right(Either::Right(
                match refusal(&**n, false, request.fence.is_some()) {
                    Some(refused) => Box::pin(ready(Err(refused))),
                    None => n.release(request),
                },
            )),
        }
    }

    /// An in-process node's answer to `request`, at once.
    pub(crate) fn complete_now(
        &self,
        request: &CompleteRequest<'_>,
    ) -> Option<Result<bool, CallError>> {
        match self {
            Self::Memory(n) => Some(Ok(n.complete_now(request))),
            _ => None,
        }
    }

    /// Sends `request`.
    pub(crate) fn complete<'a>(&'a self, request: CompleteRequest<'a>) -> NodeFuture<'a, bool> {
        match self {
            Self::Redis(n) => n.complete_request(request),
            Self::Memory(n) => Box::pin(ready(Ok(n.complete_now(&request)))),
            Self::Custom(n) => match refusal(&**n, true, request.fence.is_some()) {
                Some(refused) => Box::pin(ready(Err(refused))),
                None => n.complete(request),
            },
        }
    }
}

/// The client's answer in the place of a custom node asked a form it does not declare (see
/// [`Node::capabilities`]): a request with a record (`records`) or a fence (`fencing`).
fn refusal(node: &dyn Node, records: bool, fencing: bool) -> Option<CallError> {
    if !records && !fencing {
        return None;
    }
    let can = node.capabilities();
    if fencing && !can.fencing {
        Some(CallError::no_fencing(node.name()))
    } else if records && !can.records {
        Some(CallError::no_records(node.name()))
    } else {
        None
    }
}
