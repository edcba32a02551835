//! Waking waiters on release (`RedlockBuilder::wake_waiters`), on real masters: what the
//! scripts publish (read by a raw subscriber, `support::pubsub`, in order: a message that
//! should not be there would come first), a waiter woken by a release and by an expiry
//! well before its poll, the poll that stays (a holder that publishes nothing), a killed
//! subscriber connection that recovers, a voter whose ACL refuses the channels, and a client
//! with fewer listening voters than a quorum.

use std::time::{Duration, Instant};

use tower_redlock::node::RedisNode;
use tower_redlock::operate::ForceRelease;
use tower_redlock::{LockOrRecord, Redlock, Retry};

use super::{Masters, SECOND, TTL};
use crate::support;
use crate::support::pubsub::{
    assert_woken, listening, not_listening, subscribers, Subscriber, Waiter, WOKEN_WITHIN,
};
use crate::support::{eventually, NODE_TIMEOUT};
use support::warnings::Warnings;

/// A poll so long that a waiter that gets the lock well within it was woken.
const LONG_POLL: Duration = Duration::from_secs(8);

/// A waiter's policy: polls every [`LONG_POLL`], for up to 20 s.
fn long_poll() -> Retry {
    Retry::until(Duration::from_secs(20))
        .delay(LONG_POLL)
        .jitter(Duration::ZERO)
}

/// Each kind of delete publishes once on the key's channel when the wake-up is on; a
/// release that finds another token there, or a client without the wake-up, publishes
/// nothing (the next message is the next real delete's).
#[tokio::test]
async fn wake_every_delete_of_a_lock_publishes_on_its_channel() {
    let m = Masters::start(1);
    let port = m[0].port();
    let mut sub = Subscriber::on(port, &["wake-job", "wake-other", "wake-quiet"]).await;
    let redlock = m.builder().wake_waiters(true).build().unwrap();
    let fenced = m
        .builder()
        .fencing(true)
        .wake_waiters(true)
        .build()
        .unwrap();
    let quiet = m.client();

    // Without the wake-up: nothing (the next message must be `wake-job`'s).
    lock_and_release(&quiet, "wake-quiet").await;
    lock_and_release(&redlock, "wake-job").await;
    sub.released("wake-job").await;
    lock_and_release(&fenced, "wake-job").await;
    sub.released("wake-job").await;

    let LockOrRecord::Locked(lease) = redlock
        .lock_unless_completed("wake-job", TTL, Retry::never())
        .await
        .unwrap()
    else {
        panic!("nothing completed yet")
    };
    lease.complete(b"done".to_vec(), TTL).await.unwrap();
    sub.released("wake-job").await;

    assert!(
        m[0].set_nx("wake-other", "a-crashed-holder", Some(60_000))
            .await
    );
    redlock
        .force_release("wake-other", ForceRelease::by("test").any_holder())
        .await
        .unwrap();
    sub.released("wake-other").await;

    // A lease whose key another holder took meanwhile: its release deletes nothing, and
    // publishes nothing.
    let lost = redlock.try_lock("wake-other", TTL).await.unwrap();
    m[0].del("wake-other").await;
    assert!(
        m[0].set_nx("wake-other", "the-next-holder", Some(60_000))
            .await
    );
    let _ = lost.release().await;
    assert_eq!(
        m[0].get("wake-other").await.as_deref(),
        Some("the-next-holder")
    );
    lock_and_release(&redlock, "wake-job").await;
    sub.released("wake-job").await;
}

/// A waiter on three masters is woken by the holder's release: it has the lock well
/// before its next poll; the subscriptions end with the wait.
#[tokio::test]
async fn wake_a_waiter_is_woken_by_the_release_before_its_poll() {
    let m = Masters::start(3);
    let holder = m.builder().wake_waiters(true).build().unwrap();
    let waiter = m.builder().wake_waiters(true).build().unwrap();
    let lease = holder.try_lock("wake-release", TTL).await.unwrap();
    let waiting = Waiter::heard(&waiter, "wake-release", TTL, long_poll(), m.iter()).await;
    let released = Instant::now();
    lease.release().await.unwrap();
    waiting.woken(released, LONG_POLL).await;
    // The wait ended: no subscriber is left on the key.
    not_listening(m.iter(), "wake-release").await;
}

/// A holder that crashed: its keys expire. With `notify-keyspace-events Kx` on the
/// masters, the expiry wakes the waiter (it listens on the key's keyspace channel too).
#[tokio::test]
async fn wake_an_expiry_wakes_the_waiter_with_keyspace_notifications() {
    let m = Masters::start(3);
    for s in m.iter() {
        let mut cmd = redis::cmd("CONFIG");
        cmd.arg("SET").arg("notify-keyspace-events").arg("Kx");
        let () = s.query(&cmd).await;
    }
    let waiter = m.builder().wake_waiters(true).build().unwrap();
    for s in m.iter() {
        assert!(
            s.set_nx("wake-expiry", "a-crashed-holder", Some(1_500))
                .await
        );
    }
    let started = Instant::now();
    let lease = waiter
        .lock_with("wake-expiry", TTL, long_poll())
        .await
        .expect("the waiter gets the lock after the expiry");
    let waited = started.elapsed();
    assert!(
        waited < Duration::from_millis(1_500) + WOKEN_WITHIN,
        "woken {waited:?} after the wait began (the keys expired after 1.5 s; poll {LONG_POLL:?})"
    );
    lease.release().await.unwrap();
}

/// The poll stays: a holder that publishes nothing (a client without the wake-up, another
/// library) releases, and the waiter finds the key free at its next poll — with a policy
/// of two retries, which the wake-up does not use up (only the polls count).
#[tokio::test]
async fn wake_a_release_that_publishes_nothing_is_found_by_the_poll() {
    let m = Masters::start(3);
    let quiet = m.client();
    let waiter = m.builder().wake_waiters(true).build().unwrap();
    let lease = quiet.try_lock("wake-quiet", TTL).await.unwrap();
    let poll = Retry::times(2).delay(SECOND).jitter(Duration::ZERO);
    let waiting = Waiter::heard(&waiter, "wake-quiet", TTL, poll, m.iter()).await;
    let released = Instant::now();
    lease.release().await.unwrap();
    let (lease, waited) = waiting.answer(released).await;
    let lease = lease.expect("the poll finds the key free");
    lease.release().await.unwrap();
    // At the next poll (1 s at most after the release), with room for a loaded machine.
    assert!(waited < SECOND + WOKEN_WITHIN, "{waited:?}");
}

/// The subscriber's connections killed on every master (`CLIENT KILL TYPE pubsub`): they
/// come back and subscribe again, and the next release wakes the waiter before its poll.
#[tokio::test]
async fn wake_a_killed_subscriber_connection_recovers() {
    let m = Masters::start(3);
    let holder = m.client();
    let waiter = m.builder().wake_waiters(true).build().unwrap();
    let lease = holder.try_lock("wake-killed", TTL).await.unwrap();
    let waiting = Waiter::heard(&waiter, "wake-killed", TTL, long_poll(), m.iter()).await;
    for s in m.iter() {
        let mut kill = redis::cmd("CLIENT");
        kill.arg("KILL").arg("TYPE").arg("pubsub");
        let killed: i64 = s.query(&kill).await;
        assert!(killed >= 1, "a subscriber connection on {}", s.addr());
    }
    listening(m.iter(), "wake-killed").await;
    // The holder's release publishes nothing (no wake-up): the key is deleted by hand with a
    // publish, as a waking client's release would.
    drop(lease);
    let released = Instant::now();
    for s in m.iter() {
        s.del("wake-killed").await;
        let mut publish = redis::cmd("PUBLISH");
        publish.arg("wake-killed").arg("released");
        let _: i64 = s.query(&publish).await;
    }
    waiting.woken(released, LONG_POLL).await;
}

/// A voter whose ACL user may use no channel (Redis 7's default for a new user): it still
/// locks and releases, its subscriber subscribes to nothing, and a waiter finds the key at
/// its poll. A user allowed the keys' channels but not the keyspace channels is woken by
/// releases.
#[tokio::test]
async fn wake_a_voter_that_refuses_the_channels_falls_back_to_polling() {
    let m = Masters::start(1);
    let warnings = Warnings::capture();
    let client = as_user(&m, "nopub", &[]).await;
    let (holder, waiter) = (client(), client());
    let poll = Retry::until(Duration::from_secs(20))
        .delay(Duration::from_millis(300))
        .jitter(Duration::ZERO);
    let mut waiting = Vec::new();
    for key in ["wake-acl", "wake-acl-2"] {
        let lease = holder.try_lock(key, TTL).await.unwrap();
        waiting.push((lease, Waiter::start(&waiter, key, TTL, poll)));
    }
    // Both keys' subscriptions were refused: ACL LOG names each channel.
    eventually(
        "both subscriptions were refused",
        Duration::from_secs(5),
        || async {
            let refused = acl_log_strings(&m[0]).await;
            ["wake-acl", "wake-acl-2"]
                .iter()
                .all(|k| refused.iter().any(|s| s == k))
        },
    )
    .await;
    assert_eq!(
        warnings.count("refuses the wake-up's channels"),
        1,
        "one warning for the voter, not one per refused key"
    );
    assert_eq!(warnings.mentions("wake-acl"), 0, "a raw key in a log line");
    for (lease, waiter) in waiting {
        let key = lease.key().to_owned();
        assert_eq!(subscribers(&m[0], &key).await, 0);
        lease.release().await.unwrap();
        assert!(m[0].get(&key).await.is_none());
        let (lease, _) = waiter.answer(Instant::now()).await;
        let lease = lease.expect("the poll finds the key free");
        lease.release().await.unwrap();
    }

    // A user allowed the keys' channels but not the keyspace channels: releases still wake
    // (only expiries do not).
    let client = as_user(&m, "keysonly", &["&wake-*"]).await;
    let (holder, waiter) = (client(), client());
    let lease = holder.try_lock("wake-acl-keys", TTL).await.unwrap();
    let waiting = Waiter::heard(&waiter, "wake-acl-keys", TTL, long_poll(), [&m[0]]).await;
    let released = Instant::now();
    lease.release().await.unwrap();
    waiting.woken(released, LONG_POLL).await;
}

/// A client where fewer voters than a quorum can listen (two of three are nodes over the
/// caller's own connections, which publish but do not listen) does not wait for releases:
/// it warns once, never subscribes, its waiters find the key at their poll, and its releases
/// still publish.
#[tokio::test]
async fn wake_fewer_listening_voters_than_a_quorum_poll_and_still_publish() {
    let m = Masters::start(3);
    let warnings = Warnings::capture();
    let mut builder = Redlock::builder()
        .redis(&m[0].url())
        .node_timeout(NODE_TIMEOUT)
        .wake_waiters(true);
    for (i, s) in m.iter().enumerate().skip(1) {
        builder = builder.node(own_node(s, format!("own-{i}")).await);
    }
    let redlock = builder.build().unwrap();
    const FEWER: &str = "fewer voters can listen for releases than a quorum";
    assert_eq!(warnings.count(FEWER), 1);
    // None at all (every node over the caller's connection) warns too.
    let mut none = Redlock::builder().wake_waiters(true);
    for (i, s) in m.iter().enumerate() {
        none = none.node(own_node(s, format!("none-{i}")).await);
    }
    drop(none.build().unwrap());
    assert_eq!(warnings.count(FEWER), 2);
    let mut subs = Vec::new();
    for s in m.iter() {
        subs.push(Subscriber::on(s.port(), &["wake-few"]).await);
    }
    let lease = redlock.try_lock("wake-few", TTL).await.unwrap();
    let poll = Retry::until(Duration::from_secs(20))
        .delay(Duration::from_millis(300))
        .jitter(Duration::ZERO);
    let waiting = Waiter::start(&redlock, "wake-few", TTL, poll);
    // Its first try reached every master (the holder's acquire, then the waiter's: an
    // acquire is one `EVAL`).
    eventually("the waiter tried", Duration::from_secs(5), || async {
        for s in m.iter() {
            if calls(s, "eval").await < 2 {
                return false;
            }
        }
        true
    })
    .await;
    lease.release().await.unwrap();
    for sub in &mut subs {
        sub.released("wake-few").await;
    }
    let (lease, _) = waiting.answer(Instant::now()).await;
    lease
        .expect("the poll finds the key free")
        .release()
        .await
        .unwrap();
    for s in m.iter() {
        assert_eq!(
            calls(s, "subscribe").await,
            1,
            "only the test's own subscriber subscribed on port {}",
            s.port()
        );
    }
}

/// How many times `server` ran `command` (`INFO commandstats`).
pub(super) async fn calls(server: &support::RedisServer, command: &str) -> u64 {
    let mut info = redis::cmd("INFO");
    info.arg("commandstats");
    let info: String = server.query(&info).await;
    let head = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(head.as_str()))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// A node over a connection of the caller's to `s` (it publishes, but does not listen).
async fn own_node(s: &support::RedisServer, name: String) -> RedisNode {
    let client = redis::Client::open(s.url()).unwrap();
    let manager = redis::aio::ConnectionManager::new(client).await.unwrap();
    RedisNode::from_connection_manager(manager, name)
}

/// Every string in `ACL LOG`'s entries (their channels among them).
async fn acl_log_strings(server: &support::RedisServer) -> Vec<String> {
    fn strings(v: &redis::Value, out: &mut Vec<String>) {
        match v {
            redis::Value::BulkString(b) => out.push(String::from_utf8_lossy(b).into_owned()),
            redis::Value::SimpleString(s) => out.push(s.clone()),
            redis::Value::Array(items) => items.iter().for_each(|i| strings(i, out)),
            redis::Value::Map(pairs) => pairs.iter().for_each(|(k, v)| {
                strings(k, out);
                strings(v, out);
            }),
            _ => {}
        }
    }
    let mut log = redis::cmd("ACL");
    log.arg("LOG");
    let entries: Vec<redis::Value> = server.query(&log).await;
    let mut out = Vec::new();
    entries.iter().for_each(|e| strings(e, &mut out));
    out
}

/// A maker of waking clients of `m`'s master as a new ACL user `user` with no channel but
/// those in `channels` (Redis 7's default for a new user: none).
async fn as_user(m: &Masters, user: &str, channels: &[&str]) -> impl Fn() -> Redlock {
    let mut acl = redis::cmd("ACL");
    acl.arg("SETUSER")
        .arg(user)
        .arg(&["on", ">pw", "~*", "+@all", "resetchannels"][..])
        .arg(channels);
    let () = m[0].query(&acl).await;
    let url = format!("redis://{user}:pw@127.0.0.1:{}", m[0].port());
    move || {
        Redlock::builder()
            .redis(&url)
            .node_timeout(NODE_TIMEOUT)
            .retry(Retry::never())
            .wake_waiters(true)
            .build()
            .unwrap()
    }
}

/// A caller that may not wait (no retries) never queues behind the client's waiters of the
/// key: it is answered "contended" at once, not after its policy's delay.
#[tokio::test]
async fn wake_a_caller_without_retries_does_not_queue_behind_waiters() {
    let m = Masters::start(3);
    let holder = m.builder().wake_waiters(true).build().unwrap();
    let redlock = m.builder().wake_waiters(true).build().unwrap();
    let lease = holder.try_lock("wake-no-queue", TTL).await.unwrap();
    let waiting = Waiter::heard(&redlock, "wake-no-queue", TTL, long_poll(), m.iter()).await;
    let started = Instant::now();
    let once = Retry::times(0).delay(Duration::from_secs(10));
    let err = redlock
        .lock_with("wake-no-queue", TTL, once)
        .await
        .expect_err("the key is held");
    assert!(err.is_contended(), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let released = Instant::now();
    lease.release().await.unwrap();
    waiting.woken(released, LONG_POLL).await;
}

/// A holder on 2 of 3 masters: each try of a waiter takes the third, misses the quorum and
/// gives it back — publishing a release there. That release is not a quorum: the waiter does
/// not wake itself into a loop of tries, and its retries stay its polls (3 polls of 1 s).
///
/// The count it asserts is the bound the promise makes, not one run's luck: the first try
/// and 3 polls are 4 tries; a subscriber whose connection is (re)made after the key's
/// subscription counts as one release heard from that voter (a release may have been missed),
/// so on a loaded machine where connecting m0's and m1's subscribers takes a retry, their two
/// hints together with the waiter's own give-back on m2 can add a woken try or two: at most
/// 6. The loop this test guards against made thousands of tries.
#[tokio::test]
async fn wake_a_losing_try_does_not_wake_itself() {
    let m = Masters::start(3);
    for s in m.iter().take(2) {
        assert!(s.set_nx("wake-loser", "a-holder", Some(60_000)).await);
    }
    let waiter = m.builder().wake_waiters(true).build().unwrap();
    let started = Instant::now();
    let polls = Retry::times(3).delay(SECOND).jitter(Duration::ZERO);
    let err = waiter
        .lock_with("wake-loser", TTL, polls)
        .await
        .expect_err("held on a quorum");
    assert!(err.is_contended(), "{err}");
    assert!((4..=6).contains(&err.attempts()), "{err}");
    assert!(started.elapsed() >= 3 * SECOND, "{:?}", started.elapsed());
    // Each try gave the third master back.
    assert!(m[2].get("wake-loser").await.is_none());
}

/// Two waiters in two clients, one master of three stopped (a quorum is both others): at
/// the release each may take one master and split the vote; their releases of it add up to
/// a quorum while nobody holds the key and wake them both again. The random pause after
/// repeated splits sets them apart: both get the lock, woken, long before their polls.
#[tokio::test]
async fn wake_waiters_split_by_a_stopped_master_each_get_the_lock() {
    let m = Masters::start(3);
    m[2].stop();
    let client = || m.builder().wake_waiters(true).build().unwrap();
    let holder = client();
    let lease = holder.try_lock("wake-split", TTL).await.unwrap();
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let waiter = client();
            tokio::spawn(async move {
                let lease = waiter.lock_with("wake-split", TTL, long_poll()).await;
                let granted = Instant::now();
                let lease = lease.expect("each waiter gets the lock");
                tokio::time::sleep(Duration::from_millis(50)).await; // the work
                lease.release().await.unwrap();
                (granted, waiter)
            })
        })
        .collect();
    listening([&m[0], &m[1]], "wake-split").await;
    // Both are waiting: each client listens (two subscribers on each live master).
    eventually("both waiters listen", Duration::from_secs(20), || async {
        subscribers(&m[0], "wake-split").await >= 2 && subscribers(&m[1], "wake-split").await >= 2
    })
    .await;
    let released = Instant::now();
    lease.release().await.unwrap();
    for waiter in waiters {
        let (granted, _client) = waiter.await.unwrap();
        assert_woken(granted - released, LONG_POLL);
    }
}

/// A release message is a hint, never a grant: messages on every master while the key is
/// still held wake the waiter, its tries fail, and the holder keeps the key everywhere.
/// (The holder's value is set on every master directly: a grant returns at a quorum, and
/// a master the holder missed would be one the waiter's tries win, a split and an extra try.)
///
/// What it waits for: the waiter's subscribers listening on every master
/// ([`Waiter::heard`]) before the messages are sent. The count it asserts is the bound,
/// not one run's luck: its policy alone allows 2 tries (the first and one poll), so 3 or
/// more means the messages woke it; each woken try needs releases from a quorum (2) of
/// voters heard since the last try began, from the 3 messages and from at most one hint per
/// voter whose subscriber connection was (re)made after it subscribed (seen under load: 4
/// tries), so at most 3 woken tries: 5 in all.
#[tokio::test]
async fn wake_a_release_message_is_a_hint_never_a_grant() {
    let m = Masters::start(3);
    for s in m.iter() {
        assert!(s.set_nx("wake-hint", "the-holder", Some(60_000)).await);
    }
    let waiter = m.builder().wake_waiters(true).build().unwrap();
    let twice = Retry::times(1).delay(2 * SECOND).jitter(Duration::ZERO);
    let waiting = Waiter::heard(&waiter, "wake-hint", TTL, twice, m.iter()).await;
    for s in m.iter() {
        let mut publish = redis::cmd("PUBLISH");
        publish.arg("wake-hint").arg("released");
        let _: i64 = s.query(&publish).await;
    }
    let (answer, _) = waiting.answer(Instant::now()).await;
    let err = answer.expect_err("the key is still held");
    assert!(err.is_contended(), "{err}");
    // The first try, at least one woken by the messages, the poll.
    assert!((3..=5).contains(&err.attempts()), "{err}");
    assert!(m.everywhere("wake-hint", "the-holder").await);
}

/// A queued waiter tries at its own polls, not on the schedule of the waiter ahead of it: a
/// `delay(50 ms)` waiter queued behind one that polls every 30 s finds the key, released by a
/// holder that publishes nothing, at its next poll.
///
/// What it waits for: the first waiter listening on every master (it has the turn), then the
/// second's tries reaching the masters (an acquire is one `EVAL`) — before the fix it made
/// none until near its deadline. The bound: its next poll (50 ms) plus a try, with
/// [`WOKEN_WITHIN`] of slack for a loaded machine — far below the 30 s poll of the waiter
/// ahead and its own 20 s deadline.
#[tokio::test]
async fn wake_queue_own_poll_a_short_delay_behind_a_long_one_tries_at_its_own() {
    let m = Masters::start(3);
    let quiet = m.client();
    let redlock = m.builder().wake_waiters(true).build().unwrap();
    let key = "wake-own-poll";
    let lease = quiet.try_lock(key, TTL).await.unwrap();
    let slow = Retry::times(3)
        .delay(Duration::from_secs(30))
        .jitter(Duration::ZERO);
    let _ahead = Waiter::heard(&redlock, key, TTL, slow, m.iter()).await;
    let tried = calls(&m[0], "eval").await;
    let fast = Retry::until(Duration::from_secs(20))
        .delay(Duration::from_millis(50))
        .jitter(Duration::ZERO);
    let queued = Waiter::start(&redlock, key, TTL, fast);
    eventually(
        "the queued waiter tries at its own polls",
        Duration::from_secs(10),
        || async { calls(&m[0], "eval").await >= tried + 2 },
    )
    .await;
    let released = Instant::now();
    lease.release().await.unwrap();
    let (lease, waited) = queued.answer(released).await;
    let lease = lease.expect("the queued waiter's poll finds the key free");
    assert!(
        waited < Duration::from_millis(50) + WOKEN_WITHIN,
        "granted {waited:?} after the release"
    );
    lease.release().await.unwrap();
}

/// A queued waiter's first wait ends by its deadline, whatever its delay: a
/// `Retry::until(1 s).delay(30 s)` waiter queued behind another gives up contended about
/// 1 s after it started (plus a try), not at its 30 s delay.
#[tokio::test]
async fn wake_queue_own_poll_the_first_wait_ends_by_the_deadline() {
    let m = Masters::start(3);
    let quiet = m.client();
    let redlock = m.builder().wake_waiters(true).build().unwrap();
    let key = "wake-first-wait-deadline";
    let lease = quiet.try_lock(key, TTL).await.unwrap();
    let slow = Retry::times(3)
        .delay(Duration::from_secs(30))
        .jitter(Duration::ZERO);
    let _ahead = Waiter::heard(&redlock, key, TTL, slow, m.iter()).await;
    let short = Retry::until(SECOND)
        .delay(Duration::from_secs(30))
        .jitter(Duration::ZERO);
    let started = Instant::now();
    let queued = Waiter::start(&redlock, key, TTL, short);
    let (answer, _) = queued.answer(started).await;
    let waited = started.elapsed();
    let e = answer.expect_err("the holder keeps the key: contended");
    assert!(e.is_contended(), "{e}");
    assert!(
        waited < SECOND + WOKEN_WITHIN,
        "gave up {waited:?} after it started, past its 1 s wait"
    );
    lease.release().await.unwrap();
}

/// Takes `key` (free) and releases it.
async fn lock_and_release(redlock: &Redlock, key: &str) {
    let lease = redlock.try_lock(key, TTL).await.expect("the key is free");
    lease.release().await.expect("released");
}
