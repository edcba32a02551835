//! Idempotent work on real masters: `Redlock::lock_unless_completed` and `Lease::complete`.
//! A completed resource answers with its record and locks nothing; a record is only stored
//! where the lease still holds; any stored record is the answer, "not done" only a quorum's.

use tower_redlock_testkit as support;

use std::time::Duration;

use support::{eventually, Masters};
use tower_redlock::{LockOrRecord, Redlock, Retry};

const TTL: Duration = Duration::from_secs(10);
const DAY: Duration = Duration::from_secs(86_400);
const WITHIN: Duration = Duration::from_secs(10);
/// A record as a master stores it: behind the format tag (version 1).
fn stored(record: &str) -> Option<String> {
    Some(format!("TRR1\n{record}"))
}

async fn claim(client: &Redlock, resource: &str) -> tower_redlock::Result<LockOrRecord> {
    client
        .lock_unless_completed(resource, TTL, Retry::never())
        .await
}

/// A fault proxy in front of each of `m`, and a client (no retries) through them.
async fn behind_proxies(
    m: &Masters,
    node_timeout: Duration,
) -> (Vec<support::proxy::FaultProxy>, Redlock) {
    let mut proxies = Vec::new();
    for master in m.iter() {
        proxies.push(support::proxy::FaultProxy::start(master.addr().parse().unwrap()).await);
    }
    let client = proxies
        .iter()
        .fold(Redlock::builder(), |b, p| b.redis(&p.url()))
        .node_timeout(node_timeout)
        .retry(Retry::never())
        .build()
        .unwrap();
    (proxies, client)
}

fn locked(c: tower_redlock::Result<LockOrRecord>) -> tower_redlock::Lease {
    match c {
        Ok(LockOrRecord::Locked(lease)) => lease,
        other => panic!("expected a lease, got {other:?}"),
    }
}

fn completed(c: tower_redlock::Result<LockOrRecord>) -> Vec<u8> {
    match c {
        Ok(LockOrRecord::Completed(record)) => record.to_vec(),
        other => panic!("expected a completion record, got {other:?}"),
    }
}

/// Nothing but the record is left: no lock key on any master.
async fn no_lock_left(m: &Masters, resource: &str) {
    eventually("no lock is left", WITHIN, || async {
        m.absent_everywhere(resource).await
    })
    .await;
}

#[tokio::test]
async fn a_completed_resource_replays_its_record_and_locks_nothing() {
    let m = Masters::start(3);
    let (a, b) = (m.client(), m.client());
    let lease = locked(claim(&a, "pay:1").await);
    // In flight: a duplicate is refused, not run.
    let busy = claim(&b, "pay:1").await.unwrap_err();
    assert!(busy.is_contended(), "{busy}");
    lease.complete("charged pay_1", DAY).await.unwrap();
    // The record ended the lock on every master (the write was the release).
    no_lock_left(&m, "pay:1").await;
    for _ in 0..3 {
        assert_eq!(completed(claim(&b, "pay:1").await), b"charged pay_1");
    }
    // `complete` returns at a quorum; the last master stores it in the background.
    eventually("every master has the record", WITHIN, || async {
        m.values("pay:1:record").await == vec![stored("charged pay_1"); 3]
    })
    .await;
    no_lock_left(&m, "pay:1").await;
    // A plain lock of the resource is another matter: it is free.
    a.try_lock("pay:1", TTL)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn a_record_on_a_minority_is_still_the_answer() {
    let m = Masters::start(3);
    let client = m.client();
    locked(claim(&client, "pay:2").await)
        .complete("charged pay_2", DAY)
        .await
        .unwrap();
    eventually("every master has the record", WITHIN, || async {
        m.values("pay:2:record").await.iter().all(Option::is_some)
    })
    .await;
    // A minority loses the record (a restart without persistence, an eviction).
    m.del_on("pay:2:record", &[0]).await;
    assert_eq!(completed(claim(&client, "pay:2").await), b"charged pay_2");
    // What the try locked on the masters without the record is released.
    no_lock_left(&m, "pay:2").await;
}

#[tokio::test]
async fn a_master_down_during_the_write_leaves_the_record_on_a_quorum() {
    let m = Masters::start(3);
    let client = m.client();
    let lease = locked(claim(&client, "pay:3").await);
    m[2].freeze();
    lease.complete("charged pay_3", DAY).await.unwrap();
    m[2].thaw();
    assert_eq!(completed(claim(&client, "pay:3").await), b"charged pay_3");
    let stored = m.values("pay:3:record").await;
    assert!(
        stored.iter().filter(|v| v.is_some()).count() >= 2,
        "{stored:?}"
    );
}

/// (The ttl is 500 ms, not shorter: a lease's validity is its ttl less the acquisition's
/// time, and on a loaded machine a 100 ms ttl may leave none — the test waits for the expiry
/// anyway, so a longer one costs it only the wait.)
#[tokio::test]
async fn an_expired_lease_stores_no_stale_answer() {
    let m = Masters::start(3);
    let client = m.client();
    let lease = match client
        .lock_unless_completed("pay:4", Duration::from_millis(500), Retry::never())
        .await
    {
        Ok(LockOrRecord::Locked(lease)) => lease,
        other => panic!("expected a lease, got {other:?}"),
    };
    eventually("the lease expires", WITHIN, || async { !lease.is_valid() }).await;
    let e = lease.complete("too late", DAY).await.unwrap_err();
    assert!(e.is_lost(), "{e}");
    assert_eq!(m.values("pay:4:record").await, vec![None; 3]);
    // (The validity ends a drift allowance before the masters expire the key.)
    no_lock_left(&m, "pay:4").await;
    // The next request is not served a stale answer: it runs.
    locked(claim(&client, "pay:4").await)
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn a_write_that_misses_its_quorum_keeps_duplicates_out() {
    let m = Masters::start(3);
    let client = m.client();
    let lease = locked(claim(&client, "pay:5").await);
    let handle = lease.handle();
    m[1].freeze();
    m[2].freeze();
    let e = lease.complete("charged pay_5", DAY).await.unwrap_err();
    assert!(e.is_unavailable(), "{e}");
    // The work is over: whoever watches the lease sees it ended.
    assert!(handle.is_lost());
    m[1].thaw();
    m[2].thaw();
    // The lease was not released: where the record did not land in time the lock stays
    // (until its ttl, or until the late write lands); where it landed, the record is there.
    // A duplicate is refused as contended while the lock stays beside a minority's record
    // (the record of the key may still come: `lost_lease_one_answer_*`), or as unavailable
    // while the thawed masters are still suspended by this client (one answer is too few to
    // know the key's record), and gets the record once the late writes landed on a quorum.
    // Either way nothing runs twice.
    assert_eq!(m[0].get("pay:5:record").await, stored("charged pay_5"));
    eventually("a duplicate gets the record", WITHIN, || async {
        match claim(&client, "pay:5").await {
            Ok(LockOrRecord::Completed(record)) => record == "charged pay_5".as_bytes(),
            Err(e) if e.is_contended() || e.is_unavailable() => false,
            other => panic!("a duplicate must never run: {other:?}"),
        }
    })
    .await;
}

/// The minority-record case continued: the record lands on one master only (the other two
/// paused past the caller's patience — a completion's first retries give up then), the two
/// come back while they still hold the lock, then the one master with the record is paused.
/// A duplicate must still get the record, never a second run: while a completion lacks its
/// quorum, it is retried where the lease still holds (and the lock kept there), so the record
/// reaches the masters that come back before their lock expires.
///
/// The pause of 500 ms past the caller's patience shapes the scenario (it is no
/// synchronization: a longer pause under load changes nothing). The scenario needs the two
/// masters back before their lock expires (6 s after the grant; about 2.5 s in): a machine
/// too loaded for that fails as "could not set up the scenario", not as a broken promise.
#[tokio::test]
async fn minority_record_then_expiry_and_a_paused_record_holder_runs_nothing_twice() {
    let m = Masters::start(3);
    // 200 ms node timeouts: the caller waits ten of them (2 s) for a completion.
    let (a, b) = (m.client(), m.client());
    let ttl = Duration::from_secs(6);
    let lease = match a
        .lock_unless_completed("pay:minority", ttl, Retry::never())
        .await
    {
        Ok(LockOrRecord::Locked(lease)) => lease,
        other => panic!("expected a lease, got {other:?}"),
    };
    // The masters' keys expire no earlier than the lease's validity ends.
    let deadline = lease.deadline();
    m[1].freeze();
    m[2].freeze();
    let e = lease.complete("charged pay_m", DAY).await.unwrap_err();
    assert!(e.is_unavailable(), "{e}");
    // Paused a while longer than the caller waited, well inside the lock's ttl.
    tokio::time::sleep(Duration::from_millis(500)).await;
    m[1].thaw();
    m[2].thaw();
    assert!(
        std::time::Instant::now() < deadline,
        "could not set up the scenario: masters 1 and 2 came back after their lock's ttl"
    );
    assert_eq!(
        m[0].get("pay:minority:record").await,
        stored("charged pay_m")
    );
    // The lock on the two masters that came back ends: by the record's write, or by expiry.
    eventually("no lock is left on masters 1 and 2", WITHIN, || async {
        m[1].get("pay:minority").await.is_none() && m[2].get("pay:minority").await.is_none()
    })
    .await;
    // The only master sure to have the record stops answering: a duplicate must not run.
    m[0].freeze();
    let again = claim(&b, "pay:minority").await;
    m[0].thaw();
    assert_eq!(completed(again), b"charged pay_m");
    assert_eq!(
        m.values("pay:minority:record").await,
        vec![stored("charged pay_m"); 3]
    );
}

/// The edge of the minority-record case: the two masters that missed the record were cut off
/// (their connections reset and refused, so nothing waits for them in a socket) and
/// suspended (default 50 ms node timeouts), and come back only shortly before their lock
/// expires. They get the record in time: a suspended master is owed the completion, paid
/// the moment its probe finds it back. Then the master with the first record is paused, and
/// a duplicate still gets the record.
///
/// "Shortly": the docs state a reaction of a probe interval (200 ms), a reconnection and a
/// node timeout (50 ms) — about 300 ms. The masters come back [`BACK_BEFORE`] (1.2 s) before
/// the lock expires: four times that reaction, the slack a loaded 2-core machine needs to
/// run the probe, the reconnection and the write. A promise that is not kept (no payment on
/// the probe, only at the next lock) still fails: nothing else writes the record to them
/// before the lock expires. The masters must be suspended, and back, while the lock holds:
/// if the machine cannot make that happen the test fails as "could not set up the scenario".
#[tokio::test]
async fn minority_record_holders_back_shortly_before_expiry_get_the_record() {
    use support::proxy::Fault;
    const BACK_BEFORE: Duration = Duration::from_millis(1200);
    let m = Masters::start(3);
    let (proxies, client) = behind_proxies(&m, Duration::from_millis(50)).await;
    support::warm_up(&client, &m).await;
    let ttl = Duration::from_secs(5);
    let granted = std::time::Instant::now();
    let lease = match client
        .lock_unless_completed("pay:edge", ttl, Retry::never())
        .await
    {
        Ok(LockOrRecord::Locked(lease)) => lease,
        other => panic!("expected a lease, got {other:?}"),
    };
    proxies[1].set(Fault::Reset);
    proxies[2].set(Fault::Reset);
    let e = lease.complete("charged pay_e", DAY).await.unwrap_err();
    assert!(e.is_unavailable(), "{e}");
    let back = granted + ttl - BACK_BEFORE;
    eventually("masters 1 and 2 are suspended", WITHIN, || async {
        let s = client.node_status();
        s[1].is_suspended() && s[2].is_suspended()
    })
    .await;
    assert!(
        std::time::Instant::now() < back,
        "could not set up the scenario: masters 1 and 2 were suspended only after {:?}",
        granted.elapsed()
    );
    // Back `BACK_BEFORE` before their lock (set right after `granted`) expires.
    tokio::time::sleep_until(back.into()).await;
    proxies[1].set(Fault::Pass);
    proxies[2].set(Fault::Pass);
    let late = std::time::Instant::now().saturating_duration_since(back);
    assert!(
        late < BACK_BEFORE / 2,
        "could not set up the scenario: the masters came back {late:?} later than planned"
    );
    eventually("masters 1 and 2 have the record", WITHIN, || async {
        m[1].get("pay:edge:record").await == stored("charged pay_e")
            && m[2].get("pay:edge:record").await == stored("charged pay_e")
    })
    .await;
    proxies[0].set(Fault::BlackHole);
    let again = claim(&client, "pay:edge").await;
    proxies[0].set(Fault::Pass);
    assert_eq!(completed(again), b"charged pay_e");
}

/// A replay hit needs one record: with one master silent (its traffic held by the proxy
/// until the test lets it go, and a node timeout of 3 s, so it is neither answered nor
/// timed out, nor suspended, during the hits), a duplicate gets the stored answer from the
/// quickest master, never waiting for the silent one.
///
/// Waiting for it would cost a hit the whole node timeout (the silent master never answers
/// before it); the quickest answer is a loopback round trip. So each hit must take less than
/// the node timeout: the slack is all of it but one round trip — no machine load closes
/// that gap, and a hit that waits still fails.
#[tokio::test]
async fn a_replay_hit_never_waits_for_the_slowest_master() {
    use support::proxy::Fault;
    const NODE_TIMEOUT: Duration = Duration::from_secs(3);
    let m = Masters::start(3);
    let (proxies, client) = behind_proxies(&m, NODE_TIMEOUT).await;
    support::warm_up(&client, &m).await;
    locked(claim(&client, "pay:hit-fast").await)
        .complete("charged pay_f", DAY)
        .await
        .unwrap();
    eventually("every master has the record", WITHIN, || async {
        m.values("pay:hit-fast:record")
            .await
            .iter()
            .all(Option::is_some)
    })
    .await;
    proxies[2].set(Fault::BlackHole);
    for _ in 0..5 {
        let start = std::time::Instant::now();
        assert_eq!(
            completed(claim(&client, "pay:hit-fast").await),
            b"charged pay_f"
        );
        let took = start.elapsed();
        assert!(
            took < NODE_TIMEOUT,
            "the hit took {took:?}: it waited for the silent master"
        );
    }
    assert!(
        !client.node_status()[2].is_suspended(),
        "could not set up the scenario: the silent master was suspended, so never asked"
    );
    proxies[2].set(Fault::Pass);
}

/// A master out of memory (`maxmemory` reached under `noeviction`) refuses the record's write
/// with an error reply but still takes extensions: while the record lacks its quorum, the
/// lock is kept there past its ttl, so a duplicate is refused (not run) even with the one
/// master that has the record paused; once memory is back, the record lands — on every
/// master, also one whose memory comes back after the quorum stored it.
#[tokio::test]
async fn minority_record_on_masters_out_of_memory_keeps_their_lock_until_the_write_lands() {
    let m = Masters::start(3);
    let (a, b) = (m.client(), m.client());
    let ttl = Duration::from_secs(2);
    let lease = match a
        .lock_unless_completed("pay:oom", ttl, Retry::never())
        .await
    {
        Ok(LockOrRecord::Locked(lease)) => lease,
        other => panic!("expected a lease, got {other:?}"),
    };
    let maxmemory = |bytes: &'static str| {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg(bytes)
            .clone()
    };
    for i in [1, 2] {
        let _: () = m[i].query(&maxmemory("1")).await;
    }
    let expired = lease.deadline() + ttl;
    let e = lease.complete("charged pay_o", DAY).await.unwrap_err();
    assert!(e.is_unavailable(), "{e}");
    // Well past the lock's ttl: it is still held where the record could not be written.
    tokio::time::sleep_until(expired.into()).await;
    for i in [1, 2] {
        assert!(
            m[i].pttl("pay:oom").await > 0,
            "the lock was kept on master {i}"
        );
    }
    m[0].freeze();
    let busy = claim(&b, "pay:oom").await;
    m[0].thaw();
    // Held there (the acquire reads the key before any write, which a master out of memory
    // would refuse): refused, never run.
    let busy = busy.unwrap_err();
    assert!(
        busy.is_contended(),
        "a duplicate is refused, not run: {busy}"
    );
    // Memory back on one master first: the record reaches its quorum there; then on the
    // other, which still gets it (the background goes on past the quorum while the lock
    // may be there: an idle client sends that master nothing else).
    let _: () = m[1].query(&maxmemory("0")).await;
    eventually("the record is on a quorum", WITHIN, || async {
        m.values("pay:oom:record").await[..2] == vec![stored("charged pay_o"); 2]
    })
    .await;
    // Spacing, not synchronization: the round that reached the quorum is over by then
    // (nothing outside the client shows it), so the last master's write is a later round.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _: () = m[2].query(&maxmemory("0")).await;
    eventually("the record is on every master", WITHIN, || async {
        m.values("pay:oom:record").await == vec![stored("charged pay_o"); 3]
    })
    .await;
    no_lock_left(&m, "pay:oom").await;
    assert_eq!(completed(claim(&b, "pay:oom").await), b"charged pay_o");
}

/// A completion whose caller goes away midway (a timeout around it, a dropped task) while
/// two masters are paused is not abandoned: it goes on in the background and the record
/// reaches the masters once they are back.
#[tokio::test]
async fn minority_record_of_a_dropped_completion_still_reaches_its_quorum() {
    let m = Masters::start(3);
    let client = m.client();
    let lease = locked(claim(&client, "pay:dropped").await);
    m[1].freeze();
    m[2].freeze();
    let gave_up = tokio::time::timeout(
        Duration::from_millis(300),
        lease.complete("charged pay_d", DAY),
    )
    .await;
    assert!(gave_up.is_err(), "the caller gave up first: {gave_up:?}");
    m[1].thaw();
    m[2].thaw();
    eventually("the record is on every master", WITHIN, || async {
        m.values("pay:dropped:record").await == vec![stored("charged pay_d"); 3]
    })
    .await;
    no_lock_left(&m, "pay:dropped").await;
}

/// A completion whose requests time out (two masters paused for a moment: a stalled
/// replica or masters under load) is asked again where it got no answer: it reaches the
/// quorum once they are back, within the caller's patience, and no lock is left behind.
#[tokio::test]
async fn a_completion_that_timed_out_is_asked_again_until_a_quorum_stored_it() {
    let m = Masters::start(3);
    // 200 ms node timeouts: the caller's patience is ten of them (2 s).
    let client = m
        .builder()
        .node_timeout(Duration::from_millis(200))
        .suspend_after(100)
        .build()
        .unwrap();
    let lease = locked(claim(&client, "pay:retry").await);
    m[1].freeze();
    m[2].freeze();
    let completing = tokio::spawn(async move { lease.complete("charged pay_r", DAY).await });
    // The first requests to the paused masters timed out: no quorum yet.
    eventually("both paused masters timed out", WITHIN, || async {
        let status = client.node_status();
        status[1].consecutive_timeouts() >= 1 && status[2].consecutive_timeouts() >= 1
    })
    .await;
    m[1].thaw();
    m[2].thaw();
    // Written twice to them (the late first request, then the retry): the same record is
    // the same completion, so the retry counts as stored. `complete` answers once a
    // quorum stored it; the last master may still be being written (in the background).
    completing.await.unwrap().unwrap();
    let values = m.values("pay:retry:record").await;
    let stored_on = values
        .iter()
        .filter(|v| **v == stored("charged pay_r"))
        .count();
    assert!(
        stored_on >= 2,
        "not on a quorum when complete answered: {values:?}"
    );
    eventually("the record is on every master", WITHIN, || async {
        m.values("pay:retry:record").await == vec![stored("charged pay_r"); 3]
    })
    .await;
    no_lock_left(&m, "pay:retry").await;
    assert_eq!(
        completed(claim(&client, "pay:retry").await),
        b"charged pay_r"
    );
}

#[tokio::test]
async fn records_are_bounded_and_checked() {
    let client = Redlock::in_memory();
    let lease = locked(claim(&client, "pay:6").await);
    let big = vec![0u8; tower_redlock::Lease::MAX_RECORD_LEN + 1];
    let e = lease.complete(big, DAY).await.unwrap_err();
    assert!(e.is_invalid_input(), "{e}");
    let lease = locked(claim(&client, "pay:6").await);
    let forever = tower_redlock::Lease::MAX_RECORD_RETENTION + Duration::from_secs(1);
    let e = lease.complete("ok", forever).await.unwrap_err();
    assert!(e.is_invalid_input(), "{e}");
    let e = locked(claim(&client, "pay:6").await)
        .complete("ok", Duration::ZERO)
        .await
        .unwrap_err();
    assert!(e.is_invalid_input(), "{e}");
    // Refused up front: the lease was released, nothing stored, the work may run.
    locked(claim(&client, "pay:6").await)
        .complete("ok", DAY)
        .await
        .unwrap();
    assert_eq!(completed(claim(&client, "pay:6").await), b"ok");
}

/// A node of one's own that stores no records (only the required `Node` methods): the
/// replay acquire never takes its silence for "not done" — it fails as unavailable — while
/// plain locks work as before.
#[tokio::test]
async fn a_node_without_records_never_votes_not_done() {
    use support::nodes::BareNode;

    let nodes: Vec<BareNode> = (0..3).map(|_| BareNode::default()).collect();
    let client = nodes
        .iter()
        .fold(Redlock::builder(), |b, n| b.node(n.clone()))
        .retry(Retry::never())
        .build()
        .unwrap();
    let e = claim(&client, "job").await.unwrap_err();
    assert!(e.is_unavailable(), "{e}");
    assert!(e.to_string().contains("quorum"), "{e}");
    assert!(
        nodes.iter().all(|n| n.0.is_empty()),
        "the failed claim locked something"
    );
    client
        .try_lock("job", TTL)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// The replay acquire waits for every master that is asked: a frozen one costs each claim
/// its node timeout only until it is suspended (three timeouts in a row spanning a node
/// timeout); from then on it is not asked, and every claim and completion still succeeds on
/// the quorum that is up. (The test kit's 200 ms node timeout, not the default 50 ms: the
/// two live masters must answer every claim within it on a loaded machine; the value is not
/// what the test is about.)
#[tokio::test]
async fn a_frozen_master_is_suspended_and_costs_the_replay_acquire_nothing_after() {
    let m = Masters::start(3);
    let client = m.client();
    support::warm_up(&client, &m).await;
    m[2].freeze();
    let mut cycles = 0;
    eventually("the frozen master is suspended", WITHIN, || {
        cycles += 1;
        let (client, resource) = (client.clone(), format!("job:{cycles}"));
        async move {
            let lease = locked(claim(&client, &resource).await);
            lease.complete("done", DAY).await.unwrap();
            assert_eq!(completed(claim(&client, &resource).await), b"done");
            client.node_status()[2].is_suspended()
        }
    })
    .await;
    // Suspended: claims no longer wait for it, and still succeed.
    for i in 0..20 {
        let resource = format!("after:{i}");
        let lease = locked(claim(&client, &resource).await);
        lease.complete("done", DAY).await.unwrap();
        assert_eq!(completed(claim(&client, &resource).await), b"done");
        assert!(client.node_status()[2].is_suspended());
    }
    m[2].thaw();
}

/// Script calls (`EVAL` and `EVALSHA`) a master has served since its stats were reset.
async fn script_calls(m: &Masters) -> u64 {
    let mut calls = 0;
    for master in m.iter() {
        let info: String = master.query(redis::cmd("INFO").arg("commandstats")).await;
        for line in info.lines() {
            if line.starts_with("cmdstat_evalsha:") || line.starts_with("cmdstat_eval:") {
                let n = line
                    .split(['=', ','])
                    .nth(1)
                    .and_then(|n| n.parse::<u64>().ok())
                    .expect("calls=N");
                calls += n;
            }
        }
    }
    calls
}

#[tokio::test]
async fn a_replay_hit_sends_no_release_where_the_record_was() {
    let m = Masters::start(3);
    let client = m.client();
    locked(claim(&client, "pay:hit").await)
        .complete("charged pay_hit", DAY)
        .await
        .unwrap();
    eventually("every master has the record", WITHIN, || async {
        m.values("pay:hit:record").await.iter().all(Option::is_some)
    })
    .await;
    assert_eq!(
        completed(claim(&client, "pay:hit").await),
        b"charged pay_hit"
    );
    for master in m.iter() {
        let _: () = master.query(redis::cmd("CONFIG").arg("RESETSTAT")).await;
    }
    const HITS: u64 = 20;
    for _ in 0..HITS {
        assert_eq!(
            completed(claim(&client, "pay:hit").await),
            b"charged pay_hit"
        );
    }
    // A hit returns at the first record; the claims to the other masters land in the
    // background: await them all (one claim per master per hit).
    eventually("every hit's claim reached every master", WITHIN, || async {
        script_calls(&m).await >= HITS * 3
    })
    .await;
    // A release would follow its claim's answer on the same connection. Nothing can be
    // awaited for a message that must never come: this pause is a window to catch one (a
    // late release makes the test pass wrongly on a slow machine, never fail wrongly).
    tokio::time::sleep(support::NODE_TIMEOUT * 3).await;
    // No release: every master answered with the record, so none of them locked anything.
    assert_eq!(script_calls(&m).await, HITS * 3);
    no_lock_left(&m, "pay:hit").await;
}
