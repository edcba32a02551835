//! What each voter answered to the try an [`Error`] reports ([`Error::votes`]): the reasons
//! behind "contended" and "unavailable", voter by voter.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::{Error, NodeError};
use crate::node::Refusal;

/// What one voter answered, as [`Error::votes`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum VoteKind {
    /// It set the lock for this try (which failed elsewhere, and released it).
    Granted,
    /// The key is held by another value; `remaining` is the holder's ttl when the voter
    /// reported it (or was asked it for the error).
    Held {
        /// The holder's remaining ttl, when known.
        remaining: Option<Duration>,
    },
    /// Its answer was not awaited: the outcome was certain without it.
    NotCounted,
    /// No answer within the node timeout.
    Timeout,
    /// Not reached: connection refused or lost.
    Unreachable,
    /// Not asked: suspended after repeated timeouts, until a probe gets an answer.
    Suspended,
    /// `NOSCRIPT`: the lock's script is not loaded there and could not be sent.
    NoScript,
    /// `WRONGTYPE`: the key (or the counter or record beside it) holds another kind of value.
    WrongType,
    /// `NOAUTH`, `WRONGPASS` or `NOPERM`: the credentials or the ACL refuse the command (an
    /// ACL user needs `SET`, `GET`, `PTTL`, `EVALSHA` and `EVAL` on the lock's keys).
    Denied,
    /// Delayed-restart (tenure) protection: the master restarted, failed over or was
    /// flushed too recently to vote.
    Protected,
    /// The voter refused on its own: a Sentinel group without a recent majority of its
    /// sentinels, a master that may evict keys.
    Abstained,
    /// Any other failure (see the node's error).
    Failed,
}

impl VoteKind {
    /// A short name: `granted`, `held`, `not counted`, `timeout`, `unreachable`,
    /// `suspended`, `no script`, `wrong type`, `denied`, `protected`, `abstained`, `failed`.
    pub fn as_str(&self) -> &'static str {
        match self {
            VoteKind::Granted => "granted",
            VoteKind::Held { .. } => "held",
            VoteKind::NotCounted => "not counted",
            VoteKind::Timeout => "timeout",
            VoteKind::Unreachable => "unreachable",
            VoteKind::Suspended => "suspended",
            VoteKind::NoScript => "no script",
            VoteKind::WrongType => "wrong type",
            VoteKind::Denied => "denied",
            VoteKind::Protected => "protected",
            VoteKind::Abstained => "abstained",
            VoteKind::Failed => "failed",
        }
    }
}

/// One voter's answer to the try an [`Error`] reports (see [`Error::votes`]).
#[derive(Debug, Clone, Copy)]
pub struct Vote<'a> {
    node: usize,
    name: &'a str,
    kind: VoteKind,
    error: Option<&'a NodeError>,
}

impl<'a> Vote<'a> {
    /// The voter's index in the client's node list.
    pub fn node(&self) -> usize {
        self.node
    }

    /// The voter's name (`host:port`, never a password).
    pub fn name(&self) -> &'a str {
        self.name
    }

    /// What it answered.
    pub fn kind(&self) -> VoteKind {
        self.kind
    }

    /// Its error, when it failed.
    pub fn error(&self) -> Option<&'a NodeError> {
        self.error
    }
}

impl fmt::Display for Vote<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.name, self.kind.as_str())?;
        match (self.kind, self.error) {
            (VoteKind::Held { remaining: Some(r) }, _) => write!(f, " ({} ms left)", r.as_millis()),
            (_, Some(e)) if self.kind != VoteKind::Suspended => {
                f.write_str(" (")?;
                e.fmt_detail(f)?;
                f.write_str(")")
            }
            _ => Ok(()),
        }
    }
}

/// Every voter's answer to a try, kept with its error: the voters' names, which granted,
/// which said held (with the ttls reported).
#[derive(Debug, Clone)]
pub(crate) struct Ballots {
    pub(crate) names: Arc<[Arc<str>]>,
    pub(crate) granted: u64,
    pub(crate) held: u64,
    pub(crate) ttls: Vec<(usize, Duration)>,
}

impl NodeError {
    /// What this failure is, as a vote.
    pub fn vote(&self) -> VoteKind {
        use super::Detail;
        match &self.detail {
            Detail::Timeout(_) => VoteKind::Timeout,
            Detail::Suspended => VoteKind::Suspended,
            // Refused credentials end the connection too: named as what they are.
            Detail::Failure {
                refusal: Refusal::Denied,
                ..
            } => VoteKind::Denied,
            Detail::Failure { timeout: true, .. } => VoteKind::Timeout,
            Detail::Failure {
                unreachable: true, ..
            } => VoteKind::Unreachable,
            Detail::Failure { refusal, .. } => match refusal {
                Refusal::NoScript => VoteKind::NoScript,
                Refusal::WrongType => VoteKind::WrongType,
                Refusal::Denied => VoteKind::Denied,
                Refusal::Protected => VoteKind::Protected,
                Refusal::Abstained => VoteKind::Abstained,
                Refusal::Other => VoteKind::Failed,
            },
        }
    }
}

impl Error {
    /// What each voter answered to the try this error reports, in node order: granted,
    /// held (with the holder's ttl when known), not counted, or why it failed (timeout,
    /// unreachable, suspended, no script, wrong type, denied, protected, abstained).
    /// `Display` shows the same in one line.
    ///
    /// For a lock's error (contended, unavailable) every voter is listed; for other errors,
    /// the voters that failed.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// use tower_redlock::{Redlock, VoteKind};
    ///
    /// let redlock = Redlock::in_memory();
    /// let _held = redlock.try_lock("invoice:7", Duration::from_secs(5)).await.unwrap();
    /// let err = redlock.try_lock("invoice:7", Duration::from_secs(5)).await.unwrap_err();
    /// let votes: Vec<_> = err.votes().collect();
    /// assert!(matches!(votes[0].kind(), VoteKind::Held { remaining: Some(_) }));
    /// assert!(err.to_string().contains("memory held"));
    /// # }
    /// ```
    pub fn votes(&self) -> impl Iterator<Item = Vote<'_>> + '_ {
        let errors = self.inner.nodes.iter();
        let ballots = self.inner.ballots.as_ref();
        let listed = ballots.map_or(0, |b| b.names.len());
        let from_ballots = ballots
            .into_iter()
            .flat_map(move |b| (0..b.names.len()).map(move |i| (b, i)));
        let from_ballots = from_ballots.map(move |(b, i)| {
            let error = self.inner.nodes.iter().find(|e| e.node() == i);
            let bit = 1u64 << i;
            let kind = match error {
                Some(e) => e.vote(),
                None if b.held & bit != 0 => VoteKind::Held {
                    remaining: b.ttls.iter().find(|(n, _)| *n == i).map(|(_, r)| *r),
                },
                None if b.granted & bit != 0 => VoteKind::Granted,
                None => VoteKind::NotCounted,
            };
            Vote {
                node: i,
                name: &b.names[i],
                kind,
                error,
            }
        });
        let only_errors = errors.filter(move |_| listed == 0).map(|e| Vote {
            node: e.node(),
            name: e.node_name(),
            kind: e.vote(),
            error: Some(e),
        });
        from_ballots.chain(only_errors)
    }
}
