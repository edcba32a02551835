//! The Redlock algorithm: quorum locks over N independent nodes. The client,
//! [`Redlock`], knows nothing of HTTP; its public items are re-exported at the crate root,
//! whose documentation describes how a lock is taken.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use self::acquire::Acquisition;
use self::call::Voter;
use self::lease::Parked;
use self::options::Config;
use self::release::{CancelGuard, Release};
use self::state::{Grant, LeaseState};
use self::tally::{Skip, Vote};
pub(crate) use self::telemetry::{hashed, KeyHash};
use self::telemetry::{Acquiring, LockOutcome};
use self::token::Token;
use crate::error::Error;
use crate::node::{Acquire, MemoryNode};

mod acquire;
mod builder;
mod call;
mod completion;
mod extend;
mod fencing;
mod health;
mod lease;
mod options;
mod owed;
mod records;
mod release;
mod scope;
mod state;
mod tally;
mod telemetry;
#[cfg(test)]
mod tests;
mod token;

pub use self::builder::RedlockBuilder;
pub use self::health::NodeStatus;
pub use self::lease::{Lease, LeaseHandle};
pub use self::options::Retry;
pub use self::records::Claim;
pub use self::scope::Scope;

/// A Redlock client: locks resources on a quorum of independent nodes.
///
/// Cheap to clone (an `Arc` inside) and `Send + Sync`: build one at start-up and share it
/// with every task. See the [crate docs](crate#how-a-lock-is-taken) for the algorithm.
#[derive(Clone)]
pub struct Redlock {
    inner: Arc<Inner>,
}

struct Inner {
    nodes: Vec<Arc<Voter>>,
    quorum: usize,
    config: Config,
}

impl std::fmt::Debug for Redlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redlock")
            .field(
                "nodes",
                &self.inner.nodes.iter().map(|v| &v.name).collect::<Vec<_>>(),
            )
            .field("quorum", &self.inner.quorum)
            .field("config", &self.inner.config)
            .finish()
    }
}

impl Redlock {
    /// The longest resource name, in bytes (and the longest key prefix).
    pub const MAX_RESOURCE_LEN: usize = 1024;

    /// A client for the Redis voters at `urls`, with the default settings: masters
    /// (`redis://…`), Sentinel groups (`redis+sentinel://…`) and Clusters
    /// (`redis+cluster://…`, feature `cluster`), see [`RedisNode::open`](crate::node::RedisNode::open).
    ///
    /// Connections are made lazily in the background, so this succeeds while masters are
    /// down; it fails only on a malformed URL or an empty list. Must be called inside a
    /// Tokio runtime.
    pub fn new<I, S>(urls: I) -> crate::Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        urls.into_iter()
            .fold(Self::builder(), |b, url| b.redis(url.as_ref()))
            .build()
    }

    /// A client with one fresh in-process [`MemoryNode`]: mutual exclusion within this
    /// process only.
    pub fn in_memory() -> Self {
        Self::builder()
            .node(MemoryNode::new())
            .build()
            .expect("the default configuration with one node is valid")
    }

    /// Starts building a client.
    pub fn builder() -> RedlockBuilder {
        RedlockBuilder::default()
    }

    /// How many nodes must agree: `N/2 + 1`.
    pub fn quorum(&self) -> usize {
        self.inner.quorum
    }

    /// Whether leases carry fencing tokens ([`RedlockBuilder::fencing`]).
    pub fn fencing_enabled(&self) -> bool {
        self.inner.config.fencing
    }

    /// How many nodes vote.
    pub fn node_count(&self) -> usize {
        self.inner.nodes.len()
    }

    /// Each node's state, in the order the nodes were added: its name, whether it is
    /// suspended after repeated timeouts (see [`RedlockBuilder::suspend_after`]), its
    /// timeouts in a row, and a Redis master's eviction policy (whether it abstains for it,
    /// see [`RedisNodeOptions::allow_eviction`](crate::node::RedisNodeOptions::allow_eviction)).
    /// For health checks: a client with fewer than [`Redlock::quorum`] nodes neither
    /// suspended nor abstaining cannot lock.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// let redlock = tower_redlock::Redlock::in_memory();
    /// let status = redlock.node_status();
    /// assert_eq!(status[0].name(), "memory");
    /// assert!(!status[0].is_suspended());
    /// assert!(!status[0].is_abstaining());
    /// assert_eq!(status[0].eviction_policy(), None, "not a Redis master");
    /// # }
    /// ```
    pub fn node_status(&self) -> Vec<NodeStatus> {
        self.inner
            .nodes
            .iter()
            .map(|v| NodeStatus {
                name: v.name.to_string(),
                suspended: v.health.is_suspended(),
                timeouts: v.health.timeouts(),
                eviction: v.node.eviction(),
            })
            .collect()
    }

    /// How `resource`'s Redis key appears in logs: its short hash, as on the lock's spans.
    pub(crate) fn key_hash<'a>(&'a self, resource: &'a str) -> KeyHash<'a> {
        telemetry::hashed_in(&self.inner.config.key_prefix, resource)
    }

    /// Checks that `ttl` is usable with this client's drift allowance.
    pub(crate) fn check_ttl(&self, ttl: Duration) -> crate::Result<Duration> {
        self.inner.config.check_ttl(ttl)
    }

    /// The retry policy [`Redlock::lock`] uses.
    pub fn default_retry(&self) -> Retry {
        self.inner.config.retry
    }

    /// Locks `resource` for `ttl`, retrying with the client's retry policy while it is
    /// contended or unavailable.
    ///
    /// On success the [`Lease`] holds the token and the validity. On failure the error
    /// says whether the resource is held by someone else ([`Error::is_contended`], with
    /// [`Error::held_by`] and [`Error::retry_after`]), the quorum was unreachable
    /// ([`Error::is_unavailable`], with each node's error), or the input was bad
    /// ([`Error::is_invalid_input`]). After a failed try nothing of ours is left locked.
    pub async fn lock(&self, resource: &str, ttl: Duration) -> crate::Result<Lease> {
        self.lock_with(resource, ttl, self.inner.config.retry).await
    }

    /// Tries once to lock `resource` for `ttl`, without retrying.
    pub async fn try_lock(&self, resource: &str, ttl: Duration) -> crate::Result<Lease> {
        self.lock_with(resource, ttl, Retry::never()).await
    }

    /// Locks `resource` for `ttl` with an explicit retry policy.
    pub async fn lock_with(
        &self,
        resource: &str,
        ttl: Duration,
        retry: Retry,
    ) -> crate::Result<Lease> {
        match self.lock_inner(resource, ttl, retry, false).await? {
            Claim::Locked(lease) => Ok(lease),
            // A plain acquire counts a record as "held" (see `try_once`): never here.
            Claim::Completed(_) => Err(Error::invalid("a plain lock answered with a record")),
        }
    }

    /// The lock loop, in a `redlock.acquire` span; with `replay`, a node's completion record
    /// ends it (see [`Redlock::lock_unless_completed`]).
    pub(crate) async fn lock_inner(
        &self,
        resource: &str,
        ttl: Duration,
        retry: Retry,
        replay: bool,
    ) -> crate::Result<Claim> {
        let obs = Acquiring::start(ttl, replay);
        let checked = options::check_resource(resource).and_then(|()| self.check_ttl(ttl));
        let ttl = match checked {
            Ok(ttl) => ttl,
            Err(e) => {
                obs.done(LockOutcome::Failed(&e));
                return Err(e);
            }
        };
        let prefix = &self.inner.config.key_prefix;
        let key: Arc<str> = if prefix.is_empty() {
            resource.into()
        } else {
            format!("{prefix}{resource}").into()
        };
        obs.key(&key);
        let record_key = replay.then(|| records::record_key(&key));
        let fence_key = self.inner.config.fencing.then(|| fencing::fence_key(&key));

        let deadline = retry.max_wait().and_then(|w| obs.started.checked_add(w));
        let mut attempt = 0u32;
        let mut split_vote_retried = false;
        loop {
            attempt = attempt.saturating_add(1);
            // A try decided without I/O (every node suspended, in-process nodes) must still
            // let other tasks run: a loop of tries would otherwise starve its runtime.
            tokio::task::consume_budget().await;
            let token = Token::new();
            obs.attempt(attempt);
            let (record_key, fence_key) = (record_key.as_ref(), fence_key.as_ref());
            let try_once = || self.try_once(&key, record_key, fence_key, token, ttl, &obs);
            // The try runs in the span only when it is enabled, and awaited in place
            // otherwise: a wrapper (`telemetry::within`, or one around the whole loop) would
            // cost every lock call a move of its future (measured: ~270 instructions).
            let tried = match &obs.span {
                None => try_once().await,
                Some(span) => try_once().instrument(span.clone()).await,
            };
            match tried {
                Ok(Try::Granted(Granted { grant, parked })) => {
                    let deadline = grant.deadline;
                    let span = obs.lease_span(&key);
                    let state = LeaseState::new(key, prefix.len(), token, ttl, grant, span);
                    let lease = Lease::new(self.clone(), state, parked);
                    obs.done(LockOutcome::Locked(deadline));
                    return Ok(Claim::Locked(lease));
                }
                Ok(Try::Completed(record)) => {
                    obs.done(LockOutcome::Completed);
                    return Ok(Claim::Completed(record));
                }
                Err(e) => {
                    let mut pause = retry.next_delay();
                    // A try takes at most two node timeouts: the requests, then the release
                    // round of a failed try (a contended one rarely has any: it won no vote),
                    // or the holder's ttl, asked once for the last error.
                    let try_time = self.inner.config.node_timeout.saturating_mul(2);
                    let mut more =
                        attempt <= retry.retry_count() && Retry::fits(deadline, pause, try_time);
                    if !more && !split_vote_retried {
                        // A split vote between concurrent callers, not a holder: everyone
                        // backed off, so one quick try after a random pause usually settles it.
                        if let Some(p) = retry.split_vote_pause(&e) {
                            split_vote_retried = true;
                            (pause, more) = (p, Retry::fits(deadline, p, try_time));
                        }
                    }
                    if !more {
                        let e = self.ask_holder_ttl(&key, e).await.with_attempts(attempt);
                        obs.done(LockOutcome::Failed(&e));
                        return Err(e);
                    }
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }

    /// One try: returns the grant, or an error after releasing what it took.
    ///
    /// At the decision, the requests still unanswered are no longer polled: nothing is left
    /// running once the outcome is known. A granted lease keeps them (unpolled) until it is
    /// released, so that one already handed to its node's connection is written — the lock
    /// lands on every master that is up — and is followed there, in order, by the release; one
    /// never handed over is never sent. A failed try drops them at once. Either way no SET of
    /// ours can land after our release (the `Node` contract).
    ///
    /// With `record_key` (replay), each node is asked the replay acquire: any completion
    /// record ends the try with it, and what the try locked meanwhile is released.
    ///
    /// With `fence_key` (fencing), each node is asked the fenced acquire, and the grant
    /// carries the largest counter among the votes for (see `fencing`).
    async fn try_once(
        &self,
        key: &Arc<str>,
        record_key: Option<&Arc<str>>,
        fence_key: Option<&Arc<str>>,
        token: Token,
        ttl: Duration,
        obs: &Acquiring,
    ) -> crate::Result<Try> {
        let inner = &*self.inner;
        let n = inner.nodes.len();
        let timeout = inner.config.node_timeout;
        let start = Instant::now();
        // If this future is dropped from here on (a cancelled caller), the guard releases
        // the token everywhere in the background — after the requests, dropped first.
        let deadline = start + ttl - inner.config.drift(ttl);
        let guard = CancelGuard {
            client: Some(self.clone()),
            key: key.clone(),
            token,
            deadline,
            ttl,
        };
        let request = Acquisition::new(&inner.nodes, key, record_key, fence_key, token, ttl);
        let mut sent = tally::send(
            &inner.nodes,
            tally::all(n),
            timeout,
            Skip::Suspended,
            &|node| request.now(node),
            |v| {
                let request = request.clone();
                async move { request.send(&v.node).await }
            },
        );
        let replay = record_key.is_some();
        let mut tally = tally::count(&mut sent, n, inner.quorum, |a| match a {
            Acquire::Acquired => Vote::For,
            Acquire::Fenced { fence } => Vote::Fenced(fence),
            Acquire::Held { remaining } => Vote::Against(remaining),
            Acquire::Completed { record } if replay => Vote::Completed(record),
            // From a plain acquire (a node must not answer it): it locked nothing.
            Acquire::Completed { .. } => Vote::Against(None),
        })
        .await;
        // The answers that came meanwhile need no release if they hold nothing of ours.
        tally::drain_ready(&mut sent, |answer| tally.late_acquire(answer, replay));
        if replay {
            let until = deadline.min(start + timeout);
            records::await_every_answer(&mut sent, &mut tally, until).await;
            if tally.record.is_some() && !sent.is_empty() {
                // A record is the answer: the requests still in flight are settled in the
                // background, releasing only where they locked — not on every node asked.
                records::settle_in_background(
                    self.clone(),
                    sent.take(),
                    key.clone(),
                    token,
                    deadline,
                    ttl,
                );
            }
        }
        obs.tried(tally.votes(), tally.record.is_some());
        let holders = (tally.answered & !tally.not_ours) | sent.started();
        let granted =
            tally.record.is_none() && tally.for_ >= inner.quorum && Instant::now() < deadline;
        let fence = fence_key
            .zip(tally.fence)
            .filter(|_| granted)
            .map(|(key, token)| fencing::Fence {
                token,
                key: key.clone(),
                retention: request.retention,
            });
        // A fenced grant is handed out only once its token is settled (see `fencing`). Boxed:
        // the plain try's future (allocated per lock call) does not carry its state.
        let settled = match &fence {
            Some(f) => {
                let holding = tally.for_mask;
                let settle =
                    self.settle_fence(key, token, ttl, f, &tally.fences, holding, deadline);
                Box::pin(settle).await
            }
            None => Ok(()),
        };
        if granted && settled.is_ok() {
            guard.disarm();
            // The stragglers are kept, unpolled, with the lease (see `Lease`): what was handed
            // to a connection is written, what was not is never sent.
            let parked = (!sent.is_empty()).then(|| Parked::new(sent));
            return Ok(Try::Granted(Granted {
                grant: Grant {
                    start,
                    deadline,
                    holders,
                    fence,
                },
                parked,
            }));
        }
        drop(sent);

        // Failed: release on every node that may hold our token. Wait one round for the
        // nodes that voted for (they answered quickly), so that nothing of ours outlives this
        // try; the others, and any retry, go on in the background while the lock could be
        // valid — a try never waits longer than its node timeouts.
        if holders != 0 {
            let release = Release {
                key: key.clone(),
                token,
                mask: holders,
                needed: (tally.for_mask & holders).count_ones() as usize,
                patience: Instant::now(),
                until: deadline,
                gone: deadline + ttl,
                fence: None,
            };
            // Still guarded: if this future is dropped during the release round, the guard
            // releases everywhere in the background.
            let _ = self.release_token(release).await;
        }
        guard.disarm();
        if let Some(record) = tally.record {
            return Ok(Try::Completed(record));
        }
        let err = if let Err(unsettled) = settled {
            unsettled
        } else if tally.for_ >= inner.quorum {
            Error::unavailable(
                format!(
                    "a quorum answered, but too slowly to leave any validity of the {ttl:?} ttl"
                ),
                tally.errors,
            )
        } else if tally.against > 0 {
            // Any "held" answer makes it contended: the rule is stated on `Error`.
            let holder = tally.not_ours & !tally.error_mask();
            Error::contended(
                tally.against,
                tally.for_,
                n,
                tally.min_remaining,
                tally.errors,
            )
            .with_holder(holder.trailing_zeros() as usize)
        } else {
            Error::unavailable(
                format!(
                    "could not reach a quorum of {} of {n} nodes, and none said held",
                    inner.quorum
                ),
                tally.errors,
            )
        };
        Err(err)
    }

    /// Completes a contended error that is about to be returned with the holder's remaining
    /// ttl, asked from one node that said "held" (bounded by the node timeout), when no node
    /// reported it with its answer. Asked once per returned error, not on every try.
    async fn ask_holder_ttl(&self, key: &str, mut e: Error) -> Error {
        let Some(i) = e.holder_to_ask() else {
            return e;
        };
        let Some(voter) = self.inner.nodes.get(i) else {
            return e;
        };
        let Some(ask) = voter.node.remaining_ttl(key) else {
            return e;
        };
        let timeout = self.inner.config.node_timeout;
        if let Ok(Ok(Some(remaining))) = tokio::time::timeout(timeout, ask).await {
            e.set_retry_after(remaining);
        }
        e
    }

    /// Extends `lease` to `ttl` from now, on a quorum of nodes (compare-and-`PEXPIRE`).
    ///
    /// Fails with [`Error::is_lost`] when the lease's validity is already over — or runs out
    /// before a quorum extended it: the nodes that did extend are then released, so nothing
    /// outlives what the error reports — or the nodes no longer carry its token (an expired
    /// lock is never re-created), with
    /// [`Error::is_extension_limit`] at the extension cap, and with
    /// [`Error::is_unavailable`] when too few nodes answered — the lease then keeps its
    /// previous validity.
    pub async fn extend(&self, lease: &Lease, ttl: Duration) -> crate::Result<()> {
        lease.extend(ttl).await
    }

    /// Releases `lease` on every node. The same as [`Lease::release`].
    pub async fn unlock(&self, lease: Lease) -> crate::Result<()> {
        lease.release().await
    }

    /// Runs `work` while holding the lock on `resource`, and always releases it: on
    /// success, on error, and when the returned future is dropped (cancellation; the release
    /// is then spawned in the background).
    ///
    /// The lock is taken with the client's retry policy; if it cannot be taken, `work` does
    /// not run and the error is returned — the Rust form of the Ruby gem's `lock!`. `work`
    /// gets a [`LeaseHandle`] to check the validity. For auto-extension and abort on loss,
    /// see [`Redlock::scope`].
    pub async fn with_lock<F, Fut, T>(
        &self,
        resource: &str,
        ttl: Duration,
        work: F,
    ) -> crate::Result<T>
    where
        F: FnOnce(LeaseHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        self.scope(resource, ttl).run(work).await
    }

    /// A configurable scoped lock: like [`Redlock::with_lock`], with auto-extension,
    /// abort-on-loss and an explicit retry policy.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), tower_redlock::Error> {
    /// use std::time::Duration;
    /// use tower_redlock::Redlock;
    ///
    /// let redlock = Redlock::in_memory();
    /// let done = redlock
    ///     .scope("nightly-export", Duration::from_millis(300))
    ///     .keep_alive() // extended about every 100 ms while the work runs
    ///     .abort_on_loss() // if the lock is lost, stop the work and return an error
    ///     .run(|lease| async move {
    ///         tokio::time::sleep(Duration::from_millis(500)).await; // outlives the ttl
    ///         lease.extensions()
    ///     })
    ///     .await?;
    /// assert!(done >= 1);
    /// # Ok(()) }
    /// ```
    pub fn scope<'a>(&'a self, resource: &'a str, ttl: Duration) -> Scope<'a> {
        Scope::new(self, resource, ttl, self.inner.config.retry)
    }
}

/// The outcome of a try that did not fail.
enum Try {
    Granted(Granted),
    /// A node had the completion record (replay acquire).
    Completed(bytes::Bytes),
}

struct Granted {
    /// The validity, the nodes that may hold our token, the fencing token.
    grant: Grant,
    /// The requests still unanswered, kept with the lease.
    parked: Option<Parked>,
}
