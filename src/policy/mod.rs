//! What the middleware does: which key, how long, what to do on contention, on an
//! unreachable quorum, and when to release. Shared by the tower and actix-web glue.

// Without tower or actix-web, the middleware's part of this module has no caller.
#![cfg_attr(
    not(any(feature = "tower", feature = "actix")),
    allow(dead_code, unused_imports)
)]

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::grpc::{answer_by, GrpcOr, Wire};
use crate::key::{HmacKey, IdempotencyKey, KeyExtractor, KeyExtractorExt, LockKey, RequestView};
use crate::rejection::{ProblemJson, Rejection, RejectionKind, RejectionResponse, Responder};
use crate::replay::{Fingerprint, FingerprintBuilder, Recorder, Replay, StoredResponse};
use crate::{Lease, LockOrRecord, Redlock, Retry};

mod builder;
#[cfg(any(feature = "tower", feature = "actix"))]
mod constructors;
mod lost;
pub use self::lost::{LockLostError, LostLease, LostRule, OnLost, LOCK_LOST_HEADER};
#[cfg(any(feature = "tower", feature = "actix"))]
pub(crate) use constructors::policy_constructors;

/// What to do when another request holds the key.
///
/// ```
/// use std::time::Duration;
/// use tower_redlock::policy::OnContention;
/// use tower_redlock::Retry;
///
/// // Up to 2 s, a try about every 50 ms:
/// let wait = OnContention::wait(Duration::from_secs(2));
/// // Or a retry policy of your own, with a time bound:
/// let custom = OnContention::Wait(
///     Retry::times(5)
///         .delay(Duration::from_millis(100))
///         .max_wait(Duration::from_secs(1)),
/// );
/// # let _ = (wait, custom);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnContention {
    /// Answer `409 Conflict` at once, with `Retry-After` (the default). When the votes were
    /// split between concurrent requests (no one held a quorum), one quick retry after a
    /// random pause of up to 20 ms comes first.
    Reject,
    /// Retry as the [`Retry`] says until the lock is acquired, then run. The answer is `409` when
    /// its tries run out, or when no further try can finish within its wait. A try may take two
    /// node timeouts, plus what [`Retry::until`] says of a stalled process. So the answer never
    /// comes later than that after the request. The `Retry` must retry (not [`Retry::never`])
    /// within a time bound ([`Retry::until`], or [`max_wait`](Retry::max_wait)) greater than zero,
    /// with a delay that is not zero: `build` refuses anything else.
    Wait(Retry),
}

impl OnContention {
    /// Wait up to `max_wait` for a contended key, trying about every 50 ms (a jitter of up to
    /// 25 ms), instead of answering `409` at once.
    pub fn wait(max_wait: Duration) -> Self {
        Self::Wait(
            Retry::until(max_wait)
                .delay(Duration::from_millis(50))
                .jitter(Duration::from_millis(25)),
        )
    }
}

/// What to do when the lock quorum is unreachable (nodes down or timing out).
///
/// "Unreachable" is decided after the middleware's extra tries. A try may miss the quorum while
/// some master gave no answer in time or dropped a connection (rather than being suspended or
/// refusing). Then it is tried again, up to twice, each after a pause of one to two node timeouts.
/// A busy machine or a stolen CPU stalls healthy masters for a moment; a `503` for that would be
/// wrong. So a stall of healthy masters of up to a few node timeouts is ridden out (the middleware
/// guide, `guide::middleware`, names the tests). A longer one gets the masters suspended (see
/// [`RedlockBuilder::suspend_after`](crate::RedlockBuilder::suspend_after)) and `503` until they
/// answer again. While masters are down, the first requests learn it after the extra tries. That
/// costs at most about eight node timeouts more (two pauses of up to two, two tries of up to two),
/// also before a fail-open handler runs. Once the client has suspended them, requests learn it at
/// once. Within a gRPC call's deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OnUnavailable {
    /// Answer `503 Service Unavailable` with `Retry-After` (the default): never run
    /// unprotected.
    FailClosed,
    /// Run the handler without the lock; it sees an [`Unlocked`] marker in the request
    /// extensions. For endpoints where availability matters more than exclusion. When some
    /// node said the key is held, the answer is still `503`: a live holder is never run over.
    FailOpen,
}

/// The middleware's extra tries after a transient failure (see [`OnUnavailable`]).
const TRANSIENT_RETRIES: u32 = 2;

/// When the lock is released.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReleaseOn {
    /// When the handler has produced the response (head and body value), before the
    /// response is returned (the default).
    Response,
    /// When the response body has been fully sent (for streaming bodies whose production
    /// must stay exclusive).
    BodyEnd,
}

/// A request-extension marker: the handler runs **without** the lock because the quorum
/// was unreachable and the policy is [`OnUnavailable::FailOpen`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unlocked;

/// The complete middleware configuration, shared by [`RedlockLayer`](crate::RedlockLayer)
/// and the actix-web middleware. Cheap to clone.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_redlock::Error> {
/// use std::time::Duration;
/// use tower_redlock::key::{IdempotencyKey, KeyExtractorExt};
/// use tower_redlock::policy::{LockPolicy, OnContention, OnUnavailable, ReleaseOn};
/// use tower_redlock::Redlock;
///
/// let policy = LockPolicy::builder(Redlock::in_memory(), IdempotencyKey::required().scoped_by_route())
///     .ttl(Duration::from_secs(10))
///     .on_contention(OnContention::wait(Duration::from_secs(2))) // not 409 at once
///     .on_unavailable(OnUnavailable::FailOpen) // run unlocked when Redis is down
///     .release_on(ReleaseOn::BodyEnd)
///     .build()?;
/// assert_eq!(policy.ttl(), Duration::from_secs(10));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LockPolicy {
    inner: Arc<PolicyInner>,
}

struct PolicyInner {
    redlock: Redlock,
    extractor: Box<dyn KeyExtractor>,
    ttl: Duration,
    contention: OnContention,
    unavailable: OnUnavailable,
    unavailable_retry_after: Duration,
    release: ReleaseOn,
    keep_alive: bool,
    /// Whether a 409/503 body lists each voter's answer.
    explain_votes: bool,
    /// The methods whose requests are locked; `None`: every method.
    methods: Option<Vec<Box<str>>>,
    responder: Box<dyn Responder>,
    replay: Option<Arc<Replay>>,
    /// The request header the fencing token is passed in (lower-case).
    fencing_header: Option<Box<str>>,
    /// The secret lock keys are keyed with (HMAC), if any.
    hmac: Option<HmacKey>,
    /// What a lease lost while its request runs does to it.
    lost: LostRule,
    /// With replay: a request stopped on a lost lease leaves no record (see
    /// [`LockPolicyBuilder::repeatable_after_loss`]).
    repeatable_after_loss: bool,
}

impl fmt::Debug for LockPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &*self.inner;
        f.debug_struct("LockPolicy")
            .field("redlock", &p.redlock)
            .field("ttl", &p.ttl)
            .field("contention", &p.contention)
            .field("unavailable", &p.unavailable)
            .field("release", &p.release)
            .field("keep_alive", &p.keep_alive)
            .field("explain_votes", &p.explain_votes)
            .field("methods", &p.methods)
            .field("replay", &p.replay)
            .field("fencing_header", &p.fencing_header)
            .field("on_lost", &p.lost)
            .field("repeatable_after_loss", &p.repeatable_after_loss)
            .finish_non_exhaustive()
    }
}

/// Builds a [`LockPolicy`]; see there.
#[must_use = "a builder does nothing until `build` is called"]
pub struct LockPolicyBuilder {
    inner: PolicyInner,
    /// A problem found while building (reported by `build`).
    problem: Option<crate::Error>,
}

impl fmt::Debug for LockPolicyBuilder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockPolicyBuilder")
            .field("ttl", &self.inner.ttl)
            .finish_non_exhaustive()
    }
}

/// See [`LockPolicy::DEFAULT_TTL`].
pub(crate) const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// See [`LockPolicy::DEFAULT_LOCKED_METHODS`].
pub(crate) const DEFAULT_LOCKED_METHODS: [&str; 4] = ["POST", "PUT", "PATCH", "DELETE"];

impl LockPolicy {
    /// The default lock ttl of the middleware (30 s).
    pub const DEFAULT_TTL: Duration = DEFAULT_TTL;

    /// The methods the middleware locks by default: the unsafe, state-changing ones
    /// (RFC 9110 §9.2.1). `GET`, `HEAD`, `OPTIONS` and `TRACE` pass through without a key.
    pub const DEFAULT_LOCKED_METHODS: [&'static str; 4] = DEFAULT_LOCKED_METHODS;

    /// Starts a policy that locks the key `extractor` derives, on `redlock`'s nodes.
    ///
    /// Defaults: only [`DEFAULT_LOCKED_METHODS`](Self::DEFAULT_LOCKED_METHODS) are locked (other requests pass through
    /// untouched); ttl 30 s, kept alive while the handler runs; `409` at once on
    /// contention; `503` when the quorum is unreachable (`Retry-After: 1`); release when
    /// the response is produced; a handler whose lease is lost finishes
    /// ([`OnLost::Finish`]); problem+json rejections (gRPC statuses for gRPC calls).
    pub fn builder(redlock: Redlock, extractor: impl KeyExtractor) -> LockPolicyBuilder {
        LockPolicyBuilder {
            inner: PolicyInner {
                redlock,
                extractor: Box::new(extractor),
                ttl: DEFAULT_TTL,
                contention: OnContention::Reject,
                unavailable: OnUnavailable::FailClosed,
                unavailable_retry_after: Duration::from_secs(1),
                release: ReleaseOn::Response,
                keep_alive: true,
                explain_votes: false,
                methods: Some(DEFAULT_LOCKED_METHODS.iter().map(|&m| m.into()).collect()),
                responder: Box::new(GrpcOr(ProblemJson)),
                replay: None,
                fencing_header: None,
                hmac: None,
                lost: LostRule::from(OnLost::Finish),
                repeatable_after_loss: false,
            },
            problem: None,
        }
    }

    /// The common idempotent endpoint: the `Idempotency-Key` header (required, scoped by
    /// route) locks the first request and stores its response, which every later request
    /// with the key gets replayed ([`Replay::new`]'s defaults: 24 h, body fingerprinted).
    /// See [`replay`](crate::replay).
    ///
    /// ```
    /// # fn main() -> Result<(), tower_redlock::Error> {
    /// use tower_redlock::policy::LockPolicy;
    /// use tower_redlock::Redlock;
    ///
    /// let policy = LockPolicy::idempotent(Redlock::in_memory()).build()?;
    /// assert!(policy.replay().is_some());
    /// # Ok(()) }
    /// ```
    pub fn idempotent(redlock: Redlock) -> LockPolicyBuilder {
        Self::builder(redlock, IdempotencyKey::required().scoped_by_route()).replay(Replay::new())
    }

    /// The replay settings, if completed requests are replayed (see
    /// [`LockPolicyBuilder::replay`]).
    pub fn replay(&self) -> Option<&Replay> {
        self.inner.replay.as_deref()
    }

    /// With replay on: the fingerprint of everything but the body, and the body limit
    /// (`None`: the body is not fingerprinted).
    pub(crate) fn fingerprint(
        &self,
        req: &dyn RequestView,
    ) -> Option<(FingerprintBuilder, Option<usize>)> {
        let replay = self.inner.replay.as_deref()?;
        Some((FingerprintBuilder::new(replay, req), replay.body_limit))
    }

    /// The answer for a replay step's rejection (`413`, `400` for an unreadable body) to a
    /// client on `wire`.
    /// The policy's answer to `rejection`.
    pub(crate) fn respond(&self, rejection: &Rejection) -> RejectionResponse {
        self.inner.responder.respond(rejection)
    }

    pub(crate) fn reject(&self, kind: RejectionKind, wire: Wire) -> RejectionResponse {
        self.inner
            .responder
            .respond(&Rejection::replay(kind).on(wire))
    }

    /// The request header the lease's fencing token is passed in to the inner service, if
    /// any (see [`LockPolicyBuilder::fencing_header`]), lower-case.
    pub fn fencing_header(&self) -> Option<&str> {
        self.inner.fencing_header.as_deref()
    }

    /// The lock ttl.
    pub fn ttl(&self) -> Duration {
        self.inner.ttl
    }

    /// When the lock is released.
    pub fn release_on(&self) -> ReleaseOn {
        self.inner.release
    }

    /// Whether a lock is kept alive while its handler runs.
    pub fn keep_alive(&self) -> bool {
        self.inner.keep_alive
    }

    /// What a lease lost while its request runs does to it, when it is the same for every
    /// request (`None`: a hook decides, see [`LostRule::decide`](crate::policy::LostRule::decide)).
    pub fn on_lost(&self) -> Option<OnLost> {
        self.inner.lost.fixed()
    }

    /// The rule for a lost lease.
    pub(crate) fn lost_rule(&self) -> &LostRule {
        &self.inner.lost
    }

    /// With replay: whether a request stopped on a lost lease leaves no record
    /// ([`LockPolicyBuilder::repeatable_after_loss`]).
    pub(crate) fn repeatable_after_loss(&self) -> bool {
        self.inner.repeatable_after_loss
    }

    /// The answer to a request stopped because its lease was lost, for a client on `wire`.
    pub(crate) fn lock_lost(&self, wire: Wire) -> RejectionResponse {
        let rejection = Rejection::lock_lost(self.inner.ttl).on(wire);
        self.inner.responder.respond(&rejection)
    }

    /// The Redlock client.
    pub fn redlock(&self) -> &Redlock {
        &self.inner.redlock
    }

    /// Whether requests with this method are locked (see [`LockPolicyBuilder::methods`]).
    pub fn locks_method(&self, method: &str) -> bool {
        self.inner
            .methods
            .as_ref()
            .is_none_or(|methods| methods.iter().any(|m| **m == *method))
    }

    /// The lock resource this policy takes for `req` — its key extractor's
    /// [`LockKey`] (under the [`hmac_key`](LockPolicyBuilder::hmac_key) when set) — or `None`
    /// when the request passes through unlocked (no key, or a method the policy does not
    /// lock). The function behind the `redlock key` command: given the request's parts in a
    /// [`SimpleRequest`](crate::key::SimpleRequest) (method, path, matched route, headers,
    /// extensions), it is the resource the middleware locks for that request.
    ///
    /// ```
    /// use tower_redlock::key::{IdempotencyKey, KeyExtractorExt, SimpleRequest};
    /// use tower_redlock::{policy::LockPolicy, Redlock};
    ///
    /// let policy = LockPolicy::builder(Redlock::in_memory(), IdempotencyKey::required().scoped_by_route())
    ///     .build()
    ///     .unwrap();
    /// let req = SimpleRequest::new("POST", "/payments/7")
    ///     .route("/payments/{id}")
    ///     .header("idempotency-key", "\"k-1\"");
    /// let key = policy.redis_key(&req).unwrap().unwrap();
    /// assert!(key.starts_with("tower-redlock:"));
    /// assert!(!key.contains("k-1")); // hashed, never raw
    /// ```
    ///
    /// # Errors
    ///
    /// The [`KeyRejection`](crate::key::KeyRejection) the middleware answers `400` with: a
    /// missing, malformed or too long key.
    pub fn resource(
        &self,
        req: &dyn RequestView,
    ) -> Result<Option<LockKey>, crate::key::KeyRejection> {
        if !self.locks_method(req.method()) {
            return Ok(None);
        }
        let key = self.inner.extractor.extract(req)?;
        Ok(match &self.inner.hmac {
            Some(secret) => key.map(|k| k.keyed(secret)),
            None => key,
        })
    }

    /// The Redis key the middleware locks for `req`: [`LockPolicy::resource`] under the
    /// client's [key prefix](crate::RedlockBuilder::key_prefix) ([`Redlock::redis_key`]).
    ///
    /// # Errors
    ///
    /// As [`LockPolicy::resource`].
    pub fn redis_key(
        &self,
        req: &dyn RequestView,
    ) -> Result<Option<String>, crate::key::KeyRejection> {
        Ok(self
            .resource(req)?
            .map(|k| self.inner.redlock.redis_key(k.as_str())))
    }

    /// [`Redlock::inspect`] of the key the middleware locks for `req`; `None` when the
    /// request passes through unlocked. A bad key is an invalid-input error.
    ///
    /// # Errors
    ///
    /// [`Error::is_invalid_input`](crate::Error::is_invalid_input) for a bad key (as
    /// [`LockPolicy::resource`] rejects it); otherwise as [`Redlock::inspect`].
    pub async fn inspect(
        &self,
        req: &dyn RequestView,
    ) -> crate::Result<Option<crate::operate::Inspection>> {
        let resource = self
            .resource(req)
            .map_err(|k| crate::Error::invalid(format!("no lock key for this request: {k}")))?;
        match resource {
            Some(k) => Ok(Some(self.inner.redlock.inspect(k.as_str()).await?)),
            None => Ok(None),
        }
    }

    /// Step 1, synchronous: the request's key (`None`: pass through unlocked, also for a
    /// method the policy does not lock), or the answer for a bad key.
    pub(crate) fn key(&self, req: &dyn RequestView) -> Result<Option<LockKey>, RejectionResponse> {
        self.resource(req).map_err(|k| {
            tracing::debug!(rejection = %k, "lock key rejected");
            let rejection = Rejection::bad_key(k).on(Wire::of(req));
            self.inner.responder.respond(&rejection)
        })
    }

    /// One claim of `key`: with a fingerprint (replay on), a record found is the answer.
    async fn claim(
        &self,
        key: &LockKey,
        retry: Retry,
        replay: bool,
    ) -> crate::Result<LockOrRecord> {
        let p = &*self.inner;
        if replay {
            p.redlock
                .lock_unless_completed(key.as_str(), p.ttl, retry)
                .await
        } else {
            p.redlock
                .lock_with(key.as_str(), p.ttl, retry)
                .await
                .map(LockOrRecord::Locked)
        }
    }

    /// Step 2: take the lock for `key` according to the policy; with replay on
    /// (`fingerprint`), a completed request's response is the answer instead. A rejection
    /// is answered for a client on `wire` (gRPC or HTTP); a wait lasts at most the caller's
    /// `deadline` (gRPC's `grpc-timeout`).
    pub(crate) async fn acquire(
        self,
        key: LockKey,
        fingerprint: Option<Fingerprint>,
        wire: Wire,
        deadline: Option<Duration>,
    ) -> Decision {
        let p = &*self.inner;
        let retry = match p.contention {
            // With one quick extra try after a split vote between concurrent requests, in
            // the same lock call (counted once).
            // Either way, up to `TRANSIENT_RETRIES` more tries when masters stalled (see
            // `OnUnavailable`).
            // Within the caller's deadline (gRPC's), if it has one.
            OnContention::Reject => {
                let never = Retry::never()
                    .settling_split_votes()
                    .riding_out_transient_failures(TRANSIENT_RETRIES);
                match deadline {
                    Some(d) => never.max_wait(answer_by(d)),
                    None => never,
                }
            }
            OnContention::Wait(retry) => {
                let retry = retry.riding_out_transient_failures(TRANSIENT_RETRIES);
                match (deadline, retry.max_wait_of()) {
                    (Some(d), Some(max_wait)) => retry.max_wait(answer_by(d).min(max_wait)),
                    (Some(d), None) => retry.max_wait(answer_by(d)),
                    (None, _) => retry,
                }
            }
        };
        let started = Instant::now();
        // Keyed like the lock key: the fingerprint, stored in the record, hashes the path
        // and the query too, where a low-entropy id may sit.
        let fingerprint = match &p.hmac {
            Some(secret) => fingerprint.map(|fp| Fingerprint(secret.mac(&fp.0))),
            None => fingerprint,
        };
        let replay = p.replay.as_ref().zip(fingerprint);
        let result = self.claim(&key, retry, replay.is_some()).await;
        match result {
            Ok(LockOrRecord::Locked(lease)) => {
                // The keep-alive (`p.keep_alive`) is the glue's: see `keep_alive.rs`.
                tracing::debug!(key = %p.redlock.key_hash(key.as_str()), elapsed = ?started.elapsed(), "lock acquired");
                let recorder = replay.map(|(r, fp)| Recorder::new(Arc::clone(r), fp));
                Decision::Locked(lease, recorder)
            }
            Ok(LockOrRecord::OutcomeUnknown) => {
                crate::metrics::replay("unknown");
                tracing::debug!(key = %p.redlock.key_hash(key.as_str()), "records of lost leases differ: outcome unknown");
                Decision::Reject(self.reject(RejectionKind::OutcomeUnknown, wire))
            }
            Ok(LockOrRecord::Completed(record)) => {
                let fingerprint = replay
                    .map(|(_, fp)| fp)
                    .expect("only a replay claim completes");
                let transform = p.replay.as_ref().and_then(|r| r.transform.as_deref());
                match crate::replay::answer(&record, &fingerprint, transform) {
                    Ok(response) => {
                        tracing::debug!(key = %p.redlock.key_hash(key.as_str()), elapsed = ?started.elapsed(), "replayed");
                        Decision::Replay(response)
                    }
                    Err(kind) => {
                        tracing::debug!(key = %p.redlock.key_hash(key.as_str()), ?kind, "completed request not replayed");
                        Decision::Reject(self.reject(kind, wire))
                    }
                }
            }
            // Fail open only when no node said "held" nor had a record: a live holder is
            // never run over, nor is work that ran.
            Err(e)
                if e.is_unavailable()
                    && e.held_by() == 0
                    && !e.found_records()
                    && p.unavailable == OnUnavailable::FailOpen =>
            {
                tracing::warn!(key = %p.redlock.key_hash(key.as_str()), error = %e, "lock quorum unreachable; running unlocked (fail-open)");
                Decision::Unlocked
            }
            Err(e) => {
                if e.is_contended() {
                    tracing::debug!(key = %p.redlock.key_hash(key.as_str()), elapsed = ?started.elapsed(), held_by = e.held_by(), "lock contended");
                } else if e.is_invalid_input() {
                    tracing::error!(key = %p.redlock.key_hash(key.as_str()), error = %e, "lock call rejected: fix the lock policy");
                } else {
                    tracing::warn!(key = %p.redlock.key_hash(key.as_str()), error = %e, "lock quorum unreachable");
                }
                let rejection = Rejection::from_lock_error(e, p.unavailable_retry_after)
                    .on(wire)
                    .explained(p.explain_votes);
                Decision::Reject(p.responder.respond(&rejection))
            }
        }
    }
}

/// The outcome of [`LockPolicy::acquire`].
pub(crate) enum Decision {
    /// Run the handler holding this lease; with replay on, record its response.
    Locked(Lease, Option<Recorder>),
    /// Answer with this stored response (replay), the handler does not run.
    Replay(StoredResponse),
    /// Run the handler without a lock (fail-open).
    Unlocked,
    /// Answer with this instead of running the handler.
    Reject(RejectionResponse),
}

#[cfg(test)]
mod tests;
