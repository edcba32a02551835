//! The answers the middleware gives for itself: `400`, `409`, `413`, `422`, `503`, as
//! `application/problem+json` (RFC 9457) bodies that the user can replace — or, to a gRPC
//! call, as gRPC statuses (see [`grpc`](crate::grpc)).

pub use crate::http::rejection::{
    MissingLease, ProblemJson, Rejection, RejectionKind, RejectionResponse, Responder,
};
