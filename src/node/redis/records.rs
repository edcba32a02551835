//! Completion records on a Redis master, each one script. One is the replay acquire (a stored
//! record answers instead of a lock). The other is the fenced write that stores a record and ends
//! the lock (in its "if free" form, also where the lock is gone).

use std::time::Duration;

use bytes::Bytes;
use redis::{Cmd, Value};

use super::scripts::{Script, ACQUIRE_UNLESS_COMPLETED, COMPLETE, COMPLETE_FREE};
use super::{held, int, query, ttl_ms, RedisNode};
use crate::node::{Acquire, CallError, Refusal};

impl RedisNode {
    /// The replay acquire (see [`AcquireRequest::record_key`](crate::node::AcquireRequest)), gated
    /// by the eviction check (a record on a master that evicts may be gone).
    pub(crate) async fn acquire_unless_completed_key(
        &self,
        key: &str,
        record_key: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<Acquire, CallError> {
        self.gated(self.acquire_unless_completed_unchecked(key, record_key, token, ttl))
            .await
    }

    async fn acquire_unless_completed_unchecked(
        &self,
        key: &str,
        record_key: &str,
        token: &str,
        ttl: Duration,
    ) -> Result<Acquire, CallError> {
        let ttl_arg = ttl_ms(ttl).to_string();
        let mark = self
            .conn
            .aux_key(key, &if_free_mark(record_key))
            .into_owned();
        let record_key = self.conn.aux_key(key, record_key);
        let markers = self.guard.as_ref().map(|g| self.markers(g, key));
        let mut keys = vec![key, record_key.as_ref(), mark.as_str()];
        let mut args = vec![token.as_bytes(), ttl_arg.as_bytes()];
        let max_arg;
        if let Some(guard) = &self.guard {
            guard.check(ttl)?;
            max_arg = ttl_ms(guard.window).to_string();
            keys.extend(markers.iter().flatten().map(AsRef::as_ref));
            args.push(max_arg.as_bytes());
        }
        let reply = self
            .run_binary(&ACQUIRE_UNLESS_COMPLETED, &keys, &args)
            .await?;
        let Value::Array(items) = reply else {
            return Err(unexpected(&reply));
        };
        if let Some(done) = completed(&items) {
            return Ok(done);
        }
        match (items.first().map(int).transpose()?, items.get(1)) {
            (Some(1), None) => Ok(Acquire::Acquired),
            (Some(0), Some(pttl)) => Ok(held(int(pttl)?)),
            (Some(3), None) => Err(CallError::new(
                "the master's tenure is too young to say there is no record: abstains (delayed-restart \
                 protection)",
            )
            .with_refusal(Refusal::Protected)),
            _ => Err(unexpected(&Value::Array(items))),
        }
    }

    /// The completion (see [`Node::complete`](crate::node::Node::complete)), fenced by the lock
    /// — or, `if_free`, by its absence too ([`COMPLETE_FREE`]).
    pub(crate) async fn complete_key(
        &self,
        key: &str,
        record_key: &str,
        token: &str,
        record: &[u8],
        retention: Duration,
        if_free: bool,
    ) -> Result<bool, CallError> {
        let retention = ttl_ms(retention).to_string();
        let args = [token.as_bytes(), retention.as_bytes(), record];
        let args = self.with_wake(&args);
        let mark = self
            .conn
            .aux_key(key, &if_free_mark(record_key))
            .into_owned();
        let record_key = self.conn.aux_key(key, record_key);
        let script = if if_free { &COMPLETE_FREE } else { &COMPLETE };
        let reply = self
            .run_binary(script, &[key, record_key.as_ref(), &mark], &args)
            .await?;
        Ok(int(&reply)? == 1)
    }

    /// A deleting script's arguments `args`, then the wake-up's channel kind when this voter
    /// wakes waiters ([`RedisNode::wake`]).
    pub(super) fn with_wake<'a>(&self, args: &[&'a [u8]]) -> Vec<&'a [u8]> {
        let mut all = Vec::with_capacity(args.len() + 1);
        all.extend_from_slice(args);
        all.extend(self.wake.map(str::as_bytes));
        all
    }

    /// `EVALSHA`, falling back to `EVAL` on `NOSCRIPT`, with binary arguments; an acquire
    /// `EVAL` at once ([`Script::whole`]).
    pub(super) async fn run_binary(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&[u8]],
    ) -> Result<Value, CallError> {
        let cmd = |verb: &str, body: &str| {
            let mut cmd = Cmd::new();
            cmd.arg(verb).arg(body).arg(keys.len()).arg(keys);
            for a in args {
                cmd.arg(*a);
            }
            cmd
        };
        let script = script.for_voter(self.eviction.allows());
        let mut conn = self.conn.clone();
        let votes = script.votes();
        if script.whole() {
            // An acquire: one request, whatever the master's script cache holds.
            return Ok(self.noted(query(&mut conn, &cmd("EVAL", script.source()), votes).await)?);
        }
        match self.noted(query(&mut conn, &cmd("EVALSHA", script.sha1()), votes).await) {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                Ok(self.noted(query(&mut conn, &cmd("EVAL", script.source()), votes).await)?)
            }
            r => Ok(r?),
        }
    }
}

/// The key of the mark beside a record stored "if free" (by a lease that may have been
/// lost: [`CompleteRequest::if_free`](crate::node::CompleteRequest::if_free)):
/// `<record key>:if-free`. It lives and expires with its record; a record stored under a
/// valid lease has none.
pub(super) fn if_free_mark(record_key: &str) -> String {
    format!("{record_key}:if-free")
}

/// A replay acquire's record answer: `{2, record}`, or `{2, record, 1, PTTL}` for one stored
/// "if free" (the PTTL in ms; an older script's `{2, record, 1}` has none); `None` for any
/// other answer.
pub(super) fn completed(items: &[Value]) -> Option<Acquire> {
    let (Some(Value::Int(2)), Some(Value::BulkString(record))) = (items.first(), items.get(1))
    else {
        return None;
    };
    let record = Bytes::copy_from_slice(record);
    Some(match items.get(2) {
        Some(Value::Int(1)) => Acquire::CompletedIfFree {
            record,
            remaining: match items.get(3) {
                Some(&Value::Int(ms)) if ms > 0 => Some(Duration::from_millis(ms as u64)),
                _ => None,
            },
        },
        _ => Acquire::Completed { record },
    })
}

fn unexpected(v: &Value) -> CallError {
    CallError::new(format!("unexpected reply from the record script: {v:?}"))
}
