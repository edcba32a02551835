//! The `evict` lane: a bare master made a cache at run time (`evict`). `CONFIG SET
//! maxmemory-policy` to an evicting policy and a `maxmemory` just above what it uses, on a
//! live master whose voters checked it and found `noeviction` — no reconnection, no
//! failover, their background checks not due — then junk written until it really evicts
//! (locks among what it drops), for 150–450 ms; then `noeviction` again, no `maxmemory`,
//! the junk deleted.
//!
//! What it tries to break: a vote counted on a master that may drop the key (the voters'
//! scripts read the policy with their write and refuse, `-EVICTS`). What it cannot help
//! breaking is stated in docs/safety.md, not prevented: a lease granted before the change
//! loses its key there, and once the master votes again (its voters' next check finds it
//! fixed, about a second later) a lease that held on exactly a quorum with that master can
//! be joined by a second holder. Each fault's detail says how many keys it evicted, and the
//! lane prints the total at the end; a run with it shows what the residual does under the
//! other faults.

use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

use super::super::clock;
use super::{ms, Ctx};

/// The evicting policies the lane picks from (`allkeys-*` evict locks first when junk is
/// the newest; `volatile-*` evict only keys with a ttl: locks and records, never the junk).
const POLICIES: [&str; 4] = [
    "allkeys-lru",
    "allkeys-random",
    "volatile-ttl",
    "volatile-lru",
];

/// Room above the memory in use when the policy is set: the junk fills it at once.
const HEADROOM: u64 = 256 << 10;

/// One junk value.
const JUNK: usize = 8 << 10;

/// How long the voters of a healed master may go on abstaining (their check of an
/// abstaining voter runs every second): counted as affected meanwhile.
const ABSTAINS_AFTER: Duration = Duration::from_millis(1500);

pub(super) fn lane(ctx: &Ctx<'_>) {
    let mut rng = fastrand::Rng::new();
    let mut total = 0;
    // Let the workers warm up, and their voters check every master first.
    if !ctx.pause(Duration::from_millis(500)) {
        run(ctx, &mut rng, &mut total);
    }
    eprintln!("evict nemesis: {total} keys evicted in all");
}

/// Makes caches until told to stop; adds what they evicted to `total`.
fn run(ctx: &Ctx<'_>, rng: &mut fastrand::Rng, total: &mut u64) {
    loop {
        let Some(v) = ctx.take(rng, 1, |i| ctx.is_bare(i)) else {
            return;
        };
        let a = v[0];
        let policy = POLICIES[rng.usize(..POLICIES.len())];
        let hold = ms(rng, 150..=450);
        let from_ns = clock::now_ns();
        let master = &ctx.topology.masters[a];
        let (evicted, stopped) = ctx.rt.block_on(async {
            let mut conn = master.conn().await;
            let before = evicted_keys(&mut conn).await;
            let used = info_u64(&mut conn, "memory", "used_memory").await;
            config_set(&mut conn, "maxmemory-policy", policy).await;
            config_set(&mut conn, "maxmemory", &(used + HEADROOM).to_string()).await;
            let until = Instant::now() + hold;
            let mut i = 0u64;
            while Instant::now() < until && !ctx.stop.is_set() {
                // Refused (`-OOM`) once nothing it may evict is left: it evicted already.
                let _: redis::RedisResult<()> = redis::cmd("SET")
                    .arg(format!("checker:junk:{i}"))
                    .arg(vec![b'j'; JUNK])
                    .query_async(&mut conn)
                    .await;
                i += 1;
                if i.is_multiple_of(16) {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            let evicted = evicted_keys(&mut conn).await.saturating_sub(before);
            config_set(&mut conn, "maxmemory", "0").await;
            config_set(&mut conn, "maxmemory-policy", "noeviction").await;
            for chunk in (0..i).collect::<Vec<_>>().chunks(256) {
                let mut del = redis::cmd("UNLINK");
                for j in chunk {
                    del.arg(format!("checker:junk:{j}"));
                }
                let _: redis::RedisResult<()> = del.query_async(&mut conn).await;
            }
            (evicted, ctx.stop.is_set())
        });
        ctx.add(
            "evict",
            &[a],
            from_ns,
            format!("{policy}: {evicted} keys evicted"),
        );
        *total += evicted;
        ctx.budget.free_after(&v, ABSTAINS_AFTER);
        if stopped || ctx.pause(ms(rng, 300..=900)) {
            return;
        }
    }
}

async fn config_set(conn: &mut MultiplexedConnection, name: &str, value: &str) {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("CONFIG SET {name} {value}: {e}"));
}

/// `INFO stats`' `evicted_keys`.
async fn evicted_keys(conn: &mut MultiplexedConnection) -> u64 {
    info_u64(conn, "stats", "evicted_keys").await
}

/// The number `field` of `INFO section`.
async fn info_u64(conn: &mut MultiplexedConnection, section: &str, field: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("INFO {section}: {e}"));
    info.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("INFO {section} has no {field}"))
}
