//! Fencing tokens from the quorum against real Redis masters (`RedlockBuilder::fencing`):
//! tokens of successive holders of a resource strictly increase — after releases, after
//! expiries, under contention, with a minority frozen or restarted (behind restart
//! protection), and with one master's counter far ahead of the others' — and storage that
//! compares them refuses a holder paused past its validity.

use tower_redlock_testkit as support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use support::nodes::{BareNode, LyingFencingNode};
use support::{eventually, warm_up, Masters};
use tower_redlock::node::{MemoryNode, Node, RedisNodeOptions};
use tower_redlock::{LockOrRecord, Redlock, Retry, VoteKind};

const TTL: Duration = Duration::from_secs(10);

async fn fencing_client(m: &Masters) -> Redlock {
    let redlock = m.builder().fencing(true).build().expect("a valid client");
    warm_up(&redlock, m).await;
    redlock
}

/// Takes the lock on `resource` (a try), returns its token, releases it.
async fn token_once(redlock: &Redlock, resource: &str) -> u64 {
    let lease = redlock.try_lock(resource, TTL).await.expect("the lock");
    let token = lease.fencing_token().expect("fencing is on");
    assert_eq!(lease.handle().fencing_token(), Some(token));
    lease.release().await.expect("released");
    token
}

#[tokio::test]
async fn fencing_tokens_strictly_increase_over_sequential_holders() {
    let m = Masters::start(3);
    let a = fencing_client(&m).await;
    let b = fencing_client(&m).await;
    let mut last = 0;
    for round in 0..40 {
        // Two clients, as two processes: each has its own connections.
        let client = if round % 2 == 0 { &a } else { &b };
        let token = token_once(client, "ledger").await;
        assert!(token > last, "round {round}: {token} after {last}");
        last = token;
    }
    // Another resource has a counter of its own (from the clock, not from "ledger"'s).
    let other = token_once(&a, "other").await;
    assert!(other > 0);
    // The counters are bounded in time: they expire (twice the ttl, at least 10 s).
    let pttl = m[0].pttl("ledger:fence").await;
    assert!(pttl > 0 && pttl <= 20_000, "counter ttl {pttl} ms");
}

#[tokio::test]
async fn fencing_is_off_by_default() {
    let m = Masters::start(3);
    let redlock = m.client();
    let lease = redlock.try_lock("plain", TTL).await.unwrap();
    assert_eq!(lease.fencing_token(), None);
    assert!(!redlock.fencing_enabled());
    lease.release().await.unwrap();
    // Nothing but the lock was written, and it is gone.
    eventually("every master is empty", Duration::from_secs(5), || async {
        m.dbsizes().await.iter().all(|&n| n == 0)
    })
    .await;
}

/// A holder that never releases: its lock expires, and the next holder's token is larger —
/// its counters were not raised by a release, the clock carries the order.
#[tokio::test]
async fn fencing_tokens_grow_after_an_expired_holder() {
    let m = Masters::start(3);
    let redlock = fencing_client(&m).await;
    let short = Duration::from_millis(300);
    // Retried: a try that a loaded machine makes slower than the 300 ms ttl grants nothing.
    let first = eventually_lock(&redlock, "expiring", short).await;
    let stale = first.fencing_token().unwrap();
    let next = eventually_lock(&redlock, "expiring", short).await;
    let token = next.fencing_token().unwrap();
    assert!(token > stale, "{token} after the expired {stale}");
    next.release().await.unwrap();
    // The expired lease is long past its validity; its release touches nobody's lock.
    assert!(!first.is_valid());
    drop(first);
}

async fn eventually_lock(redlock: &Redlock, resource: &str, ttl: Duration) -> tower_redlock::Lease {
    redlock
        .lock_with(
            resource,
            ttl,
            Retry::times(200).delay(Duration::from_millis(20)),
        )
        .await
        .expect("the lock, once the last holder's expired")
}

/// One master's counter far ahead of the others' (a skewed clock, or counters raised by
/// tokens it granted): a token that includes it is that large, its release raises every
/// other master's counter to it, and once that master is gone the next token is still
/// larger — from the raised counters of the two left, while they live (the retention: after
/// it, the counters restart from the clocks, which is why the clocks must agree within a ttl).
#[tokio::test]
async fn fencing_survives_a_skewed_minority() {
    const AHEAD: u64 = 5_000_000_000_000_000; // microseconds in the year 2128
    let m = Masters::start(3);
    let redlock = fencing_client(&m).await;
    // Counters are stored as `TRF1:<n>`.
    assert!(
        m[0].set_nx("skewed:fence", &format!("TRF1:{AHEAD}"), None)
            .await
    );
    // The grant is decided at a quorum: retry until master 0's vote was counted.
    // (A request the decision did not wait for still bumps master 0's counter: the next token
    // that counts it is AHEAD + 2, and so on.)
    let mut high = 0;
    for _ in 0..100 {
        high = token_once(&redlock, "skewed").await;
        if high > AHEAD {
            break;
        }
    }
    assert!(high > AHEAD, "master 0's vote never counted");
    eventually(
        "the release raised every counter",
        Duration::from_secs(5),
        || async {
            m.values("skewed:fence")
                .await
                .iter()
                .all(|v| counter(v.as_deref()) >= Some(high))
        },
    )
    .await;
    m[0].stop();
    let after = token_once(&redlock, "skewed").await;
    assert!(after > high, "{after} after {high}");
}

fn counter(raw: Option<&str>) -> Option<u64> {
    raw?.strip_prefix("TRF1:")?.parse().ok()
}

/// Many tasks of three clients fight over one resource: in the order the critical sections
/// happened, the tokens strictly increase.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_follow_the_order_of_contended_sections() {
    const SECTIONS: usize = 120;
    let m = Masters::start(3);
    let mut clients = Vec::new();
    for _ in 0..3 {
        clients.push(fencing_client(&m).await);
    }
    let inside = Arc::new(AtomicUsize::new(0));
    // The tokens in the order the sections were entered (under the lock).
    let order = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(AtomicUsize::new(0));
    let tasks: Vec<_> = (0..9)
        .map(|i| {
            let redlock = clients[i % 3].clone();
            let (inside, order, done) = (inside.clone(), order.clone(), done.clone());
            tokio::spawn(async move {
                let retry = Retry::times(50)
                    .delay(Duration::from_millis(2))
                    .jitter(Duration::from_millis(5));
                while done.load(Ordering::SeqCst) < SECTIONS {
                    let Ok(lease) = redlock.lock_with("contended", TTL, retry).await else {
                        continue;
                    };
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                    order.lock().unwrap().push(lease.fencing_token().unwrap());
                    tokio::task::yield_now().await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    done.fetch_add(1, Ordering::SeqCst);
                    lease.release().await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("no task panicked");
    }
    let order = order.lock().unwrap();
    assert!(order.len() >= SECTIONS);
    for pair in order.windows(2) {
        assert!(
            pair[1] > pair[0],
            "tokens out of order: {} then {}",
            pair[0],
            pair[1]
        );
    }
}

/// A minority frozen (`SIGSTOP`: it answers nothing), then restarted empty — its counters
/// lost — behind restart protection: tokens keep growing throughout.
#[tokio::test]
async fn fencing_tokens_keep_growing_through_a_frozen_and_a_restarted_master() {
    let m = Masters::start(3);
    let ttl = Duration::from_millis(500);
    let options = RedisNodeOptions::new().restart_protection(Duration::from_secs(1));
    let redlock = m
        .iter()
        .fold(Redlock::builder(), |b, s| b.redis_with(&s.url(), &options))
        .node_timeout(Duration::from_millis(200))
        .retry(Retry::times(100).delay(Duration::from_millis(20)))
        .fencing(true)
        .build()
        .unwrap();
    let restarted = &m[1];
    // Takes and releases the lock: its token (larger than `last`), and whether the restarted
    // master voted for it (its key held the lease's value).
    let lock = |last: u64| {
        let redlock = redlock.clone();
        async move {
            let lease = redlock.lock("ledger", ttl).await.expect("the lock");
            let token = lease.fencing_token().unwrap();
            assert!(token > last, "{token} after {last}");
            let voted = restarted.get("ledger").await.as_deref() == Some(lease.value());
            lease.release().await.expect("released");
            (token, voted)
        }
    };
    // The masters are new: the first locks wait out their protection window.
    let (mut last, _) = lock(0).await;
    m[0].freeze();
    for _ in 0..5 {
        last = lock(last).await.0;
    }
    m[0].thaw();
    m[1].restart();
    // Empty (its counters lost) and young: it abstains, the two others carry the tokens.
    for _ in 0..5 {
        last = lock(last).await.0;
    }
    // Once its protection window has passed, the restarted master votes again, its counter
    // restarted from its clock: still above every token.
    let give_up = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (token, voted) = lock(last).await;
        last = token;
        if voted {
            break;
        }
        assert!(
            std::time::Instant::now() < give_up,
            "the restarted master never voted"
        );
    }
    let (after, _) = lock(last).await;
    assert!(after > last);
}

/// Kleppmann's scenario: a holder pauses past its validity, the next holder takes the lock
/// and writes; the paused one's late write carries the smaller token and is refused.
#[tokio::test]
async fn fencing_storage_refuses_a_paused_holders_late_write() {
    let m = Masters::start(3);
    let paused_client = fencing_client(&m).await;
    let next_client = fencing_client(&m).await;
    let storage = Storage::default();
    let short = Duration::from_millis(300);
    // Retried: a try that a loaded machine makes slower than the 300 ms ttl grants nothing.
    let paused = eventually_lock(&paused_client, "file", short).await;
    let stale = paused.fencing_token().unwrap();
    storage.write(stale, "before the pause").unwrap();
    // "The pause": the lock expires while this holder does nothing.
    let next = eventually_lock(&next_client, "file", short).await;
    assert!(!paused.is_valid());
    let token = next.fencing_token().unwrap();
    storage
        .write(token, "the next holder's first write")
        .unwrap();
    // A holder writes as often as it likes with its token.
    storage.write(token, "written by the next holder").unwrap();
    let late = storage.write(stale, "the paused holder's late write");
    assert!(late.is_err(), "a stale write was accepted");
    assert_eq!(storage.value(), "written by the next holder");
    next.release().await.unwrap();
}

/// Storage that checks fencing tokens: a compare-and-set on the largest one seen (a smaller
/// token is refused; the same one is its holder writing again).
#[derive(Default)]
struct Storage(Mutex<(u64, String)>);

impl Storage {
    fn write(&self, token: u64, value: &str) -> Result<(), u64> {
        let mut state = self.0.lock().unwrap();
        if token < state.0 {
            return Err(state.0);
        }
        *state = (token, value.to_owned());
        Ok(())
    }

    fn value(&self) -> String {
        self.0.lock().unwrap().1.clone()
    }
}

/// Custom nodes without counters: one that declares none (locks only) fails every
/// fenced request — alone, the lock fails naming it; beside two that keep counters, the
/// lock is taken without its vote — and one that sets the lock but answers without a
/// counter (`Acquired`) is no vote either: the token stays the largest counter of every vote,
/// and the key it set is released with the lease.
#[tokio::test]
async fn fencing_needs_every_node_to_keep_counters() {
    let alone = Redlock::builder()
        .node(BareNode::default())
        .fencing(true)
        .build()
        .unwrap();
    let e = alone.try_lock("k", TTL).await.unwrap_err();
    assert!(
        e.is_unavailable() && e.to_string().contains("fencing"),
        "{e}"
    );

    let bare = BareNode::default();
    beside_two_counting_nodes(bare.clone(), &bare.0).await;
    let lying = LyingFencingNode::default();
    beside_two_counting_nodes(lying.clone(), &lying.0 .0).await;
}

/// `odd` beside two nodes that keep counters: the lock is taken without its vote, with a
/// token, and whatever `odd` set (in `memory`) is released with the lease.
async fn beside_two_counting_nodes(odd: impl Node, memory: &MemoryNode) {
    let redlock = Redlock::builder()
        .node(odd)
        .node(MemoryNode::new())
        .node(MemoryNode::new())
        .fencing(true)
        .build()
        .unwrap();
    let lease = redlock
        .try_lock("k", TTL)
        .await
        .expect("two votes of three");
    assert!(lease.fencing_token().is_some());
    lease.release().await.unwrap();
    eventually(
        "the odd node's key is released",
        Duration::from_secs(5),
        || async { memory.get("k").is_none() },
    )
    .await;
}

/// Leases for work that must run once (`lock_unless_completed`) carry tokens too: a claim
/// whose work failed (released) and the next one, then — once the completion record
/// expired — a new claim, each larger than the last.
///
/// The record is kept 2 s: the claim right after `complete` must find it (a 300 ms retention
/// could expire on a loaded machine before that claim ran), and its expiry is awaited.
#[tokio::test]
async fn fencing_tokens_on_leases_of_idempotent_work() {
    let m = Masters::start(3);
    let redlock = fencing_client(&m).await;
    let claim = || redlock.lock_unless_completed("pay:1", TTL, Retry::never());
    let LockOrRecord::Locked(failed) = claim().await.unwrap() else {
        panic!("nothing completed yet")
    };
    let a = failed.fencing_token().expect("a token");
    failed.release().await.unwrap();
    let LockOrRecord::Locked(done) = claim().await.unwrap() else {
        panic!("the failed work stored nothing")
    };
    let b = done.fencing_token().expect("a token");
    assert!(b > a, "{b} after {a}");
    done.complete("paid", Duration::from_secs(2)).await.unwrap();
    assert!(matches!(claim().await.unwrap(), LockOrRecord::Completed(_)));
    // The completion raised every counter it reached to its token.
    eventually(
        "the counters were raised",
        Duration::from_secs(5),
        || async {
            m.values("pay:1:fence")
                .await
                .iter()
                .all(|v| counter(v.as_deref()) >= Some(b))
        },
    )
    .await;
    let next = Mutex::new(None);
    eventually("the record expires", Duration::from_secs(10), || async {
        match claim().await.unwrap() {
            LockOrRecord::Locked(lease) => {
                *next.lock().unwrap() = Some(lease);
                true
            }
            LockOrRecord::Completed(_) | LockOrRecord::OutcomeUnknown => false,
        }
    })
    .await;
    let next = next.into_inner().unwrap().expect("locked");
    let c = next.fencing_token().expect("a token");
    assert!(c > b, "{c} after {b}");
    next.release().await.unwrap();
}

/// A master whose clock is really 0.6 × ttl ahead (`RedisServer::start_with_clock_offset`),
/// whose vote arrives last: its request is held in the fault proxy until the other master
/// has granted the lock, then let through in time to count, so the token is its counter —
/// its clock, 1.8 s ahead. The holder then crashes (no release). Once its lock is gone on the
/// other master that granted it, the next holder's quorum is that master and a third one
/// (the skewed master held back, not counted), whose clocks are behind the first token. The
/// next token must still be larger — whatever the skew (below the bound) and however long
/// the first acquisition took.
///
/// What it waits for, not luck: the held request is let through only once master a holds
/// the lock (the vote then comes last, with its answer due within the 2 s node timeout);
/// the crashed lock's end on a is its deletion there (an expiry is a deletion; the counter
/// `<key>:fence` stays, as it does at an expiry), so the next grant need not wait out the
/// ttl. The scenario needs the next grant to land while c's clock is still below the first
/// token (1.8 s of margin, for a reconnect and one try): when a slow machine misses that, or
/// the late vote misses its node timeout, the run is a set-up failure, tried again with a
/// new key and reported as "could not set up the scenario" — never as a broken promise.
#[tokio::test(flavor = "multi_thread")]
async fn fencing_skew_a_master_ahead_by_most_of_a_ttl_never_sends_tokens_back() {
    use support::proxy::FaultProxy;
    use support::RedisServer;
    let ttl = Duration::from_secs(3);
    let skew = Duration::from_millis(1800);
    let (a, c) = (RedisServer::start(), RedisServer::start());
    let b = RedisServer::start_with_clock_offset(skew, true);
    let offset = b.time_us().await - a.time_us().await;
    let skew_us = skew.as_micros() as i64;
    assert!(
        (skew_us - 150_000..skew_us + 150_000).contains(&offset),
        "master b runs {offset} µs ahead, not about {skew:?}"
    );
    let mut proxies = Vec::new();
    for m in [&a, &b, &c] {
        proxies.push(FaultProxy::start(m.addr().parse().unwrap()).await);
    }
    let redlock = proxies
        .iter()
        .fold(Redlock::builder(), |r, p| r.redis(&p.url()))
        .node_timeout(Duration::from_secs(2))
        .suspend_after(0)
        .retry(Retry::never())
        .fencing(true)
        .build()
        .unwrap();
    // Connections up, scripts cached.
    for i in 0..5 {
        token_once(&redlock, &format!("skew-warm-{i}")).await;
    }
    let servers = [&a, &b, &c];
    let proxies = [&proxies[0], &proxies[1], &proxies[2]];
    let mut set_up_failures = Vec::new();
    for round in 0..5 {
        let key = format!("skewed-job-{round}");
        match skewed_grant_then_next(&redlock, servers, proxies, &key, ttl).await {
            Ok((t1, t2)) => {
                assert!(
                    t2 > t1,
                    "the next holder's token {t2} is {} µs below the crashed holder's {t1}",
                    t1 - t2
                );
                return;
            }
            Err(why) => set_up_failures.push(why),
        }
    }
    panic!("could not set up the scenario in 5 rounds: {set_up_failures:#?}");
}

/// One round of the skew scenario on `key` (see the test): the crashed holder's token and
/// the next holder's, or why the machine did not produce the scenario.
async fn skewed_grant_then_next(
    redlock: &Redlock,
    [a, b, c]: [&support::RedisServer; 3],
    [_, pb, pc]: [&support::proxy::FaultProxy; 3],
    key: &str,
    ttl: Duration,
) -> Result<(u64, u64), String> {
    use support::proxy::Fault;
    // c is down; b's request is held until a has granted, then let through.
    pc.set(Fault::Reset);
    pb.set(Fault::BlackHole);
    let trying = tokio::spawn({
        let (redlock, key) = (redlock.clone(), key.to_owned());
        async move { redlock.try_lock(&key, ttl).await }
    });
    eventually(
        "master a grants the lock",
        Duration::from_secs(10),
        || async { a.get(key).await.is_some() },
    )
    .await;
    // a's clock before b runs the request: b's counter (its clock, 1.8 s ahead) is above it
    // by about the skew, whatever the load.
    let a_before = a.time_us().await;
    // b's vote comes late: after a's, with part of the node timeout gone.
    tokio::time::sleep(Duration::from_millis(200)).await;
    pb.set(Fault::Pass);
    let lease = match trying.await.unwrap() {
        Ok(lease) => lease,
        // Only b's vote missing its 2 s node timeout (with 1.8 s to spare) is the machine's
        // doing; any other failure of a, b and a dead c is the lock's.
        Err(e)
            if e.votes()
                .any(|v| v.node() == 1 && v.kind() == VoteKind::Timeout) =>
        {
            return Err(format!("b's late vote missed its node timeout: {e}"));
        }
        Err(e) => panic!("the grant by a and the late b failed: {e}"),
    };
    let t1 = lease.fencing_token().expect("fencing is on");
    // From b's clock, not a's: b voted for, so its counter counts for the token.
    assert!(
        t1 as i64 >= a_before + 900_000,
        "token {t1} is not from the skewed master's clock (a's read {a_before} before b ran)"
    );
    // The holder crashes: no release, no raise.
    std::mem::forget(lease);
    // c is back (and reached again: a lock of another key lands there).
    pc.set(Fault::Pass);
    eventually("c votes again", Duration::from_secs(10), || async {
        let Ok(lease) = redlock.try_lock("skew-probe", ttl).await else {
            return false;
        };
        let on_c = c.get("skew-probe").await.as_deref() == Some(lease.value());
        lease.release().await.unwrap();
        on_c
    })
    .await;
    // b is held back (not counted): the next grant is a's and c's, once the crashed lock is
    // gone on a.
    pb.set(Fault::BlackHole);
    assert!(a.del(key).await, "the crashed holder's lock on master a");
    // a and c are up and the key is free on both: a grant, unless a try times out on the
    // machine's account (then it is tried again).
    let mut next = None;
    for _ in 0..20 {
        match redlock.try_lock(key, ttl).await {
            Ok(lease) => {
                next = Some(lease);
                break;
            }
            Err(e) if e.is_timeout() => {}
            Err(e) => panic!("a and c refused the free key: {e}"),
        }
    }
    let c_after = c.time_us().await;
    pb.set(Fault::Pass);
    let next = next.ok_or("a and c timed out 20 times")?;
    let t2 = next.fencing_token().expect("fencing is on");
    next.release().await.unwrap();
    let _ = b.del(key).await; // the crashed holder's copy there: the next round uses a new key
    if c_after >= t1 as i64 {
        // c's counter would have started above the first token anyway: nothing was shown.
        return Err(format!(
            "the next grant came after c's clock passed the first token ({c_after} ≥ {t1})"
        ));
    }
    Ok((t1, t2))
}
