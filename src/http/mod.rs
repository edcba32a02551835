//! Framework-neutral HTTP pieces shared by the tower/axum and actix-web glue (private: the
//! public faces are [`crate::key`], [`crate::policy`], [`crate::replay`],
//! [`crate::rejection`] and [`crate::grpc`]).
//!
//! Nothing in this module depends on an HTTP framework or on either major version of the
//! `http` crate: axum 0.8 speaks `http` 1.x while actix-web 4 speaks `http` 0.2, so the glue
//! for each framework adapts its own request type to the small `RequestView` trait and
//! everything else is shared.

// The middleware plumbing is used only by the framework glue.
#![cfg_attr(
    not(any(feature = "tower", feature = "actix")),
    allow(dead_code, unused_imports)
)]

#[cfg(any(feature = "tower", feature = "actix"))]
pub(crate) mod flow;
pub(crate) mod grpc;
#[cfg(any(feature = "tower", feature = "actix"))]
mod keep_alive;
pub(crate) mod key;
pub(crate) mod lost;
pub(crate) mod policy;
pub(crate) mod rejection;
#[cfg(any(feature = "tower", feature = "actix"))]
mod release;
pub(crate) mod replay;
pub(crate) mod view;
#[cfg(any(feature = "tower", feature = "actix"))]
pub(crate) mod watch;
mod wire;

pub(crate) use grpc::is_grpc;
pub(crate) use grpc::Wire;
#[cfg(any(feature = "tower", feature = "actix"))]
pub(crate) use keep_alive::KeptAlive;
pub(crate) use policy::{Decision, LockPolicy, ReleaseOn, Unlocked};
pub(crate) use rejection::{RejectionKind, RejectionResponse};
#[cfg(any(feature = "tower", feature = "actix"))]
pub(crate) use release::{release, AfterResponse, BodyTail};

pub(crate) use key::LockKey;
pub(crate) use replay::REPLAYED_HEADER;
#[cfg(any(feature = "tower", feature = "actix"))]
pub(crate) use replay::{Collector, Plan, Running, StoredResponse};
pub(crate) use view::{ExtensionType, RequestView};
