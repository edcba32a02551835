//! <!-- The crate's page: the README (with the features the quick starts need), then a map of
//! the API. Built with every feature, as docs.rs does, it also carries the guides. -->
#![cfg_attr(all(feature = "axum", feature = "actix"), doc = include_str!("../README.md"))]
#![cfg_attr(
    not(all(feature = "axum", feature = "actix")),
    doc = "Redlock distributed locks over N independent Redis voters, and tower/axum/actix-web \
           middleware that puts them in front of handlers. (Build the docs with \
           `--all-features`, as docs.rs does, for the README's quick starts and the guides.)"
)]
//!
//! ## The API, in one map
//!
//! | you want | start at |
//! | --- | --- |
//! | a lock from code | [`Redlock`] ([`Redlock::lock`], [`Redlock::critical_section`]), [`Lease`], [`Error`] |
//! | work that runs once | [`Redlock::lock_unless_completed`], [`LockOrRecord`], [`Lease::complete`] |
//! | the middleware | [`policy::LockPolicy`], [`key`] (what a request locks), [`replay`], [`rejection`], [`grpc`] |
//! | voters | [`node`]: [`node::RedisNode`] (masters, Sentinel groups, Clusters), [`node::MemoryNode`], your own [`node::Node`] |
//! | fencing where the data lives | [`Lease::fencing_token`], [`fenced`] |
//! | operating the locks | [`operate`] |
//! | the guides | `guide` (built with every feature, as on docs.rs): locks, middleware, replay, gRPC, voters, safety, fencing, operate, observability |

#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms)]
// Every fallible public function says how it fails, and one that can panic says when.
#![warn(clippy::missing_errors_doc, clippy::missing_panics_doc)]

#[cfg(feature = "actix")]
#[cfg_attr(docsrs, doc(cfg(feature = "actix")))]
pub mod actix;
#[cfg(feature = "conformance")]
#[cfg_attr(docsrs, doc(cfg(feature = "conformance")))]
pub mod conformance;
pub mod durable;
mod error;
pub mod fenced;
pub mod grpc;
#[cfg(all(feature = "axum", feature = "actix", feature = "metrics"))]
#[cfg_attr(
    docsrs,
    doc(cfg(all(feature = "axum", feature = "actix", feature = "metrics")))
)]
pub mod guide;
pub mod key;
mod lock;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
#[cfg(any(feature = "tower", feature = "actix"))]
mod middleware;
// Without the feature: the same module, private, its recording functions empty.
#[cfg(not(feature = "metrics"))]
mod metrics;
pub mod node;
pub mod operate;
pub mod policy;
pub mod rejection;
pub mod replay;
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod tower;

#[cfg(feature = "actix")]
#[cfg_attr(docsrs, doc(cfg(feature = "actix")))]
pub use crate::actix::middleware::RedlockMiddleware;
pub use crate::error::{Error, ErrorKind, NodeError, Result, Vote, VoteKind};
pub use crate::lock::{
    CriticalSection, Lease, LeaseHandle, LockOrRecord, NodeStatus, Redlock, RedlockBuilder, Retry,
};
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub use crate::tower::layer::RedlockLayer;

#[cfg(test)]
mod assertions {
    fn send_sync<T: Send + Sync>() {}

    #[test]
    fn public_types_are_send_and_sync() {
        send_sync::<crate::Redlock>();
        send_sync::<crate::Lease>();
        send_sync::<crate::LeaseHandle>();
        send_sync::<crate::Error>();
        send_sync::<crate::node::RedisNode>();
        send_sync::<crate::node::MemoryNode>();
    }
}
