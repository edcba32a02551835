//! After a lost lease, every duplicate gets the same answer (`lost_lease_one_answer_*`).
//!
//! The interleaving: R1's lease is lost while its handler runs; R2 takes masters A and B
//! (C is down during R2's run and store: killed, restarted empty — a frozen C would run
//! R2's queued acquire and record on waking) and stores its response there under a valid
//! lease; C comes back, and R1's record — its late response (`OnLost::Finish`) or its
//! "outcome unknown" mark (`OnLost::Abort`) — lands there, "if free", where the key was free.
//! Every later duplicate, whichever master answers first (and with A frozen, so that only
//! C's record and one of R2's are heard), gets R2's response: a record stored under a valid
//! lease on a quorum takes precedence. Two lost leases whose records differ, with no record
//! stored under a valid lease: every duplicate gets `409` outcome-unknown, never one or the
//! other. Each replica is its own app with its own client (separate processes), on the same
//! masters; R1's replica reaches them through fault proxies, so that its writes can be held
//! back until the test lets them through.

use std::sync::Arc;
use std::time::Duration;

use tower_redlock::policy::{LockPolicyBuilder, OnLost};
use tower_redlock::replay::Replay;
use tower_redlock::Redlock;

use crate::harness::app::{App, Handler, Route};
use crate::harness::keys::{policy_of, redis_key};
use crate::harness::probe::Probe;
use crate::harness::{Framework, Served};
use crate::on_lost::{assert_lock_lost, assert_outcome_unknown};
use crate::replay::{assert_ran, assert_replay_of, pay, record_key, records_on, BODY};
use crate::support::apps::*;
use crate::support::http::{http_client, reply, within, Reply};
use crate::support::proxy::{Fault, FaultProxy};
use crate::support::{eventually, Masters};

/// The ttl of the replicas' locks (as `on_lost`'s: a loaded machine's stalls fit in it).
const TTL: Duration = Duration::from_secs(3);
/// What a loaded machine may add to a bound on top of the protocol's own time.
const SLACK: Duration = Duration::from_millis(1500);
/// How many duplicates are sent once the records are in place.
const DUPLICATES: usize = 40;

/// One replica: an app of its own, its gate, its URL.
struct Replica {
    app: Served,
    probe: Arc<Probe>,
    url: String,
}

impl Replica {
    /// A replica with `redlock`, a replay policy of [`TTL`] that `policy` completes, and a
    /// payment handler behind a gate (`gated`) or not.
    async fn start<F: Framework>(
        redlock: &Redlock,
        policy: impl FnOnce(LockPolicyBuilder) -> LockPolicyBuilder,
        gated: bool,
    ) -> Self {
        let policy = policy(policy_of(redlock).ttl(TTL).replay(Replay::new()));
        let probe = if gated {
            Probe::new()
        } else {
            Probe::open_gate()
        };
        let app = App::new().route(
            Route::locked(PATH, policy.build().expect("a valid policy"))
                .post(Handler::payment(&probe)),
        );
        let app = F::serve(&app).await;
        let url = app.url(PATH);
        Self { app, probe, url }
    }
}

/// A warmed-up client of `masters` through one fault proxy per master (as [`client_of`]).
async fn proxied(masters: &Masters) -> (Vec<FaultProxy>, Redlock) {
    let mut proxies = Vec::new();
    let mut builder = Redlock::builder().node_timeout(HTTP_NODE_TIMEOUT);
    for m in masters.iter() {
        let proxy = FaultProxy::start(m.addr().parse().expect("an address")).await;
        builder = builder.redis(&proxy.url());
        proxies.push(proxy);
    }
    let redlock = builder.build().expect("a valid client");
    eventually("the proxied client locks", SLACK * 4, || async {
        match redlock.try_lock("warm-up", TTL).await {
            Ok(lease) => lease.release().await.is_ok(),
            Err(_) => false,
        }
    })
    .await;
    (proxies, redlock)
}

/// Whether master `i` holds `lock`'s record marked as stored "if free".
async fn if_free_on(masters: &Masters, lock: &str, i: usize) -> bool {
    let mark = format!("{}:if-free", record_key(lock));
    let exists: i64 = masters[i].query(redis::cmd("EXISTS").arg(&mark)).await;
    exists == 1
}

/// [`DUPLICATES`] duplicates, spread over `replicas`: half while every master answers
/// (whichever answers first), checked by `check`, half while master A is frozen (only B's
/// and C's records are heard), checked by `frozen`.
async fn duplicates(
    masters: &Masters,
    replicas: &[&Replica],
    check: impl Fn(&Reply),
    frozen: impl Fn(&Reply),
) {
    let http = http_client();
    for i in 0..DUPLICATES {
        if i == DUPLICATES / 2 {
            masters[0].freeze();
        }
        let url = &replicas[i % replicas.len()].url;
        let answer = reply(pay(&http, url, KEY, BODY)).await;
        if i < DUPLICATES / 2 {
            check(&answer);
        } else {
            frozen(&answer);
        }
    }
    masters[0].thaw();
}

/// `503`: too few masters answered to know which record is the key's — no replay, no run.
#[track_caller]
fn assert_unavailable(reply: &Reply) {
    assert_eq!(reply.status, 503, "{}", reply.text());
    assert_eq!(reply.header(Replay::REPLAYED_HEADER), None);
}

const KEY: &str = "\"order-one-answer\"";

/// R2, on `second`, runs while C is down (killed: it comes back empty) and stores its
/// response on A and B under a valid lease; C is restarted. Returns R2's answer.
async fn r2_runs_while_c_is_down(m: &Masters, second: &Replica, lock: &str) -> Reply {
    m[2].stop();
    let r2 = reply(pay(&http_client(), &second.url, KEY, BODY)).await;
    assert_ran(&r2);
    assert_eq!(
        records_on(m, lock, [0, 1]).await,
        2,
        "R2's record on A and B"
    );
    m[2].restart();
    r2
}

/// The duplicates of the interleaving all get R2's response; the handler ran twice in all
/// (R1, R2). Stops both replicas.
async fn every_duplicate_gets_r2s(m: &Masters, first: Replica, second: Replica, r2: &Reply) {
    // With A frozen, B's record (stored under a valid lease) outranks C's ("if free").
    let replayed = |d: &Reply| assert_replay_of(r2, d);
    duplicates(m, &[&first, &second], replayed, replayed).await;
    let runs = first.probe.started() + second.probe.started();
    assert_eq!(runs, 2, "a duplicate ran");
    first.probe.open();
    first.app.stop().await;
    second.app.stop().await;
}

/// The interleaving of the module docs with `OnLost::Finish`: R1's late response lands on C
/// "if free" after R2 stored its own on A and B; every duplicate gets R2's response. (R1's
/// writes to A and B are held back while it stores: A's and B's refusals, when they come
/// first, make R1 give up before C stores — the other order, which this test sets up.)
pub async fn lost_lease_one_answer_finish_a_later_holders_record_wins<F: Framework>() {
    let m = Masters::start(3);
    let (proxies, r1_client) = proxied(&m).await;
    let first = Replica::start::<F>(&r1_client, |p| p.keep_alive(false), true).await;
    let second = Replica::start::<F>(&client_of(&m).await, |p| p, false).await;
    let (http, lock) = (http_client(), redis_key(PATH, PATH, KEY));

    let r1 = tokio::spawn(reply(pay(&http, &first.url, KEY, BODY)));
    first.probe.until_started(1).await;
    eventually("R1's lock expires on every master", TTL + SLACK * 4, || {
        m.absent_everywhere(&lock)
    })
    .await;
    let r2 = r2_runs_while_c_is_down(&m, &second, &lock).await;
    proxies[0].set(Fault::BlackHole);
    proxies[1].set(Fault::BlackHole);
    first.probe.open();
    let r1 = within("R1's late answer", r1).await.expect("no panic");
    assert_ne!(assert_ran(&r1), assert_ran(&r2), "R1 and R2 are two runs");
    eventually("R1's record lands on C, \"if free\"", SLACK * 8, || {
        if_free_on(&m, &lock, 2)
    })
    .await;
    for p in &proxies {
        p.set(Fault::Pass);
    }
    assert!(!if_free_on(&m, &lock, 0).await && !if_free_on(&m, &lock, 1).await);

    drop(http);
    every_duplicate_gets_r2s(&m, first, second, &r2).await;
}

/// The interleaving with `OnLost::Abort`: R1 is stopped (`503`) while its writes are held
/// back (its proxies black-holed), R2 runs and stores on A and B with C down, then R1's
/// "outcome unknown" mark — retried until its patience ends — lands on C "if free" (C's
/// proxy is opened first). Every duplicate gets R2's response, not `409` outcome-unknown.
pub async fn lost_lease_one_answer_abort_a_later_holders_record_wins<F: Framework>() {
    let m = Masters::start(3);
    let (proxies, r1_client) = proxied(&m).await;
    let policy = |p: LockPolicyBuilder| p.keep_alive(false).on_lost(OnLost::Abort);
    let first = Replica::start::<F>(&r1_client, policy, true).await;
    let second = Replica::start::<F>(&client_of(&m).await, |p| p, false).await;
    let (http, lock) = (http_client(), redis_key(PATH, PATH, KEY));

    let r1 = tokio::spawn(reply(pay(&http, &first.url, KEY, BODY)));
    first.probe.until_started(1).await;
    for p in &proxies {
        p.set(Fault::BlackHole);
    }
    assert_lock_lost(&within("R1's abort", r1).await.expect("no panic"), TTL);
    eventually("R1's lock expires on every master", TTL + SLACK * 4, || {
        m.absent_everywhere(&lock)
    })
    .await;
    assert_eq!(
        records_on(&m, &lock, 0..3).await,
        0,
        "R1's mark got through"
    );
    let r2 = r2_runs_while_c_is_down(&m, &second, &lock).await;
    // C first: R1's mark, retried until its patience ends, lands there; A and B then
    // refuse it (R2's record is there).
    proxies[2].set(Fault::Pass);
    eventually("R1's mark lands on C, \"if free\"", SLACK * 8, || {
        if_free_on(&m, &lock, 2)
    })
    .await;
    proxies[0].set(Fault::Pass);
    proxies[1].set(Fault::Pass);

    drop(http);
    every_duplicate_gets_r2s(&m, first, second, &r2).await;
}

/// Two lost leases, no record stored under a valid lease: R1 (`OnLost::Finish`) stores its
/// late response on A and B (C held back by its proxy), R3 — which ran after R1's lock
/// expired, and lost its own lease — stores its different response on C (A and B held back
/// by its proxies). Every duplicate, whichever replica and master, gets `409`
/// outcome-unknown while every master answers, and `503` while one is frozen; no handler
/// runs a third time.
pub async fn lost_lease_one_answer_two_lost_leases_that_differ_are_unknown<F: Framework>() {
    let m = Masters::start(3);
    let (p1, c1) = proxied(&m).await;
    let (p3, c3) = proxied(&m).await;
    let first = Replica::start::<F>(&c1, |p| p.keep_alive(false), true).await;
    let third = Replica::start::<F>(&c3, |p| p.keep_alive(false), true).await;
    let other = Replica::start::<F>(&client_of(&m).await, |p| p, false).await;
    let (http, lock) = (http_client(), redis_key(PATH, PATH, KEY));

    let r1 = tokio::spawn(reply(pay(&http, &first.url, KEY, BODY)));
    first.probe.until_started(1).await;
    eventually("R1's lock expires on every master", TTL + SLACK * 4, || {
        m.absent_everywhere(&lock)
    })
    .await;
    let r3 = tokio::spawn(reply(pay(&http, &third.url, KEY, BODY)));
    third.probe.until_started(1).await;
    eventually("R3's lock expires on every master", TTL + SLACK * 4, || {
        m.absent_everywhere(&lock)
    })
    .await;

    p1[2].set(Fault::BlackHole);
    first.probe.open();
    let r1 = within("R1's late answer", r1).await.expect("no panic");
    let r1_id = assert_ran(&r1);
    eventually("R1's record lands on A and B", SLACK * 8, || async {
        records_on(&m, &lock, [0, 1]).await == 2
    })
    .await;
    p3[0].set(Fault::BlackHole);
    p3[1].set(Fault::BlackHole);
    third.probe.open();
    let r3 = within("R3's late answer", r3).await.expect("no panic");
    assert_ne!(assert_ran(&r3), r1_id, "R1 and R3 are two runs");
    eventually("R3's record lands on C", SLACK * 8, || {
        if_free_on(&m, &lock, 2)
    })
    .await;
    for p in p1.iter().chain(&p3) {
        p.set(Fault::Pass);
    }
    assert!(if_free_on(&m, &lock, 0).await && if_free_on(&m, &lock, 1).await);

    // With A frozen, B's and C's records differ, but A could hold a record stored under a
    // valid lease, which would outrank both: unavailable, never a guess.
    let replicas = [&first, &third, &other];
    duplicates(&m, &replicas, assert_outcome_unknown, assert_unavailable).await;
    let runs = first.probe.started() + third.probe.started() + other.probe.started();
    assert_eq!(runs, 2, "a duplicate ran");
    drop(http);
    for r in [first, third, other] {
        r.app.stop().await;
    }
}

/// The bytes of `lock`'s completion record on master `i`, if it has one.
async fn record_on(masters: &Masters, lock: &str, i: usize) -> Option<Vec<u8>> {
    masters[i]
        .query(redis::cmd("GET").arg(record_key(lock)))
        .await
}

/// An answer made from a lost lease's record alone (rule 5) lasts: R1 (`OnLost::Finish`)
/// stores its late response on C alone (its writes to A and B held back by its proxies);
/// R3, which ran after R1's lock expired, has lost its own lease and still runs. A
/// duplicate D is answered with R1's response — and copies it, "if free", to A and B, where
/// it locked — so R3's late response, stored "if free" after D's answer, lands nowhere.
/// Every later duplicate gets R1's response (`503` while A is frozen: C's and B's records
/// alone cannot rule out another on A), never `409` outcome-unknown. Without the copy, R3's
/// response landed on A and B, where D had only released its lock, and every duplicate
/// after it got outcome-unknown (found by the checker's `--nemesis lost`).
pub async fn lost_lease_one_answer_a_later_lost_lease_cannot_change_an_answer<F: Framework>() {
    let m = Masters::start(3);
    let (p1, c1) = proxied(&m).await;
    let first = Replica::start::<F>(&c1, |p| p.keep_alive(false), true).await;
    let third = Replica::start::<F>(&client_of(&m).await, |p| p.keep_alive(false), true).await;
    let other = Replica::start::<F>(&client_of(&m).await, |p| p, false).await;
    let (http, lock) = (http_client(), redis_key(PATH, PATH, KEY));

    let r1 = tokio::spawn(reply(pay(&http, &first.url, KEY, BODY)));
    first.probe.until_started(1).await;
    eventually("R1's lock expires on every master", TTL + SLACK * 4, || {
        m.absent_everywhere(&lock)
    })
    .await;
    let r3 = tokio::spawn(reply(pay(&http, &third.url, KEY, BODY)));
    third.probe.until_started(1).await;
    eventually("R3's lock expires on every master", TTL + SLACK * 4, || {
        m.absent_everywhere(&lock)
    })
    .await;

    p1[0].set(Fault::BlackHole);
    p1[1].set(Fault::BlackHole);
    first.probe.open();
    let r1 = within("R1's late answer", r1).await.expect("no panic");
    let r1_id = assert_ran(&r1);
    eventually("R1's record lands on C, \"if free\"", SLACK * 8, || {
        if_free_on(&m, &lock, 2)
    })
    .await;
    assert_eq!(
        records_on(&m, &lock, [0, 1]).await,
        0,
        "R1's writes got through"
    );

    let d = reply(pay(&http, &other.url, KEY, BODY)).await;
    assert_replay_of(&r1, &d);
    let r1_record = record_on(&m, &lock, 2).await.expect("R1's record on C");
    eventually(
        "D's copies of R1's record on A and B",
        SLACK * 4,
        || async {
            record_on(&m, &lock, 0).await.as_ref() == Some(&r1_record)
                && record_on(&m, &lock, 1).await.as_ref() == Some(&r1_record)
        },
    )
    .await;
    // Copies stored "if free" (a copy stored as under a valid lease would outrank others).
    assert!(if_free_on(&m, &lock, 0).await && if_free_on(&m, &lock, 1).await);

    third.probe.open();
    let r3 = within("R3's late answer", r3).await.expect("no panic");
    assert_ne!(assert_ran(&r3), r1_id, "R1 and R3 are two runs");
    for i in 0..3 {
        let record = record_on(&m, &lock, i).await;
        assert_eq!(
            record.as_ref(),
            Some(&r1_record),
            "R3's record landed on master {i}"
        );
    }

    // R1's held-back writes may land now: the same bytes as D's copies.
    for p in &p1 {
        p.set(Fault::Pass);
    }
    let replicas = [&first, &third, &other];
    let replayed = |d: &Reply| assert_replay_of(&r1, d);
    duplicates(&m, &replicas, replayed, assert_unavailable).await;
    let runs = first.probe.started() + third.probe.started() + other.probe.started();
    assert_eq!(runs, 2, "a duplicate ran");
    drop(http);
    for r in [first, third, other] {
        r.app.stop().await;
    }
}
