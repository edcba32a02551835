//! The key extractors through the public API (`tower_redlock::key`): the hash
//! and `LockKey`, the built-in extractors and their rejections, the scoping and
//! prefix combinators, closures and trait objects, the request view, and
//! property tests. No Redis needed.
//!
//! Tests that pin the private domain tags (`TAG_*`) or read a crate-private
//! field stay as unit tests in `src/key/tests.rs`.

mod builtin;
mod hash;
mod helpers;
mod prop;
mod rejections;
mod scope;
