//! Operating the locks: see who holds a key on which voter, read why a lock was refused,
//! clear a stuck key on purpose, and find the Redis key a request locks.
//!
//! | question | from code | from the command line (`cli/`, binary `redlock`) |
//! | --- | --- | --- |
//! | who holds it, where, for how long | [`Redlock::inspect`], [`LockPolicy::inspect`] | `redlock inspect <resource>` |
//! | why was it refused | [`Error::votes`] (and its `Display`), the problem body's `votes` ([`LockPolicyBuilder::explain_votes`]) | — |
//! | clear it | [`Redlock::force_release`] | `redlock unlock --force <resource> --holder <prefix>` |
//! | which Redis key does this request lock | [`LockPolicy::redis_key`] | `redlock key …` |
//! | what is held under a prefix | [`Redlock::scan`] | `redlock watch --prefix <p>` |
//!
//! An inspection writes nothing and takes no lock. A forced release is an operator's act,
//! logged at warn with the key's hash and who asked; the crate never does it on its own, and
//! it breaks mutual exclusion when the holder is still alive (see
//! [`Redlock::force_release`]).
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")] async fn main() {
//! use std::time::Duration;
//! use tower_redlock::operate::{ForceRelease, Summary};
//! use tower_redlock::Redlock;
//!
//! let redlock = Redlock::in_memory();
//! // A holder that crashed: its lease was never released.
//! std::mem::forget(redlock.try_lock("report:daily", Duration::from_secs(600)).await.unwrap());
//!
//! let seen = redlock.inspect("report:daily").await.unwrap();
//! assert_eq!(seen.summary(), Summary::Held);
//! let err = redlock.try_lock("report:daily", Duration::from_secs(5)).await.unwrap_err();
//! assert!(err.to_string().contains("held")); // each voter's answer, in one line
//!
//! // Name the holder by the token prefix `inspect` shows: a re-run spares a new holder.
//! let prefix = seen.holder().unwrap().token_prefix;
//! let how = ForceRelease::by("oncall").holder(prefix);
//! redlock.force_release("report:daily", how).await.unwrap();
//! assert_eq!(redlock.inspect("report:daily").await.unwrap().summary(), Summary::Free);
//! # }
//! ```
//!
//! [`Redlock::inspect`]: crate::Redlock::inspect
//! [`Redlock::force_release`]: crate::Redlock::force_release
//! [`Redlock::scan`]: crate::Redlock::scan
//! [`Error::votes`]: crate::Error::votes
//! [`LockPolicy::inspect`]: crate::policy::LockPolicy::inspect
//! [`LockPolicy::redis_key`]: crate::policy::LockPolicy::redis_key
//! [`LockPolicyBuilder::explain_votes`]: crate::policy::LockPolicyBuilder::explain_votes

mod force;
mod inspect;

pub use self::force::{ForceRelease, ForceReleased, MIN_HOLDER_PREFIX};
pub use self::inspect::{
    Holder, Holding, Inspection, Summary, VoterInspection, VoterKey, VoterScan,
};
