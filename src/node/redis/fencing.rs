//! Fencing counters on a Redis master: the fenced acquires (the lock and the counter's bump,
//! one script; with or without the completion record's check), the fenced extension that
//! settles a grant's token, and the fenced release and completion (the counter raised to the
//! lease's token, then `PEXPIRE`, compare-and-delete or the record's store).

use std::time::Duration;

use redis::Value;

use super::records::{completed, if_free_mark};
use super::scripts::{
    Script, ACQUIRE_FENCED, ACQUIRE_UNLESS_COMPLETED_FENCED, COMPLETE_FENCED, COMPLETE_FREE_FENCED,
    EXTEND_FENCED, RELEASE_FENCED,
};
use super::{held, int, ttl_ms, RedisNode};
use crate::node::{Acquire, CallError, FenceFloor, Refusal};

/// Counters stay below 2^53: Lua numbers are doubles (the clock in microseconds reaches it in
/// the year 2255).
const MAX_FENCE: u64 = 1 << 53;

impl RedisNode {
    /// The fenced acquire (see [`AcquireRequest::fence`](crate::node::AcquireRequest)).
    pub(crate) async fn acquire_fenced_key(
        &self,
        key: &str,
        fence_key: &str,
        token: &str,
        ttl: Duration,
        retention: Duration,
    ) -> Result<Acquire, CallError> {
        self.gated(self.fenced_acquire(
            &ACQUIRE_FENCED,
            key,
            None,
            fence_key,
            token,
            ttl,
            retention,
        ))
        .await
    }

    /// The fenced replay acquire (see
    /// [`AcquireRequest`](crate::node::AcquireRequest) with a record key and a fence).
    pub(crate) async fn acquire_unless_completed_fenced_key(
        &self,
        key: &str,
        record_key: &str,
        fence_key: &str,
        token: &str,
        ttl: Duration,
        retention: Duration,
    ) -> Result<Acquire, CallError> {
        let script = &ACQUIRE_UNLESS_COMPLETED_FENCED;
        self.gated(self.fenced_acquire(
            script,
            key,
            Some(record_key),
            fence_key,
            token,
            ttl,
            retention,
        ))
        .await
    }

    /// Runs a fenced acquire script: KEYS lock[, record], counter[, tenure marker]; ARGV
    /// token, ttl, the longest ttl (or "0"), the counter's retention.
    #[allow(clippy::too_many_arguments)]
    async fn fenced_acquire(
        &self,
        script: &Script,
        key: &str,
        record_key: Option<&str>,
        fence_key: &str,
        token: &str,
        ttl: Duration,
        retention: Duration,
    ) -> Result<Acquire, CallError> {
        let ttl_arg = ttl_ms(ttl).to_string();
        let retention_arg = ttl_ms(retention).to_string();
        let mark = record_key.map(|r| self.conn.aux_key(key, &if_free_mark(r)).into_owned());
        let record_key = record_key.map(|r| self.conn.aux_key(key, r));
        let fence_key = self.conn.aux_key(key, fence_key);
        let markers = self.guard.as_ref().map(|g| self.markers(g, key));
        let mut keys = vec![key];
        keys.extend(record_key.as_deref());
        keys.extend(mark.as_deref());
        keys.push(fence_key.as_ref());
        let max_arg = match &self.guard {
            Some(guard) => {
                guard.check(ttl)?;
                keys.extend(markers.iter().flatten().map(AsRef::as_ref));
                ttl_ms(guard.window).to_string()
            }
            None => "0".to_owned(),
        };
        let args = [
            token.as_bytes(),
            ttl_arg.as_bytes(),
            max_arg.as_bytes(),
            retention_arg.as_bytes(),
        ];
        let reply = self.run_binary(script, &keys, &args).await?;
        let Value::Array(items) = reply else {
            return Err(unexpected(&reply));
        };
        if let Some(done) = completed(&items).filter(|_| record_key.is_some()) {
            return Ok(done);
        }
        match (items.first().map(int).transpose()?, items.get(1)) {
            (Some(1), Some(fence)) => match u64::try_from(int(fence)?) {
                // Lua numbers are doubles: above 2^53 a counter no longer grows by one.
                Ok(fence) if fence < MAX_FENCE => Ok(Acquire::Fenced { fence }),
                _ => Err(CallError::new(
                    "the fencing counter reached 2^53, beyond what the master's Lua counts \
                     exactly: abstains",
                )),
            },
            (Some(0), Some(pttl)) => Ok(held(int(pttl)?)),
            (Some(3), None) => Err(CallError::new(
                "the master's tenure is younger than the longest ttl: abstains \
                 (delayed-restart protection)",
            )
            .with_refusal(Refusal::Protected)),
            (Some(4), None) => Err(CallError::new(
                "the fencing counter's key (the lock's key + \":fence\") holds something \
                 else, a lock of a resource named like it: not overwritten, abstains",
            )
            .with_refusal(Refusal::WrongType)),
            _ => Err(unexpected(&Value::Array(items))),
        }
    }

    /// The fenced release (see [`ReleaseRequest::fence`](crate::node::ReleaseRequest)).
    pub(crate) async fn release_fenced_key(
        &self,
        key: &str,
        fence_key: &str,
        token: &str,
        floor: u64,
        retention: Duration,
    ) -> Result<bool, CallError> {
        let floor = floor.to_string();
        let retention = ttl_ms(retention).to_string();
        let fence_key = self.conn.aux_key(key, fence_key);
        let args = [token.as_bytes(), floor.as_bytes(), retention.as_bytes()];
        let args = self.with_wake(&args);
        let reply = self
            .run_binary(&RELEASE_FENCED, &[key, fence_key.as_ref()], &args)
            .await?;
        Ok(int(&reply)? == 1)
    }

    /// The fenced extension (see [`ExtendRequest::fence`](crate::node::ExtendRequest)).
    pub(crate) async fn extend_fenced_key(
        &self,
        key: &str,
        token: &str,
        ttl: Duration,
        fence: FenceFloor<'_>,
    ) -> Result<bool, CallError> {
        let ttl = ttl_ms(ttl).to_string();
        let floor = fence.floor.to_string();
        let retention = ttl_ms(fence.retention).to_string();
        let fence_key = self.conn.aux_key(key, fence.key);
        let args = [
            token.as_bytes(),
            ttl.as_bytes(),
            floor.as_bytes(),
            retention.as_bytes(),
        ];
        let reply = self
            .run_binary(&EXTEND_FENCED, &[key, fence_key.as_ref()], &args)
            .await?;
        Ok(int(&reply)? == 1)
    }

    /// The fenced completion (see [`CompleteRequest::fence`](crate::node::CompleteRequest));
    /// `if_free`, stored where the lock is absent too ([`COMPLETE_FREE_FENCED`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn complete_fenced_key(
        &self,
        key: &str,
        record_key: &str,
        token: &str,
        record: &[u8],
        retention: Duration,
        fence: FenceFloor<'_>,
        if_free: bool,
    ) -> Result<bool, CallError> {
        let retention = ttl_ms(retention).to_string();
        let floor = fence.floor.to_string();
        let fence_retention = ttl_ms(fence.retention).to_string();
        let mark = self
            .conn
            .aux_key(key, &if_free_mark(record_key))
            .into_owned();
        let record_key = self.conn.aux_key(key, record_key);
        let fence_key = self.conn.aux_key(key, fence.key);
        let args = [
            token.as_bytes(),
            retention.as_bytes(),
            record,
            floor.as_bytes(),
            fence_retention.as_bytes(),
        ];
        let args = self.with_wake(&args);
        let keys = [key, record_key.as_ref(), &mark, fence_key.as_ref()];
        let script = if if_free {
            &COMPLETE_FREE_FENCED
        } else {
            &COMPLETE_FENCED
        };
        let reply = self.run_binary(script, &keys, &args).await?;
        Ok(int(&reply)? == 1)
    }
}

fn unexpected(v: &Value) -> CallError {
    CallError::new(format!("unexpected reply from the fencing script: {v:?}"))
}
