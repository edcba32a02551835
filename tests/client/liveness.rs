//! Liveness under load, against real masters: a stall of a paused majority, a client whose
//! runtime thread is blocked, a live holder behind suspended masters, and releases that
//! must be retried. The lock stays safe in all of them; these tests ask that it stays *live*:
//! no runtime starved by its retry loop, no healthy master suspended, no holder reported as
//! an outage, no lock stranded after a release.

use tower_redlock_testkit as support;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

use support::{eventually, warm_up, Masters};
use tower_redlock::{Redlock, Retry};

/// A ttl no test waits out: a key still there after a test was left behind, not expiring.
const LONG_TTL: Duration = Duration::from_secs(120);

/// A client of every master with this node timeout (ms), no retries, default suspension.
fn client_of(masters: &Masters, timeout_ms: u64) -> Redlock {
    masters
        .builder()
        .node_timeout(Duration::from_millis(timeout_ms))
        .build()
        .unwrap()
}

/// Every master ends empty well before any test lock could expire.
async fn all_empty(masters: &Masters) {
    eventually("every master is empty", Duration::from_secs(15), || async {
        masters.dbsizes().await.iter().all(|&n| n == 0)
    })
    .await;
}

/// Thaws the masters it names when dropped, also when the test panics.
struct Paused<'a>(&'a Masters, Vec<usize>);

impl<'a> Paused<'a> {
    fn freeze(masters: &'a Masters, which: &[usize]) -> Self {
        for &i in which {
            masters[i].freeze();
        }
        Self(masters, which.to_vec())
    }

    fn thaw(mut self) {
        self.thaw_all();
    }

    fn thaw_all(&mut self) {
        for i in self.1.drain(..) {
            self.0[i].thaw();
        }
    }
}

impl Drop for Paused<'_> {
    fn drop(&mut self) {
        self.thaw_all();
    }
}

/// What the contending tasks saw.
#[derive(Default)]
struct Seen {
    successes: AtomicU64,
    overlaps: AtomicU64,
    inside: AtomicUsize,
    /// The first success after this instant, if any (set by the test at the resume).
    resumed_at: Mutex<Option<Instant>>,
    first_after_resume: Mutex<Option<Duration>>,
}

/// The stall: 32 tasks contend for one key on 5 masters (try, and at once again on
/// failure); 3 masters are paused for 300 ms, then resumed. After the resume, successes
/// restart within 2 s; a timer task on the same runtime keeps ticking during the stall (no
/// retry loop starves it); no two holders ever; no key left behind.
///
/// The pause starts once a lock was granted (awaited, not guessed by a sleep), and the run
/// ends once one was granted after the resume. The bound on the restart is the reaction the
/// docs state — a probe interval (200 ms), a reconnection and a node timeout (50 ms), about
/// 300 ms — with the rest of 2 s as slack for a loaded 2-core machine; a lock that stays
/// stalled (the bug this test is for) fails it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_majority_stalls_the_lock_and_it_recovers() {
    let masters = Masters::start(5);
    let client = Redlock::builder();
    let client = masters
        .urls()
        .iter()
        .fold(client, |b, u| b.redis(u))
        .retry(Retry::never())
        .build()
        .unwrap(); // the default node timeout and suspension
    warm_up(&client, &masters).await;

    let seen = Arc::new(Seen::default());
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ticking = stop.clone();
    let ticker = tokio::spawn(async move {
        let mut worst = Duration::ZERO;
        let mut next = Instant::now();
        while !ticking.load(SeqCst) {
            next += Duration::from_millis(10);
            tokio::time::sleep_until(next.into()).await;
            worst = worst.max(Instant::now().saturating_duration_since(next));
        }
        worst
    });
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let (client, seen, stop) = (client.clone(), seen.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(SeqCst) {
                    let Ok(lease) = client.try_lock("stall", LONG_TTL).await else {
                        continue;
                    };
                    if seen.inside.fetch_add(1, SeqCst) != 0 {
                        seen.overlaps.fetch_add(1, SeqCst);
                    }
                    tokio::task::yield_now().await;
                    seen.inside.fetch_sub(1, SeqCst);
                    let _ = lease.release().await;
                    seen.successes.fetch_add(1, SeqCst);
                    let resumed = *seen.resumed_at.lock().unwrap();
                    if let Some(at) = resumed {
                        let mut first = seen.first_after_resume.lock().unwrap();
                        first.get_or_insert_with(|| at.elapsed());
                    }
                }
            })
        })
        .collect();

    eventually(
        "could not set up the scenario: a lock is granted before the pause",
        Duration::from_secs(10),
        || async { seen.successes.load(SeqCst) > 0 },
    )
    .await;
    let before = seen.successes.load(SeqCst);
    let paused = Paused::freeze(&masters, &[0, 1, 2]);
    // The stall's length: the fault, not a synchronization.
    tokio::time::sleep(Duration::from_millis(300)).await;
    *seen.resumed_at.lock().unwrap() = Some(Instant::now());
    paused.thaw();
    // (Waited for far longer than the asserted 2 s, so that the bound below reports it.)
    eventually(
        "a lock is granted after the resume",
        Duration::from_secs(10),
        || async { seen.first_after_resume.lock().unwrap().is_some() },
    )
    .await;
    stop.store(true, SeqCst);
    let ended = Instant::now();

    for t in tasks {
        t.await.expect("a contending task");
    }
    let took = ended.elapsed();
    let worst_tick = ticker.await.expect("the ticker");
    let first = *seen.first_after_resume.lock().unwrap();
    let total = seen.successes.load(SeqCst);
    eprintln!(
        "stall: {before} successes before the pause, {total} in all; first after the resume \
         {first:?}; worst tick lateness {worst_tick:?}; run took {took:?}"
    );
    assert!(before > 0, "no lock was granted before the pause");
    assert_eq!(seen.overlaps.load(SeqCst), 0, "two holders at once");
    let first = first.expect("no lock was granted after the resume");
    assert!(
        first < Duration::from_secs(2),
        "successes restarted {first:?} after the resume"
    );
    // A runtime starved by a retry loop stops its timers for seconds. How late a timer
    // fires also measures how the machine schedules this process (a loaded 2-core machine
    // delays it by hundreds of milliseconds), so the bound here is 2 s; the exact,
    // load-free check that a loop of tries yields is `tries_decided_without_io_still_yield`.
    assert!(
        worst_tick < Duration::from_secs(2),
        "a timer on the same runtime was {worst_tick:?} late"
    );
    // Every task ends within its try in flight (a node timeout) once told to stop.
    assert!(
        took < Duration::from_secs(2),
        "the tasks took {took:?} to stop"
    );
    all_empty(&masters).await;
}

/// A client whose runtime thread is blocked, again and again, for longer than the node
/// timeout (a CPU-starved replica), while every master is healthy: the masters answered in
/// time, so none is suspended, no free key is reported unavailable, and every lease is
/// released.
#[tokio::test(flavor = "current_thread")]
async fn a_starved_client_blames_no_healthy_master() {
    starved_client(1).await;
}

/// The same on a multi-threaded runtime whose two workers are each blocked in turn and
/// together: timers and connections are serviced late, or by the other worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starved_multi_threaded_client_blames_no_healthy_master() {
    starved_client(2).await;
}

/// Lock cycles on free keys while `blockers` tasks block the runtime's threads, `BLOCKS`
/// times in all: no error, no master suspended, nothing left.
///
/// The node timeout is the test kit's 200 ms, not the default 50 ms: the masters must
/// really be healthy — answer within it — on a loaded machine, where a redis-server
/// descheduled for 50 ms is not rare; each block is three node timeouts, as before.
async fn starved_client(blockers: usize) {
    let masters = Masters::start(3);
    let timeout = support::NODE_TIMEOUT;
    let client = client_of(&masters, timeout.as_millis() as u64);
    warm_up(&client, &masters).await;

    // Blocks the runtime `BLOCKS` times while the workers lock and release free keys.
    const BLOCKS: u64 = 6;
    let blocks = Arc::new(AtomicU64::new(0));
    let blockers: Vec<_> = (0..blockers)
        .map(|b| {
            let blocks = blocks.clone();
            tokio::spawn(async move {
                while blocks.load(SeqCst) < BLOCKS {
                    tokio::time::sleep(Duration::from_millis(20 + 7 * b as u64)).await;
                    // The thread stops: no timer, no socket is serviced on it meanwhile.
                    std::thread::sleep(timeout * 3);
                    blocks.fetch_add(1, SeqCst);
                }
            })
        })
        .collect();
    let workers: Vec<_> = (0..8)
        .map(|w| {
            let (client, blocks) = (client.clone(), blocks.clone());
            tokio::spawn(async move {
                let (mut errors, mut cycles) = (Vec::new(), 0);
                // Bounded: the blocker finishes long before.
                while blocks.load(SeqCst) < BLOCKS && cycles < 100_000 {
                    cycles += 1;
                    match client
                        .try_lock(&format!("starved:{w}:{cycles}"), LONG_TTL)
                        .await
                    {
                        Ok(lease) => {
                            if let Err(e) = lease.release().await {
                                errors.push(format!("release: {e}"));
                            }
                        }
                        Err(e) => errors.push(format!("lock: {e}")),
                    }
                }
                (errors, cycles)
            })
        })
        .collect();
    let (mut errors, mut cycles) = (Vec::new(), 0);
    for w in workers {
        let (e, c) = w.await.expect("a worker");
        errors.extend(e);
        cycles += c;
    }
    for b in blockers {
        b.await.expect("a blocker");
    }
    eprintln!("starved client: {cycles} lock cycles across {BLOCKS} blocks of the runtime");
    assert!(errors.is_empty(), "{} errors: {errors:?}", errors.len());
    let status = client.node_status();
    assert!(status.iter().all(|s| !s.is_suspended()), "{status:?}");
    all_empty(&masters).await;
}

/// Five masters, another client holds the key on all of them, and two masters are paused
/// and suspended in our client: a try fails at once on those two, but the live masters say
/// "held" — so it is contended (409), never unavailable (503), with the holder's remaining
/// ttl.
#[tokio::test(flavor = "multi_thread")]
async fn a_live_holder_is_not_hidden_by_suspended_masters() {
    let masters = Masters::start(5);
    let ours = masters.client();
    let theirs = masters.client();
    warm_up(&ours, &masters).await;
    let ttl = Duration::from_secs(30);
    let held = theirs.try_lock("held", ttl).await.unwrap();

    let paused = Paused::freeze(&masters, &[0, 1]);
    let i = AtomicU64::new(0);
    eventually(
        "masters 0 and 1 are suspended",
        Duration::from_secs(20),
        || async {
            // Cycles on other keys reach a quorum on masters 2-4; the paused masters' answers
            // time out (in the background) until they are suspended.
            let key = format!("other:{}", i.fetch_add(1, SeqCst));
            if let Ok(lease) = ours.try_lock(&key, LONG_TTL).await {
                let _ = lease.release().await;
            }
            let s = ours.node_status();
            s[0].is_suspended() && s[1].is_suspended()
        },
    )
    .await;
    for round in 0..20 {
        let err = ours.try_lock("held", ttl).await.unwrap_err();
        assert!(err.is_contended(), "round {round}: {err:?}");
        assert!(err.held_by() >= 1, "round {round}: {err:?}");
        let after = err.retry_after().expect("a live holder's remaining ttl");
        assert!(
            after > Duration::from_secs(10) && after <= ttl,
            "round {round}: retry_after {after:?} for a holder with ~{ttl:?} left"
        );
    }
    paused.thaw();
    held.release().await.unwrap();
    all_empty(&masters).await;
}

/// A release that reaches too few masters at first is retried until it reaches a quorum:
/// two of three masters are frozen while the lease is released, and thawed only once the
/// release's first request to each of them has timed out (awaited: their timeout counts
/// grow) — so one try per node would have failed. The release succeeds, and a quorum no
/// longer holds the key as soon as it returns.
///
/// The node timeout is 500 ms: generous for the set-up on a loaded machine (a lock on every
/// master, retried, else "could not set up the scenario"), and it sets the release's
/// patience, 10 node timeouts (5 s) from its start. The thaw comes a node timeout in, after
/// a 10 ms poll and a `kill`; the retry that reaches the thawed masters follows within a
/// pause (at most 200 ms) and a round trip. The other ~4 s are the slack for a loaded
/// machine; a release that is not retried (the bug) fails however fast the machine.
#[tokio::test(flavor = "multi_thread")]
async fn a_release_that_misses_a_quorum_is_retried() {
    const NODE_TIMEOUT: Duration = Duration::from_millis(500);
    let masters = Masters::start(3);
    let client = masters
        .builder()
        .node_timeout(NODE_TIMEOUT)
        .suspend_after(0)
        .build()
        .unwrap();
    warm_up(&client, &masters).await;
    // The set-up, retried: the lock, on every master.
    let set_up = Instant::now();
    let lease = loop {
        match client.try_lock("retried", LONG_TTL).await {
            Ok(lease) => break lease,
            Err(e) if set_up.elapsed() < Duration::from_secs(10) => {
                eprintln!("set-up try failed, again: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("could not set up the scenario: no lock in 10 s: {e}"),
        }
    };
    let value = lease.value().to_owned();
    eventually(
        "could not set up the scenario: every master holds the lock",
        Duration::from_secs(10),
        || masters.everywhere("retried", &value),
    )
    .await;

    let timeouts = |i: usize| client.node_status()[i].consecutive_timeouts();
    let before = [timeouts(0), timeouts(1)];
    let paused = Paused::freeze(&masters, &[0, 1]);
    let started = Instant::now();
    let resume = async {
        // Nothing but the release asks the frozen masters: a new timeout is its request's.
        let took = eventually(
            "the release's first requests to masters 0 and 1 time out",
            Duration::from_secs(10),
            || async { timeouts(0) > before[0] && timeouts(1) > before[1] },
        )
        .await;
        paused.thaw();
        took
    };
    let (released, first_timeouts) = tokio::join!(lease.release(), resume);
    eprintln!(
        "released after {:?}; thawed after the first timeouts, {first_timeouts:?} in",
        started.elapsed()
    );
    released.expect("the release is retried until a quorum answered");
    assert!(
        masters.holding("retried", &value).await <= 1,
        "a quorum still holds the released lock"
    );
    all_empty(&masters).await;
}

/// A try whose outcome is decided without any request (every master suspended) still
/// yields to the scheduler: a tight loop of such tries on a single-threaded runtime lets a
/// timer task run, again and again while the loop runs.
///
/// The timer task ticks every millisecond and notes, at each tick, how many tries the loop
/// has made: a tick at a try count it had not seen is a point of the loop where the task
/// ran. The loop runs until the task ran at 100 such points. A loop that yields (every 128
/// tries, Tokio's budget) gives the task a turn at each of its ticks: ~100 ms, a second or
/// so on a loaded machine. A loop that never yields lets it run only while one of its tries
/// waits for I/O — an in-band probe of the frozen master, let through at most once per
/// 400 ms (`2 × MAX_BACKOFF`, `Health::admit`), while the loop stands still on one try — so
/// in the 10 s the loop is given at most 1 + 10 s / 400 ms = 26 points. The count tells them
/// apart whatever the load; the 10 s only end a failing run.
#[tokio::test(flavor = "current_thread")]
async fn tries_decided_without_io_still_yield() {
    const POINTS: u64 = 100;
    const GIVEN: Duration = Duration::from_secs(10);
    let masters = Masters::start(1);
    // The test kit's node timeout: the timing is not the point here.
    let client = client_of(&masters, support::NODE_TIMEOUT.as_millis() as u64);
    warm_up(&client, &masters).await;
    let paused = Paused::freeze(&masters, &[0]);
    eventually(
        "could not set up the scenario: the frozen master is suspended",
        Duration::from_secs(10),
        || async {
            let _ = client.try_lock("suspend-me", LONG_TTL).await;
            client.node_status()[0].is_suspended()
        },
    )
    .await;
    let tries = Arc::new(AtomicU64::new(0));
    let points = Arc::new(AtomicU64::new(0));
    let ticker = {
        let (tries, points) = (tries.clone(), points.clone());
        tokio::spawn(async move {
            let mut last = None;
            loop {
                tokio::time::sleep(Duration::from_millis(1)).await;
                let now = Some(tries.load(SeqCst));
                if now != last {
                    last = now;
                    points.fetch_add(1, SeqCst);
                }
            }
        })
    };
    // A busy retry loop with no await of its own but the lock, until the timer task ran at
    // `POINTS` points of it.
    let started = Instant::now();
    let mut unavailable = 0u64;
    while points.load(SeqCst) < POINTS && started.elapsed() < GIVEN {
        if client.try_lock("busy", LONG_TTL).await.is_err() {
            unavailable += 1;
        }
        tries.fetch_add(1, SeqCst);
    }
    let took = started.elapsed();
    ticker.abort();
    let (tries, points) = (tries.load(SeqCst), points.load(SeqCst));
    eprintln!("{tries} tries in {took:?}; the timer task ran at {points} points of the loop");
    assert_eq!(
        unavailable, tries,
        "a try succeeded with the only master frozen"
    );
    assert!(
        points >= POINTS,
        "the timer task ran at only {points} points of a loop of {tries} tries in {took:?}: \
         the loop starves its runtime"
    );
    paused.thaw();
}

/// Suspends master 0 of `masters` in `client` by lock cycles on other keys (its answers are
/// missing); returns how many cycles it took.
async fn suspend_first(client: &Redlock) -> u64 {
    let cycles = AtomicU64::new(0);
    eventually("master 0 is suspended", Duration::from_secs(20), || async {
        let key = format!("suspend:{}", cycles.fetch_add(1, SeqCst));
        if let Ok(lease) = client.try_lock(&key, LONG_TTL).await {
            let _ = lease.release().await;
        }
        client.node_status()[0].is_suspended()
    })
    .await;
    cycles.load(SeqCst)
}

/// A suspended master that comes back is probed and restored on its own, even by a client
/// that takes no lock meanwhile (a readiness check on `node_status` must not wait for
/// traffic it blocks) — within about 200 ms; 2 s here for a loaded machine.
#[tokio::test(flavor = "multi_thread")]
async fn a_master_that_is_back_is_restored_without_any_lock() {
    let masters = Masters::start(3);
    let client = client_of(&masters, 50);
    warm_up(&client, &masters).await;
    let paused = Paused::freeze(&masters, &[0]);
    suspend_first(&client).await;
    paused.thaw();
    let took = eventually("master 0 is restored", Duration::from_secs(2), || async {
        !client.node_status()[0].is_suspended()
    })
    .await;
    eprintln!("restored {took:?} after the resume, with no lock taken");
    let lease = client.try_lock("back", LONG_TTL).await.unwrap();
    eventually(
        "master 0 holds the next lock",
        Duration::from_secs(5),
        || masters.everywhere("back", lease.value()),
    )
    .await;
    lease.release().await.unwrap();
    all_empty(&masters).await;
}

/// A killed master refuses connections at once: no reply, so it counts like a timeout and
/// the master is suspended (not restored by its own refusals); once restarted, a probe
/// restores it.
#[tokio::test(flavor = "multi_thread")]
async fn a_killed_master_is_suspended_and_restored_after_its_restart() {
    let masters = Masters::start(3);
    let client = client_of(&masters, 50);
    warm_up(&client, &masters).await;
    masters[0].stop();
    suspend_first(&client).await;
    // Still suspended a while later: refusals are no answers.
    for i in 0..20 {
        let lease = client.try_lock(&format!("down:{i}"), LONG_TTL).await;
        let _ = lease.expect("masters 1 and 2 grant it").release().await;
    }
    let status = client.node_status();
    assert!(status[0].is_suspended(), "{status:?}");
    masters[0].restart();
    eventually("master 0 is restored", Duration::from_secs(10), || async {
        !client.node_status()[0].is_suspended()
    })
    .await;
    all_empty(&masters).await;
}

/// The lock keys on `master` of the keys starting with `prefix` (not records, not counters).
async fn lock_keys(master: &support::RedisServer, prefix: &str) -> Vec<String> {
    let keys: Vec<String> = master
        .query(redis::cmd("KEYS").arg(format!("{prefix}*")))
        .await;
    keys.into_iter()
        .filter(|k| !k.ends_with(":record") && !k.ends_with(":fence"))
        .collect()
}

/// What the burst's requests saw.
#[derive(Default)]
struct Burst {
    /// Requests whose try has its outcome (granted, refused, or cancelled).
    decided: AtomicU64,
    /// Tries refused (no quorum).
    refused: AtomicU64,
}

/// One request of the burst on key `burst-{i}`, by `i % 4`: a plain lock and release, a
/// completion of idempotent work, a lease dropped, or a try cancelled while its requests are
/// in flight. A holder ends its lock once `end` says so.
async fn burst_request(client: Redlock, i: u64, seen: Arc<Burst>, mut end: watch::Receiver<bool>) {
    use tower_redlock::LockOrRecord;
    let key = format!("burst-{i}");
    let decided = |granted: bool| {
        if !granted {
            seen.refused.fetch_add(1, SeqCst);
        }
        seen.decided.fetch_add(1, SeqCst);
    };
    let work = async move {
        let _ = end.wait_for(|&end| end).await;
    };
    match i % 4 {
        0 => {
            let lease = client.try_lock(&key, LONG_TTL).await;
            decided(lease.is_ok());
            if let Ok(lease) = lease {
                work.await;
                let _ = lease.release().await;
            }
        }
        1 => {
            let claim = client
                .lock_unless_completed(&key, LONG_TTL, Retry::never())
                .await;
            decided(claim.is_ok());
            if let Ok(LockOrRecord::Locked(lease)) = claim {
                work.await;
                let _ = lease.complete("done", Duration::from_secs(60)).await;
            }
        }
        2 => {
            let lease = client.try_lock(&key, LONG_TTL).await;
            decided(lease.is_ok());
            if let Ok(lease) = lease {
                work.await;
                drop(lease);
            }
        }
        _ => {
            // Cancelled while its requests are in flight.
            let _ =
                tokio::time::timeout(Duration::from_micros(200), client.try_lock(&key, LONG_TTL))
                    .await;
            seen.decided.fetch_add(1, SeqCst);
        }
    }
}

/// Starts the burst's requests `keys` (see [`burst_request`]).
fn burst(
    client: &Redlock,
    keys: std::ops::Range<u64>,
    seen: &Arc<Burst>,
    end: &watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    keys.map(|i| tokio::spawn(burst_request(client.clone(), i, seen.clone(), end.clone())))
        .collect()
}

/// Waits for the requests `tasks`.
async fn ended(tasks: Vec<tokio::task::JoinHandle<()>>) {
    for t in tasks {
        t.await.expect("a request of the burst");
    }
}

/// The lock keys of the burst on every master, each with its master.
async fn burst_keys(masters: &Masters) -> Vec<String> {
    let mut left = Vec::new();
    for (i, m) in masters.iter().enumerate() {
        for k in lock_keys(m, "burst-").await {
            left.push(format!("{k} on master {i}"));
        }
    }
    left
}

/// A master that froze (SIGSTOP) for a second or more in the middle of a burst and came
/// back keeps none of the locks it granted or was sent: 20 keys, each a plain lock and
/// release, a completion of idempotent work, a lease dropped, or a request cancelled
/// mid-try — a second master frozen for a moment too, so that some tries fail. A second
/// after the frozen master answers again (all requests ended before), no lock key is left
/// on any master.
///
/// The moments are states, not a schedule. Master 2 freezes once it holds locks of the
/// burst (8 requests, whose holders end them only once it is frozen); 4 more requests are
/// sent to it frozen; the client suspends it (its requests got no answer for a node
/// timeout); master 1 freezes until a try was refused for want of a quorum (4 requests),
/// then 4 more requests; master 2 thaws once every request has ended and it was frozen for
/// a second at least. The ttl (120 s) outlasts the test: no lock expires by itself. The
/// node timeout is the test kit's 200 ms, so that the masters not frozen answer in time on
/// a loaded machine.
///
/// The bound is the one the docs state, a second after master 2 answers again (it does at
/// once when thawed): what it holds of ours is deleted by the releases queued in its socket
/// as soon as it runs, or by what it is owed, paid as soon as the client hears from it — at
/// the latest its next probe, 200 ms on — within a round trip. The rest of the second is
/// slack for a loaded machine. A check of the masters that began within the second counts.
#[tokio::test(flavor = "multi_thread")]
async fn a_master_that_froze_and_came_back_keeps_no_lock() {
    let masters = Masters::start(3);
    // The default suspension.
    let client = masters.client();
    warm_up(&client, &masters).await;
    let seen = Arc::new(Burst::default());
    let (end_holds, end) = watch::channel(false);
    let given = Duration::from_secs(10);

    // Locks granted by master 2, held until it is frozen.
    let first = burst(&client, 0..8, &seen, &end);
    eventually(
        "could not set up the scenario: master 2 holds locks of the burst",
        given,
        || async {
            seen.decided.load(SeqCst) == 8 && !lock_keys(&masters[2], "burst-").await.is_empty()
        },
    )
    .await;
    let two = Paused::freeze(&masters, &[2]);
    let frozen = Instant::now();
    end_holds.send_replace(true);
    // Requests sent to master 2 frozen, until the client suspends it.
    let mut tasks = burst(&client, 8..12, &seen, &end);
    eventually(
        "the client suspends frozen master 2 (a master silent for its node timeouts)",
        given,
        || async { client.node_status()[2].is_suspended() },
    )
    .await;
    ended(first).await;
    ended(std::mem::take(&mut tasks)).await;

    // A quorum out of reach: tries are refused.
    let one = Paused::freeze(&masters, &[1]);
    let refused = seen.refused.load(SeqCst);
    let tries = burst(&client, 12..16, &seen, &end);
    eventually(
        "a try is refused with masters 1 and 2 frozen (no quorum)",
        given,
        || async { seen.refused.load(SeqCst) > refused },
    )
    .await;
    one.thaw();
    ended(tries).await;
    ended(burst(&client, 16..20, &seen, &end)).await;

    // Frozen for a second at least: the scenario's length, not a synchronization.
    tokio::time::sleep(Duration::from_secs(1).saturating_sub(frozen.elapsed())).await;
    two.thaw();
    let answers = Instant::now();
    let frozen_for = answers - frozen;

    let within = Duration::from_secs(1);
    let (left, checked) = loop {
        let began = Instant::now();
        let left = burst_keys(&masters).await;
        if left.is_empty() || began > answers + within {
            break (left, began - answers);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!(
        "master 2 frozen for {frozen_for:?}; {} of 20 tries refused; checked {checked:?} after \
         it answered again: {} lock(s) left",
        seen.refused.load(SeqCst),
        left.len()
    );
    assert!(
        left.is_empty() && checked <= within,
        "{} lock(s) left {checked:?} after the master answered again: {left:?}",
        left.len()
    );
}
