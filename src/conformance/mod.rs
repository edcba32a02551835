//! The conformance kit (feature `conformance`): the checks every [`Node`] must pass, for the author
//! of a custom node to run against theirs. They are the same checks the built-in voters pass (a
//! `MemoryNode`, a `RedisNode` over a master, a Sentinel group and a Cluster, in
//! `tests/voters/conformance`).
//!
//! A check talks to the node through the [`Node`] trait only, and reads what the store holds
//! around it through a [`Peek`] the author writes (the raw value stored at a key: a `GET`, a
//! `SELECT`). [`check`] runs every check that applies to the node's
//! [`capabilities`](Node::capabilities) — locks always; completion records and the "if free"
//! completion when it declares records; fencing counters when it declares fencing — each on
//! a fresh node, and panics with the check's name at the first that fails. [`check_one`] runs
//! one check by its name (a test per check: [`names`] lists them). The kit needs no
//! `redis-server` of its own; a check may take a few seconds (it waits for keys to expire).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use tower_redlock::conformance::{self, Peek, PeekFuture};
//! use tower_redlock::node::MemoryNode;
//!
//! /// How the kit reads a `MemoryNode`'s store (a node of your own reads its own).
//! struct Store(MemoryNode);
//!
//! impl Peek for Store {
//!     fn peek<'a>(&'a self, key: &'a str) -> PeekFuture<'a> {
//!         Box::pin(async move { self.0.get(key) })
//!     }
//! }
//!
//! let report = conformance::check(|| async {
//!     let node = MemoryNode::new();
//!     (node.clone(), Store(node))
//! })
//! .await;
//! assert!(report.passed().contains(&"fencing_extend_raises_the_counter"));
//! assert!(report.skipped().is_empty());
//! # }
//! ```
//!
//! **Built-in only.** Some promises need control of a server that a kit cannot have:
//!
//! - a restarted or failed-over master abstaining until its tenure is old enough (delayed-restart
//!   protection);
//! - a master that may evict refusing to vote;
//! - a Sentinel group's majority;
//! - a Cluster slot that moves;
//! - the wake-up's subscriptions surviving reconnections;
//! - the quorum's answers under partitions, skewed clocks and paused processes.
//!
//! The built-in voters are tested for those with real `redis-server` processes (`tests/voters`, the
//! checker in `tests/checker.rs`). A custom node that wants them is responsible for its own.
//!
//! **Self-test.** Nodes that get a promise wrong fail the kit (`tests/voters/conformance`):
//! one that declares fencing but answers a fenced acquire as a plain one, one that extends
//! without raising the counter, and two that misread the "if free" completion.

use std::fmt::Display;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::time::{Duration, Instant};

use futures_util::FutureExt;

use crate::node::{Capabilities, Node};

mod fencing;
mod free;
mod locks;

/// Every check, one function each (run by [`check`] and [`check_one`]). Each expects a node
/// whose store holds none of its keys (a fresh one, or one emptied).
mod checks {
    pub use super::fencing::{
        fencing_counters_expire_and_restart_from_the_clock,
        fencing_counts_up_from_a_raised_counter, fencing_extend_raises_the_counter,
        fencing_never_overwrites_a_lock_named_like_the_counter,
        fencing_raise_of_an_absent_counter_starts_from_the_clock, fencing_release_is_owner_only,
        fencing_starts_from_the_clock_and_grows, fencing_with_records,
    };
    pub use super::free::{
        completion_if_free_ends_our_lock, completion_if_free_fenced_raises_the_counter,
        completion_if_free_is_told_apart_from_a_valid_one,
        completion_if_free_never_takes_a_lock_for_a_record,
        completion_if_free_never_takes_another_holders_lock,
        completion_if_free_stores_where_the_key_expired,
    };
    pub use super::locks::{
        a_first_record_is_never_overwritten, acquire_free_key, acquire_held_key, expiry,
        extend_absent_key, extend_expired_key, extend_right_token_lengthens,
        extend_right_token_shortens, extend_wrong_token, names_itself,
        records_are_fenced_by_the_token, records_expire, records_never_take_a_lock_for_one,
        records_replay_instead_of_locking, release_right_token, release_wrong_token,
    };
}

/// The future a [`Peek`] returns.
pub type PeekFuture<'a> = Pin<Box<dyn Future<Output = Option<String>> + Send + 'a>>;

/// How a check reads the node's store around the node: the value stored at a key.
pub trait Peek: Send + Sync {
    /// The value stored at `key` (a lock's token, a counter's raw value), `None` when the key
    /// is absent or expired — read from the store itself, not through the [`Node`].
    fn peek<'a>(&'a self, key: &'a str) -> PeekFuture<'a>;

    /// Whether the node's acquire answers [`Acquire::Acquired`](crate::node::Acquire::Acquired)
    /// for the holder's own token, as a node that retries a request internally must (see
    /// [`Acquire::Held`](crate::node::Acquire::Held)); `false`: it answers `Held`, which the
    /// client also accepts. The built-in Redis voters answer `Acquired`.
    fn own_token_acquired(&self) -> bool {
        false
    }
}

/// What [`check`] ran: the checks passed, and those skipped (the node does not declare what
/// they need).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    passed: Vec<&'static str>,
    skipped: Vec<&'static str>,
}

impl Report {
    /// The checks the node passed, in the order they ran.
    pub fn passed(&self) -> &[&'static str] {
        &self.passed
    }

    /// The checks not run: the node does not declare records or fencing.
    pub fn skipped(&self) -> &[&'static str] {
        &self.skipped
    }
}

type CheckFuture<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// One check: its name, what it needs, and how to run it.
struct Check {
    name: &'static str,
    records: bool,
    fencing: bool,
    run: for<'a> fn(&'a dyn Node, &'a dyn Peek) -> CheckFuture<'a>,
}

/// The table of checks: `name: needs`, needs one of `locks`, `records`, `fencing`, `both`.
macro_rules! table {
    ($($name:ident: $needs:ident),* $(,)?) => {
        const ALL: &[Check] = &[$(
            Check {
                name: stringify!($name),
                records: table!(@records $needs),
                fencing: table!(@fencing $needs),
                run: {
                    fn run<'a>(node: &'a dyn Node, peek: &'a dyn Peek) -> CheckFuture<'a> {
                        Box::pin(checks::$name(node, peek))
                    }
                    run
                },
            },
        )*];
    };
    (@records locks) => { false };
    (@records records) => { true };
    (@records fencing) => { false };
    (@records both) => { true };
    (@fencing locks) => { false };
    (@fencing records) => { false };
    (@fencing fencing) => { true };
    (@fencing both) => { true };
}

table! {
    names_itself: locks,
    acquire_free_key: locks,
    acquire_held_key: locks,
    release_wrong_token: locks,
    release_right_token: locks,
    extend_right_token_shortens: locks,
    extend_right_token_lengthens: locks,
    extend_wrong_token: locks,
    extend_absent_key: locks,
    extend_expired_key: locks,
    expiry: locks,
    records_replay_instead_of_locking: records,
    records_are_fenced_by_the_token: records,
    records_expire: records,
    records_never_take_a_lock_for_one: records,
    a_first_record_is_never_overwritten: records,
    completion_if_free_stores_where_the_key_expired: records,
    completion_if_free_ends_our_lock: records,
    completion_if_free_never_takes_another_holders_lock: records,
    completion_if_free_never_takes_a_lock_for_a_record: records,
    completion_if_free_is_told_apart_from_a_valid_one: records,
    fencing_starts_from_the_clock_and_grows: fencing,
    fencing_counts_up_from_a_raised_counter: fencing,
    fencing_release_is_owner_only: fencing,
    fencing_raise_of_an_absent_counter_starts_from_the_clock: fencing,
    fencing_counters_expire_and_restart_from_the_clock: fencing,
    fencing_never_overwrites_a_lock_named_like_the_counter: fencing,
    fencing_extend_raises_the_counter: fencing,
    fencing_with_records: both,
    completion_if_free_fenced_raises_the_counter: both,
}

/// The names of every check, in the order [`check`] runs them.
pub fn names() -> impl Iterator<Item = &'static str> {
    ALL.iter().map(|c| c.name)
}

/// Runs the check named `name` (one of [`names`]) on `node`, whose store holds none of the
/// check's keys — whatever the node declares (a check of records on a node without them
/// fails).
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use tower_redlock::conformance::{self, Peek, PeekFuture};
/// use tower_redlock::node::MemoryNode;
///
/// struct Store(MemoryNode);
/// impl Peek for Store {
///     fn peek<'a>(&'a self, key: &'a str) -> PeekFuture<'a> {
///         Box::pin(async move { self.0.get(key) })
///     }
/// }
///
/// let node = MemoryNode::new();
/// conformance::check_one("extend_absent_key", &node, &Store(node.clone())).await;
/// # }
/// ```
///
/// # Panics
///
/// When the node fails the check (or it takes over a minute: a call that never answers),
/// or no check has that name.
pub async fn check_one(name: &str, node: &dyn Node, peek: &dyn Peek) {
    let Some(c) = ALL.iter().find(|c| c.name == name) else {
        panic!("no conformance check is named {name:?} (see conformance::names)");
    };
    bounded(c, node, peek).await;
}

/// The longest a check may take: a node that never answers fails it instead of hanging the
/// kit (the slowest check waits some 3 s for keys to expire).
const CHECK_TIME: Duration = Duration::from_secs(60);

/// Runs `c`, failing it when it takes longer than [`CHECK_TIME`].
async fn bounded(c: &Check, node: &dyn Node, peek: &dyn Peek) {
    if tokio::time::timeout(CHECK_TIME, (c.run)(node, peek))
        .await
        .is_err()
    {
        panic!("no end within {CHECK_TIME:?}: a call to the node (or the Peek) never answered");
    }
}

/// Runs every check that applies to the node's [`capabilities`](Node::capabilities), each on
/// a node and [`Peek`] `fresh` makes (its store holding none of the checks' keys), and
/// reports what ran.
///
/// # Panics
///
/// At the first check the node fails: `conformance check <name> failed: <why>` (a check
/// that takes over a minute — a call that never answers — fails).
pub async fn check<F, Fut, N, P>(mut fresh: F) -> Report
where
    F: FnMut() -> Fut,
    Fut: Future<Output = (N, P)>,
    N: Node,
    P: Peek,
{
    let mut report = Report::default();
    for c in ALL {
        let (node, peek) = fresh().await;
        let Capabilities {
            records, fencing, ..
        } = node.capabilities();
        if (c.records && !records) || (c.fencing && !fencing) {
            report.skipped.push(c.name);
            continue;
        }
        let ran = AssertUnwindSafe(bounded(c, &node, &peek))
            .catch_unwind()
            .await;
        if let Err(panic) = ran {
            let why = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("(a panic without a message)");
            panic!("conformance check {} failed: {why}", c.name);
        }
        report.passed.push(c.name);
    }
    report
}

/// The lock ttl of the checks that do not wait for it to run out.
const LONG: Duration = Duration::from_secs(10);
/// Two tokens (32 hex digits, as the client's).
const T1: &str = "00000000000000000000000000000001";
const T2: &str = "00000000000000000000000000000002";

/// Polls `check` every 10 ms until it holds; panics with `what` after `within`. Returns how
/// long it took. The kit's checks wait with it (for a key to expire); for checks of your own.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::time::Duration;
/// use tower_redlock::conformance::eventually;
///
/// let start = std::time::Instant::now();
/// let took = eventually("50 ms have passed", Duration::from_secs(5), || async {
///     start.elapsed() >= Duration::from_millis(50)
/// })
/// .await;
/// assert!(took >= Duration::from_millis(40));
/// # }
/// ```
///
/// # Panics
///
/// When `check` is still false after `within`: the message names `what`.
pub async fn eventually<F, Fut>(what: impl Display, within: Duration, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return start.elapsed();
        }
        if start.elapsed() > within {
            panic!("timed out after {within:?} waiting until {what}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
