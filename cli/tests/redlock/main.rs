//! The `redlock` binary against real redis-server masters and real apps: one test binary,
//! one module per command (`terminal`: `unlock` on a pseudo-terminal; `generated`: completions
//! and man pages). Every test starts its own masters.

mod common;
mod force;
mod generated;
mod inspect;
mod key;
mod middleware;
mod pty;
mod terminal;
mod watch;
