//! An operator's questions and acts, outside the lock's own verbs: who holds a resource on
//! which voter ([`Redlock::inspect`]: reads only), and the deletion of a stuck lock, of the
//! holder named by its token prefix ([`Redlock::force_release`]). The crate never calls either on its own. The
//! types are shown to users in [`crate::operate`].

use std::sync::Arc;
use std::time::Duration;

use std::future::Future;

use futures_util::stream::{FuturesUnordered, StreamExt};

use super::call::Voter;
use super::fencing::fence_key;
use super::{options, Redlock};
use crate::error::NodeError;
use crate::node::{CallError, ForceReleaseRequest, Forced, InspectRequest, KeyState, RecordState};

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
    /// Locks are on some voters, but no holder has a quorum (a holder whose keys are
    /// expiring one by one, a try that failed and is being released, or one whose voters
    /// are down): no one holds the lock, and no one can take it until these expire.
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

/// A forced release ([`Redlock::force_release`]): who asks, which holder it clears, and
/// whether the completion record goes too.
///
/// Name the holder by its token's prefix, as [`Redlock::inspect`] shows it
/// ([`Holder::token_prefix`]): a re-run — after a voter did not answer — then deletes
/// nothing of a holder that took the key meanwhile, and a record only with that holder's
/// lock. Clearing whatever holds the key is a separate, explicit choice
/// ([`ForceRelease::any_holder`]); a forced release that makes neither choice is refused.
///
/// ```
/// use tower_redlock::operate::ForceRelease;
///
/// let precise = ForceRelease::by("alice").holder("2b5bcc88").with_record();
/// let blunt = ForceRelease::by("alice").any_holder();
/// # let _ = (precise, blunt);
/// ```
#[derive(Debug, Clone)]
pub struct ForceRelease {
    by: String,
    record: bool,
    holder: Named,
}

/// Which holder a forced release clears.
#[derive(Debug, Clone)]
enum Named {
    /// Not said: refused.
    Unnamed,
    /// The holder whose token starts with this (checked when the release runs).
    Prefix(String),
    /// Whatever holds the key.
    Any,
}

/// The shortest holder prefix a forced release accepts: the prefix [`Redlock::inspect`]
/// shows, 32 random bits — two holders of one key share it once in four billion.
pub const MIN_HOLDER_PREFIX: usize = TOKEN_PREFIX_LEN;

impl ForceRelease {
    /// A forced release asked by `who` (an operator's name, a ticket): logged with it. Name
    /// the holder ([`holder`](Self::holder)) or choose [`any_holder`](Self::any_holder).
    pub fn by(who: impl Into<String>) -> Self {
        Self {
            by: who.into(),
            record: false,
            holder: Named::Unnamed,
        }
    }

    /// Clear only the holder whose token starts with `prefix`: the token prefix
    /// [`Redlock::inspect`] shows ([`MIN_HOLDER_PREFIX`] to 32 hex digits; anything else is
    /// refused as invalid input when the release runs, and nothing is deleted).
    #[must_use]
    pub fn holder(mut self, prefix: impl Into<String>) -> Self {
        self.holder = Named::Prefix(prefix.into());
        self
    }

    /// Clear whatever holds the key — also a holder that took it a moment ago. Prefer
    /// [`holder`](Self::holder): a re-run of this one can delete a new holder's lock (two
    /// holders at once) and, with [`with_record`](Self::with_record), its fresh record.
    #[must_use]
    pub fn any_holder(mut self) -> Self {
        self.holder = Named::Any;
        self
    }

    /// Delete the completion record too: the next request with this key runs the handler
    /// again instead of replaying. With a holder named, the record goes only on the voters
    /// where that holder's lock did.
    #[must_use]
    pub fn with_record(mut self) -> Self {
        self.record = true;
        self
    }

    /// Checks the choice of holder as [`Redlock::force_release`] does, before it runs (e.g.
    /// before asking an operator to confirm): an invalid-input error says what to fix.
    pub fn check(&self) -> crate::Result<()> {
        self.checked_holder().map(drop)
    }

    /// The holder's prefix, checked (`None`: any holder).
    fn checked_holder(&self) -> crate::Result<Option<String>> {
        match &self.holder {
            Named::Any => Ok(None),
            Named::Unnamed => Err(crate::Error::invalid(
                "a forced release must name the holder it clears: ForceRelease::holder(prefix) \
                 with the token prefix `inspect` shows (or, knowingly, any_holder())",
            )),
            Named::Prefix(p) => {
                let hex = p.bytes().all(|b| b.is_ascii_hexdigit());
                if !hex || p.len() < MIN_HOLDER_PREFIX || p.len() > 32 {
                    return Err(crate::Error::invalid(format!(
                        "a holder is named by {MIN_HOLDER_PREFIX} to 32 hex digits of its token \
                         (as `inspect` shows it); got {} characters{}",
                        p.len(),
                        if hex { "" } else { ", not all hex" }
                    )));
                }
                Ok(Some(p.to_ascii_lowercase()))
            }
        }
    }
}

/// What a forced release deleted on each voter.
#[derive(Debug)]
pub struct ForceReleased {
    voters: Vec<(usize, Arc<str>, Result<Forced, NodeError>)>,
}

impl ForceReleased {
    /// How many voters had a lock at the key, now deleted.
    pub fn locks_deleted(&self) -> usize {
        self.answers().filter(|f| f.lock).count()
    }

    /// How many voters had a completion record, now deleted (only when asked).
    pub fn records_deleted(&self) -> usize {
        self.answers().filter(|f| f.record).count()
    }

    /// Whether every voter answered: nothing is left at the key on any of them.
    pub fn is_complete(&self) -> bool {
        self.voters.iter().all(|(_, _, r)| r.is_ok())
    }

    /// The voters that did not answer (ask again once they are back).
    pub fn errors(&self) -> impl Iterator<Item = &NodeError> {
        self.voters.iter().filter_map(|(_, _, r)| r.as_ref().err())
    }

    /// Each voter's index, name, and what it deleted or why it did not answer.
    pub fn voters(&self) -> impl Iterator<Item = (usize, &str, Result<&Forced, &NodeError>)> {
        self.voters.iter().map(|(i, n, r)| (*i, &**n, r.as_ref()))
    }

    fn answers(&self) -> impl Iterator<Item = &Forced> {
        self.voters.iter().filter_map(|(_, _, r)| r.as_ref().ok())
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
    pub async fn inspect(&self, resource: &str) -> crate::Result<Inspection> {
        options::check_resource(resource)?;
        let key: Arc<str> = self.redis_key(resource).into();
        let fence: Arc<str> = fence_key(&key);
        let record: Arc<str> = super::acquire::record_key(&key);
        let timeout = self.inner.config.node_timeout.saturating_mul(5);
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
                let voter = &self.inner.nodes[i];
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
            quorum: self.inner.quorum,
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
        let timeout = self.inner.config.node_timeout.saturating_mul(5) + Duration::from_secs(1);
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
                name: self.inner.nodes[i].name.clone(),
                answer,
            });
        }
        voters.sort_by_key(|v| v.node);
        voters
    }

    /// Deletes the lock at `resource`'s key on every voter — the named holder's
    /// ([`ForceRelease::holder`], the token prefix [`Redlock::inspect`] shows), or whatever
    /// holds it ([`ForceRelease::any_holder`]) — and with [`ForceRelease::with_record`] its
    /// completion record (with a holder named, only where its lock was deleted). The
    /// fencing counter is kept, so fencing tokens keep growing.
    ///
    /// An operator's act for a key a crashed holder left behind (or a record to forget);
    /// never done by the crate itself. It is logged at warn with the key's hash and who asked.
    /// **It breaks mutual exclusion if the holder is alive**: the next request takes the lock
    /// while the old holder still works (fencing tokens, checked where the data lives, are
    /// what then refuses the old holder's writes). Every voter is asked in parallel, each
    /// bounded by the node timeout; a voter that did not answer is in
    /// [`ForceReleased::errors`]: run it again when the voter is back — with the holder
    /// named, the re-run deletes nothing of a holder that took the key meanwhile
    /// (`force_rerun_spares_a_new_holders_lock_and_record`).
    ///
    /// A forced release that names no holder and did not choose
    /// [`any_holder`](ForceRelease::any_holder), or names one by anything but
    /// [`MIN_HOLDER_PREFIX`] to 32 hex digits, is refused as invalid input: nothing is sent.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// use std::time::Duration;
    /// use tower_redlock::{operate::ForceRelease, Redlock};
    ///
    /// let redlock = Redlock::in_memory();
    /// std::mem::forget(redlock.try_lock("job", Duration::from_secs(60)).await.unwrap());
    /// let holder = redlock.inspect("job").await.unwrap().holder().unwrap();
    /// let how = ForceRelease::by("alice").holder(holder.token_prefix);
    /// let cleared = redlock.force_release("job", how.clone()).await.unwrap();
    /// assert_eq!(cleared.locks_deleted(), 1);
    ///
    /// // A new holder; the re-run spares it.
    /// let lease = redlock.try_lock("job", Duration::from_secs(5)).await.unwrap();
    /// assert_eq!(redlock.force_release("job", how).await.unwrap().locks_deleted(), 0);
    /// lease.release().await.unwrap();
    ///
    /// let unnamed = redlock.force_release("job", ForceRelease::by("alice")).await;
    /// assert!(unnamed.unwrap_err().is_invalid_input());
    /// # }
    /// ```
    pub async fn force_release(
        &self,
        resource: &str,
        how: ForceRelease,
    ) -> crate::Result<ForceReleased> {
        options::check_resource(resource)?;
        let holder: Option<Arc<str>> = how.checked_holder()?.map(Into::into);
        let key: Arc<str> = self.redis_key(resource).into();
        let record = how.record.then(|| super::acquire::record_key(&key));
        tracing::warn!(
            key_hash = %self.key_hash(resource),
            by = %how.by,
            record = how.record,
            holder = holder.as_deref().unwrap_or("any"),
            "forced release of a lock (an operator's act)"
        );
        let answers = self
            .ask_every_voter(self.inner.config.node_timeout, |voter| {
                let (key, record, holder) = (key.clone(), record.clone(), holder.clone());
                async move {
                    let mut ask = ForceReleaseRequest::new(&key);
                    if let Some(record) = &record {
                        ask = ask.with_record(record);
                    }
                    if let Some(holder) = &holder {
                        ask = ask.holder(holder);
                    }
                    voter.node.force_release(ask).await
                }
            })
            .await;
        let voters = answers
            .into_iter()
            .map(|(i, answer)| (i, self.inner.nodes[i].name.clone(), answer))
            .collect();
        Ok(ForceReleased { voters })
    }
}

impl Redlock {
    /// Asks every voter at once, each bounded by `timeout`; the answers in node order. An
    /// operator's call stays outside the lock's accounting: it neither feeds a voter's health
    /// (a slow inspection never suspends a voter the locks use) nor pays what a voter is owed
    /// (an inspection writes nothing).
    async fn ask_every_voter<T, F, Fut>(
        &self,
        timeout: Duration,
        ask: F,
    ) -> Vec<(usize, Result<T, NodeError>)>
    where
        F: Fn(Arc<Voter>) -> Fut,
        Fut: Future<Output = Result<T, CallError>>,
    {
        let mut pending: FuturesUnordered<_> = self
            .inner
            .nodes
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
        let mut answers = Vec::with_capacity(self.inner.nodes.len());
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
