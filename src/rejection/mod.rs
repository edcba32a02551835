//! The answers the middleware gives for itself: `400`, `409`, `413`, `422`, `503`, as
//! `application/problem+json` (RFC 9457) bodies that the user can replace — or, to a gRPC
//! call, as gRPC statuses (see [`grpc`](crate::grpc)).

// Without tower or actix-web, the middleware's part of this module has no caller.
#![cfg_attr(
    not(any(feature = "tower", feature = "actix")),
    allow(dead_code, unused_imports)
)]

use std::fmt;
use std::time::Duration;

use crate::key::{KeyRejection, KeyRejectionKind};
mod wire;
pub(crate) use self::wire::Wire;

mod response;

pub(crate) use self::response::is_token;
pub use self::response::RejectionResponse;

/// The media type of the default rejections (RFC 9457).
const PROBLEM_JSON: &str = "application/problem+json";

/// Why the middleware answered instead of the handler. Each kind has an HTTP status
/// ([`Rejection::status`]) and a gRPC code ([`Rejection::grpc_code`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RejectionKind {
    /// The request's key is missing, empty, too long, malformed or duplicated: `400`
    /// (gRPC `INVALID_ARGUMENT`).
    BadKey,
    /// Another request holds the key (and waiting, if enabled, timed out): `409` (gRPC
    /// `ABORTED`).
    Contended,
    /// The lock quorum is unreachable and the policy fails closed: `503` (gRPC
    /// `UNAVAILABLE`).
    Unavailable,
    /// The lock call was rejected as invalid (a misconfigured ttl): `500` (gRPC
    /// `INTERNAL`).
    Misconfigured,
    /// Replay: the key was used before with a different request (method, path, query,
    /// configured headers or body): `422` (gRPC `FAILED_PRECONDITION`).
    Mismatch,
    /// Replay: the request body is larger than the fingerprint's body limit: `413` (gRPC
    /// `RESOURCE_EXHAUSTED`).
    BodyTooLarge,
    /// Replay: the request body could not be read (the client went away or sent a broken
    /// body): `400` (gRPC `CANCELLED`).
    BodyUnreadable,
    /// Replay: a request with this key completed, but its response was not stored, so it cannot be
    /// replayed. The response was a streamed body (every gRPC response whose status comes in
    /// trailers), or larger than the response limit. Answered `409` without `Retry-After` (gRPC
    /// `ALREADY_EXISTS`): a retry gets the same answer, and the handler never runs twice.
    CompletedNotStored,
    /// The lease was lost while the handler ran (its validity ran out, or the keep-alive
    /// could not extend it on a quorum) and the policy aborts on a lost lease
    /// ([`OnLost::Abort`](crate::policy::OnLost::Abort)): the handler was stopped. `503`
    /// with a `Retry-After` of at least the ttl (gRPC `UNAVAILABLE`).
    LockLost,
    /// Replay: the request with this key was stopped because its lease was lost
    /// ([`OnLost::Abort`](crate::policy::OnLost::Abort)), or lost leases stored records that
    /// differ ([`LockOrRecord::OutcomeUnknown`](crate::LockOrRecord::OutcomeUnknown)); it may or may not
    /// have had its effects, and it is not run again: `409` without `Retry-After` (gRPC
    /// `UNKNOWN`).
    OutcomeUnknown,
}

/// A rejection: what went wrong, with the details a responder may use.
#[derive(Debug)]
pub struct Rejection {
    kind: RejectionKind,
    retry_after: Option<Duration>,
    cause: Cause,
    /// How the client expects the answer (HTTP or gRPC), from the request.
    wire: Wire,
    /// Whether the problem body lists each voter's answer (the policy's `explain_votes`).
    explain: bool,
}

/// What a rejection comes from: a bad key (400), a lock error (409, 503, 500) or replay
/// (413, 422, 409).
#[derive(Debug)]
enum Cause {
    Key(KeyRejection),
    Lock(crate::Error),
    Replay,
}

impl Rejection {
    pub(crate) fn bad_key(key: KeyRejection) -> Self {
        Self {
            kind: RejectionKind::BadKey,
            retry_after: None,
            cause: Cause::Key(key),
            wire: Wire::Http,
            explain: false,
        }
    }

    pub(crate) fn from_lock_error(error: crate::Error, unavailable_retry: Duration) -> Self {
        let (kind, retry_after) = if error.is_contended() {
            // A holder without an expiry (a foreign plain SET) gives no hint: say 1 s.
            (
                RejectionKind::Contended,
                Some(error.retry_after().unwrap_or(Duration::from_secs(1))),
            )
        } else if error.is_invalid_input() {
            (RejectionKind::Misconfigured, None)
        } else {
            (RejectionKind::Unavailable, Some(unavailable_retry))
        };
        Self {
            kind,
            retry_after,
            cause: Cause::Lock(error),
            wire: Wire::Http,
            explain: false,
        }
    }

    /// The answer to a request whose handler was stopped because its lease was lost: `503`,
    /// retried no sooner than a new holder's `ttl` can need.
    pub(crate) fn lock_lost(ttl: Duration) -> Self {
        Self {
            kind: RejectionKind::LockLost,
            retry_after: Some(ttl.max(Duration::from_secs(1))),
            cause: Cause::Replay,
            wire: Wire::Http,
            explain: false,
        }
    }

    /// A rejection of the replay step (`Mismatch`, `BodyTooLarge`, `BodyUnreadable`,
    /// `CompletedNotStored`, `OutcomeUnknown`).
    pub(crate) fn replay(kind: RejectionKind) -> Self {
        Self {
            kind,
            retry_after: None,
            cause: Cause::Replay,
            wire: Wire::Http,
            explain: false,
        }
    }

    /// A rejection of the replay step that the client may retry after `after`
    /// (`Contended` and `Unavailable` of durable replay).
    pub(crate) fn retry(kind: RejectionKind, after: Duration) -> Self {
        Self {
            retry_after: Some(after),
            ..Self::replay(kind)
        }
    }

    /// The rejection of a request that came over `wire` (see [`Wire::of`]).
    #[must_use]
    pub(crate) fn on(mut self, wire: Wire) -> Self {
        self.wire = wire;
        self
    }

    /// Whether the problem body lists each voter's answer (see
    /// [`LockPolicyBuilder::explain_votes`](crate::policy::LockPolicyBuilder::explain_votes)).
    #[must_use]
    pub(crate) fn explained(mut self, on: bool) -> Self {
        self.explain = on;
        self
    }

    /// Whether the policy asks the answer to list each voter's answer
    /// ([`LockPolicyBuilder::explain_votes`](crate::policy::LockPolicyBuilder::explain_votes)):
    /// the default responder then adds a `votes` array to a `409` or `503` body.
    pub fn explains_votes(&self) -> bool {
        self.explain
    }

    /// How the client expects the answer.
    pub(crate) fn wire(&self) -> Wire {
        self.wire
    }

    /// What went wrong.
    pub fn kind(&self) -> RejectionKind {
        self.kind
    }

    /// The HTTP status: 400, 409, 413, 422, 503 or 500.
    pub fn status(&self) -> u16 {
        match self.kind {
            RejectionKind::BadKey | RejectionKind::BodyUnreadable => 400,
            RejectionKind::Contended
            | RejectionKind::CompletedNotStored
            | RejectionKind::OutcomeUnknown => 409,
            RejectionKind::BodyTooLarge => 413,
            RejectionKind::Mismatch => 422,
            RejectionKind::Unavailable | RejectionKind::LockLost => 503,
            RejectionKind::Misconfigured => 500,
        }
    }

    /// The `Retry-After` value in whole seconds: the holder's remaining ttl rounded **up**,
    /// at least 1. `None` for 400 and 500.
    pub fn retry_after_secs(&self) -> Option<u64> {
        self.retry_after.map(|d| {
            let secs = d.as_secs() + u64::from(d.subsec_nanos() > 0);
            secs.max(1)
        })
    }

    /// The same delay in milliseconds, rounded **up**, at least 1 (`grpc-retry-pushback-ms`).
    pub(crate) fn retry_after_ms(&self) -> Option<u64> {
        self.retry_after.map(|d| {
            let ms = d.as_millis() + u128::from(d.subsec_nanos() % 1_000_000 > 0);
            u64::try_from(ms).unwrap_or(u64::MAX).max(1)
        })
    }

    /// The key rejection behind a `400`.
    pub fn key_rejection(&self) -> Option<&KeyRejection> {
        match &self.cause {
            Cause::Key(k) => Some(k),
            Cause::Lock(_) | Cause::Replay => None,
        }
    }

    /// The lock error behind a `409`, `503` or `500`.
    pub fn lock_error(&self) -> Option<&crate::Error> {
        match &self.cause {
            Cause::Lock(e) => Some(e),
            Cause::Key(_) | Cause::Replay => None,
        }
    }

    /// A short, human-readable summary.
    pub fn title(&self) -> &'static str {
        if let Cause::Key(k) = &self.cause {
            return k.title();
        }
        match self.kind {
            RejectionKind::BadKey => "Bad lock key",
            RejectionKind::Contended => "Request in progress",
            RejectionKind::Unavailable => "Lock service unavailable",
            RejectionKind::Misconfigured => "Lock misconfigured",
            RejectionKind::Mismatch => "Idempotency key reused",
            RejectionKind::BodyTooLarge => "Request body too large",
            RejectionKind::BodyUnreadable => "Request body unreadable",
            RejectionKind::CompletedNotStored => "Request already completed",
            RejectionKind::LockLost => "Lock lost",
            RejectionKind::OutcomeUnknown => "Request outcome unknown",
        }
    }

    /// An explanation for the client. Never contains the raw key or node addresses.
    pub fn detail(&self) -> String {
        if let Cause::Key(k) = &self.cause {
            return k.detail();
        }
        match self.kind {
            RejectionKind::BadKey => "the lock key is invalid".to_owned(),
            RejectionKind::Contended => format!(
                "another request with the same key is being processed; retry after {} s",
                self.retry_after_secs().unwrap_or(1)
            ),
            RejectionKind::Unavailable => {
                "the lock service could not reach a quorum; retry later".to_owned()
            }
            RejectionKind::Misconfigured => "the server's lock configuration is invalid".to_owned(),
            RejectionKind::Mismatch => "this key was already used with a different request \
                 (method, path, query, headers or body); use a new key for a new request"
                .to_owned(),
            RejectionKind::BodyTooLarge => {
                "the request body is larger than this endpoint accepts".to_owned()
            }
            RejectionKind::BodyUnreadable => "the request body could not be read".to_owned(),
            RejectionKind::CompletedNotStored => "a request with this key already completed; \
                 its response was not stored and cannot be replayed, and it is not run again"
                .to_owned(),
            RejectionKind::LockLost => format!(
                "the lock of this request was lost while it was processed, so it was stopped; \
                 its effects are unknown; retry after {} s",
                self.retry_after_secs().unwrap_or(1)
            ),
            RejectionKind::OutcomeUnknown => "a request with this key ran, but its lock was \
                 lost before its outcome was recorded for good; it may or may not have taken \
                 effect, and it is not run again"
                .to_owned(),
        }
    }

    /// A stable identifier for the problem type, used as the `type` member (a relative URI
    /// reference, as RFC 9457 allows).
    pub fn type_uri(&self) -> &'static str {
        if let Cause::Key(k) = &self.cause {
            // Exhaustive: a new kind of key rejection must get its own type.
            return match k.kind() {
                KeyRejectionKind::Missing => "/problems/lock-key-missing",
                KeyRejectionKind::Empty => "/problems/lock-key-empty",
                KeyRejectionKind::TooLong { .. } => "/problems/lock-key-too-long",
                KeyRejectionKind::Malformed { .. } => "/problems/lock-key-malformed",
                KeyRejectionKind::Duplicate => "/problems/lock-key-duplicate",
            };
        }
        match self.kind {
            RejectionKind::BadKey => "/problems/lock-key-malformed",
            RejectionKind::Contended => "/problems/lock-contended",
            RejectionKind::Unavailable => "/problems/lock-unavailable",
            RejectionKind::Misconfigured => "/problems/lock-misconfigured",
            RejectionKind::Mismatch => "/problems/idempotency-key-reused",
            RejectionKind::BodyTooLarge => "/problems/request-body-too-large",
            RejectionKind::BodyUnreadable => "/problems/request-body-unreadable",
            RejectionKind::CompletedNotStored => "/problems/idempotency-completed-not-stored",
            RejectionKind::LockLost => "/problems/lock-lost",
            RejectionKind::OutcomeUnknown => "/problems/idempotency-outcome-unknown",
        }
    }

    /// The default answer: an `application/problem+json` body with `type`, `title`,
    /// `status` and `detail` (plus `retry_after` for 409 and 503), and a `Retry-After`
    /// header for 409 and 503.
    pub fn to_problem_json(&self) -> RejectionResponse {
        let mut body = String::with_capacity(192);
        body.push_str("{\"type\":");
        json_string(&mut body, self.type_uri());
        body.push_str(",\"title\":");
        json_string(&mut body, self.title());
        body.push_str(",\"status\":");
        body.push_str(&self.status().to_string());
        body.push_str(",\"detail\":");
        json_string(&mut body, &self.detail());
        if let Some(secs) = self.retry_after_secs() {
            body.push_str(",\"retry_after\":");
            body.push_str(&secs.to_string());
        }
        let explained = matches!(
            self.kind,
            RejectionKind::Contended | RejectionKind::Unavailable
        );
        if let (true, true, Cause::Lock(e)) = (self.explain, explained, &self.cause) {
            body.push_str(",\"votes\":[");
            for (i, vote) in e.votes().enumerate() {
                if i > 0 {
                    body.push(',');
                }
                body.push_str("{\"voter\":");
                json_string(&mut body, vote.name());
                body.push_str(",\"vote\":");
                json_string(&mut body, vote.kind().as_str());
                if let crate::VoteKind::Held { remaining: Some(r) } = vote.kind() {
                    body.push_str(",\"ttl_ms\":");
                    body.push_str(&r.as_millis().to_string());
                }
                body.push('}');
            }
            body.push(']');
        }
        body.push('}');
        let res = RejectionResponse::new(self.status(), PROBLEM_JSON, body);
        match self.retry_after_secs() {
            Some(secs) => res.with_retry_after(secs),
            None => res,
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.status(), self.title(), self.detail())
    }
}

/// Appends `s` as a JSON string literal.
fn json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Turns a [`Rejection`] into a response. The default is
/// [`GrpcOr`](crate::grpc::GrpcOr)`(`[`ProblemJson`]`)` (a gRPC status for a gRPC call,
/// problem+json otherwise); closures `Fn(&Rejection) -> RejectionResponse` are responders
/// too. A responder answers every rejection, gRPC calls' included (see
/// [`Rejection::is_grpc`]).
///
/// ```
/// use tower_redlock::rejection::{Rejection, RejectionResponse, Responder};
///
/// let plain = |r: &Rejection| {
///     let res = RejectionResponse::new(r.status(), "text/plain; charset=utf-8", r.detail());
///     match r.retry_after_secs() {
///         Some(secs) => res.with_retry_after(secs),
///         None => res,
///     }
/// };
/// fn is_responder(_: &impl Responder) {}
/// is_responder(&plain);
/// ```
pub trait Responder: Send + Sync + 'static {
    /// The response for `rejection`.
    fn respond(&self, rejection: &Rejection) -> RejectionResponse;
}

impl<F> Responder for F
where
    F: Fn(&Rejection) -> RejectionResponse + Send + Sync + 'static,
{
    fn respond(&self, rejection: &Rejection) -> RejectionResponse {
        self(rejection)
    }
}

/// RFC 9457 `application/problem+json` for every request. The default responder is
/// [`GrpcOr`](crate::grpc::GrpcOr)`(ProblemJson)`: gRPC calls get gRPC statuses, every other
/// request this; set `ProblemJson` alone to answer gRPC calls with problem+json too.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProblemJson;

impl Responder for ProblemJson {
    fn respond(&self, rejection: &Rejection) -> RejectionResponse {
        rejection.to_problem_json()
    }
}

/// The rejection of the `LeaseHandle` extractor (axum and actix-web) when no lock is held
/// for the request: the route is not behind the middleware, the request had no key, or the
/// middleware failed open. Answers `500`: a server misconfiguration, not the client's fault.
#[derive(Debug, Clone, Copy)]
pub struct MissingLease;

impl MissingLease {
    /// The `500` problem+json answer.
    pub fn to_problem_json(&self) -> RejectionResponse {
        let mut body = String::from(
            "{\"type\":\"/problems/lock-missing\",\"title\":\"No lock held\",\"status\":500,\"detail\":",
        );
        json_string(&mut body, &self.to_string());
        body.push('}');
        RejectionResponse::new(500, PROBLEM_JSON, body)
    }
}

impl fmt::Display for MissingLease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(
            "no lock is held for this request: the route is not behind the lock middleware, \
             the request had no key, or the middleware failed open",
        )
    }
}

impl std::error::Error for MissingLease {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::KeySource;

    fn contended(retry: Duration) -> Rejection {
        Rejection {
            kind: RejectionKind::Contended,
            retry_after: Some(retry),
            cause: Cause::Lock(crate::Error::contended(1, 0, 1, Some(retry), Vec::new())),
            wire: Wire::Http,
            explain: false,
        }
    }

    #[test]
    fn retry_after_rounds_up_to_whole_seconds() {
        assert_eq!(
            contended(Duration::from_millis(1)).retry_after_secs(),
            Some(1)
        );
        assert_eq!(contended(Duration::ZERO).retry_after_secs(), Some(1));
        assert_eq!(
            contended(Duration::from_millis(1000)).retry_after_secs(),
            Some(1)
        );
        assert_eq!(
            contended(Duration::from_millis(1001)).retry_after_secs(),
            Some(2)
        );
        assert_eq!(
            contended(Duration::from_millis(29_400)).retry_after_secs(),
            Some(30)
        );
    }

    #[test]
    fn problem_json_is_valid_json_with_the_fields() {
        let r = Rejection::bad_key(KeyRejection::missing(KeySource::header("idempotency-key")));
        let p = r.to_problem_json();
        assert_eq!(p.status(), 400);
        assert_eq!(p.content_type(), "application/problem+json");
        assert_eq!(p.retry_after(), None);
        let v: serde_json::Value = serde_json::from_slice(p.body()).unwrap();
        assert_eq!(v["status"], 400);
        assert_eq!(v["type"], "/problems/lock-key-missing");
        assert!(v["detail"].as_str().unwrap().contains("idempotency-key"));

        let p = contended(Duration::from_millis(2500)).to_problem_json();
        let v: serde_json::Value = serde_json::from_slice(p.body()).unwrap();
        assert_eq!((p.status(), p.retry_after()), (409, Some(3)));
        assert_eq!(v["retry_after"], 3);
    }

    #[test]
    fn invalid_headers_are_dropped_never_sent() {
        let r = RejectionResponse::new(409, "text/plain\r\nx-evil: 1", "b")
            .with_header("x-ok", "fine\tvalue")
            .with_header("x bad", "v")
            .with_header("x-bad-value", "a\r\nx-evil: 1")
            .with_header("", "v")
            .with_header("Content-Length", "1");
        assert_eq!(r.content_type(), "text/plain; charset=utf-8");
        assert_eq!(r.headers().collect::<Vec<_>>(), [("x-ok", "fine\tvalue")]);
    }

    #[test]
    fn json_strings_are_escaped() {
        let mut s = String::new();
        json_string(&mut s, "a\"b\\c\n\u{1}");
        assert_eq!(s, r#""a\"b\\c\n\u0001""#);
    }
}
