//! The test kit of `tower-redlock` (a workspace member, never published): real
//! `redis-server` masters on free loopback ports, a throwaway PostgreSQL server
//! ([`PostgresServer`], for the fenced-store tests), polling helpers, the fault proxy
//! ([`proxy`]), the TLS fixtures ([`tls_file`]), the HTTP helpers ([`http`], [`apps`]) and the
//! multi-process mutual-exclusion checker ([`checker`], and the `soak` binary for long runs).
//!
//! Every test starts its own masters (never a fixed port), so tests run in parallel. A
//! server is killed by its own child pid when it is dropped, also when a test panics.
//!
//! The integration tests of the root crate use it as `use tower_redlock_testkit as support;`.

pub mod apps;
pub mod checker;
pub mod cluster;
pub mod http;
pub mod nodes;
pub mod proxy;
pub mod pubsub;
pub mod sentinel;
pub mod warnings;

mod launch;
mod masters;
mod postgres;
mod serve;
mod server;
mod skew;
mod wait;

use std::path::{Path, PathBuf};

pub use launch::redis_server_version;
pub use masters::{silent_majority_bound, Masters, NODE_TIMEOUT};
pub use postgres::PostgresServer;
pub use serve::HttpApp;
pub use server::RedisServer;
pub use wait::{eventually, warm_up};

/// Whether `s` looks like a lock token: 32 lowercase hex digits.
pub fn is_token(s: &str) -> bool {
    s.len() == 32
        && s.bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
}

/// A TLS fixture in `testkit/tls`, by file name: `ca.pem` (the test CA), `server.pem` and
/// `server-key.pem` (the masters' certificate, issued to `127.0.0.1` by that CA).
pub fn tls_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tls").join(name)
}
