//! [`LockPolicyBuilder`]: the settings of a [`LockPolicy`], and their checks at build.

use std::sync::Arc;
use std::time::Duration;

use super::{LockPolicy, LockPolicyBuilder, OnContention, OnUnavailable, ReleaseOn};
use crate::key::HmacKey;
use crate::policy::LostRule;
#[cfg(doc)]
use crate::policy::OnLost;
use crate::rejection::Responder;
use crate::replay::Replay;

impl LockPolicyBuilder {
    /// The lock ttl (default 30 s). With keep-alive on, the lock is extended about every
    /// ttl/3 while the handler runs, so the ttl bounds how long a crashed replica blocks
    /// the key, not how long a handler may run.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.inner.ttl = ttl;
        self
    }

    /// What to do on contention (default [`OnContention::Reject`]; to wait,
    /// [`OnContention::wait`]).
    #[doc(alias = "wait")]
    pub fn on_contention(mut self, policy: OnContention) -> Self {
        self.inner.contention = policy;
        self
    }

    /// What to do when the quorum is unreachable (default [`OnUnavailable::FailClosed`]).
    #[doc(alias = "fail_open")]
    pub fn on_unavailable(mut self, policy: OnUnavailable) -> Self {
        self.inner.unavailable = policy;
        self
    }

    /// The `Retry-After` of a `503` (default 1 s, rounded up to whole seconds).
    pub fn unavailable_retry_after(mut self, after: Duration) -> Self {
        self.inner.unavailable_retry_after = after;
        self
    }

    /// When to release the lock (default [`ReleaseOn::Response`]; [`ReleaseOn::BodyEnd`] holds
    /// it until the response body has been fully sent).
    #[doc(alias = "release_on_body_end")]
    pub fn release_on(mut self, release: ReleaseOn) -> Self {
        self.inner.release = release;
        self
    }

    /// Whether to extend the lock while the handler runs (default on): a handler still
    /// running after ttl/3 gets its lock extended then, and every ttl/3 after. Handlers that
    /// finish sooner cost nothing for it (no task is spawned per request). With
    /// [`ReleaseOn::BodyEnd`], the lock is also kept alive while the body streams.
    ///
    /// The timer that starts the keep-alive lives in the request's own future. So a handler must
    /// not block its thread (CPU-bound work or blocking I/O without yielding) for longer than
    /// ttl/3. Run such work with `tokio::task::spawn_blocking` and await it, as Tokio asks of any
    /// async code. (A keep-alive task spawned from the blocked worker would not run either: it
    /// waits in that worker's non-stealable LIFO slot.)
    pub fn keep_alive(mut self, on: bool) -> Self {
        self.inner.keep_alive = on;
        self
    }

    /// Whether a `409` or `503` answer's problem+json body lists what each voter answered
    /// (default off: it reveals the voters' addresses): a `votes` array of
    /// `{"voter": "host:port", "vote": "held", "ttl_ms": 1200}` (`ttl_ms` only for a held
    /// vote that knows it; `vote` is a [`VoteKind::as_str`](crate::VoteKind::as_str)). For
    /// an internal API whose clients are its operators; a custom responder reads the same
    /// from [`Rejection::lock_error`](crate::rejection::Rejection::lock_error).
    pub fn explain_votes(mut self, on: bool) -> Self {
        self.inner.explain_votes = on;
        self
    }

    /// What a lease lost while its request runs does to the request: an [`OnLost`] for every
    /// request, or a [`LostRule::decide`] hook per request (default
    /// [`OnLost::Finish`]: the handler runs on, its response says `Lock-Lost: true`). Lost
    /// is the lock's own rule: the validity ran out before an extension landed, or an
    /// extension found the token gone — a paused process or masters the keep-alive cannot
    /// reach, never healthy masters and a live process.
    ///
    /// ```
    /// # fn main() -> Result<(), tower_redlock::Error> {
    /// use tower_redlock::policy::{LockPolicy, OnLost};
    /// use tower_redlock::Redlock;
    ///
    /// // Work whose result is worthless without the lock: stop it, answer 503 lock-lost.
    /// let policy = LockPolicy::idempotent(Redlock::in_memory())
    ///     .on_lost(OnLost::Abort)
    ///     .build()?;
    /// assert_eq!(policy.on_lost(), Some(OnLost::Abort));
    /// # Ok(()) }
    /// ```
    #[doc(alias = "on_lost_with")]
    pub fn on_lost(mut self, rule: impl Into<LostRule>) -> Self {
        self.inner.lost = rule.into();
        self
    }

    /// With replay and [`OnLost::Abort`]: the handler is safe to run again after it was
    /// stopped on a lost lease, so such a request leaves no record and the key's next
    /// request runs the handler again (instead of `409` outcome-unknown). Only for handlers
    /// whose work is idempotent or fenced.
    pub fn repeatable_after_loss(mut self, on: bool) -> Self {
        self.inner.repeatable_after_loss = on;
        self
    }

    /// Lock only requests with these methods (default [`DEFAULT_LOCKED_METHODS`](crate::policy::LockPolicy::DEFAULT_LOCKED_METHODS)); the
    /// others pass through untouched: no key is read, nothing is locked, nothing rejected.
    /// Names are matched exactly after ASCII upper-casing (`"post"` means `POST`).
    ///
    /// ```
    /// # fn main() -> Result<(), tower_redlock::Error> {
    /// use tower_redlock::key::IdempotencyKey;
    /// use tower_redlock::policy::LockPolicy;
    /// use tower_redlock::Redlock;
    ///
    /// let policy = LockPolicy::builder(Redlock::in_memory(), IdempotencyKey::required())
    ///     .methods(["POST"])
    ///     .build()?;
    /// assert!(policy.locks_method("POST"));
    /// assert!(!policy.locks_method("PUT") && !policy.locks_method("GET"));
    /// # Ok(()) }
    /// ```
    pub fn methods<I>(mut self, methods: I) -> Self
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        self.inner.methods = Some(
            methods
                .into_iter()
                .map(|m| m.as_ref().to_ascii_uppercase().into_boxed_str())
                .collect(),
        );
        self
    }

    /// Lock requests of every method, `GET` included.
    pub fn any_method(mut self) -> Self {
        self.inner.methods = None;
        self
    }

    /// Replay completed requests: the first request with a key runs and its response is
    /// stored on the quorum; later ones get it replayed, a reused key with another request
    /// `422`. See [`replay`](crate::replay).
    pub fn replay(mut self, replay: Replay) -> Self {
        self.inner.replay = Some(Arc::new(replay));
        self
    }

    /// Pass the lease's fencing token ([`Lease::fencing_token`](crate::Lease::fencing_token))
    /// to the inner service in the request header `name` (in decimal), for handlers that
    /// forward it to storage which refuses stale tokens. The client's own header of that
    /// name is removed from every request through the middleware, locked or not, so a
    /// handler never reads a token the lock did not give. Needs a client built with
    /// [`RedlockBuilder::fencing`](crate::RedlockBuilder::fencing)`(true)`. Works with
    /// replay too (the request that runs gets the token; a replayed one runs nothing).
    /// Handlers can also read the token from the [`LeaseHandle`](crate::LeaseHandle).
    ///
    /// Name a header of its own: not the one the key is read from (it is removed before
    /// the key is read). On actix-web the header is set through
    /// `ServiceRequest::headers_mut`, which panics if an outer middleware keeps a clone of
    /// the `HttpRequest` across the call; the `LeaseHandle` extractor has no such
    /// requirement.
    ///
    /// ```
    /// # fn main() -> Result<(), tower_redlock::Error> {
    /// use tower_redlock::key::IdempotencyKey;
    /// use tower_redlock::policy::LockPolicy;
    /// use tower_redlock::node::MemoryNode;
    /// use tower_redlock::Redlock;
    ///
    /// let redlock = Redlock::builder().node(MemoryNode::new()).fencing(true).build()?;
    /// let policy = LockPolicy::builder(redlock, IdempotencyKey::required())
    ///     .fencing_header("Fencing-Token")
    ///     .build()?;
    /// assert_eq!(policy.fencing_header(), Some("fencing-token"));
    /// # Ok(()) }
    /// ```
    pub fn fencing_header(mut self, name: &str) -> Self {
        self.inner.fencing_header = Some(name.to_ascii_lowercase().into_boxed_str());
        self
    }

    /// Replace the middleware's own answers with yours. The default,
    /// [`GrpcOr`](crate::grpc::GrpcOr)`(`[`ProblemJson`](crate::rejection::ProblemJson)`)`,
    /// answers gRPC calls with gRPC statuses and other requests with problem+json;
    /// `responder` replaces it whole, so your responder answers gRPC calls too — wrap it
    /// in `GrpcOr` to keep their gRPC statuses (see [`grpc`](crate::grpc)).
    pub fn responder(mut self, responder: impl Responder) -> Self {
        self.inner.responder = Box::new(responder);
        self
    }

    /// Keys every lock key with `secret` (HMAC-SHA-256, RFC 2104): the Redis key becomes the
    /// extractor's prefix and the hex of the first 16 bytes of HMAC-SHA-256(secret, the
    /// extractor's key). With replay, the request fingerprint a record keeps (a SHA-256 of
    /// the method, path, query, chosen headers and body) is keyed the same way. Without the secret, a key in Redis (or a hashed key in the logs)
    /// can no longer be matched to a guessed request value — an order id, a short
    /// idempotency key — by hashing candidates. Every instance of a service must use the
    /// same secret (they must contend for the same keys); changing it changes every key
    /// (a rolling change lets two instances lock one request under two keys, and loses the
    /// stored responses of replay). At least 16 bytes, 32 random bytes recommended: a
    /// shorter secret fails [`build`](Self::build).
    ///
    /// ```
    /// # fn main() -> tower_redlock::Result<()> {
    /// use tower_redlock::key::IdempotencyKey;
    /// use tower_redlock::node::MemoryNode;
    /// use tower_redlock::policy::LockPolicy;
    /// use tower_redlock::Redlock;
    ///
    /// let redlock = Redlock::builder().node(MemoryNode::new()).build()?;
    /// let secret = std::env::var("LOCK_KEY_SECRET").unwrap_or_else(|_| "x".repeat(32));
    /// let policy = LockPolicy::builder(redlock.clone(), IdempotencyKey::required())
    ///     .hmac_key(secret.as_bytes())
    ///     .build()?;
    /// # let _ = policy;
    /// let short = LockPolicy::builder(redlock, IdempotencyKey::required()).hmac_key(b"short");
    /// assert!(short.build().unwrap_err().is_invalid_input());
    /// # Ok(()) }
    /// ```
    pub fn hmac_key(mut self, secret: impl AsRef<[u8]>) -> Self {
        match HmacKey::new(secret.as_ref()) {
            Ok(key) => self.inner.hmac = Some(key),
            Err(e) => self.problem = Some(e),
        }
        self
    }

    /// Builds the policy, or says what to fix.
    ///
    /// # Errors
    ///
    /// [`Error::is_invalid_input`](crate::Error::is_invalid_input), naming the setting, for
    /// settings that contradict each other or the client. They are reported here, never per
    /// request. Among them:
    ///
    /// - a ttl the voters' restart protection does not cover;
    /// - a fencing header on a client without fencing tokens;
    /// - `OnContention::Wait` without a time bound;
    /// - `repeatable_after_loss` without replay and a rule that may abort.
    pub fn build(self) -> crate::Result<LockPolicy> {
        if let Some(problem) = self.problem {
            return Err(problem);
        }
        let p = &self.inner;
        // The same check a lock call makes, up front.
        p.redlock.check_ttl(p.ttl)?;
        if let Some(methods) = &p.methods {
            if methods.is_empty() {
                return Err(crate::Error::invalid(
                    "no method would be locked: name at least one, or use any_method()",
                ));
            }
            if let Some(bad) = methods.iter().find(|m| !crate::rejection::is_token(m)) {
                return Err(crate::Error::invalid(format!(
                    "{bad:?} is not an HTTP method name (a token: letters, digits, !#$%&'*+-.^_`|~)"
                )));
            }
        }
        if let Some(replay) = &p.replay {
            replay.check()?;
            if p.unavailable == OnUnavailable::FailOpen {
                // Unlocked, a request cannot see a record on the masters it cannot reach:
                // a completed key could run again.
                return Err(crate::Error::invalid(
                    "fail_open cannot be combined with replay: a request run unlocked could \
                     run a completed key again (replay answers 503 when the quorum is unreachable)",
                ));
            }
        }
        if p.repeatable_after_loss && (p.replay.is_none() || !p.lost.may_abort()) {
            return Err(crate::Error::invalid(
                "repeatable_after_loss says what a request stopped on a lost lease leaves \
                 behind: it needs replay and on_lost(OnLost::Abort) (or a LostRule::decide hook)",
            ));
        }
        if let Some(name) = &p.fencing_header {
            if !crate::rejection::is_token(name) {
                return Err(crate::Error::invalid(format!(
                    "{name:?} is not a header name (a token: letters, digits, !#$%&'*+-.^_`|~)"
                )));
            }
            if !p.redlock.fencing_enabled() {
                return Err(crate::Error::invalid(
                    "fencing_header needs a client with fencing tokens: build it with \
                     RedlockBuilder::fencing(true)",
                ));
            }
        }
        if let OnContention::Wait(retry) = p.contention {
            if retry.retry_count() == 0 || retry.max_wait_of().is_none_or(|w| w.is_zero()) {
                return Err(crate::Error::invalid(
                    "OnContention::Wait must retry, within a wait greater than zero: \
                     Retry::until(d), or a Retry with .max_wait(d) (use OnContention::Reject \
                     to not wait)",
                ));
            }
            if retry.delay_of().is_zero() {
                return Err(crate::Error::invalid(
                    "the delay between tries must be greater than zero",
                ));
            }
        }
        Ok(LockPolicy {
            inner: Arc::new(self.inner),
        })
    }
}
