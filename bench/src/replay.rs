//! Replay at the client level: idempotent work (`lock_unless_completed`, then
//! `Lease::complete`), one task, one operation at a time, beside this crate's lock cycle, the
//! limit's and one master's `SET`; its table and targets in the report. The targets' wording
//! and one master's `SET` serve the HTTP level too ([`crate::http_replay`]).

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tower_redlock::{LockOrRecord, Redlock, Retry};
use tower_redlock_testkit::Masters;

use crate::report::{counts, mark, p, workload_rows};
use crate::{fmt_dur, Extras, Latency, Limit, Locker, Params};

/// The completion record of the replay workload: a small answer, as an idempotent API keeps.
pub const RECORD_LEN: usize = 200;

/// How long the replay workload's records are kept: longer than the run.
const RETENTION: Duration = Duration::from_secs(600);

/// The replay workload at one N: sequential single-task latencies, all on the same masters
/// in the same rounds (see [`run`]).
#[derive(Debug, Default)]
pub struct ReplayRow {
    /// The limit's lock + release cycle.
    pub limit: Latency,
    /// This crate's lock cycle, `try_lock` + `Lease::release`; its `acquire` is one write
    /// round on the quorum (`SET NX PX` to every master, decided at quorum).
    pub cycle: Latency,
    /// `lock_unless_completed` answering `Completed` (a resource completed beforehand).
    pub hit: Latency,
    /// A first execution on a fresh resource: `lock_unless_completed` answering `Locked`
    /// (`acquire`), then `Lease::complete` with the record (`cycle`: the whole).
    pub first: Latency,
    /// One `SET` of the record on one master: a write round trip without a quorum.
    pub write: Latency,
    /// Lock keys (not completion records) left under the workload's prefix once everything
    /// settled: `complete` ends the lock, so 0 is expected.
    pub locks_left: u64,
}

/// Replay hits: `lock_unless_completed` on `resource`, completed beforehand, answering
/// `Completed` with the record.
async fn replay_hits(
    r: &Redlock,
    resource: &str,
    count: usize,
    budget: Duration,
    cap: Duration,
) -> Latency {
    crate::sequential(count, budget, cap, |_| async move {
        let t0 = Instant::now();
        match r
            .lock_unless_completed(resource, crate::TTL, Retry::never())
            .await
        {
            Ok(LockOrRecord::Completed(record)) if record.len() == RECORD_LEN => {
                let d = t0.elapsed();
                Some((d, d))
            }
            Ok(LockOrRecord::Locked(lease)) => {
                // Not completed after all (a bug): counted as a failure, the lock released.
                let _ = lease.release().await;
                None
            }
            _ => None,
        }
    })
    .await
}

/// First executions: `lock_unless_completed` on a fresh resource (`{prefix}:{i}`) answering
/// `Locked`, then `Lease::complete` with `record`.
async fn first_executions(
    r: &Redlock,
    prefix: &str,
    record: &Bytes,
    count: usize,
    budget: Duration,
    cap: Duration,
) -> Latency {
    crate::sequential(count, budget, cap, |i| {
        let resource = format!("{prefix}:{i}");
        let record = record.clone();
        async move {
            let t0 = Instant::now();
            match r
                .lock_unless_completed(&resource, crate::TTL, Retry::never())
                .await
            {
                Ok(LockOrRecord::Locked(lease)) => {
                    let claimed = t0.elapsed();
                    lease.complete(record, RETENTION).await.ok()?;
                    Some((claimed, t0.elapsed()))
                }
                _ => None,
            }
        }
    })
    .await
}

/// One `SET key record` on one master's multiplexed connection, a round trip each.
pub async fn single_writes(
    conn: &redis::aio::MultiplexedConnection,
    key: &str,
    record: &Bytes,
    count: usize,
    budget: Duration,
    cap: Duration,
) -> Latency {
    crate::sequential(count, budget, cap, |_| {
        let mut conn = conn.clone();
        let mut cmd = redis::cmd("SET");
        cmd.arg(key).arg(&record[..]);
        async move {
            let t0 = Instant::now();
            let ok: redis::RedisResult<()> = cmd.query_async(&mut conn).await;
            let d = t0.elapsed();
            ok.ok().map(|()| (d, d))
        }
    })
    .await
}

/// The replay workload on the first `n` masters: in each round, in a rotated order, the
/// limit's lock cycle, this crate's lock cycle (`try_lock` + `release`), replay hits on one
/// resource completed beforehand, first executions on fresh resources
/// (`lock_unless_completed` + `complete` of a [`RECORD_LEN`]-byte record), and one master's
/// `SET` of that record. One task, one operation at a time; latencies are pooled.
pub async fn run(s: &Params, masters: &Masters, n: usize) -> ReplayRow {
    const PREFIX: &str = "bench:replay";
    let urls = &masters.urls()[..n];
    let limit = Locker::Limit(Arc::new(
        Limit::connect(urls, s.node_timeout, Extras::default()).await,
    ));
    let redlock = crate::ours(urls, s.node_timeout);
    let ours = Locker::Ours(redlock.clone());
    let one = redis::Client::open(urls[0].as_str())
        .expect("valid url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");
    let record = Bytes::from(vec![b'r'; RECORD_LEN]);
    let (write_key, done) = ("bench:rtt:write", format!("{PREFIX}:done"));
    let claim = redlock
        .lock_unless_completed(&done, crate::TTL, Retry::never())
        .await
        .expect("the replay resource's claim");
    match claim {
        LockOrRecord::Locked(lease) => lease
            .complete(record.clone(), RETENTION)
            .await
            .expect("the replay resource completed"),
        other => panic!("{done} was completed before the run: {other:?}"),
    }

    // Warm-up: connections, script caches.
    let warm = Duration::from_secs(5);
    let w = [
        crate::latency(&limit, &format!("{PREFIX}:warm:limit"), 50, warm, warm).await,
        crate::latency(&ours, &format!("{PREFIX}:warm:cycle"), 50, warm, warm).await,
        replay_hits(&redlock, &done, 50, warm, warm).await,
        first_executions(
            &redlock,
            &format!("{PREFIX}:warm:first"),
            &record,
            50,
            warm,
            warm,
        )
        .await,
        single_writes(&one, write_key, &record, 50, warm, warm).await,
    ];
    for w in &w {
        assert!(w.failures == 0 && !w.hung, "replay warm-up failed: {w:?}");
    }

    let mut row = ReplayRow::default();
    let (count, budget, cap) = (s.count(600), s.dur(10.0), Duration::from_secs(5));
    const K: usize = 5;
    for round in 0..s.rounds {
        for j in 0..K {
            match (j + round) % K {
                0 => row.limit.merge(
                    crate::latency(&limit, &format!("{PREFIX}:limit"), count, budget, cap).await,
                ),
                1 => row.cycle.merge(
                    crate::latency(&ours, &format!("{PREFIX}:cycle"), count, budget, cap).await,
                ),
                2 => row
                    .hit
                    .merge(replay_hits(&redlock, &done, count, budget, cap).await),
                3 => {
                    let prefix = format!("{PREFIX}:first:{round}");
                    row.first.merge(
                        first_executions(&redlock, &prefix, &record, count, budget, cap).await,
                    )
                }
                _ => row
                    .write
                    .merge(single_writes(&one, write_key, &record, count, budget, cap).await),
            }
        }
    }

    // The slower masters' completions (in the background) settle, then count the lock keys.
    tokio::time::sleep(s.node_timeout * 4 + Duration::from_millis(300)).await;
    for m in masters.iter().take(n) {
        let keys: Vec<String> = m.query(redis::cmd("KEYS").arg(format!("{PREFIX}:*"))).await;
        let locks: Vec<_> = keys.iter().filter(|k| !k.ends_with(":record")).collect();
        if !locks.is_empty() && std::env::var_os("REDLOCK_BENCH_DEBUG").is_some() {
            eprintln!("replay: locks left on {}: {locks:?}", m.addr());
        }
        row.locks_left += locks.len() as u64;
    }
    row
}

/// The replay table: each workload's p50 and p99, and their ratios to this crate's lock
/// cycle (`try_lock` + `release`) measured in the same rounds.
pub fn table(o: &mut String, node_timeout: Duration, replays: &[(usize, ReplayRow)]) {
    let _ = writeln!(
        o,
        "\n### Idempotent work (replay): one task, one operation at a time, record {RECORD_LEN} B, ttl {:?}, node timeout {:?}\n",
        crate::TTL,
        node_timeout
    );
    let _ = writeln!(
        o,
        "| N | workload | p50 | p99 | p50 / lock cycle p50 | p99 / lock cycle p99 | failures |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|");
    for (n, row) in replays {
        let lines: [(&str, &Latency, &[Duration]); 7] = [
            ("limit: lock + release", &row.limit, &row.limit.cycle),
            (
                "(a) tower-redlock lock cycle: `try_lock` + `release`",
                &row.cycle,
                &row.cycle.cycle,
            ),
            (
                "… of which `try_lock` (one write round on the quorum)",
                &row.cycle,
                &row.cycle.acquire,
            ),
            (
                "(b) replay hit: `lock_unless_completed` → `Completed`",
                &row.hit,
                &row.hit.cycle,
            ),
            (
                "(c) first execution: `lock_unless_completed` → `Locked`, then `complete`",
                &row.first,
                &row.first.cycle,
            ),
            (
                "… of which `lock_unless_completed` → `Locked`",
                &row.first,
                &row.first.acquire,
            ),
            (
                "one master: `SET` of the record (one round trip)",
                &row.write,
                &row.write.cycle,
            ),
        ];
        workload_rows(o, *n, &row.cycle.cycle, &lines);
    }
    counts(
        o,
        "\nLock keys left under the replay prefix once settled (completion records aside)",
        replays.iter().map(|(n, r)| (*n, r.locks_left)),
    );
}

/// The targets for idempotent work, at one N: a replay hit p50 ≤ 1.2× the lock
/// cycle p50; a first execution p50 ≤ the lock cycle p50 + one write round trip, taken as
/// `try_lock`'s p50 (one write round on the quorum), and shown too against one master's
/// `SET` round trip (the stricter reading).
pub fn targets(o: &mut String, n: usize, row: &ReplayRow) {
    let times: [&[Duration]; 5] = [
        &row.cycle.cycle,
        &row.hit.cycle,
        &row.first.cycle,
        &row.cycle.acquire,
        &row.write.cycle,
    ];
    replay_targets(o, n, &CLIENT, times);
}

/// How [`replay_targets`] words its lines: the client level's ([`CLIENT`]) or the HTTP
/// level's ([`crate::http_replay`]).
pub(crate) struct Wording {
    /// After `N={n}` in a target: `""`, or `", HTTP"`.
    pub level: &'static str,
    /// What is named when nothing was measured: `replay`, `HTTP replay`.
    pub nothing: &'static str,
    /// The base in the replay hit's target: `the lock cycle p50`.
    pub hit_base: &'static str,
    /// The base in the first execution's target: `lock cycle p50`.
    pub first_base: &'static str,
    /// The base in the first execution's ratio: `the cycle`.
    pub unit: &'static str,
}

/// The client level's wording: against this crate's lock cycle.
pub(crate) const CLIENT: Wording = Wording {
    level: "",
    nothing: "replay",
    hit_base: "the lock cycle p50",
    first_base: "lock cycle p50",
    unit: "the cycle",
};

/// The two targets of idempotent work at one N, from the p50s of `times`: the base (a lock
/// cycle, or a plain locked request), a replay hit, a first execution, a quorum write
/// (`try_lock`) and one master's `SET`. The hit ≤ 1.2× the base; the first execution ≤ the
/// base + a quorum write (and, the stricter reading, + one `SET`).
pub(crate) fn replay_targets(o: &mut String, n: usize, w: &Wording, times: [&[Duration]; 5]) {
    let [Some(base), Some(hit), Some(first), Some(quorum_write), Some(one_write)] =
        times.map(|v| p(v, 50.0))
    else {
        let _ = writeln!(o, "- N={n}: {}: nothing measured", w.nothing);
        return;
    };
    let r = |a: Duration| a.as_secs_f64() / base.as_secs_f64();
    let _ = writeln!(
        o,
        "- N={n}{}: replay hit p50 ≤ 1.2× {}: {} / {} = {:.2}× — {}",
        w.level,
        w.hit_base,
        fmt_dur(hit),
        fmt_dur(base),
        r(hit),
        mark(r(hit) <= 1.2)
    );
    let budget = base + quorum_write;
    let strict = base + one_write;
    let _ = writeln!(
        o,
        "- N={n}{}: first execution p50 ≤ {} + one write round trip (a quorum write, `try_lock` p50): {} ({:.2}× {}) ≤ {} + {} = {} ({:.2}×) — {} (against one master's `SET` round trip instead: {} + {} = {} ({:.2}×) — {})",
        w.level,
        w.first_base,
        fmt_dur(first),
        r(first),
        w.unit,
        fmt_dur(base),
        fmt_dur(quorum_write),
        fmt_dur(budget),
        r(budget),
        mark(first <= budget),
        fmt_dur(base),
        fmt_dur(one_write),
        fmt_dur(strict),
        r(strict),
        mark(first <= strict)
    );
}
