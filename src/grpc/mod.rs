//! gRPC answers: a rejection of a gRPC call is a gRPC status, not an HTTP problem+json body.
//!
//! A gRPC client (tonic, grpc-go, grpc-java, …) reads a call's outcome from `grpc-status`,
//! not from the HTTP status: a `409` with a JSON body reaches it as an opaque protocol error.
//! So a request whose `content-type` is `application/grpc` (or `application/grpc+proto`,
//! `application/grpc-web…`; see [`is_grpc`]) is answered by the default responder,
//! [`GrpcOr`]`(`[`ProblemJson`](crate::rejection::ProblemJson)`)`, the way a gRPC server answers a
//! call that fails before its first message — *trailers-only*: HTTP `200`, `content-type:
//! application/grpc` (`application/grpc-web` or `application/grpc-web-text` for a gRPC-Web
//! call), `grpc-status` and a percent-encoded `grpc-message` in the headers, and no body
//! ([`Rejection::to_grpc_status`](crate::rejection::Rejection::to_grpc_status)). The crate's tests read these answers with tonic's
//! client; other clients follow the same protocol but are not tested.
//!
//! | rejection ([`RejectionKind`]) | HTTP | gRPC | why |
//! | --- | --- | --- | --- |
//! | `Contended`: another call holds the key | `409` | `ABORTED` (10) + retry hint | a concurrency conflict; the gRPC docs: "the client should retry at a higher level" |
//! | `Unavailable`: no lock quorum | `503` | `UNAVAILABLE` (14) + retry hint | transient, safe to retry: nothing ran |
//! | `BadKey`: key missing, empty, too long, malformed, sent twice | `400` | `INVALID_ARGUMENT` (3) | the call itself is wrong, whatever the server's state |
//! | `BodyUnreadable` (replay) | `400` | `CANCELLED` (1) | the request stream failed before its end: the client reset it (cancelled, or its deadline passed) or the connection broke — gRPC reports a cancelled call as `CANCELLED` on both sides. Nothing about the messages was judged, so not `INVALID_ARGUMENT` (which tells the client that retrying is useless): nothing ran and no lock was taken, a retry with the same key is safe |
//! | `BodyTooLarge` (replay) | `413` | `RESOURCE_EXHAUSTED` (8) | what gRPC answers for a message over the size limit |
//! | `Mismatch` (replay): key reused with another request | `422` | `FAILED_PRECONDITION` (9) | the key's state forbids it: "do not retry until the state is fixed" — use a new key |
//! | `CompletedNotStored` (replay) | `409` | `ALREADY_EXISTS` (6) | the call with this key was already done; retrying cannot run it again |
//! | `Misconfigured`: invalid lock settings | `500` | `INTERNAL` (13) | the server's fault |
//! | `LockLost`: the lease was lost while the handler ran, and the policy aborts ([`OnLost::Abort`](crate::policy::OnLost::Abort)) | `503` | `UNAVAILABLE` (14) + retry hint (at least the ttl) | the call was stopped; what it did is unknown. If the response had begun, its trailers carry this status |
//! | `OutcomeUnknown` (replay): the call with this key was stopped on a lost lease | `409` | `UNKNOWN` (2) | the outcome of the first call is unknown, and it is not run again |
//!
//! The retry hint of `ABORTED` and `UNAVAILABLE` is sent twice: `retry-after` (whole seconds
//! rounded up, as over HTTP) and `grpc-retry-pushback-ms` (the delay in milliseconds, rounded up).
//! Pushback is a hint for clients with a retry policy (gRFC A6). They honour it only when the code
//! is in the policy's `retryableStatusCodes`: `UNAVAILABLE` often is, `ABORTED` rarely. tonic has
//! no retry policy: a tonic client sees both values in `Status::metadata()` and decides itself.
//! `grpc-message` is [`Rejection::detail`](crate::rejection::Rejection::detail), which never
//! contains the raw key.
//!
//! A layer on a whole tonic server (`Server::builder().layer(..)`) also sees its health
//! checks and reflection: give them no key
//! ([`only_grpc_service`](crate::key::KeyExtractorExt::only_grpc_service), or any extractor that
//! returns `Ok(None)` outside the protected service), or they are refused with
//! `INVALID_ARGUMENT`. For streaming methods, see
//! [`Replay::without_body`](crate::replay::Replay::without_body) and
//! [`ReleaseOn::BodyEnd`](crate::policy::ReleaseOn::BodyEnd) (the gRPC
//! guide, `tower_redlock::guide::grpc`, says why).
//!
//! A custom [`Responder`] set with
//! [`LockPolicyBuilder::responder`](crate::policy::LockPolicyBuilder::responder) replaces the
//! default whole and answers gRPC calls too; wrap it in [`GrpcOr`] to keep gRPC statuses for
//! them, or look at [`Rejection::is_grpc`](crate::rejection::Rejection::is_grpc) yourself.
//!
//! ```
//! use tower_redlock::grpc::{GrpcCode, GrpcOr};
//! use tower_redlock::rejection::{ProblemJson, Rejection, RejectionResponse};
//!
//! assert!(tower_redlock::grpc::is_grpc(b"application/grpc+proto"));
//! assert_eq!(GrpcCode::Aborted.value(), 10);
//!
//! // HTTP clients get plain text, gRPC clients their status.
//! let responder = GrpcOr(|r: &Rejection| {
//!     RejectionResponse::new(r.status(), "text/plain; charset=utf-8", r.detail())
//! });
//! # fn is_responder(_: &impl tower_redlock::rejection::Responder) {}
//! # is_responder(&responder);
//! # is_responder(&GrpcOr(ProblemJson));
//! ```

// Without tower or actix-web, the middleware's part of this module has no caller.
#![cfg_attr(
    not(any(feature = "tower", feature = "actix")),
    allow(dead_code, unused_imports)
)]

use std::fmt;

use bytes::Bytes;

use crate::key::RequestView;
pub(crate) use crate::rejection::Wire;
use crate::rejection::{Rejection, RejectionKind, RejectionResponse, Responder};

/// A gRPC status code (the `grpc-status` value), as the gRPC specification lists them.
///
/// ```
/// use tower_redlock::grpc::GrpcCode;
///
/// assert_eq!(GrpcCode::from_value(14), Some(GrpcCode::Unavailable));
/// assert_eq!(GrpcCode::Unavailable.name(), "UNAVAILABLE");
/// assert_eq!(GrpcCode::Unavailable.http_equivalent(), 503);
/// assert_eq!(GrpcCode::from_value(17), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GrpcCode {
    /// `OK` (0).
    Ok,
    /// `CANCELLED` (1).
    Cancelled,
    /// `UNKNOWN` (2).
    Unknown,
    /// `INVALID_ARGUMENT` (3).
    InvalidArgument,
    /// `DEADLINE_EXCEEDED` (4).
    DeadlineExceeded,
    /// `NOT_FOUND` (5).
    NotFound,
    /// `ALREADY_EXISTS` (6).
    AlreadyExists,
    /// `PERMISSION_DENIED` (7).
    PermissionDenied,
    /// `RESOURCE_EXHAUSTED` (8).
    ResourceExhausted,
    /// `FAILED_PRECONDITION` (9).
    FailedPrecondition,
    /// `ABORTED` (10).
    Aborted,
    /// `OUT_OF_RANGE` (11).
    OutOfRange,
    /// `UNIMPLEMENTED` (12).
    Unimplemented,
    /// `INTERNAL` (13).
    Internal,
    /// `UNAVAILABLE` (14).
    Unavailable,
    /// `DATA_LOSS` (15).
    DataLoss,
    /// `UNAUTHENTICATED` (16).
    Unauthenticated,
}

/// Every code, by value.
const CODES: [GrpcCode; 17] = [
    GrpcCode::Ok,
    GrpcCode::Cancelled,
    GrpcCode::Unknown,
    GrpcCode::InvalidArgument,
    GrpcCode::DeadlineExceeded,
    GrpcCode::NotFound,
    GrpcCode::AlreadyExists,
    GrpcCode::PermissionDenied,
    GrpcCode::ResourceExhausted,
    GrpcCode::FailedPrecondition,
    GrpcCode::Aborted,
    GrpcCode::OutOfRange,
    GrpcCode::Unimplemented,
    GrpcCode::Internal,
    GrpcCode::Unavailable,
    GrpcCode::DataLoss,
    GrpcCode::Unauthenticated,
];

impl GrpcCode {
    /// The numeric code, as sent in `grpc-status` (and as `tonic::Code::from_i32` takes it).
    pub fn value(self) -> i32 {
        self as i32
    }

    /// The code of a numeric value, `None` outside 0–16.
    pub fn from_value(value: i32) -> Option<Self> {
        usize::try_from(value)
            .ok()
            .and_then(|i| CODES.get(i).copied())
    }

    /// The specification's name, e.g. `"ABORTED"`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Ok => "OK",
            Self::Cancelled => "CANCELLED",
            Self::Unknown => "UNKNOWN",
            Self::InvalidArgument => "INVALID_ARGUMENT",
            Self::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Self::NotFound => "NOT_FOUND",
            Self::AlreadyExists => "ALREADY_EXISTS",
            Self::PermissionDenied => "PERMISSION_DENIED",
            Self::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Self::FailedPrecondition => "FAILED_PRECONDITION",
            Self::Aborted => "ABORTED",
            Self::OutOfRange => "OUT_OF_RANGE",
            Self::Unimplemented => "UNIMPLEMENTED",
            Self::Internal => "INTERNAL",
            Self::Unavailable => "UNAVAILABLE",
            Self::DataLoss => "DATA_LOSS",
            Self::Unauthenticated => "UNAUTHENTICATED",
        }
    }

    /// The HTTP status of the same meaning, as `google.rpc.Code` maps them (`OK` 200,
    /// `INVALID_ARGUMENT` 400, `ABORTED` 409, `UNAVAILABLE` 503, …). A replay policy judges a
    /// trailers-only gRPC response by it (see
    /// [`Replay::store_if`](crate::replay::Replay::store_if)). The codes that invite a retry —
    /// `CANCELLED`, `DEADLINE_EXCEEDED`, `ABORTED`, `RESOURCE_EXHAUSTED`, `UNAVAILABLE` — are
    /// judged as `503` instead. By default a call that failed with `UNAVAILABLE`, `ABORTED` or
    /// `INTERNAL` is not stored and may run again. One that failed with `NOT_FOUND` is stored.
    pub fn http_equivalent(self) -> u16 {
        match self {
            Self::Ok => 200,
            Self::Cancelled => 499,
            Self::Unknown | Self::Internal | Self::DataLoss => 500,
            Self::InvalidArgument | Self::FailedPrecondition | Self::OutOfRange => 400,
            Self::DeadlineExceeded => 504,
            Self::NotFound => 404,
            Self::AlreadyExists | Self::Aborted => 409,
            Self::PermissionDenied => 403,
            Self::ResourceExhausted => 429,
            Self::Unimplemented => 501,
            Self::Unavailable => 503,
            Self::Unauthenticated => 401,
        }
    }

    /// Whether a handler that answers with this code asks for a retry: the call may succeed
    /// when sent again as it is (the codes gRPC retry policies and proxies retry on).
    fn invites_retry(self) -> bool {
        matches!(
            self,
            Self::Cancelled
                | Self::DeadlineExceeded
                | Self::Aborted
                | Self::ResourceExhausted
                | Self::Unavailable
        )
    }

    /// The code in a `grpc-status` header value (ASCII digits), if it is one.
    fn parse(value: &[u8]) -> Option<Self> {
        let text = std::str::from_utf8(value).ok()?;
        Self::from_value(text.trim().parse().ok()?)
    }
}

impl fmt::Display for GrpcCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether a request with this `content-type` is a gRPC call: `application/grpc`, alone or
/// with a `+codec` suffix or parameters, and the gRPC-Web types `application/grpc-web…`,
/// compared case-insensitively.
///
/// ```
/// use tower_redlock::grpc::is_grpc;
///
/// assert!(is_grpc("application/grpc"));
/// assert!(is_grpc("application/grpc+proto"));
/// assert!(is_grpc("Application/GRPC-Web-Text"));
/// assert!(!is_grpc("application/json"));
/// assert!(!is_grpc("application/grpcfoo"));
/// ```
pub fn is_grpc(content_type: impl AsRef<[u8]>) -> bool {
    Wire::of_content_type(content_type.as_ref()) != Wire::Http
}

/// The caller's deadline of a gRPC request, from its `grpc-timeout` header (`1–8 digits` and
/// a unit: `H`, `M`, `S`, `m`, `u`, `n`); `None` for HTTP, or without a valid one. A wait for
/// a busy key is bounded by it: the caller gives up then.
pub(crate) fn timeout(wire: Wire, req: &dyn RequestView) -> Option<std::time::Duration> {
    use std::time::Duration;
    if wire == Wire::Http {
        return None;
    }
    let v = req.header("grpc-timeout")?.trim_ascii();
    let (&unit, digits) = v.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(n.checked_mul(3600)?),
        b'M' => Duration::from_secs(n.checked_mul(60)?),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// How long a gRPC caller whose deadline is `d` (its [`timeout`]) may wait for a busy key: `d` less
/// a tenth of it (at most 1 s) for the answer's way back. The caller's deadline counts from before
/// the call reached us, and tonic's server cancels the call at it. A wait that ended at the
/// deadline itself would leave the `ABORTED` answer (with its retry hint) racing that cancellation
/// on a loaded machine.
pub(crate) fn answer_by(d: std::time::Duration) -> std::time::Duration {
    d.saturating_sub((d / 10).min(std::time::Duration::from_secs(1)))
}

/// Percent-encodes a `grpc-message` as the gRPC specification says: every byte outside
/// space..`~`, and `%`, as `%XX`.
fn percent_encode(message: &str) -> String {
    const HEX: &[u8; 16] = b"0123456789ABCDEF";
    let mut out = String::with_capacity(message.len());
    for &b in message.as_bytes() {
        if (b' '..=b'~').contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push('%');
            out.push(char::from(HEX[usize::from(b >> 4)]));
            out.push(char::from(HEX[usize::from(b & 0xf)]));
        }
    }
    out
}

impl Rejection {
    /// Whether the rejected request is a gRPC call (its `content-type` passes [`is_grpc`]):
    /// the default responder then answers with [`to_grpc_status`](Self::to_grpc_status).
    pub fn is_grpc(&self) -> bool {
        self.wire() != Wire::Http
    }

    /// The gRPC status code of this rejection; see the [`grpc` module docs](crate::grpc) for the mapping
    /// and its reasons.
    pub fn grpc_code(&self) -> GrpcCode {
        match self.kind() {
            RejectionKind::BadKey => GrpcCode::InvalidArgument,
            RejectionKind::BodyUnreadable => GrpcCode::Cancelled,
            RejectionKind::Contended => GrpcCode::Aborted,
            RejectionKind::Unavailable => GrpcCode::Unavailable,
            RejectionKind::Misconfigured => GrpcCode::Internal,
            RejectionKind::Mismatch => GrpcCode::FailedPrecondition,
            RejectionKind::BodyTooLarge => GrpcCode::ResourceExhausted,
            RejectionKind::CompletedNotStored => GrpcCode::AlreadyExists,
            RejectionKind::LockLost => GrpcCode::Unavailable,
            RejectionKind::OutcomeUnknown => GrpcCode::Unknown,
        }
    }

    /// The trailers-only gRPC answer: HTTP `200`, `content-type: application/grpc` (the
    /// gRPC-Web type for a gRPC-Web call), `grpc-status` ([`grpc_code`](Self::grpc_code)),
    /// `grpc-message` ([`detail`](Self::detail), percent-encoded), no body; for `ABORTED` and
    /// `UNAVAILABLE` also `retry-after` (whole seconds, rounded up) and
    /// `grpc-retry-pushback-ms` (the same delay in milliseconds, rounded up, at least 1).
    ///
    /// ```
    /// use tower_redlock::rejection::{Rejection, RejectionResponse};
    ///
    /// // A responder that answers every client, HTTP ones included, with gRPC statuses.
    /// let grpc_only = |r: &Rejection| -> RejectionResponse { r.to_grpc_status() };
    /// # fn is_responder(_: &impl tower_redlock::rejection::Responder) {}
    /// # is_responder(&grpc_only);
    /// ```
    pub fn to_grpc_status(&self) -> RejectionResponse {
        let code = self.grpc_code();
        let res = RejectionResponse::new(200, self.wire().content_type(), Bytes::new())
            .with_header("grpc-status", code.value().to_string())
            .with_header("grpc-message", percent_encode(&self.detail()));
        match (self.retry_after_secs(), self.retry_after_ms()) {
            (Some(secs), Some(ms)) => res
                .with_retry_after(secs)
                .with_header("grpc-retry-pushback-ms", ms.to_string()),
            _ => res,
        }
    }
}

/// A responder that answers gRPC calls ([`Rejection::is_grpc`]) with their gRPC status
/// ([`Rejection::to_grpc_status`]) and every other request with `R`. The default responder
/// is `GrpcOr(ProblemJson)`; set `GrpcOr(your_responder)` to replace the HTTP answers only.
///
/// ```
/// # fn main() -> Result<(), tower_redlock::Error> {
/// use tower_redlock::grpc::GrpcOr;
/// use tower_redlock::key::IdempotencyKey;
/// use tower_redlock::policy::LockPolicy;
/// use tower_redlock::rejection::Rejection;
/// use tower_redlock::Redlock;
///
/// let policy = LockPolicy::builder(Redlock::in_memory(), IdempotencyKey::required())
///     .responder(GrpcOr(|r: &Rejection| r.to_problem_json().with_header("x-lock", "busy")))
///     .build()?;
/// # let _ = policy;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct GrpcOr<R>(pub R);

impl<R: Responder> Responder for GrpcOr<R> {
    fn respond(&self, rejection: &Rejection) -> RejectionResponse {
        if rejection.is_grpc() {
            rejection.to_grpc_status()
        } else {
            self.0.respond(rejection)
        }
    }
}

/// What a replay policy's store decision sees of a response: its status and body length. A gRPC
/// response (HTTP `200`, a gRPC `content-type`) is judged by its gRPC status. A trailers-only one
/// is judged by [`GrpcCode::http_equivalent`] of its `grpc-status` header. The codes that invite a
/// retry ([`GrpcCode::invites_retry`]) are judged as `503` instead, so that the default policy does
/// not store them. (A stored `UNAVAILABLE` would answer every retry with it.) An unknown code is
/// judged as `500`. One whose status is still to come in the trailers is judged as a `200` whose
/// length is unknown. So it is sent as it is and its key marked completed (trailers are never
/// stored).
pub(crate) fn replay_view(
    status: u16,
    content_type: Option<&[u8]>,
    grpc_status: Option<&[u8]>,
    body_len: Option<u64>,
) -> (u16, Option<u64>) {
    if status != 200 || !content_type.is_some_and(is_grpc) {
        return (status, body_len);
    }
    let Some(value) = grpc_status else {
        return (200, None);
    };
    let judged = match GrpcCode::parse(value) {
        Some(code) if code.invites_retry() => 503,
        Some(code) => code.http_equivalent(),
        None => 500,
    };
    (judged, body_len)
}

#[cfg(test)]
mod tests;
