//! Fenced writes to data kept in Redis: [`FencedRedis`], a value, a hash field or a stream
//! entry written only with a fencing token at least the one stored beside the data.

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};

use super::StaleToken;

/// Writes to data kept in Redis, each refused when its fencing token is older than the one
/// the data was last written with — atomically: the check, the write and the token's store
/// are one Lua script.
///
/// Over any redis-rs async connection (`C:` [`redis::aio::ConnectionLike`]): a
/// `MultiplexedConnection`, a `ConnectionManager`, a cluster connection, a pooled
/// connection; to a Redis of your data or to one of the lock's masters. The methods take
/// `&mut self`, as redis-rs' own commands do, so no `Clone` is asked of the connection (a
/// pooled one works); over a `MultiplexedConnection` or a `ConnectionManager`, clone the
/// `FencedRedis` per task or request: it is the connection's cheap clone.
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use tower_redlock::{fenced::FencedRedis, Redlock};
///
/// let redlock = Redlock::builder()
///     .redis("redis://10.0.0.1:6379")
///     .redis("redis://10.0.0.2:6379")
///     .redis("redis://10.0.0.3:6379")
///     .fencing(true) // every lease carries a fencing token
///     .build()?;
/// let data = redis::Client::open("redis://10.0.0.9:6379")?;
/// let mut orders = FencedRedis::new(data.get_connection_manager().await?);
///
/// let lease = redlock.lock("order:1", Duration::from_secs(10)).await?;
/// let token = lease.fencing_token().expect("fencing is on");
/// // `?` on Redis' failures, then on the refusal (a `StaleToken` is an error too).
/// orders.set("{order:1}", "paid", token).await??;
/// match orders.hset("{order:1}:items", "sku-7", "2", token).await? {
///     Ok(()) => {}
///     // A newer holder of "order:1" wrote since: this lease was lost (a pause past its
///     // validity), and its write did not land.
///     Err(stale) => eprintln!("{stale}"),
/// }
/// let id = orders.xadd("{order:1}:events", &[("status", "paid")], token).await??;
/// println!("appended {id}");
/// lease.release().await?;
/// # Ok(()) }
/// ```
///
/// In a handler behind [`RedlockLayer`](crate::RedlockLayer) or `RedlockMiddleware`, the
/// token is [`LeaseHandle::fencing_token`](crate::LeaseHandle::fencing_token), and with the
/// `axum` or `actix` feature a [`StaleToken`] is an answer of its own (`409` problem+json).
///
/// # What it guarantees
///
/// Per data key: a write lands only if its token is at least the token stored beside the
/// data, and stores its token there, in one script (nothing runs between the check and the
/// write). So **a write with an older token never lands after a write with a newer one**;
/// the holder of a token writes as often as it likes (an equal token is accepted), and a
/// holder paused past its lease finds its late writes refused ([`StaleToken`], nothing
/// written) once the next holder has written. Tests: `fenced_store_redis_*` in
/// `tests/fenced_store/redis.rs` (sequential holders, the paused holder refused for each
/// kind of write, contended writers checked from the stream's history).
///
/// # Read-modify-write
///
/// Fencing the writes is not enough for a write computed from a read (a balance, a stock count). A
/// holder paused after its read and the next holder read the same value. The paused one's write
/// still lands if it comes first, is acknowledged, then replaced. Start such a write with
/// [`read_for_write`](Self::read_for_write) (a string) or
/// [`raise_for_write`](Self::raise_for_write) (then read a hash or a stream yourself). They raise
/// the stored token before the read, so every later write of an older holder is refused. Tests:
/// `fenced_claim_redis_*` in `tests/fenced_store/claim_redis.rs`.
///
/// # What it needs
///
/// - Tokens of **one resource**: [`RedlockBuilder::fencing(true)`](crate::RedlockBuilder::fencing),
///   and every writer of a data key holding the lock of the same resource. Tokens of two
///   resources come from two counters and order nothing between them.
/// - **Every write of that data goes through it.** A plain `SET` neither checks nor raises
///   the stored token. Keep the token key as long as the data's writers may run: deleting it
///   (or letting it expire) lets the next write land whatever its token. Delete only the
///   data key to empty it. Never write a token key itself as data (a key ending in
///   `:fenced-token`): that would reset the fence of the data beside it.
/// - The data Redis keeps what it acknowledged: the token is stored with the data and shares its
///   fate. A restart without persistence, or a failover to a replica that missed writes, loses
///   both. A token between the lost and the kept ones may then write again.
///
/// # Keys
///
/// The token is kept at `<key>:fenced-token` ([`token_key`](Self::token_key)), behind the
/// tag `TRW1:` (`TRW1:<token>`). A value found there without the tag (something else of
/// yours, a lock of a resource named so) or of another type is never overwritten: the write
/// fails with a `WRONGTYPE` error and nothing is written. The suffix differs from the
/// lock's own counters (`<resource>:fence`), so locking a resource named like a data key is
/// fine. Tokens are compared as numbers over the whole `u64` range.
///
/// **Redis Cluster**: a script's keys must share a hash slot. Give the data key a hash tag,
/// `{order:1}` or `{order:1}:events`: the token key shares it. A key without one whose token
/// key lands in another slot fails with `CROSSSLOT`, nothing written.
///
/// # Timeouts
///
/// A call waits as long as the connection does: give it a response timeout (redis-rs
/// `ConnectionManagerConfig::set_response_timeout`, or the multiplexed connection's
/// `AsyncConnectionConfig::set_response_timeout`), as the lock's own nodes have. A call that
/// timed out may still have written: write the same value with the same token again (that
/// holder may) or read it back.
///
/// # Errors and odd answers
///
/// Every method answers `Result<Result<T, StaleToken>, RedisError>`. The outer error is Redis'
/// (I/O, `WRONGTYPE`, `CROSSSLOT`, an unexpected reply: never a panic), the inner one the refusal.
/// `WRONGTYPE` means the data key holds another type than the write's, or the token key a foreign
/// value. In a function returning `Result<_, E>` where `E: From<RedisError> + From<StaleToken>`
/// (e.g. `Box<dyn Error>`), `.await??` does both. An error can come after the write landed (a reply
/// lost with its connection). [`fence`](Self::fence) then says whether a token at least yours is
/// stored. A connection that sends a request again on its own after a dropped connection (redis-rs'
/// cluster connection) may run a write twice with the same token. `set` and `hset` do the same
/// thing again, `xadd` appends a second entry.
#[derive(Debug, Clone)]
pub struct FencedRedis<C> {
    conn: C,
}

impl<C> FencedRedis<C> {
    /// The fenced writes over `conn`.
    pub fn new(conn: C) -> Self {
        Self { conn }
    }

    /// The connection.
    pub fn get_ref(&self) -> &C {
        &self.conn
    }

    /// The connection, for other commands.
    pub fn get_mut(&mut self) -> &mut C {
        &mut self.conn
    }

    /// The connection back.
    pub fn into_inner(self) -> C {
        self.conn
    }

    /// The key the token of the data at `key` is stored at: `<key>:fenced-token`.
    ///
    /// ```
    /// # use tower_redlock::fenced::FencedRedis;
    /// let store = FencedRedis::new(());
    /// assert_eq!(store.token_key("{order:1}"), "{order:1}:fenced-token");
    /// ```
    pub fn token_key(&self, key: &str) -> String {
        token_key(key)
    }
}

impl<C: ConnectionLike> FencedRedis<C> {
    /// `SET key value` (replacing the value and any expiry) if `token` is at least the stored
    /// token, then stores `token`. The key must hold a string or nothing (`WRONGTYPE`
    /// otherwise: a plain `SET` would replace a value of any type).
    ///
    /// # Errors
    ///
    /// `Ok(Err(StaleToken))`: a newer token is stored, nothing written. `Err(_)`: Redis failed
    /// or refused (`WRONGTYPE` for a key of another type).
    pub async fn set(
        &mut self,
        key: &str,
        value: impl AsRef<[u8]>,
        token: u64,
    ) -> RedisResult<Result<(), StaleToken>> {
        let token_arg = token.to_string();
        let reply = self
            .run(&SET, key, &[token_arg.as_bytes(), value.as_ref()])
            .await?;
        Ok(outcome(token, reply)?.map(|_| ()))
    }

    /// `HSET key field value` if `token` is at least the stored token, then stores `token`.
    /// The token is the whole hash's: one per key, not per field. The key must hold a hash or
    /// nothing (`WRONGTYPE` otherwise).
    ///
    /// # Errors
    ///
    /// As [`set`](Self::set).
    pub async fn hset(
        &mut self,
        key: &str,
        field: impl AsRef<[u8]>,
        value: impl AsRef<[u8]>,
        token: u64,
    ) -> RedisResult<Result<(), StaleToken>> {
        let token_arg = token.to_string();
        let args = [token_arg.as_bytes(), field.as_ref(), value.as_ref()];
        let reply = self.run(&HSET, key, &args).await?;
        Ok(outcome(token, reply)?.map(|_| ()))
    }

    /// `XADD key * field value …` if `token` is at least the stored token, then stores
    /// `token`; answers the new entry's id. The key must hold a stream or nothing
    /// (`WRONGTYPE` otherwise). `fields` must not be empty (a client error, nothing sent);
    /// a few thousand pairs at most (Lua's stack).
    ///
    /// # Errors
    ///
    /// As [`set`](Self::set); an empty `fields` is an `Err` (a client error, nothing sent).
    pub async fn xadd<F: AsRef<[u8]>, V: AsRef<[u8]>>(
        &mut self,
        key: &str,
        fields: &[(F, V)],
        token: u64,
    ) -> RedisResult<Result<String, StaleToken>> {
        if fields.is_empty() {
            return Err(RedisError::from((
                ErrorKind::Client,
                "a stream entry needs at least one field",
            )));
        }
        let token_arg = token.to_string();
        let mut args = Vec::with_capacity(1 + 2 * fields.len());
        args.push(token_arg.as_bytes());
        for (f, v) in fields {
            args.push(f.as_ref());
            args.push(v.as_ref());
        }
        let reply = self.run(&XADD, key, &args).await?;
        match outcome(token, reply)? {
            Ok(Some(id)) => Ok(Ok(string(id)?)),
            Ok(None) => Err(unexpected(&Value::Nil)),
            Err(stale) => Ok(Err(stale)),
        }
    }

    /// The read of a read-modify-write (a balance, a stock count): raises the token stored
    /// beside the string at `key` to `token`, then `GET key` — one script. Refused
    /// ([`StaleToken`], nothing raised, nothing read) when a newer token is stored. `None`
    /// when the key holds nothing; `WRONGTYPE` when it holds another type than a string.
    ///
    /// **Start every read-modify-write with it**, not with a plain `GET`. The raise refuses every
    /// later write of an older holder. So what was read stays what holds until this holder writes —
    /// or a newer one raises in turn, and this holder's write is refused. With a plain read, a
    /// holder paused after its read and the next holder both read the same value. The paused one's
    /// write lands first (the stored token is still older than both) and is acknowledged. Then the
    /// next one's write replaces it: a lost update that fencing of the writes alone does not see.
    /// The fencing guide (`guide::fencing`) names the tests that show both.
    ///
    /// ```no_run
    /// # async fn run(mut accounts: tower_redlock::fenced::FencedRedis<redis::aio::ConnectionManager>, token: u64)
    /// # -> Result<(), Box<dyn std::error::Error>> {
    /// let balance: u64 = match accounts.read_for_write("{account:7}", token).await?? {
    ///     Some(raw) => std::str::from_utf8(&raw)?.parse()?,
    ///     None => 0,
    /// };
    /// accounts.set("{account:7}", (balance + 50).to_string(), token).await??;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`set`](Self::set): `Ok(Err(StaleToken))` nothing raised, nothing read.
    pub async fn read_for_write(
        &mut self,
        key: &str,
        token: u64,
    ) -> RedisResult<Result<Option<Vec<u8>>, StaleToken>> {
        let token_arg = token.to_string();
        let reply = self
            .run(&READ_FOR_WRITE, key, &[token_arg.as_bytes()])
            .await?;
        match outcome(token, reply)? {
            Ok(Some(Value::Nil)) => Ok(Ok(None)),
            Ok(Some(Value::BulkString(value))) => Ok(Ok(Some(value))),
            Ok(other) => Err(unexpected(&other.unwrap_or(Value::Nil))),
            Err(stale) => Ok(Err(stale)),
        }
    }

    /// Raises the token stored beside the data at `key` to `token`, whatever the data's type
    /// — the start of a read-modify-write of a hash or a stream, read next with your own
    /// commands (`HGETALL`, `XRANGE`) on [`get_mut`](Self::get_mut)'s connection. Refused
    /// ([`StaleToken`], nothing raised) when a newer token is stored. Every later write of
    /// an older holder is refused from then on, so the read that follows sees what holds
    /// until this holder writes (as [`read_for_write`](Self::read_for_write) explains).
    ///
    /// # Errors
    ///
    /// As [`set`](Self::set).
    pub async fn raise_for_write(
        &mut self,
        key: &str,
        token: u64,
    ) -> RedisResult<Result<(), StaleToken>> {
        let token_arg = token.to_string();
        let reply = self
            .run(&RAISE_FOR_WRITE, key, &[token_arg.as_bytes()])
            .await?;
        Ok(outcome(token, reply)?.map(|_| ()))
    }

    /// The token the data at `key` was last written with; `None` when no fenced write stored
    /// one. A foreign value at the token key is a `WRONGTYPE` error, as for the writes.
    ///
    /// # Errors
    ///
    /// Redis failed, or the token key holds something else (`WRONGTYPE`).
    pub async fn fence(&mut self, key: &str) -> RedisResult<Option<u64>> {
        let reply = self.run(&FENCE, key, &[]).await?;
        match reply {
            Value::Nil => Ok(None),
            v => decimal(&v).map(Some),
        }
    }

    /// `EVALSHA` with `KEYS = [key, its token key]`, then `EVAL` if the server answers
    /// `NOSCRIPT` (it lost its script cache, or never saw the script).
    async fn run(&mut self, script: &Script, key: &str, args: &[&[u8]]) -> RedisResult<Value> {
        let token_key = token_key(key);
        let cmd = |verb: &str, body: &str| {
            let mut cmd = Cmd::new();
            cmd.arg(verb).arg(body).arg(2).arg(key).arg(&token_key);
            for a in args {
                cmd.arg(*a);
            }
            cmd
        };
        match cmd("EVALSHA", script.sha1)
            .query_async(&mut self.conn)
            .await
        {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                cmd("EVAL", script.source).query_async(&mut self.conn).await
            }
            r => r,
        }
    }
}

/// `<key>:fenced-token`.
fn token_key(key: &str) -> String {
    format!("{key}:fenced-token")
}

/// A script with its SHA-1 (pinned by `hashes_match_sources`). Not the voters' `Script`:
/// that one says whether a voter's answer is a vote, and runs over the voter's connection.
#[derive(Debug)]
struct Script {
    source: &'static str,
    sha1: &'static str,
}

/// The start of every script: reads the token key `KEYS[2]` into `stored` (the stored token
/// in decimal, without leading zeros; `nil` when there is none). A value of another type, or
/// a string without the tag `TRW1:`, is foreign: a `WRONGTYPE` error, nothing written.
macro_rules! read_token_lua {
    () => {
        r#"local raw = redis.pcall('get', KEYS[2])
if type(raw) == 'table' then
  return redis.error_reply('WRONGTYPE the fencing token key ' .. KEYS[2] ..
    ' holds a value of another type: refused, nothing written')
end
local stored
if raw then
  stored = string.match(raw, '^TRW1:0*(%d+)$')
  if not stored then
    return redis.error_reply('WRONGTYPE the fencing token key ' .. KEYS[2] ..
      ' holds a value no fenced write stored: refused, nothing written')
  end
end
"#
    };
}

/// After `read_token_lua!`: answers `{0, stored}` (nothing written) when the token
/// `ARGV[1]` is smaller than the stored one — compared as decimal strings (length, then
/// digit by digit), exact for any `u64`.
macro_rules! older_lua {
    () => {
        r#"local token = ARGV[1]
if stored then
  local older = #token < #stored
  if #token == #stored then
    for i = 1, #token do
      local a, b = string.byte(token, i), string.byte(stored, i)
      if a ~= b then
        older = a < b
        break
      end
    end
  end
  if older then
    return {0, stored}
  end
end
"#
    };
}

/// When the data key `KEYS[1]` holds a type other than `$type`, a `WRONGTYPE` error
/// (nothing written).
macro_rules! type_lua {
    ($type:literal) => {
        concat!(
            r#"local t = redis.call('type', KEYS[1]).ok
if t ~= 'none' and t ~= '"#,
            $type,
            r#"' then
  return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' holds a ' .. t ..
    ', not a "#,
            $type,
            r#": refused, nothing written')
end
"#
        )
    };
}

/// After `read_token_lua!`, for the writes: `older_lua!`, then `type_lua!($type)`.
macro_rules! check_lua {
    ($type:literal) => {
        concat!(older_lua!(), type_lua!($type))
    };
}

/// The end of the writes, after the data's write: stores the token `ARGV[1]`, tagged.
macro_rules! store_token_lua {
    () => {
        "redis.call('set', KEYS[2], 'TRW1:' .. token)\n"
    };
}

/// KEYS data, token key; ARGV token, value. `{1}` written, `{0, stored}` refused.
static SET: Script = Script {
    source: concat!(
        read_token_lua!(),
        check_lua!("string"),
        "redis.call('set', KEYS[1], ARGV[2])\n",
        store_token_lua!(),
        "return {1}\n"
    ),
    sha1: "d441b53362390db8f8f5d9b4bf169ef0bb8bd0ac",
};

/// KEYS data, token key; ARGV token, field, value. `{1}` written, `{0, stored}` refused.
static HSET: Script = Script {
    source: concat!(
        read_token_lua!(),
        check_lua!("hash"),
        "redis.call('hset', KEYS[1], ARGV[2], ARGV[3])\n",
        store_token_lua!(),
        "return {1}\n"
    ),
    sha1: "e3a36575acf0bf891e24bd1ff306a5cbf2614df7",
};

/// KEYS data, token key; ARGV token, then field, value pairs. `{1, id}` appended,
/// `{0, stored}` refused.
static XADD: Script = Script {
    source: concat!(
        read_token_lua!(),
        check_lua!("stream"),
        "local id = redis.call('xadd', KEYS[1], '*', unpack(ARGV, 2))\n",
        store_token_lua!(),
        "return {1, id}\n"
    ),
    sha1: "dfd36cbe5c35f6137619c0e95d5d339d41431fcf",
};

/// KEYS data, token key. The stored token (decimal), or nil.
static FENCE: Script = Script {
    source: concat!(read_token_lua!(), "return stored\n"),
    sha1: "631434353b21e81bb81d331db0b8ab23fc700b6f",
};

/// KEYS data, token key; ARGV token. The read of a read-modify-write: raises the stored
/// token to `ARGV[1]`, then reads the string. `{1, value}` (`value` nil when there is
/// none), `{0, stored}` refused (nothing raised, nothing read).
static READ_FOR_WRITE: Script = Script {
    source: concat!(
        read_token_lua!(),
        check_lua!("string"),
        store_token_lua!(),
        "return {1, redis.call('get', KEYS[1])}\n"
    ),
    sha1: "fc6cfd1f9539740df0b9c211bebaa893dcd50758",
};

/// KEYS data, token key; ARGV token. Raises the stored token to `ARGV[1]`, whatever the
/// data's type. `{1}` raised, `{0, stored}` refused.
static RAISE_FOR_WRITE: Script = Script {
    source: concat!(
        read_token_lua!(),
        older_lua!(),
        store_token_lua!(),
        "return {1}\n"
    ),
    sha1: "0c0ad283807d6e712e9071cfca170fc737138093",
};

/// A write script's reply: `Ok(what it answered beside the 1)`, or the refusal of `token`.
fn outcome(token: u64, reply: Value) -> RedisResult<Result<Option<Value>, StaleToken>> {
    let Value::Array(mut items) = reply else {
        return Err(unexpected(&reply));
    };
    match (items.first(), items.len()) {
        (Some(Value::Int(1)), 1) => Ok(Ok(None)),
        (Some(Value::Int(1)), 2) => Ok(Ok(items.pop())),
        (Some(Value::Int(0)), 2) => {
            let stored = decimal(&items[1])?;
            Ok(Err(StaleToken::new(token, stored)))
        }
        _ => Err(unexpected(&Value::Array(items))),
    }
}

/// A token in decimal, as the scripts answer it.
fn decimal(v: &Value) -> RedisResult<u64> {
    let digits = match v {
        Value::BulkString(b) => std::str::from_utf8(b).ok(),
        Value::SimpleString(s) => Some(s.as_str()),
        _ => None,
    };
    digits
        .filter(|d| !d.is_empty() && d.bytes().all(|c| c.is_ascii_digit()))
        .and_then(|d| d.parse().ok())
        .ok_or_else(|| unexpected(v))
}

fn string(v: Value) -> RedisResult<String> {
    match v {
        Value::BulkString(b) => {
            String::from_utf8(b).map_err(|e| unexpected(&Value::BulkString(e.into_bytes())))
        }
        Value::SimpleString(s) => Ok(s),
        other => Err(unexpected(&other)),
    }
}

fn unexpected(v: &Value) -> RedisError {
    RedisError::from((
        ErrorKind::UnexpectedReturnType,
        "unexpected reply from a fenced-write script",
        format!("{v:?}"),
    ))
}

#[cfg(test)]
mod tests;
