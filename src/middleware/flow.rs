//! The one request flow of both frameworks, for a request that has a key. With
//! [replay](crate::replay) on, it buffers and fingerprints the body first. It claims the key, puts
//! the lease and the fencing token in, and runs the inner service with keep-alive. That run is
//! stopped if the lease is lost and the policy says abort (`lost.rs`). Then it releases — or stores
//! the response — and answers. The tower and actix-web glue implement [`Glue`] with their own types
//! and call [`run`]; nothing here knows either framework.

use std::future::Future;
use std::time::Instant;

use bytes::Bytes;

pub(crate) use super::answer::FullResponse;
use super::durable;
use super::watch::{LossWatch, Watched, WatchedFuture};
use super::{AfterResponse, KeptAlive};
use crate::durable::{KeyRow, RowKey};
use crate::key::{LockKey, RequestView};
use crate::policy::{Decision, LockPolicy};
use crate::policy::{OnLost, LOCK_LOST_HEADER};
use crate::rejection::{RejectionKind, RejectionResponse, Wire};
use crate::replay::{Fingerprint, FingerprintBuilder};
use crate::replay::{Plan, Running};
use crate::{Lease, LeaseHandle};

/// What a framework's glue gives the flow: its request and response types and the few
/// operations on them. `Output` is what the middleware answers; the others are the inner
/// service's own.
pub(crate) trait Glue {
    /// The request the middleware got.
    type Request;
    /// The inner service's response.
    type Response;
    /// A response's head once its body is taken out ([`Glue::split`]).
    type Head;
    /// A response's body.
    type Body;
    /// The middleware's answer.
    type Output;
    /// The inner service's error.
    type Error;

    /// The request's declared `Content-Length`.
    fn content_length(req: &Self::Request) -> Option<u64>;

    /// Reads the request's body whole, up to `limit` bytes, and puts the same bytes back for
    /// the inner service.
    fn buffer_body(
        req: &mut Self::Request,
        limit: usize,
    ) -> impl Future<Output = Result<Bytes, RejectionKind>>;

    /// Hands the lease to the inner service: its handle in the request extensions, and the
    /// fencing token in `fencing.0`'s header.
    fn lend(req: &mut Self::Request, handle: LeaseHandle, fencing: Option<(&str, u64)>);

    /// Hands durable replay's key row to the inner service (its request extensions).
    fn lend_row(req: &mut Self::Request, row: KeyRow);

    /// Marks a request let through without a lock (fail-open).
    fn unlocked(req: &mut Self::Request);

    /// Calls the inner service.
    fn call(
        &mut self,
        req: Self::Request,
    ) -> impl Future<Output = Result<Self::Response, Self::Error>>;

    /// The response's status.
    fn status(res: &Self::Response) -> u16;

    /// The response's headers.
    fn headers(res: &Self::Response) -> impl Iterator<Item = (&str, &[u8])>;

    /// The head's headers.
    fn head_headers(head: &Self::Head) -> impl Iterator<Item = (&str, &[u8])>;

    /// The exact length of the response's body, if known.
    fn body_len(res: &Self::Response) -> Option<u64>;

    /// Whether the response's body may still have data to send (an empty one is never
    /// polled by the server, so it could not report its end).
    fn body_to_send(res: &Self::Response) -> bool;

    /// Adds `name: value` to the response's headers.
    fn add_header(res: &mut Self::Response, name: &'static str, value: &'static str);

    /// The response as the middleware's answer; with `lease`, its body releases it at its
    /// end (and, with `watch`, ends with an error if the lease is lost and the policy says
    /// abort).
    fn pass(res: Self::Response, lease: Option<Lease>, watch: Option<LossWatch>) -> Self::Output;

    /// The response's head and body.
    fn split(res: Self::Response) -> (Self::Head, Self::Body);

    /// Reads a response body whole, up to `limit` bytes (`None`: it failed or was longer).
    fn collect(body: Self::Body, limit: usize) -> impl Future<Output = Option<Bytes>>;

    /// A head with this body.
    fn rebuild(head: Self::Head, body: Bytes) -> Self::Output;

    /// `500`, no headers, no body, for the request of `head`.
    fn server_error(head: Self::Head) -> Self::Output;

    /// The middleware's own answer to `req`.
    fn full(req: Self::Request, res: FullResponse) -> Self::Output;

    /// The middleware's own answer in place of the response `res` (dropped).
    fn replace(res: Self::Response, answer: FullResponse) -> Self::Output;

    /// The middleware's own answer to a request already handed to the inner service (and
    /// dropped with the handler): tower answers it; actix-web, which needs the request to
    /// answer, returns it as an error whose response it is (a clone of the request kept
    /// meanwhile would make actix-web's routing and `headers_mut` panic inside).
    fn answer_dropped(res: FullResponse) -> Result<Self::Output, Self::Error>;
}

/// What the middleware does with a request, decided from its view before anything else.
pub(crate) enum Route {
    /// Answer this (a bad key).
    Reject(RejectionResponse),
    /// No key: the inner service, without a lock.
    Pass,
    /// The flow ([`run`]).
    Lock(Keyed),
}

/// A request's key, and what the flow needs of the request's view.
pub(crate) struct Keyed {
    key: LockKey,
    /// With replay on: the fingerprint of all but the body, and the body limit (`None`: the
    /// body is not fingerprinted).
    fingerprint: Option<(FingerprintBuilder, Option<usize>)>,
    /// gRPC or HTTP, for the rejections.
    wire: Wire,
    /// A gRPC caller's deadline (`grpc-timeout`): the longest wait for a busy key.
    deadline: Option<std::time::Duration>,
}

/// The route of the request `view` shows.
pub(crate) fn route(policy: &LockPolicy, view: &dyn RequestView) -> Route {
    match policy.key(view) {
        Err(rejection) => Route::Reject(rejection),
        Ok(None) => Route::Pass,
        Ok(Some(key)) => {
            let wire = Wire::of(view);
            Route::Lock(Keyed {
                key,
                fingerprint: policy.fingerprint(view),
                wire,
                deadline: crate::grpc::timeout(wire, view),
            })
        }
    }
}

/// The flow for one keyed request.
pub(crate) async fn run<G: Glue>(
    mut glue: G,
    policy: LockPolicy,
    keyed: Keyed,
    mut req: G::Request,
) -> Result<G::Output, G::Error> {
    let Keyed {
        key,
        fingerprint,
        wire,
        deadline,
    } = keyed;
    let fingerprint = match fingerprint_body::<G>(fingerprint, &mut req).await {
        Ok(fingerprint) => fingerprint,
        Err(kind) => {
            let answer = FullResponse::rejection(policy.reject(kind, wire));
            return Ok(G::full(req, answer));
        }
    };
    // Durable replay's row key, from the lock key (which the lock call takes).
    let row_key = policy
        .replay()
        .is_some_and(|r| r.durable.is_some())
        .then(|| RowKey::of(key.as_str()));
    let (lease, mut recorder) = match policy
        .clone()
        .acquire(key, fingerprint, wire, deadline)
        .await
    {
        Decision::Reject(r) => return Ok(G::full(req, FullResponse::rejection(r))),
        Decision::Replay(stored) => return Ok(G::full(req, FullResponse::replay(stored))),
        Decision::Unlocked => {
            G::unlocked(&mut req);
            return Ok(G::pass(glue.call(req).await?, None, None));
        }
        Decision::Locked(lease, recorder) => (lease, recorder),
    };
    // The keep-alive starts only if the handler outlives ttl/3 from the lock.
    let due = Instant::now() + lease.ttl() / 3;
    let mut lease = lease;
    let mut row = None;
    // The recorder moves into the lookup only under durable replay.
    let durable = row_key.and_then(|k| Some((k, recorder.take()?)));
    if let Some((row_key, r)) = durable {
        // Nothing has run yet: a request cancelled during the lookup releases the lease.
        match durable::before(lease, r, row_key, &policy, wire).await {
            durable::Before::Run(l, r, key_row) => {
                (lease, recorder) = (l, Some(r));
                G::lend_row(&mut req, key_row.clone());
                row = Some(key_row);
            }
            durable::Before::Answered(answer) => return Ok(G::full(req, answer)),
        }
    }
    // A cancelled request drops `running` from here on: without replay that releases the
    // lease in the background, with replay it marks the key completed (see `Running`).
    let mut running = Running::new(lease, recorder);
    let lease = running.lease_mut();
    let fencing = policy.fencing_header().zip(lease.fencing_token());
    G::lend(&mut req, lease.handle(), fencing);
    let rule = policy.lost_rule();
    // Watched only when a loss may stop it; otherwise the loss is looked at once, below.
    let mut watch = rule
        .may_abort()
        .then(|| LossWatch::new(lease.handle(), rule.clone(), wire));
    let keep_alive = policy.keep_alive().then_some(due);
    let call = KeptAlive::new(glue.call(req), running.lease_mut(), keep_alive);
    let mut res = match WatchedFuture::new(call, watch.as_mut()).await {
        Watched::Done(Ok(res)) => res,
        Watched::Done(Err(e)) => {
            // With replay the handler may have run: at most once, so the key is marked
            // completed; without, the lease is released.
            running.finish_unstored().await;
            return Err(e);
        }
        Watched::Aborted => return abort::<G>(running, &policy, wire),
    };
    // A loss known by now decides the answer: the handler ran (partly) without its lock.
    let decision = match watch.as_mut() {
        Some(watch) => watch.decide(false),
        None => (!running.lease_mut().is_valid()).then_some(OnLost::Finish),
    };
    match decision {
        Some(OnLost::Abort) => {
            running.abort(policy.repeatable_after_loss());
            let answer = FullResponse::rejection(policy.lock_lost(wire));
            return Ok(G::replace(res, answer));
        }
        Some(_) => G::add_header(&mut res, LOCK_LOST_HEADER, "true"),
        None => {}
    }
    let after = After {
        policy: &policy,
        running,
        watch,
        due,
        wire,
        row,
    };
    after.answer::<G>(res).await
}

/// With replay on: the request's fingerprint, its body read whole when the fingerprint
/// covers it (up to the limit: over it, `413`); `None` without replay.
async fn fingerprint_body<G: Glue>(
    fingerprint: Option<(FingerprintBuilder, Option<usize>)>,
    req: &mut G::Request,
) -> Result<Option<Fingerprint>, RejectionKind> {
    match fingerprint {
        None => Ok(None),
        Some((fingerprint, None)) => Ok(Some(fingerprint.finish(None))),
        Some((fingerprint, Some(limit))) => {
            if G::content_length(req).is_some_and(|len| len > limit as u64) {
                return Err(RejectionKind::BodyTooLarge);
            }
            let bytes = G::buffer_body(req, limit).await?;
            Ok(Some(fingerprint.finish(Some(&bytes))))
        }
    }
}

/// What follows the handler's response: release (now or at the body's end), or store the
/// response for replay, then answer.
struct After<'a> {
    policy: &'a LockPolicy,
    running: Running,
    /// The lease's loss watch, when a loss may stop the request.
    watch: Option<LossWatch>,
    /// When the keep-alive is due (ttl/3 after the lock).
    due: Instant,
    wire: Wire,
    /// Under durable replay: the key's row the handler was given.
    row: Option<KeyRow>,
}

impl After<'_> {
    async fn answer<G: Glue>(mut self, res: G::Response) -> Result<G::Output, G::Error> {
        if let Some(row) = &self.row {
            match durable::after(self.running, row, self.policy, self.wire).await {
                Ok(running) => self.running = running,
                Err(answer) => return Ok(G::replace(res, answer)),
            }
        }
        let status = G::status(&res);
        let plan = self.running.recorder().map_or(Plan::Release, |recorder| {
            recorder.plan_response(status, G::headers(&res), G::body_len(&res))
        });
        match plan {
            Plan::Release => {
                let body_to_send = G::body_to_send(&res);
                let lease = self.running.into_lease();
                match AfterResponse::decide(lease, self.policy.release_on(), body_to_send) {
                    AfterResponse::HoldToBodyEnd(mut lease) => {
                        if self.policy.keep_alive() {
                            // On the handler's schedule (nothing if it already started).
                            lease.keep_alive_from(self.due);
                        }
                        Ok(G::pass(res, Some(lease), self.watch))
                    }
                    AfterResponse::ReleaseNow(lease) => {
                        super::release(lease).await;
                        Ok(G::pass(res, None, None))
                    }
                }
            }
            Plan::MarkCompleted => {
                self.running.finish_unstored().await;
                Ok(G::pass(res, None, None))
            }
            Plan::Store { body_len } => self.store::<G>(res, status, body_len).await,
        }
    }

    /// Reads the response body whole and stores it for replay, then answers it.
    async fn store<G: Glue>(
        mut self,
        res: G::Response,
        status: u16,
        body_len: usize,
    ) -> Result<G::Output, G::Error> {
        let (head, body) = G::split(res);
        // Bounded by the lease (a body that takes longer is not waited for), or by a ttl
        // from now once the lease is lost (a handler that finished without it).
        let lease = self.running.lease_mut();
        let until = if lease.is_valid() {
            lease.deadline()
        } else {
            Instant::now() + lease.ttl()
        };
        let read = tokio::time::timeout_at(until.into(), G::collect(body, body_len));
        let read = match WatchedFuture::new(read, self.watch.as_mut()).await {
            Watched::Done(read) => read.ok().flatten(),
            Watched::Aborted => return abort::<G>(self.running, self.policy, self.wire),
        };
        let Some(bytes) = read else {
            // The handler ran but its response failed (or outlasted the lease): nothing to
            // replay, and it must not run again.
            tracing::warn!(
                "the response body failed while it was read for replay: key marked completed, answered 500"
            );
            self.running.finish_unstored().await;
            return Ok(G::server_error(head));
        };
        let record = self
            .running
            .recorder()
            .map(|recorder| recorder.response(status, G::head_headers(&head), &bytes))
            .expect("a plan to store has a recorder");
        if let Some(row) = &self.row {
            // In the database first: a crash before the Redis record replays from the row.
            durable::store(&self.running, row, &record, self.policy.ttl()).await;
        }
        self.running.complete(record).await;
        Ok(G::rebuild(head, bytes))
    }
}

/// The answer to a request whose lease was lost and whose policy says abort: the handler's
/// future is already dropped; with replay the key is marked "outcome unknown" (unless the
/// handler is repeatable), and the client gets `503` lock-lost.
fn abort<G: Glue>(
    running: Running,
    policy: &LockPolicy,
    wire: Wire,
) -> Result<G::Output, G::Error> {
    running.abort(policy.repeatable_after_loss());
    G::answer_dropped(FullResponse::rejection(policy.lock_lost(wire)))
}
