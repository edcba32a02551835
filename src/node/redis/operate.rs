//! An operator's verbs on one Redis voter. One reads what it holds at a key (plain reads: `GET`,
//! `PTTL`, `GETRANGE`, `STRLEN`, so that a user allowed only to read can inspect). One lists the
//! locks under a prefix (`SCAN`). One is the forced deletion of a stuck lock (one script).

use std::time::Duration;

use redis::{Cmd, Value};

use super::conn::query;
use super::records::if_free_mark;
use super::scripts::FORCE_RELEASE;
use super::RedisNode;
use crate::node::{
    CallError, ForceReleaseRequest, Forced, HeldKey, InspectRequest, KeyState, RecordState, Refusal,
};

/// The fencing counter's form in Redis (`TRF1:<counter>`, see `scripts.rs`).
const FENCE_TAG: &str = "TRF1:";
/// A completion record's tag (`TRR1\n<record>`, see `scripts.rs`).
const RECORD_TAG: &str = "TRR1\n";

/// Whether a value is one of ours that is no lock: a counter, a record, a tenure marker, a
/// fenced write's token, or the first tenure marker's untagged `<run_id>:<ms>` (what
/// [`FORCE_RELEASE`] spares).
fn is_tagged(value: &str) -> bool {
    ["TRF1:", "TRR1\n", "TRT2:", "TRW1:"]
        .iter()
        .any(|tag| value.starts_with(tag))
        || is_first_marker(value)
}

/// `<hex>:<digits>`: the first tenure marker's form (Lua's `^%x+:%d+$`).
fn is_first_marker(value: &str) -> bool {
    value.split_once(':').is_some_and(|(id, ms)| {
        !id.is_empty()
            && !ms.is_empty()
            && id.bytes().all(|b| b.is_ascii_hexdigit())
            && ms.bytes().all(|b| b.is_ascii_digit())
    })
}

impl RedisNode {
    /// [`Operation::Inspect`](crate::node::Operation::Inspect): the lock, its ttl, the counter, the
    /// record's size and ttl, each read by its own command (the lock's value first: a lock
    /// that expires between its `GET` and its `PTTL` is reported free). A value tagged as one
    /// of ours (a counter, a record, a marker) is no lock; a record is one only if tagged.
    pub(crate) async fn inspect_keys(
        &self,
        request: InspectRequest<'_>,
    ) -> Result<KeyState, CallError> {
        let fence_key = self.conn.aux_key(request.key, request.fence_key);
        let record_key = self.conn.aux_key(request.key, request.record_key);
        let mut state = KeyState::new();
        if let Some(token) = self.read("GET", request.key).await?.into_text()? {
            if !is_tagged(&token) {
                if let Some(ttl) = self.pttl(request.key).await? {
                    state.lock = Some((token, ttl));
                }
            }
        }
        state.fence = self
            .read("GET", &fence_key)
            .await?
            .into_text()?
            .and_then(|raw| raw.strip_prefix(FENCE_TAG)?.parse().ok());
        let mut head = Cmd::new();
        head.arg("GETRANGE").arg(record_key.as_ref()).arg(0).arg(4);
        let tag = self.send(&head).await?.into_text()?;
        if tag.as_deref() == Some(RECORD_TAG) {
            if let Some(ttl) = self.pttl(&record_key).await? {
                let len = self.read("STRLEN", &record_key).await?.int()?;
                let size = usize::try_from(len)
                    .unwrap_or(0)
                    .saturating_sub(RECORD_TAG.len());
                state.record = Some(RecordState::new(size, ttl));
            }
        }
        Ok(state)
    }

    /// [`Operation::ForceRelease`](crate::node::Operation::ForceRelease): one script
    /// ([`FORCE_RELEASE`]) deletes the named holder's lock (never a value tagged as ours)
    /// and, when asked, the record (only a record; with a holder named, only with its
    /// lock). The fencing counter is never deleted.
    pub(crate) async fn force_release_keys(
        &self,
        request: ForceReleaseRequest<'_>,
    ) -> Result<Forced, CallError> {
        let record_key = request
            .record_key
            .map(|r| self.conn.aux_key(request.key, r));
        let mark = request.record_key.map(|r| {
            self.conn
                .aux_key(request.key, &if_free_mark(r))
                .into_owned()
        });
        let mut keys = vec![request.key];
        keys.extend(record_key.as_deref());
        keys.extend(mark.as_deref());
        let holder = request.holder.unwrap_or("");
        let reply = self
            .run_binary(&FORCE_RELEASE, &keys, &self.with_wake(&[holder.as_bytes()]))
            .await?;
        match reply {
            Value::Array(items) if items.len() == 2 => {
                let deleted = |v: &Value| matches!(v, Value::Int(n) if *n > 0);
                Ok(Forced::new(deleted(&items[0]), deleted(&items[1])))
            }
            other => Err(CallError::new(format!(
                "unexpected reply from the forced release: {other:?}"
            ))),
        }
    }

    /// [`Operation::Scan`](crate::node::Operation::Scan): `SCAN … MATCH <prefix>*`, then each lock's
    /// `GET` and `PTTL`; values tagged as ours (the counters, records and markers beside the
    /// locks) and keys of another kind are left out. Not on a Redis Cluster (its keys are spread over its
    /// masters).
    pub(crate) async fn scan_keys(
        &self,
        prefix: &str,
        limit: usize,
    ) -> Result<Vec<HeldKey>, CallError> {
        if self.conn.sends_again() {
            return Err(CallError::new(format!(
                "{}: listing the keys of a Redis Cluster is not supported (inspect a key instead)",
                self.name
            )));
        }
        let pattern = format!("{}*", glob_escape(prefix));
        let mut held = Vec::new();
        let mut cursor = 0u64;
        loop {
            let mut cmd = Cmd::new();
            cmd.arg("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000);
            let mut conn = self.conn.clone();
            let reply = self.noted(query(&mut conn, &cmd, false).await)?;
            let (next, keys) = match reply {
                Value::Array(mut parts) if parts.len() == 2 => {
                    let keys = parts.pop();
                    let next = parts.pop();
                    (Reply(next.unwrap_or(Value::Nil)).into_text()?, keys)
                }
                other => {
                    return Err(CallError::new(format!(
                        "unexpected reply to SCAN: {other:?}"
                    )))
                }
            };
            let Some(Value::Array(keys)) = keys else {
                return Err(CallError::new("unexpected reply to SCAN"));
            };
            for key in keys {
                let Some(key) = Reply(key).into_text()? else {
                    continue;
                };
                if held.len() >= limit {
                    continue;
                }
                // A key of another kind (a hash, a list): not a lock, left out.
                let token = match self.read("GET", &key).await {
                    Err(e) if e.refusal() == Refusal::WrongType => continue,
                    other => other?.into_text()?,
                };
                let Some(token) = token.filter(|t| !is_tagged(t)) else {
                    continue;
                };
                if let Some(ttl) = self.pttl(&key).await? {
                    held.push(HeldKey::new(key, token, ttl));
                }
            }
            cursor = next.and_then(|n| n.parse().ok()).unwrap_or(0);
            if cursor == 0 || held.len() >= limit {
                break;
            }
        }
        held.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(held)
    }

    /// One command on one key (not a vote: a Sentinel voter answers it without a recent
    /// majority of its sentinels).
    async fn read(&self, verb: &str, key: &str) -> Result<Reply, CallError> {
        let mut cmd = Cmd::new();
        cmd.arg(verb).arg(key);
        self.send(&cmd).await
    }

    /// `cmd`, not a vote.
    async fn send(&self, cmd: &Cmd) -> Result<Reply, CallError> {
        let mut conn = self.conn.clone();
        Ok(Reply(self.noted(query(&mut conn, cmd, false).await)?))
    }

    /// `PTTL key`: `None` when the key is gone, `Some(None)` when it has no expiry.
    async fn pttl(&self, key: &str) -> Result<Option<Option<Duration>>, CallError> {
        Ok(match self.read("PTTL", key).await?.int()? {
            -2 => None,
            ms => Some(u64::try_from(ms).ok().map(Duration::from_millis)),
        })
    }
}

/// A reply, read as what was asked.
struct Reply(Value);

impl Reply {
    fn int(self) -> Result<i64, CallError> {
        match self.0 {
            Value::Int(i) => Ok(i),
            other => Err(CallError::new(format!("unexpected reply: {other:?}"))),
        }
    }

    fn into_text(self) -> Result<Option<String>, CallError> {
        match self.0 {
            Value::Nil => Ok(None),
            Value::BulkString(bytes) => Ok(Some(String::from_utf8_lossy(&bytes).into_owned())),
            Value::SimpleString(s) => Ok(Some(s)),
            other => Err(CallError::new(format!("unexpected reply: {other:?}"))),
        }
    }
}

/// `prefix` with the glob's special characters escaped, for `SCAN … MATCH`.
fn glob_escape(prefix: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + 4);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\' | '^') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::is_tagged;

    #[test]
    fn the_first_tenure_marker_and_the_tags_are_no_locks() {
        for ours in [
            "a94a8fe5ccb19ba61c4c0873d391e987982fbbd3:1733380000000",
            "TRF1:41",
            "TRR1\nrecord",
            "TRT2:abc:1",
            "TRW1:7",
        ] {
            assert!(is_tagged(ours), "{ours:?}");
        }
        for lock in [
            "f0f0f0f0c0ffee00c0ffee00c0ffee00",
            "a:",
            ":1",
            "zz:12",
            "ab:1x",
        ] {
            assert!(!is_tagged(lock), "{lock:?}");
        }
    }
}
