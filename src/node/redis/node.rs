//! The [`Node`] trait over a [`RedisNode`]'s calls (each in the file of its concern), and the
//! dispatch of a request value to the call of its form: the plain forms unboxed (the hot
//! path), the others boxed.

use std::future::Future;

use futures_util::future::Either;
use redis::Cmd;

use super::RedisNode;
use crate::node::{
    Acquire, AcquireRequest, CallError, Capabilities, CompleteRequest, ExtendRequest, Node,
    NodeFuture, Operated, Operation, ReleaseRequest,
};

impl RedisNode {
    /// The acquire `request` asks; with `prepared` (what [`RedisNode::packed_acquire`]
    /// names), the acquire packed once for the fan-out.
    pub(crate) fn acquire_request<'a>(
        &'a self,
        request: AcquireRequest<'a>,
        prepared: Option<&'a Cmd>,
    ) -> impl Future<Output = Result<Acquire, CallError>> + Send + 'a {
        let AcquireRequest {
            key, token, ttl, ..
        } = request;
        let other: NodeFuture<'a, Acquire> = match (request.record_key, request.fence) {
            (None, None) => return Either::Left(self.acquire_key(key, token, ttl, prepared)),
            (Some(record_key), None) => {
                Box::pin(self.acquire_unless_completed_key(key, record_key, token, ttl))
            }
            (None, Some(f)) => {
                Box::pin(self.acquire_fenced_key(key, f.key, token, ttl, f.retention))
            }
            (Some(record_key), Some(f)) => Box::pin(self.acquire_unless_completed_fenced_key(
                key,
                record_key,
                f.key,
                token,
                ttl,
                f.retention,
            )),
        };
        Either::Right(other)
    }

    /// The extension `request` asks.
    pub(crate) fn extend_request<'a>(
        &'a self,
        request: ExtendRequest<'a>,
    ) -> impl Future<Output = Result<bool, CallError>> + Send + 'a {
        let ExtendRequest {
            key, token, ttl, ..
        } = request;
        match request.fence {
            None => Either::Left(self.extend_key(key, token, ttl)),
            Some(f) => Either::Right(
                Box::pin(self.extend_fenced_key(key, token, ttl, f)) as NodeFuture<'a, bool>
            ),
        }
    }

    /// The release `request` asks; with `prepared` ([`RedisNode::release_cmd`]), the plain
    /// release packed once for the fan-out.
    pub(crate) fn release_request<'a>(
        &'a self,
        request: ReleaseRequest<'a>,
        prepared: Option<&'a Cmd>,
    ) -> impl Future<Output = Result<bool, CallError>> + Send + 'a {
        let ReleaseRequest { key, token, .. } = request;
        match request.fence {
            None => Either::Left(self.release_key(key, token, prepared)),
            Some(f) => Either::Right(Box::pin(self.release_fenced_key(
                key,
                f.key,
                token,
                f.floor,
                f.retention,
            )) as NodeFuture<'a, bool>),
        }
    }

    /// The completion `request` asks.
    pub(crate) fn complete_request<'a>(
        &'a self,
        request: CompleteRequest<'a>,
    ) -> NodeFuture<'a, bool> {
        let CompleteRequest {
            key,
            record_key,
            token,
            record,
            retention,
            if_free,
            ..
        } = request;
        match request.fence {
            None => Box::pin(self.complete_key(key, record_key, token, record, retention, if_free)),
            Some(f) => Box::pin(
                self.complete_fenced_key(key, record_key, token, record, retention, f, if_free),
            ),
        }
    }
}

impl Node for RedisNode {
    fn name(&self) -> &str {
        &self.name
    }

    fn capabilities(&self) -> Capabilities {
        match &self.guard {
            Some(g) => Capabilities::ALL.with_max_ttl(g.max_ttl),
            None => Capabilities::ALL,
        }
    }

    fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> NodeFuture<'a, Acquire> {
        Box::pin(self.acquire_request(request, None))
    }

    fn extend<'a>(&'a self, request: ExtendRequest<'a>) -> NodeFuture<'a, bool> {
        Box::pin(self.extend_request(request))
    }

    fn release<'a>(&'a self, request: ReleaseRequest<'a>) -> NodeFuture<'a, bool> {
        Box::pin(self.release_request(request, None))
    }

    fn complete<'a>(&'a self, request: CompleteRequest<'a>) -> NodeFuture<'a, bool> {
        self.complete_request(request)
    }

    fn operate<'a>(&'a self, operation: Operation<'a>) -> NodeFuture<'a, Operated> {
        Box::pin(async move {
            Ok(match operation {
                Operation::Inspect(r) => Operated::Inspected(self.inspect_keys(r).await?),
                Operation::Scan { prefix, limit } => {
                    Operated::Scanned(self.scan_keys(prefix, limit).await?)
                }
                Operation::ForceRelease(r) => Operated::Forced(self.force_release_keys(r).await?),
            })
        })
    }
}
