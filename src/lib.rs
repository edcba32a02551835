//! # tower-redlock
//!
//! A distributed lock that actually holds: the [Redlock] algorithm over N independent
//! Redis voters (masters, Sentinel groups, Clusters), as a framework-free client ([`Redlock`]), and as middleware that puts the
//! lock in front of your handlers — [`RedlockLayer`] for tower/axum, [`RedlockMiddleware`]
//! for actix-web — so that two replicas never run the same request at the same time.
//!
//! ## The middleware, in a few lines
//!
//! ```
//! # #[cfg(feature = "axum")]
//! # async fn demo() -> Result<(), tower_redlock::Error> {
//! use axum::{routing::post, Router};
//! use tower_redlock::key::IdempotencyKey;
//! use tower_redlock::{Redlock, RedlockLayer};
//!
//! let redlock = Redlock::new(["redis://10.0.0.1", "redis://10.0.0.2", "redis://10.0.0.3"])?;
//! let app: Router = Router::new()
//!     .route("/payments", post(|| async { "charged once" }))
//!     // A duplicate Idempotency-Key in flight: 409 + Retry-After. Quorum down: 503.
//!     // A bad key: 400. Only POST/PUT/PATCH/DELETE are locked.
//!     .route_layer(RedlockLayer::new(redlock, IdempotencyKey::required())?);
//! # let _ = app; Ok(()) }
//! ```
//!
//! [`LockPolicy`](crate::policy::LockPolicy) configures the rest: ttl and keep-alive, waiting instead
//! of `409`, fail-open, release at body end, key scopes (route, tenant header, the
//! authenticated principal), the rejection bodies.
//!
//! ## Idempotent endpoints: the handler runs once per key
//!
//! A lock stops two requests with one key from running *at the same time*; replay stops the
//! second from running *at all*. The first request's response is stored on the quorum, and a
//! retry with the key — the client timed out, the server finished — gets it back, with
//! `Idempotency-Replayed: true`, without running the handler. A reused key with another
//! request is `422`. See [`replay`].
//!
//! ```
//! # #[cfg(feature = "axum")]
//! # async fn demo() -> Result<(), tower_redlock::Error> {
//! use axum::{routing::post, Router};
//! use tower_redlock::{Redlock, RedlockLayer};
//!
//! let redlock = Redlock::new(["redis://10.0.0.1", "redis://10.0.0.2", "redis://10.0.0.3"])?;
//! let app: Router = Router::new()
//!     .route("/payments", post(|| async { "charged once, replayed after" }))
//!     // Idempotency-Key required, scoped by route; responses replayed for 24 h.
//!     .route_layer(RedlockLayer::idempotent(redlock)?);
//! # let _ = app; Ok(()) }
//! ```
//!
//! ## The client
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
//! Work that must run **once**, not only one at a time: [`Redlock::lock_unless_completed`]
//! answers with the resource's completion record when the work is done
//! ([`Claim::Completed`]), or with a lease to do it, which [`Lease::complete`] ends by
//! storing the record where the lock still holds.
//!
//! ## How a lock is taken
//!
//! 1. A fresh token (128 random bits) is sent to **all** nodes **in parallel** as
//!    `SET key token NX PX ttl`, each request bounded by the per-node timeout.
//! 2. Votes are counted as they arrive; the outcome is decided as soon as it is certain
//!    (a quorum of `N/2 + 1` said yes, or too few nodes are left to reach it).
//! 3. The validity is `ttl − elapsed − drift`, with `drift = ttl · 0.01 + 2 ms` and the
//!    elapsed time on the monotonic clock. The lock counts only with a quorum **and** a
//!    validity above zero.
//! 4. Otherwise whatever was taken is released on every node that may hold it, and — for
//!    [`Redlock::lock`] — the client waits a random delay and tries again, a bounded number
//!    of times.
//!
//! Release and extension are compare-and-delete and compare-and-`PEXPIRE` scripts: only the
//! token's owner can release or extend, and an expired lock is never re-created. A voter is
//! a [`node::Node`]: a Redis master, a Sentinel-managed group or a Redis Cluster
//! ([`node::RedisNode`]; each one independent failure domain, with failover protection for
//! groups), the in-process [`node::MemoryNode`], or your own.
//!
//! ## Features
//!
//! None is on by default: the lock client alone needs none, and each framework user turns
//! on theirs.
//!
//! | feature | what it adds |
//! | --- | --- |
//! | `tower` | [`RedlockLayer`] for any service on `http` 1.x (hyper, tonic) |
//! | `axum` | `tower`, plus axum's matched route, path parameters and peer address as key material, and the lease as an axum extractor |
//! | `actix` | [`RedlockMiddleware`] for actix-web 4, and the lease as an actix extractor |
//! | `cluster` | Redis Cluster voters ([`node::RedisNode::cluster`], `redis+cluster://` URLs) |
//! | `tls` | `rediss://` masters (and `rediss+sentinel://`, `rediss+cluster://`), via rustls |
//! | `metrics` | counters, histograms and gauges (`redlock_*`) on the `metrics` facade: see [`metrics`] |
//!
//! ## Observability
//!
//! [`tracing`](https://docs.rs/tracing) spans, target `tower_redlock`, each with its
//! outcome, votes, elapsed time and validity recorded as fields once known:
//!
//! | span (level) | one per | fields |
//! | --- | --- | --- |
//! | `redlock.acquire` (info) | lock call: [`Redlock::lock`] and its variants, [`Redlock::lock_unless_completed`], the middleware's | `key`, `ttl`, `replay`, `outcome` (`acquired`, `contended`, `unavailable`, `completed`, `invalid`, `cancelled`: the caller dropped the call first), `attempts`, `votes_for`, `votes_held`, `votes_failed` (of the last try), `elapsed`, `validity` |
//! | `redlock.lease` (info) | lease, while it is held (a child of the caller's span; follows from its acquire) | `key`, `lost_after` (when lost: how long after its lock request) |
//! | `redlock.extend` (info) | extension, manual or keep-alive | `key`, `ttl`, `outcome` (`extended`, `lost`, `unavailable`, `limit`, `invalid`), votes, `elapsed`, `validity` |
//! | `redlock.release` (info) | release: explicit, scoped or on drop | `key`, `outcome` (`released`, `failed`), `votes_for` (nodes released), `votes_failed`, `elapsed`, `validity` (left) |
//! | `redlock.complete` (info) | [`Lease::complete`] | `key`, `outcome` (`completed`, `lost`, `unavailable`, `invalid`), votes, `elapsed`, `validity` (left) |
//! | `redlock.keep_alive` (info) | [`Lease::keep_alive`] task | `key` |
//! | `redlock.stragglers`, `redlock.settle`, `redlock.release_rest`, `redlock.cancelled`, `redlock.completing`, `redlock.owed` (debug) | background work: requests still in flight at a decision, a replay try's settling, a release's retries, a cancelled try's release, a completion that lacks its quorum, what a master is owed | |
//!
//! Extensions, releases, completions and background work *follow from* the lease's span, so
//! a release spawned by a dropped lease is still linked to the request that took it. `key`
//! is never the key: it is the first 8 bytes, in hex, of the SHA-256 of the Redis key
//! (`printf %s "$KEY" | sha256sum | cut -c1-16` finds it). Events: a lost lease and a
//! failed release at **warn**, a suspended node at warn and its return at **info**, an
//! unreachable quorum at info; each try's votes, each node's answer and each failed node
//! request at **debug**. An outcome is a field, not a line of its own: to see one line per
//! lock call, print the spans as they close (`tracing_subscriber::fmt().with_span_events(FmtSpan::CLOSE)`,
//! as the axum example does). A disabled span costs no allocation and hashes nothing.
//!
//! Read the crate README's *Safety* section before relying on Redlock for correctness.
//!
//! [Redlock]: https://redis.io/docs/latest/develop/use/patterns/distributed-locks/

#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations, rust_2018_idioms)]

#[cfg(feature = "actix")]
#[cfg_attr(docsrs, doc(cfg(feature = "actix")))]
pub mod actix;
mod error;
pub mod fenced;
pub mod grpc;
mod http;
pub mod key;
mod lock;
#[cfg(feature = "metrics")]
#[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
pub mod metrics;
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
    Claim, CriticalSection, Lease, LeaseHandle, NodeStatus, Redlock, RedlockBuilder, Retry,
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

/// The README's code blocks, compiled as doc tests (they use every framework).
#[cfg(all(doctest, feature = "axum", feature = "actix"))]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
