//! # tower-redlock
//!
//! A distributed lock that actually holds: the [Redlock] algorithm over N independent
//! Redis masters, as a framework-free client ([`Redlock`]).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_redlock::Error> {
//! use std::time::Duration;
//! use tower_redlock::Redlock;
//!
//! // Redlock::new(["redis://127.0.0.1:7777", "redis://127.0.0.1:7778", "redis://127.0.0.1:7779"])?
//! let redlock = Redlock::in_memory();
//!
//! let first = redlock.lock("resource_key", Duration::from_secs(2)).await?;
//! let second = redlock.try_lock("resource_key", Duration::from_secs(2)).await;
//! assert!(second.unwrap_err().is_contended());
//!
//! redlock.unlock(first).await?;
//! let again = redlock.lock("resource_key", Duration::from_secs(2)).await?;
//! println!("{again}"); // {resource: "resource_key", value: "…", validity: 1977 ms}
//! # Ok(()) }
//! ```
//!
//! | Ruby `redlock` gem | tower-redlock |
//! | --- | --- |
//! | `Redlock::Client.new(urls)` | [`Redlock::new(urls)`](Redlock::new), [`Redlock::builder`] |
//! | `lock(resource, ttl)` → info or `false` | [`Redlock::lock`] → [`Lease`] or [`Error`] |
//! | `unlock(info)` | [`Redlock::unlock`] / [`Lease::release`] (and on drop) |
//! | `lock(resource, ttl) { \|locked\| … }` | [`Redlock::with_lock`] |
//! | `lock!(resource, ttl) { … }` raising `LockError` | [`Redlock::with_lock`] + `?` |
//! | `extend: info` | [`Lease::extend`], [`Lease::keep_alive`] |
//!
//! Read the crate README's *Safety* section before relying on Redlock for correctness.
//!
//! [Redlock]: https://redis.io/docs/latest/develop/use/patterns/distributed-locks/

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms)]

#[cfg(feature = "actix")]
pub mod actix;
mod error;
pub mod http;
pub mod lock;
pub mod node;
#[cfg(feature = "tower")]
pub mod tower;

pub use crate::error::{Error, ErrorKind, NodeError, Result};
pub use crate::lock::{Lease, LeaseHandle, NodeStatus, Redlock, RedlockBuilder, Retry, Scope};
pub use crate::node::{MemoryNode, Node, RedisNode, RedisNodeOptions};

#[cfg(test)]
mod assertions {
    fn send_sync<T: Send + Sync>() {}

    #[test]
    fn public_types_are_send_and_sync() {
        send_sync::<crate::Redlock>();
        send_sync::<crate::Lease>();
        send_sync::<crate::LeaseHandle>();
        send_sync::<crate::Error>();
        send_sync::<crate::RedisNode>();
        send_sync::<crate::MemoryNode>();
    }
}

/// The README's code blocks, compiled as doc tests (they use every framework).
#[cfg(all(doctest, feature = "axum", feature = "actix"))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
