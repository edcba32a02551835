//! Fencing counters on a Redis master: the fenced acquire (the lock and the counter's bump,
//! one script) and the fenced release (the counter raised to the lease's token, then
//! compare-and-delete).

use std::time::Duration;

use redis::Value;

use super::scripts::{ACQUIRE_FENCED, RELEASE_FENCED};
use super::{held, int, ttl_ms, RedisNode};
use crate::node::{Acquire, NodeFailure};

impl RedisNode {
    /// The fenced acquire (see [`Node::acquire_fenced`](crate::node::Node)).
    pub(crate) async fn acquire_fenced_key(
        &self,
        key: &str,
        fence_key: &str,
        token: &str,
        ttl: Duration,
        retention: Duration,
    ) -> Result<Acquire, NodeFailure> {
        let ttl_arg = ttl_ms(ttl).to_string();
        let retention_arg = ttl_ms(retention).to_string();
        let fence_key = self.conn.aux_key(key, fence_key);
        let guard_key = self.guard.as_ref().map(|g| self.conn.aux_key(key, &g.key));
        let mut keys = vec![key, fence_key.as_ref()];
        let max_arg = match &self.guard {
            Some(guard) => {
                if ttl > guard.max_ttl {
                    return Err(NodeFailure::new(format!(
                        "the ttl {ttl:?} exceeds the {:?} of delayed-restart protection; raise it",
                        guard.max_ttl
                    )));
                }
                keys.extend(guard_key.as_deref());
                ttl_ms(guard.max_ttl).to_string()
            }
            None => "0".to_owned(),
        };
        let args = [
            token.as_bytes(),
            ttl_arg.as_bytes(),
            max_arg.as_bytes(),
            retention_arg.as_bytes(),
        ];
        let reply = self.run_binary(&ACQUIRE_FENCED, &keys, &args).await?;
        let Value::Array(items) = reply else {
            return Err(unexpected(&reply));
        };
        match (items.first().map(int).transpose()?, items.get(1)) {
            (Some(1), Some(fence)) => Ok(Acquire::Fenced {
                fence: u64::try_from(int(fence)?).map_err(|_| unexpected(fence))?,
            }),
            (Some(0), Some(pttl)) => Ok(held(int(pttl)?)),
            (Some(3), None) => Err(NodeFailure::new(
                "the master's tenure is younger than the longest ttl: abstains \
                 (delayed-restart protection)",
            )),
            (Some(4), None) => Err(NodeFailure::new(
                "the fencing counter's key (the lock's key + \":fence\") holds something \
                 else, a lock of a resource named like it: not overwritten, abstains",
            )),
            _ => Err(unexpected(&Value::Array(items))),
        }
    }

    /// The fenced release (see [`Node::release_fenced`](crate::node::Node)).
    pub(crate) async fn release_fenced_key(
        &self,
        key: &str,
        fence_key: &str,
        token: &str,
        floor: u64,
        retention: Duration,
    ) -> Result<bool, NodeFailure> {
        let floor = floor.to_string();
        let retention = ttl_ms(retention).to_string();
        let fence_key = self.conn.aux_key(key, fence_key);
        let args = [token.as_bytes(), floor.as_bytes(), retention.as_bytes()];
        let reply = self
            .run_binary(&RELEASE_FENCED, &[key, fence_key.as_ref()], &args)
            .await?;
        Ok(int(&reply)? == 1)
    }
}

fn unexpected(v: &Value) -> NodeFailure {
    NodeFailure::new(format!("unexpected reply from the fencing script: {v:?}"))
}
