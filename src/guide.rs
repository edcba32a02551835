//! The guides: each a page of `docs/`, with its code compiled as doc tests. Built with every
//! feature (as docs.rs does): their examples use axum, actix-web and the metrics. The crate
//! page lists them with what each covers.

#[doc = include_str!("../docs/locks.md")]
pub mod locks {}

#[doc = include_str!("../docs/middleware.md")]
pub mod middleware {}

#[doc = include_str!("../docs/replay.md")]
pub mod replay {}

#[doc = include_str!("../docs/grpc.md")]
pub mod grpc {}

#[doc = include_str!("../docs/voters.md")]
pub mod voters {}

#[doc = include_str!("../docs/safety.md")]
pub mod safety {}

#[doc = include_str!("../docs/fencing.md")]
pub mod fencing {}

#[doc = include_str!("../docs/operate.md")]
pub mod operate {}

#[doc = include_str!("../docs/observability.md")]
pub mod observability {}
