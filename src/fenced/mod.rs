//! Fenced writes: the storage half of [fencing tokens](crate::RedlockBuilder::fencing).
//!
//! A fencing token protects nothing until the storage compares it. The data keeps the largest token
//! that wrote it, and a write carrying a smaller one is refused. The refusal is atomic with the
//! write, so that a holder paused between a check and its write is still refused. A write with the
//! same token is the same holder writing again: accepted.
//!
//! A refused write is a [`StaleToken`]: a typed outcome the handler maps to an answer (with
//! the `axum` or `actix` feature it is one: `409` problem+json `/problems/fencing-token-stale`).
//!
//! For data kept in Redis: [`FencedRedis`], a value, a hash field or a stream entry written
//! only with a token at least the one stored beside it, one script per write.
//!
//! For rows in PostgreSQL (feature `postgres`): [`postgres::FencedTable`], a row *claimed*
//! with the token as the first statement of the transaction that reads and writes it.
//!
//! A write computed from a read (a balance, a stock count) needs the token checked at the read, not
//! only at the write. Take a holder that read before a newer holder and writes after it. It would
//! overwrite what the newer one computed from the same old value. A check at the write alone lets
//! it through while the newer one has not written yet. Both stores have a read that raises the
//! stored token first: [`FencedRedis::read_for_write`] and [`postgres::FencedTable::claim`].
//! `docs/fencing.md` says what each pattern guarantees.

use std::fmt;

use crate::rejection::RejectionResponse;

#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres;
mod redis;

pub use self::redis::FencedRedis;

/// A write refused because its fencing token is older than the one the data was last
/// written with: a newer holder of the lock has written since (the writer's lease was lost,
/// e.g. while it was paused).
///
/// ```
/// use tower_redlock::fenced::StaleToken;
///
/// let stale = StaleToken::new(7, 9);
/// assert_eq!((stale.token(), stale.stored()), (7, 9));
/// assert_eq!(stale.to_problem_json().status(), 409);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaleToken {
    token: u64,
    stored: u64,
}

impl StaleToken {
    /// The problem type of its answer.
    pub const PROBLEM_TYPE: &'static str = "/problems/fencing-token-stale";

    /// A write with `token` refused: the data was written with `stored` (larger).
    pub fn new(token: u64, stored: u64) -> Self {
        Self { token, stored }
    }

    /// The refused write's token.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The token the data was last written with.
    pub fn stored(&self) -> u64 {
        self.stored
    }

    /// The answer for the client of the refused write: `409` problem+json
    /// ([`PROBLEM_TYPE`](Self::PROBLEM_TYPE)), without `Retry-After` (the request lost its
    /// lock; whether to send it again is the client's call).
    pub fn to_problem_json(&self) -> RejectionResponse {
        let body = format!(
            "{{\"type\":\"{}\",\"title\":\"Stale fencing token\",\"status\":409,\"detail\":\
             \"this request lost its lock before it wrote: a newer holder has written since, \
             so its write was refused\"}}",
            Self::PROBLEM_TYPE
        );
        RejectionResponse::new(409, "application/problem+json", body)
    }
}

impl fmt::Display for StaleToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "stale fencing token {}: the data was written with {} since",
            self.token, self.stored
        )
    }
}

impl std::error::Error for StaleToken {}
