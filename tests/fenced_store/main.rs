//! Fencing where the data lives: the lease's fencing token checked by the storage, against
//! real servers. Every test name contains `fenced_store`.
//!
//! - [`postgres`]: a row guarded by a `fence` column in a real PostgreSQL (a throwaway
//!   cluster the test kit starts);
//! - [`redis`]: the crate's fenced writes to data kept in Redis
//!   ([`tower_redlock::fenced`]).

mod postgres;
mod redis;
