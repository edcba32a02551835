//! Whether a voter's master may evict keys. A master with a `maxmemory` and a policy other than
//! `noeviction` (a Redis shared with a cache) can drop a lock or a completion record before its ttl
//! under memory pressure. A second holder or a second run then follows.
//!
//! The master's `INFO memory` (`maxmemory`, `maxmemory_policy`; `INFO` is usually allowed
//! where `CONFIG` is not) is read, one check at a time, each bounded by a timeout:
//! - on first use, beside the first acquires and extensions: they are sent at once and the
//!   check along with them (no time of its own; a request that times out still reaches the
//!   master, as any does), and their answers count only if the check lets the voter vote;
//! - so again after a connection error (redis-rs reconnects after one: the new connection
//!   may reach another server, or one restarted with another configuration), and after a
//!   Sentinel voter adopts another master;
//! - in the background, when an acquire, an extension or a status read finds the last check older
//!   than [`RECHECK_EVERY`] (for a `CONFIG SET` on a live connection). The age is
//!   [`RECHECK_ABSTAINING`] instead while the voter abstains (so that a fixed master votes again
//!   soon) or after a check that failed. The request goes by the last verdict meanwhile.
//!
//! The check is for reporting and for refusing early. What keeps a lock safe is in the scripts.
//! Every acquire, extension and completion of a voter that does not allow eviction is a script that
//! reads `INFO memory` itself, atomically with its write. It refuses (`-EVICTS` naming the policy)
//! on a master that may evict — a `CONFIG SET` made a moment ago included. A refusal makes the
//! voter abstain at once, and the check due in [`RECHECK_ABSTAINING`] sees the master fixed. No
//! command or round trip is added to a lock: the read is inside the request
//! (`eviction_check_costs_no_round_trip_per_lock`). What a script cannot see is a lease already
//! granted. One taken before the change keeps its key on that master, exposed to eviction, until
//! its next extension (refused there) or its end. A completion record stored before the change
//! stays there for its retention (docs/safety.md says what that exposes).
//!
//! A check that gets no answer in time, or an error reply (`-BUSY`), leaves the
//! last verdict standing; with none yet, it fails the requests beside it (on a Cluster,
//! where one master down fails it, the policy is unknown until every master answers). One
//! that loses the connection leaves the voter unchecked. A denied `INFO` (`NOPERM`: an
//! ACL without `+info`) leaves the policy unknown: the voter votes, and says so once (the
//! scripts' read is denied too, and they write as if the policy were `noeviction`). A
//! master that evicts abstains — its acquires and extensions fail at once, unsent, with a
//! message naming its policy — unless its options allow eviction
//! ([`RedisNodeOptions::allow_eviction`](super::RedisNodeOptions::allow_eviction)). A
//! request sent beside a check that then refuses is a failed vote, released as any is.
//! Releases and completions are never held back, so nothing is stranded by the voter; a
//! completion the master's script refuses leaves the lock there until its ttl.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use futures_util::future::{join, BoxFuture, Either, FutureExt, Shared};
use redis::{Cmd, RedisError};

pub(crate) use self::info::refusal;
use self::info::{abstains, of_refusal, verdict, Verdict};
use super::conn::{connection_lost, query, Conn};
use super::RedisNode;
use crate::node::{CallError, Refusal};

mod info;

/// How often a checked master is checked again: a `CONFIG SET maxmemory-policy` on a live
/// connection goes unnoticed for at most this long (while the voter is used).
pub(crate) const RECHECK_EVERY: Duration = Duration::from_secs(30);
/// ... and a master the voter abstains for (set to `noeviction`, it votes again within
/// about this long: its requests, refused before they reach it, notice no reconnection),
/// or whose last check failed.
pub(crate) const RECHECK_ABSTAINING: Duration = Duration::from_secs(1);

/// A voter's eviction check, shared by its clones and, on a Sentinel voter, its discovery.
/// See the module docs.
#[derive(Clone)]
pub(crate) struct Eviction {
    inner: Arc<Inner>,
}

/// What a Sentinel voter's discovery holds: it calls [`Eviction::adopted`].
pub(super) type NewMaster = Eviction;

struct Inner {
    /// The voter's name, for the logs.
    name: String,
    /// Whether a master that evicts votes all the same.
    allow: bool,
    /// The bound of one check (it may have to connect first).
    timeout: Duration,
    /// The clock of `votes_until` and [`State::due`], in milliseconds.
    epoch: Instant,
    /// The fast path: until when acquires and extensions go straight to the master (the
    /// last verdict lets the voter vote, and no check is due); 0 when they do not.
    votes_until: AtomicU64,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// The last check's answer, for the status and the logs (kept across a reset).
    verdict: Option<Verdict>,
    /// When the current connection's master is due for a check again; `None` while it is
    /// not checked (first use, and after a reset): requests then go beside a check.
    due: Option<u64>,
    /// Counts the resets: a check begun before one says nothing of the server after it.
    generation: u64,
    /// The check under way (at most one), and when it began.
    check: Option<(u64, Check)>,
}

/// A check, shared by the requests beside it: the verdict, or why there is none.
type Check = Shared<BoxFuture<'static, Result<Verdict, Failed>>>;

/// Why a check got no verdict.
#[derive(Debug, Clone)]
struct Failed {
    why: Arc<str>,
    timeout: bool,
    /// The connection is gone (no reply came).
    lost: bool,
    /// The credentials were refused.
    denied: bool,
}

/// A voter's eviction state as [`Redlock::node_status`](crate::Redlock::node_status)
/// reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct EvictionStatus {
    /// The master's `maxmemory-policy`, as last read.
    pub(crate) policy: Option<String>,
    /// Whether the master may evict keys.
    pub(crate) evicts: bool,
    /// Whether the voter abstains for it.
    pub(crate) abstains: bool,
}

impl Eviction {
    /// The check of the voter `name`; with `allow`, a master that evicts votes all the same.
    /// A check may take `timeout` (it may have to connect first).
    pub(super) fn new(name: &str, allow: bool, timeout: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                name: name.to_owned(),
                allow,
                timeout,
                epoch: Instant::now(),
                votes_until: AtomicU64::new(0),
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// Whether an acquire or an extension may go to the master at once (see
    /// [`RedisNode::gated`]).
    #[inline]
    fn votes(&self) -> bool {
        self.inner.now() < self.inner.votes_until.load(Ordering::Acquire)
    }

    /// For a request that may not go at once: the check to send it beside (the master was not
    /// checked). Else the last verdict — `Ok` to send it, or why the voter abstains — after
    /// starting a check in the background if one is due.
    fn admit(&self, conn: &Conn) -> Result<Option<Check>, CallError> {
        let mut state = self.inner.state();
        match (state.due, &state.verdict) {
            (Some(_), Some(verdict)) => {
                let admits = self.inner.admits(verdict);
                self.renew(&mut state, conn);
                admits.map(|()| None)
            }
            _ => Ok(Some(self.check(&mut state, conn))),
        }
    }

    fn renew(&self, state: &mut State, conn: &Conn) {
        if state.due.is_some_and(|due| due <= self.inner.now()) {
            let _background = self.check(state, conn);
        }
    }

    /// The check under way, or a new one, run in the background (driven by those waiting
    /// for it as well).
    fn check(&self, state: &mut State, conn: &Conn) -> Check {
        let now = self.inner.now();
        if let Some((began, check)) = &state.check {
            // One older than twice its bound was dropped unfinished (with its runtime).
            if now.saturating_sub(*began) <= 2 * ms(self.inner.timeout) {
                return check.clone();
            }
        }
        let (inner, generation) = (Arc::downgrade(&self.inner), state.generation);
        let (mut conn, timeout) = (conn.clone(), self.inner.timeout);
        let check = async move {
            let answer = ask(&mut conn, timeout).await;
            match inner.upgrade() {
                Some(inner) => inner.record(generation, answer, is_cluster(&conn)),
                None => answer,
            }
        }
        .boxed()
        .shared();
        state.check = Some((now, check.clone()));
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(check.clone());
        }
        check
    }

    /// A request failed: when the connection is gone (redis-rs makes a new one, maybe to
    /// another server), the next acquires and extensions go beside a check; when a vote
    /// script found the master evicting (`-EVICTS`), the voter abstains from now on, unsent,
    /// until a check in the background finds the master fixed.
    pub(super) fn failed(&self, e: &RedisError) {
        if connection_lost(e) {
            self.adopted();
        } else if let Some(verdict) = of_refusal(e) {
            self.inner.refused(verdict);
        }
    }

    /// Whether a master that evicts votes all the same
    /// ([`RedisNodeOptions::allow_eviction`](super::RedisNodeOptions::allow_eviction)): the
    /// voter then sends the vote scripts without their eviction check.
    pub(super) fn allows(&self) -> bool {
        self.inner.allow
    }

    /// The voter talks to another server (a Sentinel voter's discovery adopts another
    /// master: call before any request can reach it): the next acquires and extensions go
    /// beside a check of it.
    pub(super) fn adopted(&self) {
        self.inner.reset(&mut self.inner.state());
    }

    /// The state for [`Redlock::node_status`](crate::Redlock::node_status); starts a check
    /// in the background if one is due (an abstaining voter that gets no requests notices a
    /// fixed master all the same).
    pub(crate) fn status(&self, conn: &Conn) -> EvictionStatus {
        self.renew(&mut self.inner.state(), conn);
        self.last()
    }

    /// The state as last checked.
    fn last(&self) -> EvictionStatus {
        let state = self.inner.state();
        let (policy, evicts) = match &state.verdict {
            None | Some(Verdict::Unknown(_)) => (None, false),
            Some(Verdict::Keeps { policy }) => (Some(policy.clone()), false),
            Some(Verdict::Evicts { policy, .. }) => (Some(policy.clone()), true),
        };
        EvictionStatus {
            policy,
            evicts,
            abstains: evicts && !self.inner.allow,
        }
    }
}

/// A request's future, boxed on the rare path.
type Boxed<'a, T> = Pin<Box<dyn Future<Output = Result<T, CallError>> + Send + 'a>>;

impl RedisNode {
    /// `request` (an acquire or an extension) as the eviction check allows it: at once on a
    /// voter that votes (a clock read and one atomic load); beside a check on a master not
    /// checked yet; not at all, failing at once, on a voter that abstains.
    pub(super) fn gated<'a, T, F>(&'a self, request: F) -> Either<F, Boxed<'a, T>>
    where
        F: Future<Output = Result<T, CallError>> + Send + 'a,
        T: Send + 'a,
    {
        if self.eviction.votes() {
            return Either::Left(request);
        }
        match self.eviction.admit(&self.conn) {
            Ok(None) => Either::Left(request),
            // Boxed: the common path's future (allocated per request) stays small.
            Err(abstains) => Either::Right(Box::pin(async move { Err(abstains) })),
            // Sent at once, beside the check: a request that times out still reaches the
            // master (as any does), and the check costs no round trip of its own.
            Ok(Some(check)) => Either::Right(Box::pin(async move {
                let (checked, answer) = join(check, request).await;
                self.eviction.inner.admits(&checked?)?;
                answer
            })),
        }
    }
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn now(&self) -> u64 {
        ms(self.epoch.elapsed())
    }

    /// The voter now talks to another server: it is not checked.
    fn reset(&self, state: &mut State) {
        state.due = None;
        state.check = None;
        state.generation = state.generation.wrapping_add(1);
        self.votes_until.store(0, Ordering::Release);
    }

    /// Whether a voter votes with `verdict`, else why it abstains.
    fn admits(&self, verdict: &Verdict) -> Result<(), CallError> {
        match verdict {
            Verdict::Evicts {
                policy,
                maxmemory,
                master,
            } if !self.allow => Err(abstains(policy, *maxmemory, master.as_deref()).abstaining()),
            _ => Ok(()),
        }
    }

    /// A vote script found the master evicting (a `CONFIG SET` the last check did not see):
    /// the voter abstains, unsent, until a check in the background — due in
    /// [`RECHECK_ABSTAINING`] — finds the master fixed. (A check already under way, begun
    /// before, may answer the old policy and let requests go again: the scripts refuse them
    /// all the same.)
    fn refused(&self, verdict: Verdict) {
        let mut state = self.state();
        // What the last check said, when it says the same: it may name the master.
        if !state.verdict.as_ref().is_some_and(|v| v.says(&verdict)) {
            self.log(state.verdict.as_ref(), &verdict);
            state.verdict = Some(verdict);
        }
        self.votes_until.store(0, Ordering::Release);
        if state.due.is_some() {
            state.due = Some(self.now() + ms(RECHECK_ABSTAINING));
        }
    }

    /// Records the answer of a check begun at `generation` (or why it got none) and logs a
    /// verdict that changed; returns what the requests beside it go by (they reached the
    /// server it asked). One begun before a reset leaves the voter unchecked.
    fn record(
        &self,
        generation: u64,
        answer: Result<Verdict, Failed>,
        cluster: bool,
    ) -> Result<Verdict, Failed> {
        let mut state = self.state();
        let current = state.generation == generation;
        if current {
            state.check = None;
        }
        let (verdict, failed) = match answer {
            Ok(verdict) => (verdict, false),
            Err(failed) if !current => return Err(failed),
            Err(failed) if failed.lost && !cluster => {
                self.reset(&mut state);
                return Err(failed);
            }
            Err(failed) => match (state.due, &state.verdict) {
                (Some(_), Some(verdict)) => {
                    let (voter, why) = (self.name.as_str(), &failed.why);
                    tracing::debug!(voter, %why, "eviction check failed: the last verdict stands");
                    (verdict.clone(), true)
                }
                // One master down fails a Cluster's INFO, not the requests to the others'
                // slots: best effort, unknown until every master answers.
                _ if cluster => {
                    let why = format!(
                        "not every master of the cluster answered INFO: {}",
                        failed.why
                    );
                    (Verdict::Unknown(why), true)
                }
                _ => return Err(failed),
            },
        };
        if !state.verdict.as_ref().is_some_and(|v| v.says(&verdict)) {
            self.log(state.verdict.as_ref(), &verdict);
        }
        state.verdict = Some(verdict.clone());
        if !current {
            return Ok(verdict);
        }
        let votes = self.admits(&verdict).is_ok();
        let period = if votes && !failed {
            RECHECK_EVERY
        } else {
            RECHECK_ABSTAINING
        };
        let due = self.now() + ms(period);
        self.votes_until
            .store(if votes { due } else { 0 }, Ordering::Release);
        state.due = Some(due);
        Ok(verdict)
    }

    /// A change of verdict, once: never a key, the voter's name and its master's settings.
    fn log(&self, before: Option<&Verdict>, now: &Verdict) {
        let voter = self.name.as_str();
        match now {
            Verdict::Evicts {
                policy,
                maxmemory,
                master,
            } => {
                let (master, policy) = (master.as_deref().unwrap_or(""), policy.as_str());
                let then = if self.allow {
                    "it votes all the same (allow_eviction). Set maxmemory-policy noeviction \
                     to be safe"
                } else {
                    "so this voter abstains until its maxmemory-policy is noeviction (or its \
                     options allow eviction)"
                };
                tracing::warn!(
                    voter,
                    master,
                    policy,
                    maxmemory,
                    "the master may evict keys: a lock or a completion record could vanish \
                     before its ttl and a second holder follow; {then}"
                );
            }
            Verdict::Unknown(why) => tracing::warn!(
                voter,
                error = %why,
                "cannot read the master's maxmemory-policy (INFO memory): it votes unchecked"
            ),
            Verdict::Keeps { policy } => {
                if matches!(before, Some(Verdict::Evicts { .. })) {
                    tracing::info!(voter, %policy, "the master no longer evicts keys: it votes");
                } else {
                    tracing::debug!(voter, %policy, "the master keeps every key until its ttl");
                }
            }
        }
    }
}

/// One `INFO memory`, bounded by `timeout`. A denial (`NOPERM`) leaves the policy unknown;
/// any other error reply (`-BUSY`, `-LOADING`) fails the check, as no answer does.
async fn ask(conn: &mut Conn, timeout: Duration) -> Result<Verdict, Failed> {
    let mut cmd = Cmd::new();
    cmd.arg("INFO").arg("memory");
    match tokio::time::timeout(timeout, query(conn, &cmd, false)).await {
        Ok(Ok(reply)) => Ok(verdict(&reply)),
        Ok(Err(e)) if e.code() == Some("NOPERM") => Ok(Verdict::Unknown(format!(
            "INFO memory: {e} (allow INFO for its user: ACL +info)"
        ))),
        Ok(Err(e)) => Err(Failed {
            why: e.to_string().into(),
            timeout: e.is_timeout(),
            lost: connection_lost(&e),
            denied: CallError::from(e).refusal() == Refusal::Denied,
        }),
        Err(_) => Err(Failed {
            why: format!("no answer to INFO within {timeout:?}").into(),
            timeout: true,
            lost: false,
            denied: false,
        }),
    }
}

impl From<Failed> for CallError {
    fn from(failed: Failed) -> Self {
        let why = CallError::new(format!(
            "could not check the maxmemory-policy: {}",
            failed.why
        ));
        let why = if failed.denied {
            why.with_refusal(Refusal::Denied)
        } else {
            why
        };
        match (failed.timeout, failed.lost) {
            (true, _) => why.with_timeout(),
            (false, true) => why.with_unreachable(),
            (false, false) => why,
        }
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn is_cluster(conn: &Conn) -> bool {
    #[cfg(feature = "cluster")]
    if matches!(conn, Conn::Cluster(_)) {
        return true;
    }
    let _ = conn;
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn evicts() -> Verdict {
        Verdict::Evicts {
            policy: "allkeys-lru".to_owned(),
            maxmemory: 1 << 20,
            master: None,
        }
    }

    fn keeps() -> Verdict {
        Verdict::Keeps {
            policy: "noeviction".to_owned(),
        }
    }

    #[test]
    fn an_evicting_master_abstains_unless_allowed() {
        for allow in [false, true] {
            let e = Eviction::new("127.0.0.1:6379", allow, Duration::from_secs(1));
            assert!(!e.votes(), "unchecked: a request goes beside a check");
            assert_eq!(e.last(), EvictionStatus::default());
            e.inner.record(0, Ok(evicts()), false).expect("a verdict");
            assert_eq!(e.votes(), allow);
            let admitted = e.inner.admits(&evicts());
            assert_eq!(admitted.is_ok(), allow);
            if let Err(why) = admitted {
                let why = why.to_string();
                for part in ["allkeys-lru", "noeviction", "allow_eviction", "abstains"] {
                    assert!(why.contains(part), "{part} in {why}");
                }
            }
            let status = e.last();
            assert_eq!(status.policy.as_deref(), Some("allkeys-lru"));
            assert!(status.evicts);
            assert_eq!(status.abstains, !allow);
            // A lost connection: the next acquire goes beside a fresh check; the status keeps
            // the last verdict meanwhile.
            e.adopted();
            assert!(!e.votes());
            assert!(e.inner.state().due.is_none());
            assert_eq!(e.last(), status);
            // A check begun before the reset says nothing of the new connection's server.
            e.inner.record(0, Ok(keeps()), false).expect("its answer");
            assert!(!e.votes());
            e.inner.record(1, Ok(keeps()), false).expect("a verdict");
            assert!(e.votes());
            assert!(!e.last().abstains);
        }
    }

    #[test]
    fn an_unknown_policy_votes() {
        let e = Eviction::new("127.0.0.1:6379", false, Duration::from_secs(1));
        let unknown = Verdict::Unknown("NOPERM".to_owned());
        e.inner.record(0, Ok(unknown), false).expect("a verdict");
        assert!(e.votes());
        assert_eq!(e.last(), EvictionStatus::default());
    }

    /// A check that gets no answer changes no verdict, and the next one comes within the
    /// re-check period (a second while the voter abstains): the checks never stop.
    #[test]
    fn a_failed_check_keeps_the_verdict_and_the_rechecks() {
        for (verdict, period) in [(evicts(), RECHECK_ABSTAINING), (keeps(), RECHECK_EVERY)] {
            let e = Eviction::new("127.0.0.1:6379", false, Duration::from_secs(1));
            e.inner
                .record(0, Ok(verdict.clone()), false)
                .expect("a verdict");
            let (votes, status) = (e.votes(), e.last());
            let failed = Failed {
                why: "no answer to INFO within 2s".into(),
                timeout: true,
                lost: false,
                denied: false,
            };
            let kept = e.inner.record(0, Err(failed), false);
            assert_eq!(kept.ok(), Some(verdict.clone()), "the verdict stands");
            let due = e.inner.state().due.expect("checked");
            let next = Duration::from_millis(due.saturating_sub(e.inner.now()));
            assert!(next <= period, "{verdict:?}: next check in {next:?}");
            assert_eq!((e.votes(), e.last()), (votes, status), "{verdict:?}");
        }
    }

    /// Unchecked, a failed check fails the requests beside it (on a Cluster, the policy is
    /// unknown: it votes); a lost connection leaves the voter unchecked.
    #[test]
    fn a_failed_first_check_fails_its_requests() {
        let failed = |lost| Failed {
            why: "connection refused".into(),
            timeout: false,
            lost,
            denied: false,
        };
        let e = Eviction::new("127.0.0.1:6379", false, Duration::from_secs(1));
        assert!(e.inner.record(0, Err(failed(false)), false).is_err());
        assert!(e.inner.state().due.is_none());
        let unknown = e.inner.record(0, Err(failed(true)), true);
        assert!(matches!(unknown, Ok(Verdict::Unknown(_))), "{unknown:?}");
        assert!(e.votes());
        assert!(e.inner.record(0, Err(failed(true)), false).is_err());
        assert!(!e.votes() && e.inner.state().due.is_none(), "reset");
    }
}
