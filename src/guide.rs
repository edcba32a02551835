//! The guides: each a page of `docs/`, with its code compiled as doc tests. Built with every
//! feature (as docs.rs does): their examples use axum, actix-web and the metrics.
//!
//! | guide | what it covers |
//! | --- | --- |
//! | [`locks`] | the client (the Ruby gem's API, mapped), work that must run once, errors and each voter's answer, configuration, how a lock is taken |
//! | [`middleware`] | `RedlockLayer` and `RedlockMiddleware`, policies, the answers, waiting, a lease lost mid-request |
//! | [`replay`] | idempotent endpoints: stored responses, reused keys, what is fingerprinted and stored |
//! | [`grpc`] | tonic behind the layer |
//! | [`voters`] | masters, Sentinel groups, Clusters, TLS, tenure protection, eviction |
//! | [`safety`] | what holds and under which exact assumptions; the faults the tests inject |
//! | [`fencing`] | fencing tokens, and the stores that check them |
//! | [`operate`] | inspect, explain, force-release, find the key; the `redlock` command line |
//! | [`observability`] | spans, metrics, readiness |

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
