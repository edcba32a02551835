//! Custom [`Node`]s for tests of what the client does with nodes that lack the optional
//! forms: over a [`MemoryNode`], declaring locks only (no completion records, no fencing
//! counters — the client answers such requests with an error in their place), or getting
//! fencing wrong.

use tower_redlock::node::{
    Acquire, AcquireRequest, Capabilities, CompleteRequest, ExtendRequest, MemoryNode, Node,
    NodeFuture, ReleaseRequest,
};

/// Locks only: `acquire`, `extend` and `release` of the inner [`MemoryNode`] (public, to look
/// at what it holds), with the default capabilities ([`Capabilities::LOCKS`]).
#[derive(Debug, Clone, Default)]
pub struct BareNode(pub MemoryNode);

impl Node for BareNode {
    fn name(&self) -> &str {
        "bare"
    }

    fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> NodeFuture<'a, Acquire> {
        self.0.acquire(request)
    }

    fn extend<'a>(&'a self, request: ExtendRequest<'a>) -> NodeFuture<'a, bool> {
        self.0.extend(request)
    }

    fn release<'a>(&'a self, request: ReleaseRequest<'a>) -> NodeFuture<'a, bool> {
        self.0.release(request)
    }
}

/// A [`BareNode`] that declares fencing but answers a fenced acquire as a plain one
/// (`Acquired`, no counter): a node that gets fencing wrong.
#[derive(Debug, Clone, Default)]
pub struct LyingFencingNode(pub BareNode);

impl Node for LyingFencingNode {
    fn name(&self) -> &str {
        "lying"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::LOCKS.with_fencing()
    }

    fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> NodeFuture<'a, Acquire> {
        // The fence dropped: the plain acquire.
        let plain = AcquireRequest::new(request.key, request.token, request.ttl);
        self.0.acquire(plain)
    }

    fn extend<'a>(&'a self, request: ExtendRequest<'a>) -> NodeFuture<'a, bool> {
        self.0.extend(request)
    }

    fn release<'a>(&'a self, request: ReleaseRequest<'a>) -> NodeFuture<'a, bool> {
        self.0.release(request)
    }
}

/// A node that declares every form and carries them out over a [`MemoryNode`] — except the
/// fenced extension, which it sends without its fence (extending, answering `true`, the
/// counter left as it was): a node that gets fencing wrong where the client cannot see it.
#[derive(Debug, Clone, Default)]
pub struct FenceDroppingNode(pub MemoryNode);

impl Node for FenceDroppingNode {
    fn name(&self) -> &str {
        "fence-dropping"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::ALL
    }

    fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> NodeFuture<'a, Acquire> {
        self.0.acquire(request)
    }

    fn extend<'a>(&'a self, request: ExtendRequest<'a>) -> NodeFuture<'a, bool> {
        // The fence dropped: the plain extension.
        let plain = ExtendRequest::new(request.key, request.token, request.ttl);
        self.0.extend(plain)
    }

    fn release<'a>(&'a self, request: ReleaseRequest<'a>) -> NodeFuture<'a, bool> {
        self.0.release(request)
    }

    fn complete<'a>(&'a self, request: CompleteRequest<'a>) -> NodeFuture<'a, bool> {
        self.0.complete(request)
    }
}

/// A node that declares every form and carries them out over a [`MemoryNode`] — except the
/// "if free" completion ([`CompleteRequest::if_free`]), which it gets wrong: it stores as
/// the plain completion does (refusing where the lock is absent), or — `overreach` — it
/// clears the lock first, whoever holds it (storing over another client's lock).
#[derive(Debug, Clone, Default)]
pub struct FreeMisreadingNode {
    /// Where it keeps everything (public, to look at what it holds).
    pub inner: MemoryNode,
    /// Clear the lock before an "if free" completion (else: send the plain one).
    pub overreach: bool,
}

impl Node for FreeMisreadingNode {
    fn name(&self) -> &str {
        "free-misreading"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::ALL
    }

    fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> NodeFuture<'a, Acquire> {
        self.inner.acquire(request)
    }

    fn extend<'a>(&'a self, request: ExtendRequest<'a>) -> NodeFuture<'a, bool> {
        self.inner.extend(request)
    }

    fn release<'a>(&'a self, request: ReleaseRequest<'a>) -> NodeFuture<'a, bool> {
        self.inner.release(request)
    }

    fn complete<'a>(&'a self, request: CompleteRequest<'a>) -> NodeFuture<'a, bool> {
        if !request.if_free {
            return self.inner.complete(request);
        }
        if !self.overreach {
            // The "if free" dropped: the plain completion.
            let r = request;
            let plain = CompleteRequest::new(r.key, r.record_key, r.token, r.record, r.retention);
            return self.inner.complete(match r.fence {
                Some(f) => plain.fenced(f),
                None => plain,
            });
        }
        Box::pin(async move {
            if let Some(holder) = self.inner.get(request.key) {
                let clear = ReleaseRequest::new(request.key, &holder);
                self.inner.release(clear).await?;
            }
            self.inner.complete(request).await
        })
    }
}
