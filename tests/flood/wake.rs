//! A storm of distinct contended keys against the wake-up's subscribers (issue 42): 20,000
//! keys, each held for a moment by a holder that lets it expire, each waited for by its own
//! caller, 2,000 new keys a second for 10 s. Each voter's subscriber takes the keys in
//! batches from a queue of bounded capacity (4,096 keys: a key beyond it polls on that
//! voter, `src/node/wake.rs`'s `the_queue_is_bounded_and_coalesces`): every waiter is
//! served — woken by its key's expiry (keyspace notifications are on) or found free at its
//! own poll — the process' memory follows the waiters alive at once (under 50 MiB here on
//! an idle machine), never the keys seen, and no subscription is left afterwards.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tower_redlock::{Redlock, Retry};

use super::{fresh_masters, ONE_FLOOD_AT_A_TIME};

/// The keys of the storm, and how many start each tick.
const KEYS: usize = 20_000;
const TICK: Duration = Duration::from_millis(100);
const PER_TICK: usize = 200;
/// How long a holder keeps each key (it lets it expire).
const HELD_MS: u64 = 1_000;
/// The most the process' resident memory may grow over the storm: 50 MiB, or
/// [`PER_WAITER`] for each waiter alive at the peak when more are (a machine too loaded to
/// serve them as fast as they come keeps more alive at once).
const MAX_GROWTH: u64 = 50 << 20;
/// A waiter's memory: its task, its lock call, its share of the connections' buffers
/// (measured per waiter alive at the peak: about 9 KiB on an idle machine, 3,301 alive; 17 to
/// 19 KiB under the stress runner's CPU hog, 3,600 to 4,000 alive), with room: memory kept
/// per key seen (20,000 of them) fails it from about 5 KiB a key; the queue's own bound is
/// `the_queue_is_bounded_and_coalesces`'s.
const PER_WAITER: u64 = 32 << 10;

/// The process' resident set, in bytes (`/proc/self/statm`, Linux).
fn rss() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("resident pages");
    pages * 4096
}

#[tokio::test(flavor = "multi_thread")]
async fn wake_subscribe_storm_twenty_thousand_distinct_keys_are_each_served() {
    let _turn = ONE_FLOOD_AT_A_TIME.lock().await;
    let masters = fresh_masters().await;
    let mut conns = Vec::new();
    for s in masters.iter() {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("SET").arg("notify-keyspace-events").arg("Kx");
        let () = s.query(&cmd).await;
        let client = redis::Client::open(s.url()).unwrap();
        conns.push(client.get_multiplexed_async_connection().await.unwrap());
    }
    let redlock = masters
        .urls()
        .iter()
        .fold(Redlock::builder(), |b, url| b.redis(url))
        .node_timeout(Duration::from_millis(500))
        .wake_waiters(true)
        .build()
        .unwrap();
    let before = rss();
    let (served, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (live, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut peak = before;
    // A set that is reaped as the waiters end: a finished task's memory goes with it.
    let mut tasks = tokio::task::JoinSet::new();
    let started = Instant::now();
    for tick in 0..KEYS / PER_TICK {
        let keys: Vec<String> = (0..PER_TICK)
            .map(|i| format!("wake-storm:{}", tick * PER_TICK + i))
            .collect();
        // The holder: every key taken on every master, to expire after a second.
        for conn in &mut conns {
            let mut pipe = redis::pipe();
            for key in &keys {
                pipe.cmd("SET")
                    .arg(key)
                    .arg("the-holder")
                    .arg("NX")
                    .arg("PX")
                    .arg(HELD_MS)
                    .ignore();
            }
            let () = pipe.query_async(conn).await.unwrap();
        }
        for key in keys {
            let (redlock, served, failed) = (redlock.clone(), served.clone(), failed.clone());
            let live = live.clone();
            most.fetch_max(live.fetch_add(1, SeqCst) + 1, SeqCst);
            tasks.spawn(async move {
                let policy = Retry::until(Duration::from_secs(30))
                    .delay(Duration::from_millis(1_500))
                    .jitter(Duration::from_millis(500));
                match redlock
                    .lock_with(&key, Duration::from_secs(5), policy)
                    .await
                {
                    Ok(lease) => {
                        let _ = lease.release().await;
                        served.fetch_add(1, SeqCst);
                    }
                    Err(e) => {
                        eprintln!("a waiter was not served: {e}");
                        failed.fetch_add(1, SeqCst);
                    }
                }
                live.fetch_sub(1, SeqCst);
            });
        }
        while let Some(ended) = tasks.try_join_next() {
            ended.unwrap();
        }
        peak = peak.max(rss());
        let next = started + TICK * (tick as u32 + 1);
        tokio::time::sleep_until(next.into()).await;
    }
    let spawned = started.elapsed();
    while let Some(ended) = tasks.join_next().await {
        ended.unwrap();
    }
    let done = started.elapsed();
    peak = peak.max(rss());
    let most = most.load(SeqCst);
    println!(
        "{KEYS} keys in {spawned:?}, all answered after {done:?}; rss {} MiB → peak {} MiB; \
         at most {most} waiters at once ({} bytes each)",
        before >> 20,
        peak >> 20,
        peak.saturating_sub(before) / most.max(1) as u64
    );
    assert_eq!(failed.load(SeqCst), 0, "every waiter is served");
    assert_eq!(served.load(SeqCst), KEYS);
    // The memory follows the waiters alive at once, never the keys seen.
    let bound = MAX_GROWTH.max(most as u64 * PER_WAITER);
    assert!(
        peak.saturating_sub(before) < bound,
        "resident memory grew {} MiB over the storm (bound {} MiB: {most} waiters at once)",
        (peak - before) >> 20,
        bound >> 20
    );
    // No subscription is left on any master once every waiter has left.
    let keys: Vec<String> = (0..KEYS).map(|i| format!("wake-storm:{i}")).collect();
    tower_redlock_testkit::eventually("no subscription is left", Duration::from_secs(20), || {
        let conns = conns.clone();
        let keys = keys.clone();
        async move {
            for mut conn in conns {
                for batch in keys.chunks(500) {
                    let counts: Vec<(String, i64)> = redis::cmd("PUBSUB")
                        .arg("NUMSUB")
                        .arg(batch)
                        .query_async(&mut conn)
                        .await
                        .unwrap();
                    if counts.iter().any(|(_, n)| *n != 0) {
                        return false;
                    }
                }
            }
            true
        }
    })
    .await;
}
