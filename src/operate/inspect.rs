//! An operator's questions, outside the lock's own verbs: who holds a resource on which
//! voter ([`Redlock::inspect`]: reads only), and what is held under a prefix
//! ([`Redlock::scan`]); the deletion of a stuck lock is `force.rs`'s. The crate never calls
//! them on its own. The types are shown to users in [`crate::operate`].

use std::sync::Arc;
use std::time::Duration;

use std::future::Future;

use futures_util::stream::{FuturesUnordered, StreamExt};

use crate::error::NodeError;
use crate::lock::{check_resource, fence_key, record_key, Redlock, Voter};
use crate::node::{CallError, InspectRequest, KeyState, RecordState};

/// How many characters of a holder's token an inspection shows: enough to tell holders
/// apart, never enough to act as the holder.
pub(crate) const TOKEN_PREFIX_LEN: usize = 8;

/// What every voter holds at a resource's key ([`Redlock::inspect`]), and a summary.
#[derive(Debug)]
pub struct Inspection {
    key: String,
    quorum: usize,
    voters: Vec<VoterInspection>,
}

/// What one voter holds at the key, or why it did not say.
#[derive(Debug)]
pub struct VoterInspection {
    node: usize,
    name: Arc<str>,
    suspended: bool,
    answer: Result<VoterKey, NodeError>,
    /// The holder's whole token: holders are told apart by it, and only its prefix shown.
    token: Option<String>,
}

/// What a voter that answered holds at the key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct VoterKey {
    /// The lock, when held.
    pub holder: Option<Holder>,
    /// The resource's fencing counter, when the voter keeps one.
    pub fence: Option<u64>,
    /// The completion record, when there is one: its size and how long it is kept still
    /// ([`RecordState::age`] says how old it is, given its retention).
    pub record: Option<RecordState>,
}

/// A lock as an inspection shows it: the first characters of the holder's token (never the
/// whole token), and its remaining ttl.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The first eight characters of the holder's token: compare it with the start of
    /// [`Lease::value`](crate::Lease::value).
    pub token_prefix: String,
    /// The remaining ttl (`None`: the key has no expiry, which no client of this crate sets).
    pub ttl: Option<Duration>,
}

/// An inspection in one word, decided as an acquire would see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Summary {
    /// A completion record is on at least one voter: a replay acquire answers with it.
    Completed,
    /// One holder's token is on a quorum of the voters: the lock is held.
    Held,
    /// Locks are on some voters, but no holder has a quorum. It may be a holder whose keys are
    /// expiring one by one, a try that failed and is being released, or one whose voters are down.
    /// No one holds the lock, and no one can take it until these expire.
    HeldOnMinority,
    /// Nothing on a quorum of voters that answered: the lock is free.
    Free,
    /// Too few voters answered to say.
    Unknown,
}

impl Inspection {
    /// The Redis key inspected (the client's key prefix and the resource).
    pub fn key(&self) -> &str {
        &self.key
    }

    /// Each voter's answer, in the client's node order.
    pub fn voters(&self) -> &[VoterInspection] {
        &self.voters
    }

    /// The client's quorum.
    pub fn quorum(&self) -> usize {
        self.quorum
    }

    /// The inspection in one word (see [`Summary`]).
    pub fn summary(&self) -> Summary {
        let answered: Vec<&VoterKey> = self.voters.iter().filter_map(|v| v.key()).collect();
        if answered.iter().any(|k| k.record.is_some()) {
            return Summary::Completed;
        }
        if self.holder().is_some() {
            return Summary::Held;
        }
        let unanswered = self.voters.len() - answered.len();
        let most = self
            .voters
            .iter()
            .filter_map(|v| v.token.as_deref())
            .map(|t| self.holding(t))
            .max();
        match most {
            // A holder the silent voters may still give a quorum: cannot say.
            Some(most) if most + unanswered >= self.quorum => Summary::Unknown,
            Some(_) => Summary::HeldOnMinority,
            None if answered.len() >= self.quorum => Summary::Free,
            None => Summary::Unknown,
        }
    }

    /// The holder whose token is on a quorum of voters, with the shortest ttl among them.
    pub fn holder(&self) -> Option<Holder> {
        let token = self
            .voters
            .iter()
            .filter_map(|v| v.token.as_deref())
            .find(|t| self.holding(t) >= self.quorum)?;
        let same = self
            .voters
            .iter()
            .filter(|v| v.token.as_deref() == Some(token));
        Some(Holder {
            token_prefix: token.chars().take(TOKEN_PREFIX_LEN).collect(),
            ttl: same.filter_map(|v| v.key()?.holder.as_ref()?.ttl).min(),
        })
    }

    /// On how many voters `token` holds the key.
    fn holding(&self, token: &str) -> usize {
        self.voters
            .iter()
            .filter(|v| v.token.as_deref() == Some(token))
            .count()
    }

    /// The largest fencing counter among the voters (the next fenced lock's token is above
    /// it).
    pub fn fence(&self) -> Option<u64> {
        self.voters.iter().filter_map(|v| v.key()?.fence).max()
    }
}

impl VoterInspection {
    /// The voter's index in the client's node list.
    pub fn node(&self) -> usize {
        self.node
    }

    /// The voter's name (`host:port`, never a password).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the client has the voter suspended (after repeated timeouts): its locks are
    /// not asked for until a probe gets an answer. An inspection asks it all the same.
    pub fn is_suspended(&self) -> bool {
        self.suspended
    }

    /// What it holds at the key, when it answered.
    pub fn key(&self) -> Option<&VoterKey> {
        self.answer.as_ref().ok()
    }

    /// Why it did not answer.
    pub fn error(&self) -> Option<&NodeError> {
        self.answer.as_ref().err()
    }
}

/// The locks a voter holds under a prefix ([`Redlock::scan`]), or why it did not say.
#[derive(Debug)]
pub struct VoterScan {
    node: usize,
    name: Arc<str>,
    answer: Result<Vec<Holding>, NodeError>,
}

/// One lock on one voter, as a scan lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holding {
    /// The Redis key.
    pub key: String,
    /// The holder's token prefix and remaining ttl.
    pub holder: Holder,
}

impl VoterScan {
    /// The voter's index in the client's node list.
    pub fn node(&self) -> usize {
        self.node
    }

    /// The voter's name (`host:port`, never a password).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The locks it holds under the prefix (sorted by key), when it answered.
    pub fn locks(&self) -> Option<&[Holding]> {
        self.answer.as_deref().ok()
    }

    /// Why it did not answer.
    pub fn error(&self) -> Option<&NodeError> {
        self.answer.as_ref().err()
    }
}

impl Redlock {
    /// What every voter holds at `resource`'s key: the holder's token prefix and remaining
    /// ttl, the fencing counter, the completion record's size and ttl, whether the client has
    /// the voter suspended — and a [`Summary`]. Takes no lock and writes nothing; every voter
    /// is asked in parallel (suspended ones too), each bounded by five node timeouts (the
    /// reads are five commands). A voter that fails is reported with its error; an
    /// operator's call never counts toward a voter's suspension (a slow inspection does not
    /// take a voter out of the locks) and pays nothing a voter is owed.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// use tower_redlock::{operate::Summary, Redlock};
    ///
    /// let redlock = Redlock::in_memory();
    /// assert_eq!(redlock.inspect("invoice:7").await.unwrap().summary(), Summary::Free);
    ///
    /// let lease = redlock.try_lock("invoice:7", Duration::from_secs(5)).await.unwrap();
    /// let seen = redlock.inspect("invoice:7").await.unwrap();
    /// assert_eq!(seen.summary(), Summary::Held);
    /// let holder = seen.holder().unwrap();
    /// assert!(lease.value().starts_with(&holder.token_prefix));
    /// assert!(holder.ttl.unwrap() <= Duration::from_secs(5));
    /// # }
    /// ```
    ///
    /// An invalid resource name is an invalid-input error.
    ///
    /// # Errors
    ///
    /// [`Error::is_invalid_input`](crate::Error::is_invalid_input): an empty or too long
    /// resource. A voter that does not answer is not an error: its entry says why.
    pub async fn inspect(&self, resource: &str) -> crate::Result<Inspection> {
        check_resource(resource)?;
        let key: Arc<str> = self.redis_key(resource).into();
        let fence: Arc<str> = fence_key(&key);
        let record: Arc<str> = record_key(&key);
        let timeout = self.node_timeout().saturating_mul(5);
        let answers = self
            .ask_every_voter(timeout, |voter| {
                let (key, fence, record) = (key.clone(), fence.clone(), record.clone());
                async move {
                    let ask = InspectRequest::new(&key, &fence, &record);
                    voter.node.inspect(ask).await
                }
            })
            .await;
        let voters = answers
            .into_iter()
            .map(|(i, answer)| {
                let voter = &self.voters()[i];
                let token = answer
                    .as_ref()
                    .ok()
                    .and_then(|s| Some(s.lock.as_ref()?.0.clone()));
                VoterInspection {
                    node: i,
                    name: voter.name.clone(),
                    suspended: voter.health.is_suspended(),
                    answer: answer.map(shown),
                    token,
                }
            })
            .collect();
        Ok(Inspection {
            key: key.to_string(),
            quorum: self.quorum(),
            voters,
        })
    }

    /// The locks every voter holds whose Redis key starts with `prefix` (at most `limit`
    /// per voter; the fencing counters and completion records beside them left out): what
    /// `redlock watch` shows. Reads only (`SCAN`, then `GET` and `PTTL` per key), each voter
    /// bounded by a second plus five node timeouts (a keyspace too large to scan in that
    /// time answers a timeout: narrow the prefix). A Redis Cluster voter answers an error
    /// (its keys are spread over its masters: inspect a key instead).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// use tower_redlock::Redlock;
    ///
    /// let redlock = Redlock::in_memory();
    /// let _job = redlock.try_lock("job:7", Duration::from_secs(5)).await.unwrap();
    /// let scans = redlock.scan("job:", 100).await;
    /// assert_eq!(scans[0].locks().unwrap()[0].key, "job:7");
    /// # }
    /// ```
    pub async fn scan(&self, prefix: &str, limit: usize) -> Vec<VoterScan> {
        let prefix: Arc<str> = prefix.into();
        let timeout = self.node_timeout().saturating_mul(5) + Duration::from_secs(1);
        let answers = self
            .ask_every_voter(timeout, |voter| {
                let prefix = prefix.clone();
                async move { voter.node.scan(&prefix, limit).await }
            })
            .await;
        let mut voters = Vec::with_capacity(answers.len());
        for (i, answer) in answers {
            let answer = answer.map(|held| {
                held.into_iter()
                    .map(|h| Holding {
                        key: h.key,
                        holder: Holder {
                            token_prefix: h.token.chars().take(TOKEN_PREFIX_LEN).collect(),
                            ttl: h.ttl,
                        },
                    })
                    .collect()
            });
            voters.push(VoterScan {
                node: i,
                name: self.voters()[i].name.clone(),
                answer,
            });
        }
        voters.sort_by_key(|v| v.node);
        voters
    }
}

impl Redlock {
    /// Asks every voter at once, each bounded by `timeout`; the answers in node order. An
    /// operator's call stays outside the lock's accounting: it neither feeds a voter's health
    /// (a slow inspection never suspends a voter the locks use) nor pays what a voter is owed
    /// (an inspection writes nothing).
    pub(super) async fn ask_every_voter<T, F, Fut>(
        &self,
        timeout: Duration,
        ask: F,
    ) -> Vec<(usize, Result<T, NodeError>)>
    where
        F: Fn(Arc<Voter>) -> Fut,
        Fut: Future<Output = Result<T, CallError>>,
    {
        let mut pending: FuturesUnordered<_> = self
            .voters()
            .iter()
            .enumerate()
            .map(|(i, voter)| {
                let (name, asked) = (voter.name.clone(), ask(voter.clone()));
                async move {
                    let answer = match tokio::time::timeout(timeout, asked).await {
                        Ok(Ok(x)) => Ok(x),
                        Ok(Err(e)) => Err(NodeError::from_source(i, name, e)),
                        Err(_) => Err(NodeError::timeout(i, name, timeout)),
                    };
                    (i, answer)
                }
            })
            .collect();
        let mut answers = Vec::with_capacity(self.voters().len());
        while let Some(answer) = pending.next().await {
            answers.push(answer);
        }
        answers.sort_by_key(|(i, _)| *i);
        answers
    }
}

/// A node's answer as an inspection shows it: the token cut to its prefix.
fn shown(state: KeyState) -> VoterKey {
    VoterKey {
        holder: state.lock.map(|(token, ttl)| Holder {
            token_prefix: token.chars().take(TOKEN_PREFIX_LEN).collect(),
            ttl,
        }),
        fence: state.fence,
        record: state.record,
    }
}
