//! The Lua scripts the Redis node runs. Each runs atomically on one master.

/// A Lua script with its SHA-1, for `EVALSHA`.
#[derive(Debug)]
pub(crate) struct Script {
    source: &'static str,
    sha1: &'static str,
    /// Whether its answer is a vote (it grants, extends or completes): a voter that must
    /// abstain (a Sentinel voter without a recent majority) refuses to send it. Releases
    /// are not votes.
    votes: bool,
    /// A vote script's variant without the eviction check (`eviction_lua!`), for a voter
    /// that allows eviction.
    lenient: Option<&'static Script>,
    /// Whether it is sent whole (`EVAL` with its source), not by its hash: an acquire. A try
    /// keeps the requests still out when it is decided unpolled (`Lease::_parked`): what was
    /// handed to a connection is written, nothing more is sent. An `EVALSHA` answered
    /// `NOSCRIPT` (a master restarted, or `SCRIPT FLUSH`) by such a master would never be
    /// followed by its `EVAL`, and that master would miss the lock every time it is the
    /// slowest (`lock_reaches_a_late_master_after_script_flush`). Sent whole, an acquire is
    /// one request; a master hashes its source each time (about what `EVALSHA` costs it:
    /// BENCHMARKS.md). Other scripts are awaited to their end, fallback included.
    whole: bool,
}

impl Script {
    pub(crate) fn source(&self) -> &'static str {
        self.source
    }

    pub(crate) fn sha1(&self) -> &'static str {
        self.sha1
    }

    pub(crate) fn votes(&self) -> bool {
        self.votes
    }

    /// Whether it is sent whole, with its source (an acquire: see `Script::whole`).
    pub(crate) fn whole(&self) -> bool {
        self.whole
    }

    /// The script a voter sends: this one, or — for a voter that allows eviction
    /// (`RedisNodeOptions::allow_eviction`) — a vote script's variant without the eviction
    /// check.
    pub(crate) fn for_voter(&self, allow_eviction: bool) -> &Script {
        match self.lenient {
            Some(lenient) if allow_eviction => lenient,
            _ => self,
        }
    }

    /// The variant [`Script::for_voter`] picks for a voter that allows eviction, if any.
    #[cfg(test)]
    pub(crate) fn lenient(&self) -> Option<&'static Script> {
        self.lenient
    }
}

/// The eviction check every vote script starts with (acquires, extensions, completions). A master
/// may evict keys when it has a `maxmemory` and a policy other than `noeviction`, as `INFO memory`
/// says now, read atomically with the script's write. On such a master the script refuses with
/// `-EVICTS <policy> <maxmemory>` and writes nothing. The digits come as `INFO` wrote them: a Lua
/// number would print a large one as `2e+14`. It refuses whatever the voter's background check last
/// saw. (A `CONFIG SET` on a live connection goes unnoticed by that check for up to 30 s.) `INFO`
/// denied (an ACL without `+info`, caught by `pcall`) leaves the policy unknown: the script goes
/// on, as the voter does. The usual answers (`noeviction`, or no `maxmemory`) are found by two
/// plain searches, before any pattern. The check costs a master about 5 µs of CPU; the patterns
/// would cost twice that (measured with `redis-benchmark`, see BENCHMARKS.md).
macro_rules! eviction_lua {
    () => {
        r#"do
  local mem = redis.pcall('INFO', 'memory')
  if type(mem) == 'string'
    and not string.find(mem, '\nmaxmemory_policy:noeviction\r', 1, true)
    and not string.find(mem, '\nmaxmemory:0\r', 1, true) then
    local max = string.match(mem, '\nmaxmemory:(%d+)')
    local policy = string.match(mem, '\nmaxmemory_policy:([%w%-]+)')
    if max and tonumber(max) > 0 and policy and policy ~= 'noeviction' then
      return redis.error_reply('EVICTS ' .. policy .. ' ' .. max)
    end
  end
end
"#
    };
}

/// A vote script `$name`, which starts with the eviction check (`eviction_lua!`), and
/// `$lenient`, the same script without it, which [`Script::for_voter`] picks for a voter
/// that allows eviction. The two SHA-1s are the scripts' (checked by the tests).
///
/// `acquire` scripts are sent whole ([`Script::whole`]); `extend` and `complete` scripts by
/// their hash.
macro_rules! vote_script {
    ($(#[$doc:meta])* acquire $($rest:tt)+) => {
        vote_script!(@ true, $(#[$doc])* $($rest)+);
    };
    ($(#[$doc:meta])* extend $($rest:tt)+) => {
        vote_script!(@ false, $(#[$doc])* $($rest)+);
    };
    ($(#[$doc:meta])* complete $($rest:tt)+) => {
        vote_script!(@ false, $(#[$doc])* $($rest)+);
    };
    (@ $whole:literal, $(#[$doc:meta])* $name:ident / $lenient:ident = [$sha1:literal, $lenient_sha1:literal], $($source:tt)+) => {
        $(#[$doc])*
        pub(crate) static $name: Script = Script {
            source: concat!(eviction_lua!(), $($source)+),
            sha1: $sha1,
            votes: true,
            lenient: Some(&$lenient),
            whole: $whole,
        };

        static $lenient: Script = Script {
            source: $($source)+,
            sha1: $lenient_sha1,
            votes: true,
            lenient: None,
            whole: $whole,
        };
    };
}

/// The tenure check shared by the guarded scripts: sets `young` when the master serving the
/// dataset has held it for less than `ARGV[3]` ms. Two markers, the last two keys, in the
/// server's own clock (`TIME`, ms):
///
/// - `KEYS[#KEYS - 1]`, `<run_id>:<ms>` (the first format): which server process knows the
///   dataset since when. A restart, a flush (the marker is gone) or a promoted replica (the
///   marker it replicated names the old master) starts the clock again.
/// - `KEYS[#KEYS]`, `TRT2:<master_replid>:<ms>` (format 2): since when this replication
///   history is served as master. Every promotion changes the `master_replid`, so a master
///   that was demoted, re-synced and promoted again — the same process, its `run_id`
///   unchanged — starts the clock again too.
///
/// Rolling deploys: versions of this crate before the second marker read and write only the
/// first, in the same format, and leave the second alone. A missing second marker beside a
/// first one of this very process (written by such a version) takes its time — so an
/// upgrade does not start the clock again — only if this process was never promoted
/// (`second_repl_offset:-1`); a master promoted at some point starts it again once.
macro_rules! tenure_lua {
    () => {
        r#"local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local me = string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
if not me then
  return redis.error_reply('INFO server names no run_id: tenure protection cannot work here')
end
local info = redis.call('INFO', 'replication')
local repl = string.match(info, 'master_replid:(%x+)') or '0'
local promoted = string.match(info, 'second_repl_offset:(%-?%d+)') ~= '-1'
local mkey, rkey = KEYS[#KEYS - 1], KEYS[#KEYS]
local mark, rmark = redis.call('get', mkey), redis.call('get', rkey)
local who, since, rid, rsince
if mark then
  who, since = string.match(mark, '^(%x+):(%d+)$')
end
if rmark then
  rid, rsince = string.match(rmark, '^TRT2:(%x+):(%d+)$')
end
if who ~= me then
  since = now
  redis.call('set', mkey, me .. ':' .. now)
end
if rid ~= repl then
  if rmark or who ~= me or promoted then
    rsince = now
  else
    rsince = since
  end
  redis.call('set', rkey, 'TRT2:' .. repl .. ':' .. rsince)
end
local young = now - tonumber(since) < tonumber(ARGV[3])
  or now - tonumber(rsince) < tonumber(ARGV[3])
"#
    };
}

/// The lock's set, shared by the acquire scripts. `held` is the key's value before, and `mine`
/// whether it already held our token `ARGV[1]`. A request sent again after its connection dropped,
/// whose first send ran (redis-rs' cluster connection does that), finds it so. That is a grant, not
/// "held by another". Else, when the key is free, it is set to our token for `ARGV[2]` ms (and
/// `set` is true). Reading first also answers "held" for a held key on a master out of memory,
/// which refuses any `SET`. A key of another type (`WRONGTYPE`, caught by `pcall`) is held by
/// another value too.
macro_rules! set_lua {
    () => {
        r#"local held = redis.pcall('get', KEYS[1])
local mine, set = held == ARGV[1], false
if not held then
  redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
  mine, set = true, true
end
"#
    };
}

vote_script! {
    /// `SET key token NX PX ttl` as a script. It is the acquire of every voter that does not allow
    /// eviction (its check refuses on a master that may evict). It is also the acquire of one whose
    /// connection may send a request twice (a Cluster's). It answers -3 when the key holds our
    /// token — set now, or by the first send of this very request. It answers the holder's `PTTL`
    /// when another value holds it. (A voter that allows eviction, over one master's connection,
    /// which never sends a request twice, sends a plain `SET`: see `RedisNode::acquire_key`.)
    acquire ACQUIRE / ACQUIRE_LENIENT = ["a5e3cde915dcd47925a996f3bd72db3401b38970", "6ea14a0a47a726d848cf0be414d912cdc7537eea"],
    concat!(
        set_lua!(),
        r#"if mine then
  return -3
end
return redis.call('pttl', KEYS[1])
"#
    )
}

vote_script! {
    /// [`ACQUIRE`] behind tenure protection (restarts, failovers). `KEYS[2]` and `KEYS[3]` are
    /// the tenure markers (see `tenure_lua!`); returns -4 without setting anything while the tenure is
    /// younger than `ARGV[3]` ms (the longest ttl in use).
    acquire ACQUIRE_GUARDED / ACQUIRE_GUARDED_LENIENT = ["405be4a690c80bec5bafbd1024482c44a501cec8", "b2413ddfb9aae99135b0a5c22210b29597afd745"],
    concat!(
        tenure_lua!(),
        r#"if young then
  return -4
end
"#,
        set_lua!(),
        r#"if mine then
  return -3
end
return redis.call('pttl', KEYS[1])
"#
    )
}

/// The wake-up of a lock's waiters after a delete of the lock `KEYS[1]` (and only then). It runs
/// when the script's caller asked for it (`local wake`, the script's last argument: absent, `P` or
/// `S`). It sends `released` on the channel named as the key. That is `PUBLISH` on a master or a
/// Sentinel group's, and `SPUBLISH` (sharded, Redis 7) on a Cluster, where it reaches the key's
/// shard only. With `pcall`: a server or a user that may not publish still releases (its waiters
/// poll).
macro_rules! wake_lua {
    () => {
        "if wake then redis.pcall(wake == 'S' and 'spublish' or 'publish', KEYS[1], 'released') end\n"
    };
}

/// The compare-and-delete of [`RELEASE`] (also the end of [`RELEASE_FENCED`]), waking the
/// key's waiters when it deleted (`wake_lua!`).
macro_rules! release_lua {
    () => {
        concat!(
            "if redis.call('get', KEYS[1]) == ARGV[1] then\n  redis.call('del', KEYS[1])\n  ",
            wake_lua!(),
            "  return 1\nend\nreturn 0\n"
        )
    };
}

/// The start of every completion: when something is at the record key `KEYS[2]`, the
/// answer — 1 when it is our record `ARGV[3]` (the same bytes: a completion asked again after
/// its answer was lost; the lock is ended if it still holds our token), else 0 (a first
/// record is never overwritten, nor a value that is not a record: a lock of another
/// resource).
macro_rules! record_there_lua {
    () => {
        concat!(
            r#"if redis.call('exists', KEYS[2]) == 1 then
  if redis.call('type', KEYS[2]).ok == 'string'
      and redis.call('get', KEYS[2]) == 'TRR1\n' .. ARGV[3] then
    if redis.call('get', KEYS[1]) == ARGV[1] then
      redis.call('del', KEYS[1])
      "#,
            wake_lua!(),
            r#"    end
    return 1
  end
  return 0
end
"#
        )
    };
}

/// The completion of [`COMPLETE`] (also the end of [`COMPLETE_FENCED`]). Idempotent: a
/// completion asked again after its answer was lost finds its own record (the same bytes)
/// and answers stored, ending the lock if it is still there. A record stored here was
/// stored under the lease: an "if free" mark at `KEYS[3]` is deleted (none should be there:
/// a mark lives and expires with its record), never another value there.
macro_rules! complete_lua {
    () => {
        concat!(
            record_there_lua!(),
            r#"if redis.call('get', KEYS[1]) == ARGV[1] then
  redis.call('set', KEYS[2], 'TRR1\n' .. ARGV[3], 'PX', ARGV[2])
  local mark = redis.pcall('get', KEYS[3])
  if type(mark) == 'string' and string.sub(mark, 1, 13) == 'TRR1\nif-free:' then
    redis.call('del', KEYS[3])
  end
  redis.call('del', KEYS[1])
  "#,
            wake_lua!(),
            r#"  return 1
end
return 0
"#
        )
    };
}

/// The completion of [`COMPLETE_FREE`] (also the end of [`COMPLETE_FREE_FENCED`]). It works as
/// `complete_lua!`, but the record is stored also where the lock `KEYS[1]` is absent. It is never
/// stored where the lock holds another value (read with `pcall`: a key of another type,
/// `WRONGTYPE`, is another value too). The record is marked as stored "if free". The mark `KEYS[3]`
/// (`TRR1\nif-free:` and the SHA-1 of the record's bytes, tagged as ours) lives as long as the
/// record. The replay acquire answers such a record apart (`{2, record, 1, PTTL}`) when the mark
/// names it. So one stored under a valid lease takes precedence over it. The digest binds the mark
/// to its record: a mark left beside another record (deleted by a release that did not know marks)
/// marks nothing. Nothing is stored where the mark's key holds a value that is not a mark (a lock
/// of a resource named like it). The record's own bytes are those of `COMPLETE`. A client of an
/// earlier release reads it as it always did (a record: never a second run).
macro_rules! complete_free_lua {
    () => {
        concat!(
            record_there_lua!(),
            r#"local held = redis.pcall('get', KEYS[1])
local mark = redis.pcall('get', KEYS[3])
if mark and not (type(mark) == 'string' and string.sub(mark, 1, 13) == 'TRR1\nif-free:') then
  return 0
end
if held == ARGV[1] or held == false then
  redis.call('set', KEYS[2], 'TRR1\n' .. ARGV[3], 'PX', ARGV[2])
  redis.call('set', KEYS[3], 'TRR1\nif-free:' .. redis.sha1hex(ARGV[3]), 'PX', ARGV[2])
  if held then
    redis.call('del', KEYS[1])
    "#,
            wake_lua!(),
            r#"  end
  return 1
end
return 0
"#
        )
    };
}

/// Compare-and-delete: delete the key only if it holds our token.
pub(crate) static RELEASE: Script = Script {
    source: concat!("local wake = ARGV[2]\n", release_lua!()),
    sha1: "a3e720b44627c424876e445a508213e8904ae484",
    votes: false,
    lenient: None,
    whole: false,
};

vote_script! {
    /// Compare-and-`PEXPIRE`: set a new ttl only if the key holds our token. `PEXPIRE` on an
    /// absent key does nothing, so an expired lock is never re-created.
    extend EXTEND / EXTEND_LENIENT = ["662438d820074533b212926e5e1fa3b3de60843b", "7a2d59e59d451095bd1eeb526d6f765e0fd9b022"],
    r#"if redis.call('get', KEYS[1]) == ARGV[1] then
  return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"#
}

vote_script! {
    /// The replay acquire. It answers `{2, record}` when the completion record `KEYS[2]` exists
    /// (nothing is locked: the work is done). It answers `{2, record, 1, PTTL}` when the record was
    /// stored "if free" (its mark `KEYS[3]` names it: see `complete_free_lua!`). A record is stored
    /// behind the format tag `TRR1\n` (version 1). So a value someone else put at that key (a lock
    /// of a resource that happens to be named `…:record`) is never taken for one. Otherwise the
    /// lock's set (`set_lua!`: our token there → `{1}`), or `{0, PTTL}` when another value holds
    /// it. With the two tenure markers as fourth and fifth keys, behind tenure protection (as
    /// [`ACQUIRE_GUARDED`]), a tenure younger than `ARGV[3]` ms answers `{3}` and sets nothing. It
    /// does so after it has shown any record it has. A record is only ever written by a holder, so
    /// one that survived is an answer; only "no record" needs a dataset old enough to trust.
    acquire ACQUIRE_UNLESS_COMPLETED / ACQUIRE_UNLESS_COMPLETED_LENIENT = ["58d36bf78055fd6a69ecc1e1506a7e48ac0ec23a", "7eb33a6672015e35f2b020e2060129f47d94e778"],
    concat!(
        r#"local record = redis.call('get', KEYS[2])
if record and string.sub(record, 1, 5) == 'TRR1\n' then
  local body, mark = string.sub(record, 6), redis.pcall('get', KEYS[3])
  if type(mark) == 'string' and mark == 'TRR1\nif-free:' .. redis.sha1hex(body) then
    return {2, body, 1, redis.call('pttl', KEYS[2])}
  end
  return {2, body}
end
if #KEYS == 5 then
"#,
        tenure_lua!(),
        r#"if young then
  return {3}
end
end
"#,
        set_lua!(),
        r#"if mine then
  return {1}
end
return {0, redis.call('pttl', KEYS[1])}
"#
    )
}

vote_script! {
    /// Completes the work a lock guarded: only if `KEYS[1]` holds our token `ARGV[1]`, and
    /// nothing is at `KEYS[2]` yet (`KEYS[3]`: the "if free" mark, deleted) (a first record is never overwritten; nor is another
    /// client's key), stores the tagged record `ARGV[3]` at `KEYS[2]` for `ARGV[2]` ms and
    /// deletes the lock, atomically; answers 1, else 0 (an expired or lost lease never stores
    /// a stale answer). On a master that may evict, refused (`eviction_lua!`): a record there
    /// could vanish while a duplicate counts that master's "no record".
    complete COMPLETE / COMPLETE_LENIENT = ["3e546eb6ffb48a6a2071a284c7f186e2206b60af", "12bd88aa0af413d31f2fcf452e091adee97a2f2b"],
    concat!("local wake = ARGV[4]\n", complete_lua!())
}

vote_script! {
    /// Completes the work of a lease that may have been lost (its lock expired while the work ran).
    /// It acts as [`COMPLETE`], and also where `KEYS[1]` is absent. It never acts where another
    /// value holds it (that holder keeps its lock). The record is marked as stored "if free". KEYS
    /// lock, record, its "if free" mark; ARGV token, retention, record.
    complete COMPLETE_FREE / COMPLETE_FREE_LENIENT = ["87954d3d1adb21e5d01eec64261fce86c54df951", "ff79058c67e96c099e4f46db6f88c513f2d264d4"],
    concat!("local wake = ARGV[4]\n", complete_free_lua!())
}

/// An operator's forced release (`Redlock::force_release`). It deletes the lock of the holder named
/// by its token's prefix (or, with an empty prefix, whatever holds it). It deletes the completion
/// record when asked, but only in the call that deleted that holder's lock. (A record carries no
/// token: a re-run that finds another holder leaves its record.) It never deletes a value tagged as
/// one of ours: a fencing counter, a record, a tenure marker, the first tenure marker's
/// `run_id:ms`. So forcing a resource named like one (`job:fence`) cannot delete it. Nor can it
/// delete a record key holding another resource's lock. Not a vote.
pub(crate) static FORCE_RELEASE: Script = Script {
    source: concat!(
        r#"-- KEYS[1] the lock; KEYS[2], when given, its completion record (KEYS[3], its "if free"
-- mark, deleted with it). ARGV[1] the holder's
-- token prefix ('' for whatever holds it); ARGV[2] the wake-up's publish, when on. A value
-- tagged as one of ours (a fencing counter, a record, a tenure marker, a fenced write's
-- token, the first tenure marker's run_id:ms) is no lock: never deleted as one. The record
-- is deleted only if it is one (read with pcall: a key of another type there is no record,
-- and the lock's delete stands), and, with a holder named, only once its lock is deleted.
local function tagged(v)
  local t = string.sub(v, 1, 5)
  return t == 'TRF1:' or t == 'TRR1\n' or t == 'TRT2:' or t == 'TRW1:'
    or string.find(v, '^%x+:%d+$') ~= nil
end
local lock, record, holder, wake = 0, 0, ARGV[1], ARGV[2]
local v = redis.call('get', KEYS[1])
if v and not tagged(v) and string.sub(v, 1, #holder) == holder then
  lock = redis.call('del', KEYS[1])
  "#,
        wake_lua!(),
        r#"end
if #KEYS > 1 and (holder == '' or lock == 1) then
  local r = redis.pcall('get', KEYS[2])
  if type(r) == 'string' and string.sub(r, 1, 5) == 'TRR1\n' then
    record = redis.call('del', KEYS[2])
    local mark = #KEYS > 2 and redis.pcall('get', KEYS[3])
    if type(mark) == 'string' and string.sub(mark, 1, 13) == 'TRR1\nif-free:' then
      redis.call('del', KEYS[3])
    end
  end
end
return {lock, record}
"#
    ),
    sha1: "66bfdbc62a75cd0948a1c8d1956dc72195d1052f",
    votes: false,
    lenient: None,
    whole: false,
};

mod fenced;
pub(crate) use fenced::*;

#[cfg(test)]
mod tests;
