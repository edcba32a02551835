//! Fencing where the data lives: the lease's fencing token checked by the storage, against
//! real servers. Every test name contains `fenced_store`, or `fenced_claim` for a
//! read-modify-write fenced from its read.
//!
//! - [`postgres`]: a row guarded by a `fence` column in a real PostgreSQL (a throwaway
//!   cluster the test kit starts), written after the library's claim;
//! - [`claim_postgres`]: a read-modify-write of such a row, read from its claim
//!   (`FencedTable::claim`), under each isolation level, and the claim's timeouts;
//! - [`redis`]: the crate's fenced writes to data kept in Redis
//!   ([`tower_redlock::fenced`]);
//! - [`claim_redis`]: a read-modify-write of data kept in Redis, its read raising the token
//!   first (`FencedRedis::read_for_write`).

mod claim_postgres;
mod claim_redis;
mod postgres;
mod redis;
