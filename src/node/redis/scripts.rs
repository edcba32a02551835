//! The Lua scripts the Redis node runs. Each runs atomically on one master.

/// A Lua script with its SHA-1, for `EVALSHA`.
#[derive(Debug)]
pub(crate) struct Script {
    source: &'static str,
    sha1: &'static str,
}

impl Script {
    pub(crate) fn source(&self) -> &'static str {
        self.source
    }

    pub(crate) fn sha1(&self) -> &'static str {
        self.sha1
    }
}

/// The tenure check shared by the guarded scripts: sets `young` when the master serving
/// the dataset has held it for less than `ARGV[3]` ms. The marker at the last key holds which
/// server process (its `run_id`) knows the dataset since when, in the server's own clock
/// (`TIME`, ms): a restart, a flush (the marker is gone) or a promoted replica (the marker it
/// replicated names the old master) starts the clock again.
macro_rules! tenure_lua {
    () => {
        r#"local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local me = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
local mark = redis.call('get', KEYS[#KEYS])
local who, since
if mark then
  who, since = string.match(mark, '^(%x+):(%d+)$')
end
local young = true
if who ~= me then
  redis.call('set', KEYS[#KEYS], me .. ':' .. now)
elseif now - tonumber(since) >= tonumber(ARGV[3]) then
  young = false
end
"#
    };
}

/// `SET key token NX PX ttl` behind tenure protection (restarts, failovers), answering -3
/// when it set the key and the holder's `PTTL` when it is held (the unguarded acquire is a
/// plain `SET`, see `RedisNode::acquire_key`). `KEYS[2]` is the tenure marker (see
/// `tenure_lua!`); returns -4 without setting anything while the tenure is younger than
/// `ARGV[3]` ms (the longest ttl in use).
pub(crate) static ACQUIRE_GUARDED: Script = Script {
    source: concat!(
        tenure_lua!(),
        r#"if young then
  return -4
end
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return -3
end
return redis.call('pttl', KEYS[1])
"#
    ),
    sha1: "1a50304347c46d0bdd34b4b2509f3f4efa34348e",
};

/// Compare-and-delete: delete the key only if it holds our token.
pub(crate) static RELEASE: Script = Script {
    source: r#"if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"#,
    sha1: "1c3217d3f56fb4a69cec7b3c42af8182dce2e5c2",
};

/// Compare-and-`PEXPIRE`: set a new ttl only if the key holds our token. `PEXPIRE` on an
/// absent key does nothing, so an expired lock is never re-created.
pub(crate) static EXTEND: Script = Script {
    source: r#"if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"#,
    sha1: "7a2d59e59d451095bd1eeb526d6f765e0fd9b022",
};

/// The replay acquire: answers `{2, record}` when the completion record `KEYS[2]` exists
/// (nothing is locked: the work is done). A record is stored behind the format tag
/// `TRR1\n` (version 1), so a value someone else put at that key (a lock of a resource
/// that happens to be named `…:record`) is never taken for one. Otherwise `SET KEYS[1] token
/// NX PX ttl` → `{1}`, or `{0, PTTL}` when held. With a third key, behind tenure protection
/// (as [`ACQUIRE_GUARDED`]): a tenure younger than `ARGV[3]` ms answers `{3}` and sets nothing —
/// after it has shown any record it has (a record is only ever written by a holder, so one
/// that survived is an answer; only "no record" needs a dataset old enough to trust).
pub(crate) static ACQUIRE_UNLESS_COMPLETED: Script = Script {
    source: concat!(
        r#"local record = redis.call('get', KEYS[2])
if record and string.sub(record, 1, 5) == 'TRR1\n' then
  return {2, string.sub(record, 6)}
end
if #KEYS == 3 then
"#,
        tenure_lua!(),
        r#"if young then
  return {3}
end
end
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1}
end
return {0, redis.call('pttl', KEYS[1])}
"#
    ),
    sha1: "d8ae2d3450862026dc0ca7a39dbb459be7d37128",
};

/// Completes the work a lock guarded: only if `KEYS[1]` holds our token `ARGV[1]`, and
/// nothing is at `KEYS[2]` yet (a first record is never overwritten; nor is another
/// client's key), stores the tagged record `ARGV[3]` at `KEYS[2]` for `ARGV[2]` ms and
/// deletes the lock, atomically; answers 1, else 0 (an expired or lost lease never stores
/// a stale answer).
pub(crate) static COMPLETE: Script = Script {
    source: r#"if redis.call('exists', KEYS[2]) == 1 then
  return 0
end
if redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('set', KEYS[2], 'TRR1\n' .. ARGV[3], 'PX', ARGV[2])
  redis.call('del', KEYS[1])
  return 1
end
return 0
"#,
    sha1: "465311df18bdf01b301983738e1f6b548cd73864",
};

/// The fencing counter's bump, for the fenced acquire (after `fence_read_lua!`): `fence`
/// becomes the counter plus one, or the server's clock in microseconds if that is larger (a
/// counter that expired, or was lost in a restart, starts again above the tokens it gave),
/// kept for `ARGV[4]` ms. Lua numbers are doubles: exact below 2^53 (microseconds since 1970
/// stay below it until the year 2255); stored with `%.0f`, never in exponent form, behind
/// the tag `TRF1:`.
macro_rules! fence_lua {
    () => {
        r#"local ft = redis.call('TIME')
fence = math.max(fence + 1, tonumber(ft[1]) * 1000000 + tonumber(ft[2]))
redis.call('set', KEYS[2], 'TRF1:' .. string.format('%.0f', fence), 'PX', ARGV[4])
"#
    };
}

/// Reads the fencing counter at `KEYS[2]` into `fence` (0 when absent); `foreign` is set when
/// the key holds something else than a counter (tagged `TRF1:`) — a lock of a resource named
/// like the counter — which the scripts never overwrite.
macro_rules! fence_read_lua {
    () => {
        r#"local raw = redis.call('get', KEYS[2])
local fence, foreign = 0, false
if raw then
  if string.sub(raw, 1, 5) == 'TRF1:' then
    fence = tonumber(string.sub(raw, 6)) or 0
  else
    foreign = true
  end
end
"#
    };
}

/// The fenced acquire: `SET KEYS[1] token NX PX ttl` and, when it set the key, the bump of
/// the fencing counter `KEYS[2]` (`fence_lua!`): answers `{1, fence}`, or `{0, PTTL}` when
/// held; `{4}`, setting nothing, when the counter's key holds something else (a lock of a
/// resource named like it). With a third key, behind tenure protection (as
/// [`ACQUIRE_GUARDED`], `ARGV[3]` the longest ttl): `{3}` while the tenure is young, setting
/// nothing.
pub(crate) static ACQUIRE_FENCED: Script = Script {
    source: concat!(
        "if #KEYS == 3 then\n",
        tenure_lua!(),
        r#"if young then
  return {3}
end
end
"#,
        fence_read_lua!(),
        r#"if foreign then
  return {4}
end
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
"#,
        fence_lua!(),
        r#"return {1, fence}
end
return {0, redis.call('pttl', KEYS[1])}
"#
    ),
    sha1: "bde41ae60a1a3fe66196f6432086d3afcb6901fd",
};

/// The fenced release: raises the fencing counter `KEYS[2]` to the lease's token `ARGV[2]`
/// if it is below (kept for `ARGV[3]` ms; a key holding something else than a counter is
/// left alone) — so that the next holder, whose quorum shares a node with this one's, gets a
/// larger token — then compare-and-delete, as [`RELEASE`].
pub(crate) static RELEASE_FENCED: Script = Script {
    source: concat!(
        fence_read_lua!(),
        r#"if not foreign and fence < tonumber(ARGV[2]) then
  redis.call('set', KEYS[2], 'TRF1:' .. ARGV[2], 'PX', ARGV[3])
end
if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('del', KEYS[1])
end
return 0
"#
    ),
    sha1: "c40874b2847becc65e01c8d1de2f86e7cf0bc725",
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_match_sources() {
        for s in [
            &ACQUIRE_GUARDED,
            &RELEASE,
            &EXTEND,
            &ACQUIRE_UNLESS_COMPLETED,
            &COMPLETE,
            &ACQUIRE_FENCED,
            &RELEASE_FENCED,
        ] {
            assert_eq!(
                redis::Script::new(s.source()).get_hash(),
                s.sha1(),
                "{}",
                &s.source()[..40]
            );
        }
    }
}
