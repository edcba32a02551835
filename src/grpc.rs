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
//! | rejection ([`RejectionKind`](crate::rejection::RejectionKind)) | HTTP | gRPC | why |
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
//! The retry hint of `ABORTED` and `UNAVAILABLE` is sent twice: `retry-after` (whole
//! seconds rounded up, as over HTTP) and `grpc-retry-pushback-ms` (the delay in
//! milliseconds, rounded up). Pushback is a hint for clients with a retry policy (gRFC A6),
//! and they honour it only when the code is in the policy's `retryableStatusCodes` —
//! `UNAVAILABLE` often is, `ABORTED` rarely. tonic has no retry policy: a tonic client sees
//! both values in `Status::metadata()` and decides itself. `grpc-message` is
//! [`Rejection::detail`](crate::rejection::Rejection::detail), which never contains the raw key.
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
//! A custom [`Responder`](crate::rejection::Responder) set with
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

pub use crate::http::grpc::{is_grpc, GrpcCode, GrpcOr};
