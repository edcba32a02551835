//! The wake-up's subscriptions under load, on real masters (issue 42): no subscription
//! outlives its waiters, however they leave — granted, timed out, cancelled, or while a
//! master was frozen during their subscription — also after the subscribers reconnect.

use std::time::Duration;

use tower_redlock::{Redlock, Retry};

use super::{Masters, TTL};
use crate::support;
use crate::support::eventually;

/// How many keys, in four groups of a quarter each.
const KEYS: usize = 1_000;

/// `PUBSUB NUMSUB` of `keys` on the master behind `conn`: whether any has a subscriber.
async fn any_subscribed(conn: &mut redis::aio::MultiplexedConnection, keys: &[String]) -> bool {
    for batch in keys.chunks(500) {
        let counts: Vec<(String, i64)> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(batch)
            .query_async(conn)
            .await
            .unwrap();
        if counts.iter().any(|(_, n)| *n != 0) {
            return true;
        }
    }
    false
}

/// Waits (bounded) until no master has a subscriber on any of `keys`.
async fn none_subscribed(m: &Masters, keys: &[String], what: &str) {
    let mut conns = Vec::new();
    for s in m.iter() {
        let client = redis::Client::open(s.url()).unwrap();
        conns.push(client.get_multiplexed_async_connection().await.unwrap());
    }
    eventually(what, Duration::from_secs(20), || {
        let mut conns = conns.clone();
        async move {
            for conn in &mut conns {
                if any_subscribed(conn, keys).await {
                    return false;
                }
            }
            true
        }
    })
    .await;
}

/// Takes each of `keys` on every master for `px` ms, as a holder that lets it expire.
async fn hold(m: &Masters, keys: &[String], px: u64) {
    for s in m.iter() {
        let client = redis::Client::open(s.url()).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let mut pipe = redis::pipe();
        for key in keys {
            pipe.cmd("SET")
                .arg(key)
                .arg("a-holder")
                .arg("NX")
                .arg("PX")
                .arg(px)
                .ignore();
        }
        let () = pipe.query_async(&mut conn).await.unwrap();
    }
}

/// Starts a waiter for each of `keys`; each returns whether it got the lock.
fn wait_for(
    redlock: &Redlock,
    keys: &[String],
    retry: Retry,
) -> Vec<tokio::task::JoinHandle<bool>> {
    keys.iter()
        .map(|key| {
            let (redlock, key) = (redlock.clone(), key.clone());
            tokio::spawn(async move {
                match redlock.lock_with(&key, TTL, retry).await {
                    Ok(lease) => lease.release().await.is_ok(),
                    Err(_) => false,
                }
            })
        })
        .collect()
}

/// 1,000 keys in four groups whose waiters leave four ways: granted (the keys expire, the
/// waiters find them free), timed out (their policy ends first), cancelled (their tasks
/// aborted), and cancelled while a master is frozen, so that their subscriptions there are
/// late (the subscriber's request times out; the frozen master runs it when it thaws).
/// Afterwards no master has a subscriber on any key — also once every subscriber
/// connection was killed and made again (`CLIENT KILL TYPE pubsub`), which re-subscribes
/// whatever a subscriber still lists.
///
/// What it waits for: each group's waiters listening (every master counts a subscriber on
/// every key) before they are made to leave, except the frozen group (whose subscriptions
/// cannot land while the master is frozen: that is the scenario).
#[tokio::test(flavor = "multi_thread")]
async fn wake_no_leak_masters_no_subscription_outlives_its_waiters() {
    let m = Masters::start(3);
    let redlock = m
        .builder()
        .node_timeout(Duration::from_millis(300))
        .wake_waiters(true)
        .build()
        .unwrap();
    let keys: Vec<String> = (0..KEYS).map(|i| format!("wake-leak:{i}")).collect();
    let groups: Vec<&[String]> = keys.chunks(KEYS / 4).collect();
    let long = || {
        Retry::until(Duration::from_secs(60))
            .delay(Duration::from_secs(30))
            .jitter(Duration::ZERO)
    };
    let listening = |group: &'static str, keys: Vec<String>, on: &'static [usize]| {
        let m = &m;
        async move {
            eventually(
                format!("the {group} group's waiters listen on masters {on:?}"),
                Duration::from_secs(30),
                || async {
                    for s in on.iter().map(|&i| &m[i]) {
                        for key in keys.iter().step_by(25) {
                            if support::pubsub::subscribers(s, key).await < 1 {
                                return false;
                            }
                        }
                    }
                    true
                },
            )
            .await;
        }
    };

    // Granted: held 3 s, then found free at the poll (1 s apart) or woken.
    hold(&m, groups[0], 3_000).await;
    let poll = Retry::until(Duration::from_secs(30))
        .delay(Duration::from_secs(1))
        .jitter(Duration::ZERO);
    let granted = wait_for(&redlock, groups[0], poll);
    // Timed out: held for a minute; the waiters give up after 8 s (polls 1 s apart).
    hold(&m, groups[1], 60_000).await;
    let short = Retry::until(Duration::from_secs(8))
        .delay(Duration::from_secs(1))
        .jitter(Duration::ZERO);
    let timed_out = wait_for(&redlock, groups[1], short);
    listening("timed-out", groups[1].to_vec(), &[0, 1, 2]).await;
    // Cancelled.
    hold(&m, &[groups[2], groups[3]].concat(), 60_000).await;
    let cancelled = wait_for(&redlock, groups[2], long());
    listening("cancelled", groups[2].to_vec(), &[0, 1, 2]).await;
    for task in &cancelled {
        task.abort();
    }
    // Cancelled while the third master is frozen: their subscriptions there come late.
    m[2].freeze();
    let late = wait_for(&redlock, groups[3], long());
    // Their tries fail on the two others (held) and time out on the frozen one: they are
    // waiting, their subscriptions queued, once the live masters listen.
    listening("late", groups[3].to_vec(), &[0, 1]).await;
    for task in &late {
        task.abort();
    }
    m[2].thaw();

    for task in granted {
        assert!(
            task.await.unwrap(),
            "a waiter of a key that expired gets it"
        );
    }
    for task in timed_out {
        assert!(!task.await.unwrap(), "a held key is not granted");
    }
    none_subscribed(&m, &keys, "no master has a subscriber on any key").await;
    for s in m.iter() {
        let mut kill = redis::cmd("CLIENT");
        kill.arg("KILL").arg("TYPE").arg("pubsub");
        let _: i64 = s.query(&kill).await;
    }
    // The subscribers come back (a new waiter is listened on), then leave again.
    hold(&m, &["wake-leak:probe".to_owned()], 60_000).await;
    let probe = wait_for(&redlock, &["wake-leak:probe".to_owned()], long());
    listening("probe", vec!["wake-leak:probe".to_owned()], &[0, 1, 2]).await;
    probe[0].abort();
    none_subscribed(&m, &keys, "still none after the subscribers reconnected").await;
}
