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

/// `SET key token NX PX ttl` behind delayed-restart protection, answering -3 when it set
/// the key and the holder's `PTTL` when it is held (the unguarded acquire is a plain `SET`,
/// see `RedisNode::acquire_key`). `KEYS[2]` marks, in the server's own
/// clock (`TIME`, ms), since when this dataset is known; a restart without persistence or a
/// flush loses it. Returns -4 without setting anything while the dataset is younger than
/// `ARGV[3]` ms (the longest ttl in use), starting the clock when the mark is missing.
pub(crate) static ACQUIRE_GUARDED: Script = Script {
    source: r#"local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local since = redis.call('get', KEYS[2])
if not since then
  redis.call('set', KEYS[2], now)
  return -4
end
if now - tonumber(since) < tonumber(ARGV[3]) then
  return -4
end
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return -3
end
return redis.call('pttl', KEYS[1])
"#,
    sha1: "a0634b35453fe1db7e65485f9c34328dbf194526",
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
/// that happens to be named `…:record`) is never taken for one. Otherwise else `SET KEYS[1] token NX PX ttl` → `{1}`, or
/// `{0, PTTL}` when held. With a third key, behind delayed-restart protection (as
/// [`ACQUIRE_GUARDED`]): a dataset younger than `ARGV[3]` ms answers `{3}` and sets nothing —
/// after it has shown any record it has (a record is only ever written by a holder, so one
/// that survived is an answer; only "no record" needs a dataset old enough to trust).
pub(crate) static ACQUIRE_UNLESS_COMPLETED: Script = Script {
    source: r#"local record = redis.call('get', KEYS[2])
if record and string.sub(record, 1, 5) == 'TRR1\n' then
  return {2, string.sub(record, 6)}
end
if #KEYS == 3 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local since = redis.call('get', KEYS[3])
  if not since then
    redis.call('set', KEYS[3], now)
    return {3}
  end
  if now - tonumber(since) < tonumber(ARGV[3]) then
    return {3}
  end
end
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1}
end
return {0, redis.call('pttl', KEYS[1])}
"#,
    sha1: "39c51cfd127d7c9a7d3a53d36f0ab199238ac96e",
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
        ] {
            assert_eq!(redis::Script::new(s.source()).get_hash(), s.sha1());
        }
    }
}
