//! The lock's calls on one Redis voter: the acquire (a script that refuses on a master that
//! may evict, or behind tenure protection; a plain `SET` where eviction is allowed), the
//! release and the extension, each gated by the eviction check.

use std::borrow::Cow;
use std::future::Future;
use std::time::Duration;

use redis::{Cmd, Value};

use super::conn::query;
use super::options::RestartGuard;
use super::scripts::{ACQUIRE, ACQUIRE_GUARDED, EXTEND, RELEASE};
use super::{held, int, script_cmd, ttl_ms, RedisNode};
use crate::node::{Acquire, CallError, Refusal};

/// An acquire a fan-out packs once for all the Redis masters that send it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Packed {
    /// `SET key token NX PX ttl` ([`RedisNode::set_cmd`]).
    Set,
    /// The script [`ACQUIRE`] with its eviction check ([`RedisNode::acquire_cmd`]).
    Script,
}

impl RedisNode {
    /// The script [`ACQUIRE`], which reads the master's eviction policy atomically with its `SET`
    /// and refuses on a master that may evict. With delayed-restart protection, the guarded script.
    /// Both return the holder's ttl at once. A voter that allows eviction (not behind protection,
    /// over a connection that never sends twice) sends the plain `SET key token NX PX ttl`. That
    /// costs a master less CPU than a script (`bench/benches/profile.rs`). A held key then answers
    /// without the holder's ttl. The client asks one node for it ([`RedisNode::remaining_ttl`])
    /// when a contended error is returned, not every node on every try.
    ///
    /// With `prepared` (what [`RedisNode::packed_acquire`] names), the `SET` or the script
    /// packed once for every master of a fan-out (measured in `bench/benches/profile.rs`: a command per node cost about a tenth of the
    /// throughput at five masters).
    ///
    /// Gated by the eviction check ([`RedisNode::gated`]).
    pub(crate) fn acquire_key<'a>(
        &'a self,
        key: &'a str,
        token: &'a str,
        ttl: Duration,
        prepared: Option<&'a Cmd>,
    ) -> impl Future<Output = Result<Acquire, CallError>> + Send + 'a {
        self.gated(self.acquire_key_unchecked(key, token, ttl, prepared))
    }

    /// [`RedisNode::acquire_key`] without the eviction check.
    async fn acquire_key_unchecked(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        prepared: Option<&Cmd>,
    ) -> Result<Acquire, CallError> {
        // The rare paths are boxed, so that the common one's future (allocated per request)
        // stays small.
        if !self.plain_acquire() {
            let v = Box::pin(self.acquire_scripted(key, token, ttl, prepared)).await?;
            // The script answers -3 when the key holds our token, else the holder's PTTL.
            return Ok(match int(&v)? {
                -3 => Acquire::Acquired,
                ms => held(ms),
            });
        }
        let mut conn = self.conn.clone();
        let own;
        let cmd = match prepared {
            Some(cmd) => cmd,
            None => {
                own = Self::set_cmd(key, token, ttl);
                &own
            }
        };
        match self.noted(query(&mut conn, cmd, true).await)? {
            Value::Okay => Ok(Acquire::Acquired),
            // The holder's ttl is asked only if the caller needs it (`remaining_ttl`), from
            // one node: a contended try costs each master one command, as an uncontended one.
            Value::Nil => Ok(Acquire::Held { remaining: None }),
            other => Err(CallError::new(format!(
                "unexpected reply to SET NX PX: {other:?}"
            ))),
        }
    }

    /// The remaining ttl of `key` (`PTTL`): `None` when it has no expiry or is gone.
    pub(crate) async fn remaining_ttl(&self, key: &str) -> Result<Option<Duration>, CallError> {
        let mut conn = self.conn.clone();
        let mut cmd = Cmd::with_capacity(2, 4 + key.len());
        cmd.arg("PTTL").arg(key);
        match held(int(&self.noted(query(&mut conn, &cmd, false).await)?)?) {
            Acquire::Held { remaining } => Ok(remaining),
            Acquire::Acquired
            | Acquire::Completed { .. }
            | Acquire::CompletedIfFree { .. }
            | Acquire::Fenced { .. } => Ok(None),
        }
    }

    /// `SET key token NX PX ttl`, packed: the same for every master of a fan-out.
    pub(crate) fn set_cmd(key: &str, token: &str, ttl: Duration) -> Cmd {
        let mut cmd = Cmd::with_capacity(6, 3 + key.len() + token.len() + 2 + 2 + 20);
        cmd.arg("SET")
            .arg(key)
            .arg(token)
            .arg("NX")
            .arg("PX")
            .arg(ttl_ms(ttl));
        cmd
    }

    /// The release's `EVALSHA`, packed: the same for every master of a fan-out whose
    /// [`RedisNode::wake`] is `wake`.
    pub(crate) fn release_cmd(key: &str, token: &str, wake: Option<&str>) -> Cmd {
        script_cmd("EVALSHA", RELEASE.sha1(), &[key], token, [None, None], wake)
    }

    /// Whether this node acquires with the plain `SET` of [`RedisNode::set_cmd`]. It does for a
    /// voter that allows eviction, not behind tenure protection, and over a connection that never
    /// sends a request twice. A voter that does not allow eviction acquires with the script
    /// [`ACQUIRE`] instead, which reads the master's policy atomically with its `SET`. A Cluster's
    /// connection does send a request twice, after a dropped connection: there the script takes our
    /// own token for a grant.
    pub(crate) fn plain_acquire(&self) -> bool {
        self.eviction.allows() && self.guard.is_none() && !self.conn.sends_again()
    }

    /// Which acquire packed once for a fan-out ([`RedisNode::set_cmd`], [`RedisNode::acquire_cmd`])
    /// this node sends, if any. A node behind tenure protection sends none (its script takes the
    /// markers' keys). Nor does a Cluster voter that allows eviction, with its lenient script
    /// (rare: it packs its own).
    pub(crate) fn packed_acquire(&self) -> Option<Packed> {
        if self.plain_acquire() {
            Some(Packed::Set)
        } else if self.guard.is_none() && !self.eviction.allows() {
            Some(Packed::Script)
        } else {
            None
        }
    }

    /// The `EVAL` of [`ACQUIRE`] (with its eviction check; sent whole, as every acquire:
    /// [`Script::whole`](super::scripts::Script::whole)), packed: the same for every master
    /// of a fan-out whose [`RedisNode::packed_acquire`] is [`Packed::Script`].
    pub(crate) fn acquire_cmd(key: &str, token: &str, ttl: Duration) -> Cmd {
        script_cmd(
            "EVAL",
            ACQUIRE.source(),
            &[key],
            token,
            [Some(ttl_ms(ttl)), None],
            None,
        )
    }

    /// Compare-and-delete: whether `key` held `token` and was deleted. With `prepared`
    /// ([`RedisNode::release_cmd`]), the command packed once for the fan-out.
    pub(crate) async fn release_key(
        &self,
        key: &str,
        token: &str,
        prepared: Option<&Cmd>,
    ) -> Result<bool, CallError> {
        let v = self
            .run(&RELEASE, &[key], token, [None, None], self.wake, prepared)
            .await?;
        Ok(int(&v)? == 1)
    }

    /// Compare-and-`PEXPIRE`: whether `key` held `token` and now has the ttl `ttl`. Gated by
    /// the eviction check ([`RedisNode::gated`]).
    pub(crate) fn extend_key<'a>(
        &'a self,
        key: &'a str,
        token: &'a str,
        ttl: Duration,
    ) -> impl Future<Output = Result<bool, CallError>> + Send + 'a {
        self.gated(self.extend_key_unchecked(key, token, ttl))
    }

    async fn extend_key_unchecked(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<bool, CallError> {
        let v = self
            .run(
                &EXTEND,
                &[key],
                token,
                [Some(ttl_ms(ttl)), None],
                None,
                None,
            )
            .await?;
        Ok(int(&v)? == 1)
    }

    /// The tenure markers' keys for the lock `key` (in its slot on a Cluster): what the
    /// guarded scripts take as their last two keys.
    pub(super) fn markers<'a>(&self, guard: &'a RestartGuard, key: &str) -> [Cow<'a, str>; 2] {
        [
            self.conn.aux_key(key, &guard.key),
            self.conn.aux_key(key, &guard.repl_key),
        ]
    }

    /// The acquire as a script: behind tenure protection, or [`ACQUIRE`] (with `prepared`,
    /// [`RedisNode::acquire_cmd`] packed once for the fan-out).
    async fn acquire_scripted(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        prepared: Option<&Cmd>,
    ) -> Result<Value, CallError> {
        match &self.guard {
            Some(guard) => self.acquire_guarded(guard, key, token, ttl).await,
            None => Ok(self
                .run(
                    &ACQUIRE,
                    &[key],
                    token,
                    [Some(ttl_ms(ttl)), None],
                    None,
                    prepared,
                )
                .await?),
        }
    }

    /// The acquire script behind tenure (delayed-restart) protection: a master whose tenure is
    /// younger than the longest ttl does not vote.
    async fn acquire_guarded(
        &self,
        guard: &RestartGuard,
        key: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<Value, CallError> {
        guard.check(ttl)?;
        let [marker, repl_marker] = self.markers(guard, key);
        let keys = [key, marker.as_ref(), repl_marker.as_ref()];
        let max_ms = Some(ttl_ms(guard.window));
        let v = self
            .run(
                &ACQUIRE_GUARDED,
                &keys,
                token,
                [Some(ttl_ms(ttl)), max_ms],
                None,
                None,
            )
            .await?;
        if int(&v)? == -4 {
            return Err(CallError::new(format!(
                "the master's tenure is younger than {:?} (a restart, a failover, a flush, \
                 or the first use of protection): abstains (delayed-restart protection)",
                guard.window
            ))
            .with_refusal(Refusal::Protected));
        }
        Ok(v)
    }
}
