//! The fenced scripts: the fencing counter read, bumped by a grant and raised by the lease's
//! other calls (the Lua fragments of the parent module, `set_lua!` and the tenure check, in
//! scope here).

use super::Script;

/// Reads the fencing counter at the key `fkey` into `fence` (0 when absent); `foreign` is
/// set when the key holds something else than a counter (tagged `TRF1:`) — a lock of a
/// resource named like the counter — which the scripts never overwrite.
macro_rules! fence_read_lua {
    () => {
        r#"local raw = redis.call('get', fkey)
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

/// The fencing counter's bump, for the fenced acquires (after `fence_read_lua!`). `fence` becomes
/// the counter plus one. When there is none (it expired, or was lost in a restart), it becomes the
/// server's clock in microseconds, so that it starts again above the tokens it gave. Either way it
/// is kept for `fret` ms. Counters kept level by the settling and the raises bump to the same value
/// on every master, so a grant rarely needs settling. Lua numbers are doubles: exact below 2^53
/// (microseconds since 1970 stay below it until the year 2255). The counter is stored with
/// `%.0f`, never in exponent form, behind the tag `TRF1:`.
macro_rules! fence_bump_lua {
    () => {
        r#"if raw then
  fence = fence + 1
else
  local ft = redis.call('TIME')
  fence = tonumber(ft[1]) * 1000000 + tonumber(ft[2])
end
redis.call('set', fkey, 'TRF1:' .. string.format('%.0f', fence), 'PX', fret)
"#
    };
}

/// The raise of the fenced release, completion and extension (after `fence_read_lua!`). The counter
/// becomes the lease's token `$floor` if it is below, kept for `$ret` ms. A counter that is gone
/// (it expired, or was lost) starts again from the larger of the token and the server's clock in
/// microseconds. A raise long after its lease must not bring a counter back at an old token, below
/// tokens issued since from a counter that expired too. A foreign value is left alone.
macro_rules! fence_raise_lua {
    ($floor:literal, $ret:literal) => {
        concat!(
            "if not foreign then\n",
            "  local floor = tonumber(",
            $floor,
            ")\n",
            "  if not raw then\n",
            "    local rt = redis.call('TIME')\n",
            "    floor = math.max(floor, tonumber(rt[1]) * 1000000 + tonumber(rt[2]))\n",
            "  end\n",
            "  if not raw or fence < floor then\n",
            "    redis.call('set', fkey, 'TRF1:' .. string.format('%.0f', floor), 'PX', ",
            $ret,
            ")\n",
            "  end\n",
            "end\n"
        )
    };
}

/// The end of the fenced acquires, after the record and tenure checks. `{4}` when the counter's key
/// is foreign (nothing set). Else the lock's set (`set_lua!`) and, when it set the key, the bump:
/// `{1, fence}`. That is also the answer when the key already held our token (a request sent twice:
/// the counter is as its first send left it). Or `{0, PTTL}` when another value holds it.
macro_rules! fenced_set_lua {
    () => {
        concat!(
            fence_read_lua!(),
            r#"if foreign then
  return {4}
end
"#,
            set_lua!(),
            r#"if set then
"#,
            fence_bump_lua!(),
            r#"end
if mine then
  return {1, fence}
end
return {0, redis.call('pttl', KEYS[1])}
"#
        )
    };
}

vote_script! {
    /// The fenced acquire: KEYS lock, counter[, the two tenure markers]; ARGV token, ttl, the longest ttl
    /// (tenure protection, as [`ACQUIRE_GUARDED`]: `{3}` while the tenure is young, setting
    /// nothing), the counter's retention. Answers as `fenced_set_lua!`.
    acquire ACQUIRE_FENCED / ACQUIRE_FENCED_LENIENT = ["4d9ff7654a3b258b804ffab27e0c1e4dd324d77c", "4bab749cd81df14ca0b4902e573d47b772b45218"],
    concat!(
        "local fkey, fret = KEYS[2], ARGV[4]\n",
        "if #KEYS == 4 then\n",
        tenure_lua!(),
        r#"if young then
  return {3}
end
end
"#,
        fenced_set_lua!()
    )
}

vote_script! {
    /// The fenced extension, which settles a fenced lease's token right after its grant: only
    /// if `KEYS[1]` holds our token `ARGV[1]`, raise the counter `KEYS[2]` to the token `ARGV[3]`
    /// (`fence_raise_lua!`, kept for `ARGV[4]` ms) and `PEXPIRE` the lock to `ARGV[2]` ms;
    /// answers 1, else 0 (nothing done).
    extend EXTEND_FENCED / EXTEND_FENCED_LENIENT = ["363937b5d7b2f03d725d76b91f784c7077207e3a", "220c43d1ba4ccfc78d76e00d85bf7f79c112df6b"],
    concat!(
        r#"if redis.call('get', KEYS[1]) ~= ARGV[1] then
  return 0
end
local fkey = KEYS[2]
"#,
        fence_read_lua!(),
        fence_raise_lua!("ARGV[3]", "ARGV[4]"),
        r#"return redis.call('pexpire', KEYS[1], ARGV[2])
"#
    )
}

vote_script! {
    /// The fenced replay acquire: KEYS lock, record, its "if free" mark, counter[, the two
    /// tenure markers]; ARGV as [`ACQUIRE_FENCED`]. `{2, record}` (or `{2, record, 1}`) when
    /// the completion record exists (as [`ACQUIRE_UNLESS_COMPLETED`]), else as
    /// [`ACQUIRE_FENCED`].
    acquire ACQUIRE_UNLESS_COMPLETED_FENCED / ACQUIRE_UNLESS_COMPLETED_FENCED_LENIENT = ["7f8ed85cb2cca5cf8a5360106ec34f81974b163c", "49c9147456ec2917fceb8cf85624e754a8946da7"],
    concat!(
        r#"local fkey, fret = KEYS[4], ARGV[4]
local record = redis.call('get', KEYS[2])
if record and string.sub(record, 1, 5) == 'TRR1\n' then
  local body, mark = string.sub(record, 6), redis.pcall('get', KEYS[3])
  if type(mark) == 'string' and mark == 'TRR1\nif-free:' .. redis.sha1hex(body) then
    return {2, body, 1, redis.call('pttl', KEYS[2])}
  end
  return {2, body}
end
if #KEYS == 6 then
"#,
        tenure_lua!(),
        r#"if young then
  return {3}
end
end
"#,
        fenced_set_lua!()
    )
}

/// The fenced release: KEYS lock, counter; ARGV token, the lease's fencing token, the
/// counter's retention. Raises the counter to the lease's token (`fence_raise_lua!`) — so
/// that the next holder, whose quorum shares a node with this one's, gets a larger token —
/// then compare-and-delete, as [`RELEASE`].
pub(crate) static RELEASE_FENCED: Script = Script {
    source: concat!(
        "local fkey, wake = KEYS[2], ARGV[4]\n",
        fence_read_lua!(),
        fence_raise_lua!("ARGV[2]", "ARGV[3]"),
        release_lua!()
    ),
    sha1: "1f02cf740c6641970fafebb3d7a50eea48c34d9d",
    votes: false,
    lenient: None,
    whole: false,
};

vote_script! {
    /// The fenced completion: KEYS lock, record, its "if free" mark, counter; ARGV as [`COMPLETE`], then the lease's
    /// fencing token and the counter's retention. Raises the counter as [`RELEASE_FENCED`],
    /// then as [`COMPLETE`] (refused, nothing raised, on a master that may evict).
    complete COMPLETE_FENCED / COMPLETE_FENCED_LENIENT = ["0227955c570fd56efb043bacbae4585ca302464b", "51d10a68f6119e5d6c1b793988c3def72166f61c"],
    concat!(
        "local fkey, wake = KEYS[4], ARGV[6]\n",
        fence_read_lua!(),
        fence_raise_lua!("ARGV[4]", "ARGV[5]"),
        complete_lua!()
    )
}

vote_script! {
    /// The fenced [`COMPLETE_FREE`]: KEYS lock, record, its "if free" mark, counter; ARGV as
    /// [`COMPLETE_FENCED`].
    /// Raises the counter as [`COMPLETE_FENCED`] does (also where nothing is stored), then as
    /// [`COMPLETE_FREE`] (refused, nothing raised, on a master that may evict).
    complete COMPLETE_FREE_FENCED / COMPLETE_FREE_FENCED_LENIENT = ["6ca23c0966c4d937cea279b942c43e26e1ce5804", "ee7010d1dd0cf3fcdfdad10a1d080829290fa60d"],
    concat!(
        "local fkey, wake = KEYS[4], ARGV[6]\n",
        fence_read_lua!(),
        fence_raise_lua!("ARGV[4]", "ARGV[5]"),
        complete_free_lua!()
    )
}
