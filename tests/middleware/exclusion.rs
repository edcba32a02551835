//! Exclusion: one key runs exactly once across two app instances; different keys run at the
//! same time.

use std::collections::HashSet;

use tokio::sync::mpsc;
use tower_redlock::policy::LockPolicy;

use crate::harness::app::App;
use crate::harness::keys::{default_policy, redis_key};
use crate::harness::probe::Probe;
use crate::harness::Framework;
use crate::support::apps::*;
use crate::support::http::{http_client, within, Reply};
use crate::support::{eventually, Masters};

/// Sends bursts of `n` concurrent same-key requests over `urls` (handlers gated by `probe`)
/// until one request holds the lock at the gate while the `n - 1` others were answered `409`.
/// A burst whose first racers split the masters' votes three ways has no winner (Redlock's
/// split vote: everyone backs off and gives back what it took); it is rare, and another burst
/// is sent, a bounded number of times. Returns the receiver that gets the winner's reply.
pub async fn burst_until_one_holds(
    http: &reqwest::Client,
    urls: &[String],
    key: &str,
    n: usize,
    probe: &Probe,
    masters: &Masters,
) -> mpsc::UnboundedReceiver<Reply> {
    const MAX_BURSTS: usize = 5;
    let mut split_votes = 0;
    loop {
        let mut replies = burst(http, urls, key, n);
        // A holder is stuck at the gate: every other request is answered meanwhile.
        for _ in 0..n - 1 {
            assert_conflict(&next_reply(&mut replies).await, LockPolicy::DEFAULT_TTL);
        }
        tokio::select! {
            () = probe.until_started(1) => {
                if split_votes > 0 {
                    eprintln!("{split_votes} burst(s) without a winner (split votes)");
                }
                return replies;
            }
            last = next_reply(&mut replies) => {
                assert_conflict(&last, LockPolicy::DEFAULT_TTL);
                assert_eq!(probe.started(), 0, "a handler ran, yet its request got a 409");
                split_votes += 1;
                assert!(split_votes < MAX_BURSTS, "{split_votes} bursts without a winner");
                // Every racer gave back what it took.
                assert_all_empty(masters).await;
            }
        }
    }
}

/// 50 concurrent requests with one key over two instances, each with its own client of the
/// same three masters (as two processes would have): exactly one runs, the 49 others get a
/// 409 with `Retry-After`, and the key is gone from every master once the winner answered.
pub async fn one_key_across_two_instances_runs_exactly_once<F: Framework>() {
    const REQUESTS: usize = 50;
    const KEY: &str = "\"payment-7\"";
    let m = Masters::start(3);
    let probe = Probe::new();
    let mut apps = Vec::new();
    for _ in 0..2 {
        let policy = default_policy(&client_of(&m).await);
        apps.push(F::serve(&App::gated(PATH, policy, &probe)).await);
    }
    let urls = [apps[0].url(PATH), apps[1].url(PATH)];
    let http = http_client();
    let key = redis_key(PATH, PATH, KEY);

    let mut replies = burst_until_one_holds(&http, &urls, KEY, REQUESTS, &probe, &m).await;
    assert_eq!(probe.started(), 1, "exactly one request got the lock");
    assert_eq!(probe.inside(), 1);
    assert_held_on_quorum(&m, &key).await;
    assert!(held_on(&m, &key).await >= 2, "held on a quorum");

    probe.open();
    let v = next_reply(&mut replies).await.ok();
    assert_eq!(v["locked"], true, "{v}");
    assert_eq!(v["resource"], key, "{v}");
    assert_eq!(probe.max_inside(), 1, "two handlers overlapped");
    assert_eq!((probe.started(), probe.completed()), (1, 1));
    assert_all_empty(&m).await;
    drop(http);
    for app in apps {
        app.stop().await;
    }
}

/// Requests with different keys hold their locks at the same time.
pub async fn different_keys_run_concurrently<F: Framework>() {
    const REQUESTS: usize = 6;
    let (m, redlock) = masters_and_client().await;
    let probe = Probe::new();
    let app = F::serve(&App::gated(PATH, default_policy(&redlock), &probe)).await;
    let http = http_client();

    let requests: Vec<_> = (0..REQUESTS)
        .map(|i| tokio::spawn(post_key(&http, &app.url(PATH), &format!("order-{i}"))))
        .collect();
    // Only if the middleware lets them all in at once do all of them reach the gate.
    probe.until_started(REQUESTS).await;
    assert_eq!(probe.inside(), REQUESTS);
    eventually("every master holds every key", RELEASED_WITHIN, || async {
        m.dbsizes().await.iter().all(|n| *n == REQUESTS as u64)
    })
    .await;

    probe.open();
    let mut resources = HashSet::new();
    for request in requests {
        let v = within("a response", request).await.expect("no panic").ok();
        assert_eq!(v["locked"], true, "{v}");
        resources.insert(v["resource"].as_str().expect("a resource").to_owned());
    }
    assert_eq!(resources.len(), REQUESTS, "one lock per key");
    assert_eq!(probe.max_inside(), REQUESTS);
    assert_all_empty(&m).await;
    drop(http);
    app.stop().await;
}
