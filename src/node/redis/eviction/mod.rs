//! Whether a voter's master may evict keys: a master with a `maxmemory` and a policy other
//! than `noeviction` (a Redis shared with a cache) can drop a lock or a completion record
//! before its ttl under memory pressure, and a second holder or a second run follows.
//!
//! The master's `INFO memory` (`maxmemory`, `maxmemory_policy`; `INFO` is usually allowed
//! where `CONFIG` is not) is read by a task of the voter's own:
//! - on first use, beside the first acquire or extension: the request is sent at once and
//!   the check along with it (no time of its own; a request that times out still reaches
//!   the master, as any does), and the answer counts only if the check lets the voter vote;
//! - after a connection error (redis-rs reconnects after one: the new connection may reach
//!   another server, or one restarted with another configuration), and after a Sentinel
//!   voter adopts another master: the next acquires and extensions are checked so again;
//! - every [`RECHECK_EVERY`] in the background, for a `CONFIG SET` on a live connection
//!   (every [`RECHECK_ABSTAINING`] while the voter abstains, so that a fixed master votes
//!   again soon).
//!
//! Between checks an acquire costs one atomic load: no command is added to a lock. A check
//! that gets no answer fails the requests beside it (their master is unreachable); an
//! answer without the fields (`INFO` denied by an ACL) leaves the policy unknown: the voter
//! votes, and says so once. A master that evicts abstains — its acquires and extensions fail
//! at once, unsent, with a message naming its policy — unless its options allow eviction
//! ([`RedisNodeOptions::allow_eviction`](super::RedisNodeOptions::allow_eviction)). A
//! request sent beside a check that then refuses is a failed vote, released as any is.
//! Releases and completions are never held back, so nothing is stranded.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use futures_util::future::{join, Either};
use redis::{Cmd, RedisError};
use tokio::sync::{watch, Notify};

use self::info::{verdict, Verdict};
use super::conn::{connection_lost, query, Conn};
use super::RedisNode;
use crate::node::NodeFailure;

mod info;

/// How often a checked master is checked again: a `CONFIG SET maxmemory-policy` on a live
/// connection goes unnoticed for at most this long.
pub(crate) const RECHECK_EVERY: Duration = Duration::from_secs(30);
/// ... and a master the voter abstains for: set to `noeviction`, it votes again within
/// about this long (its requests, refused before they reach it, notice no reconnection).
pub(crate) const RECHECK_ABSTAINING: Duration = Duration::from_secs(1);

/// A voter's eviction check, shared by its clones. See the module docs.
#[derive(Clone)]
pub(crate) struct Eviction {
    inner: Arc<Inner>,
}

struct Inner {
    /// The voter's name, for the logs.
    name: String,
    /// Whether a master that evicts votes all the same.
    allow: bool,
    /// The bound of one check (it may have to connect first).
    timeout: Duration,
    /// The fast path: whether acquires and extensions may go straight to the master (the
    /// current connection's master was checked, and may vote).
    votes: AtomicBool,
    state: Mutex<State>,
    /// Each check's outcome, for the requests waiting for one.
    outcome: watch::Sender<Outcome>,
    /// Wakes the task: a request waits for a check.
    wake: Arc<Notify>,
    /// Whether the task was started.
    started: AtomicBool,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // Ends the task now rather than at its next period.
        self.wake.notify_one();
    }
}

#[derive(Default)]
struct State {
    /// Whether the current connection's master was checked.
    checked: bool,
    /// Counts the resets: a check begun before one says nothing of the server after it.
    generation: u64,
    /// The last check's answer, for the status and the logs (kept while a new check is due).
    verdict: Option<Verdict>,
}

/// What became of the last check, for the requests waiting for one: answered (its verdict
/// is in the state), or not (the requests beside it fail as their own would have).
#[derive(Debug, Clone, Default)]
enum Outcome {
    /// No check yet.
    #[default]
    None,
    Answered,
    Failed {
        why: Arc<str>,
        timeout: bool,
    },
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
                votes: AtomicBool::new(false),
                state: Mutex::new(State::default()),
                outcome: watch::Sender::new(Outcome::None),
                wake: Arc::new(Notify::new()),
                started: AtomicBool::new(false),
            }),
        }
    }

    /// Whether an acquire or an extension may go to the master at once, unchecked (see
    /// [`RedisNode::gated`]).
    #[inline]
    fn votes(&self) -> bool {
        self.inner.votes.load(Ordering::Acquire)
    }

    /// The verdict on the current connection's master, if it was checked: `Ok` when the
    /// voter may vote, else why it abstains.
    fn settled(&self) -> Option<Result<(), NodeFailure>> {
        let state = self.inner.state();
        state.checked.then(|| self.inner.admits(&state))
    }

    /// Waits for a check of the current connection's master if none was made, then: `Ok` when
    /// the voter may vote, else why it abstains. A check that got no answer fails the
    /// request as unreachable (or timed out).
    async fn admit(&self, conn: &Conn) -> Result<(), NodeFailure> {
        loop {
            let mut outcomes = self.inner.outcome.subscribe();
            {
                let state = self.inner.state();
                if state.checked {
                    return self.inner.admits(&state);
                }
            }
            if !self.start(conn) {
                self.inner.wake.notify_one();
            }
            if outcomes.changed().await.is_err() {
                return Err(NodeFailure::new("the voter is shutting down").with_unreachable());
            }
            let outcome = outcomes.borrow_and_update().clone();
            if let Outcome::Failed { why, timeout } = outcome {
                let failure = NodeFailure::new(format!(
                    "could not check the master's maxmemory-policy: {why}"
                ));
                return Err(if timeout {
                    failure.with_timeout()
                } else {
                    failure.with_unreachable()
                });
            }
            // Answered: its verdict is read above (a connection lost since asks again).
        }
    }

    /// A request failed: when the connection is gone (redis-rs makes a new one, maybe to
    /// another server), the next acquires and extensions are checked again (beside a check,
    /// see [`RedisNode::gated`]).
    pub(super) fn failed(&self, e: &RedisError) {
        if connection_lost(e) {
            self.reset();
        }
    }

    /// The voter now talks to another server: the next acquires and extensions are checked
    /// beside a check of it.
    fn reset(&self) {
        self.inner.reset();
    }

    /// A handle for a Sentinel voter's discovery, to reset the check when it adopts another
    /// master. Weak: the check's task keeps the discovery alive (through the connection), so
    /// the discovery must not keep the check alive in turn.
    pub(super) fn on_new_master(&self) -> NewMaster {
        NewMaster(Arc::downgrade(&self.inner))
    }

    /// The state for [`Redlock::node_status`](crate::Redlock::node_status).
    pub(crate) fn status(&self) -> EvictionStatus {
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

    /// Starts the task, once: it checks at once, then every [`RECHECK_EVERY`] and whenever
    /// a request waits for a check. Returns whether this call started it.
    fn start(&self, conn: &Conn) -> bool {
        if self.inner.started.swap(true, Ordering::AcqRel) {
            return false;
        }
        let task = Task {
            inner: Arc::downgrade(&self.inner),
            wake: self.inner.wake.clone(),
            conn: conn.clone(),
            timeout: self.inner.timeout,
        };
        tokio::spawn(task.run());
        true
    }
}

/// Resets a voter's eviction check when its Sentinel discovery adopts another master (see
/// [`Eviction::on_new_master`]).
pub(crate) struct NewMaster(Weak<Inner>);

impl NewMaster {
    /// The discovery adopts another master: call before any request can reach it.
    pub(super) fn adopted(&self) {
        if let Some(inner) = self.0.upgrade() {
            inner.reset();
        }
    }
}

/// A request's future, boxed on the rare path.
type Boxed<'a, T> = Pin<Box<dyn Future<Output = Result<T, NodeFailure>> + Send + 'a>>;

impl RedisNode {
    /// `request` (an acquire or an extension) as the eviction check allows it: at once on a
    /// voter that votes (one atomic load); beside a check on a master not checked yet; not
    /// at all, failing at once, on a voter that abstains.
    pub(super) fn gated<'a, T, F>(&'a self, request: F) -> Either<F, Boxed<'a, T>>
    where
        F: Future<Output = Result<T, NodeFailure>> + Send + 'a,
        T: Send + 'a,
    {
        if self.eviction.votes() {
            return Either::Left(request);
        }
        // Boxed: the common path's future (allocated per request) stays small.
        Either::Right(Box::pin(async move {
            if let Some(verdict) = self.eviction.settled() {
                verdict?;
                return request.await;
            }
            // Sent at once, beside the check: a request that times out still reaches the
            // master (as any does), and the check costs no round trip of its own.
            let (admitted, answer) = join(self.eviction.admit(&self.conn), request).await;
            admitted.and(answer)
        }))
    }
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn reset(&self) {
        let mut state = self.state();
        state.checked = false;
        state.generation = state.generation.wrapping_add(1);
        self.votes.store(false, Ordering::Release);
    }

    /// Whether a checked voter votes, else why it abstains.
    fn admits(&self, state: &State) -> Result<(), NodeFailure> {
        match &state.verdict {
            Some(Verdict::Evicts {
                policy,
                maxmemory,
                master,
            }) if !self.allow => Err(NodeFailure::new(format!(
                "the master{} may evict keys (maxmemory-policy {policy}, maxmemory {maxmemory} \
                 bytes): a lock or a completion record could vanish before its ttl, so this \
                 voter abstains. Set `maxmemory-policy noeviction` on it (a Redis not shared \
                 with a cache), or accept the risk with RedisNodeOptions::allow_eviction()",
                master.as_ref().map(|m| format!(" {m}")).unwrap_or_default(),
            ))),
            _ => Ok(()),
        }
    }

    /// Records the answer of a check begun at `generation` (or why it got none) and tells
    /// the waiting requests; logs a verdict that changed. A check begun before a reset
    /// leaves the voter unchecked: its waiters ask again. Returns when to check again by
    /// itself (`None`: only when a request waits for it).
    fn record(&self, generation: u64, answer: Result<Verdict, Outcome>) -> Option<Duration> {
        let mut next = None;
        let outcome = match answer {
            Ok(verdict) => {
                let mut state = self.state();
                if state.verdict.as_ref() != Some(&verdict) {
                    self.log(state.verdict.as_ref(), &verdict);
                }
                let votes = !matches!(verdict, Verdict::Evicts { .. }) || self.allow;
                if state.generation == generation {
                    state.checked = true;
                    self.votes.store(votes, Ordering::Release);
                }
                state.verdict = Some(verdict);
                next = Some(if votes {
                    RECHECK_EVERY
                } else {
                    RECHECK_ABSTAINING
                });
                Outcome::Answered
            }
            Err(failed) => failed,
        };
        self.outcome.send_replace(outcome);
        next
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
                if self.allow {
                    tracing::warn!(
                        voter,
                        master,
                        policy,
                        maxmemory,
                        "the master may evict keys: a lock or a completion record can vanish \
                         before its ttl and a second holder follow; it votes all the same \
                         (allow_eviction). Set maxmemory-policy noeviction to be safe"
                    );
                } else {
                    tracing::warn!(
                        voter,
                        master,
                        policy,
                        maxmemory,
                        "the master may evict keys: a lock or a completion record could vanish \
                         before its ttl, so this voter abstains until its maxmemory-policy is \
                         noeviction (or its options allow eviction)"
                    );
                }
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

/// The voter's checks, in a task of their own.
struct Task {
    inner: Weak<Inner>,
    wake: Arc<Notify>,
    conn: Conn,
    timeout: Duration,
}

impl Task {
    async fn run(mut self) {
        let _alive = Alive(self.inner.clone());
        loop {
            let Some(generation) = self.inner.upgrade().map(|i| i.state().generation) else {
                return;
            };
            let (answer, soon) = self.check().await;
            let Some(inner) = self.inner.upgrade() else {
                return;
            };
            // Without an answer, the next check waits for a request that needs it.
            let mut period = inner.record(generation, answer).unwrap_or(Duration::MAX);
            if soon {
                period = period.min(RECHECK_ABSTAINING);
            }
            drop(inner);
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = self.wake.notified() => {}
            }
        }
    }

    /// One `INFO memory`, bounded by the timeout; and whether to check again soon (not every
    /// master of a Cluster answered).
    async fn check(&mut self) -> (Result<Verdict, Outcome>, bool) {
        let mut cmd = Cmd::new();
        cmd.arg("INFO").arg("memory");
        let reply = tokio::time::timeout(self.timeout, query(&mut self.conn, &cmd, false)).await;
        let (why, timeout) = match reply {
            Ok(Ok(reply)) => return (Ok(verdict(&reply)), false),
            Err(_) => (format!("no answer to INFO within {:?}", self.timeout), true),
            Ok(Err(e)) => {
                if let Some(inner) = self.inner.upgrade() {
                    Eviction { inner }.failed(&e);
                }
                if !connection_lost(&e) {
                    // An error reply: the master is there, its policy unknown.
                    let hint = if e.code() == Some("NOPERM") {
                        " (allow INFO for its user: ACL +info)"
                    } else {
                        ""
                    };
                    return (
                        Ok(Verdict::Unknown(format!("INFO memory: {e}{hint}"))),
                        false,
                    );
                }
                (e.to_string(), e.is_timeout())
            }
        };
        if is_cluster(&self.conn) {
            // One master down fails a Cluster's INFO, not the requests to the others' slots:
            // best effort, unknown until every master answers (checked again soon).
            let why = format!("not every master of the cluster answered INFO memory: {why}");
            return (Ok(Verdict::Unknown(why)), true);
        }
        let failed = Outcome::Failed {
            why: why.into(),
            timeout,
        };
        (Err(failed), false)
    }
}

fn is_cluster(conn: &Conn) -> bool {
    #[cfg(feature = "cluster")]
    if matches!(conn, Conn::Cluster(_)) {
        return true;
    }
    let _ = conn;
    false
}

/// Lives as long as the task: a task dropped with its runtime lets the next request start
/// another (and fails the requests that waited for it).
struct Alive(Weak<Inner>);

impl Drop for Alive {
    fn drop(&mut self) {
        if let Some(inner) = self.0.upgrade() {
            inner.started.store(false, Ordering::Release);
            inner.outcome.send_replace(Outcome::Failed {
                why: "the check's task ended (its runtime shut down?)".into(),
                timeout: false,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_evicting_master_abstains_unless_allowed() {
        let evicts = Verdict::Evicts {
            policy: "allkeys-lru".to_owned(),
            maxmemory: 1 << 20,
            master: None,
        };
        for allow in [false, true] {
            let e = Eviction::new("127.0.0.1:6379", allow, Duration::from_secs(1));
            assert!(!e.votes(), "unchecked: a request goes beside a check");
            assert_eq!(e.status(), EvictionStatus::default());
            e.inner.record(0, Ok(evicts.clone()));
            assert_eq!(e.votes(), allow);
            let admitted = e.inner.admits(&e.inner.state());
            assert_eq!(admitted.is_ok(), allow);
            if let Err(why) = admitted {
                let why = why.to_string();
                for part in ["allkeys-lru", "noeviction", "allow_eviction", "abstains"] {
                    assert!(why.contains(part), "{part} in {why}");
                }
            }
            let status = e.status();
            assert_eq!(status.policy.as_deref(), Some("allkeys-lru"));
            assert!(status.evicts);
            assert_eq!(status.abstains, !allow);
            // A lost connection: the next acquire goes beside a fresh check; the status keeps
            // the last verdict meanwhile.
            e.reset();
            assert!(!e.votes());
            assert_eq!(e.status(), status);
            let keeps = || {
                Ok(Verdict::Keeps {
                    policy: "noeviction".to_owned(),
                })
            };
            // A check begun before the reset says nothing of the new connection's server.
            e.inner.record(0, keeps());
            assert!(!e.votes());
            e.inner.record(1, keeps());
            assert!(e.votes());
            assert!(!e.status().abstains);
        }
    }

    /// A check that gets no answer changes no verdict, and the next one comes within the
    /// re-check period (a second while the voter abstains): the checks never stop.
    #[test]
    fn a_failed_check_keeps_the_verdict_and_the_rechecks() {
        let evicts = Verdict::Evicts {
            policy: "allkeys-lru".to_owned(),
            maxmemory: 1 << 20,
            master: None,
        };
        let keeps = Verdict::Keeps {
            policy: "noeviction".to_owned(),
        };
        for (verdict, period) in [(evicts, RECHECK_ABSTAINING), (keeps, RECHECK_EVERY)] {
            let e = Eviction::new("127.0.0.1:6379", false, Duration::from_secs(1));
            e.inner.record(0, Ok(verdict.clone()));
            let (votes, status) = (e.votes(), e.status());
            let failed = Outcome::Failed {
                why: "no answer to INFO within 2s".into(),
                timeout: true,
            };
            let next = e.inner.record(0, Err(failed));
            assert!(next.is_some_and(|n| n <= period), "{verdict:?}: {next:?}");
            assert_eq!((e.votes(), e.status()), (votes, status), "{verdict:?}");
        }
    }

    #[test]
    fn an_unknown_policy_votes() {
        let e = Eviction::new("127.0.0.1:6379", false, Duration::from_secs(1));
        e.inner.record(0, Ok(Verdict::Unknown("NOPERM".to_owned())));
        assert!(e.votes());
        assert_eq!(e.status(), EvictionStatus::default());
    }
}
