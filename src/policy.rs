//! What the middleware does: which key, how long, what to do on contention, on an
//! unreachable quorum, and when to release. Shared by the tower and actix-web glue.

pub use crate::http::lost::{LockLostError, LostLease, LostRule, OnLost, LOCK_LOST_HEADER};
pub use crate::http::policy::{
    LockPolicy, LockPolicyBuilder, OnContention, OnUnavailable, ReleaseOn, Unlocked,
};
