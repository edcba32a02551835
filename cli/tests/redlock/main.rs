//! The `redlock` binary against real redis-server masters and real apps: one test binary,
//! one module per command. Every test starts its own masters.

mod common;
mod force;
mod inspect;
mod key;
mod middleware;
mod watch;
