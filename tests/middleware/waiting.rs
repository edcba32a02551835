//! Waiting for a held key (`LockPolicyBuilder::wait`): waiters take turns, and give up at
//! their deadline.

use std::time::{Duration, Instant};

use tower_redlock::policy::{LockPolicy, OnContention};

use crate::harness::app::App;
use crate::harness::keys::{policy_of, redis_key};
use crate::harness::probe::Probe;
use crate::harness::Framework;
use crate::support::apps::*;
use crate::support::http::{http_client, within, DEADLINE};
use crate::support::Masters;

/// With waiting on, same-key requests all succeed, one at a time: the test lets each holder
/// out only once it is alone inside, and the next waiter takes over.
pub async fn waiting_requests_take_turns<F: Framework>() {
    const REQUESTS: usize = 8;
    const KEY: &str = "order-1";
    let (m, redlock) = masters_and_client().await;
    let policy = policy_of(&redlock)
        .on_contention(OnContention::wait(DEADLINE))
        .build()
        .expect("a valid policy");
    let probe = Probe::new();
    let app = F::serve(&App::gated(PATH, policy, &probe)).await;
    let http = http_client();

    let requests: Vec<_> = (0..REQUESTS)
        .map(|_| tokio::spawn(post_key(&http, &app.url(PATH), KEY)))
        .collect();
    for turn in 1..=REQUESTS {
        probe.until_started(turn).await;
        assert_eq!(probe.inside(), 1, "turn {turn}: not alone inside");
        assert_eq!(probe.completed(), turn - 1);
        probe.let_one_out();
    }
    for request in requests {
        let v = within("a response", request).await.expect("no panic").ok();
        assert_eq!(v["locked"], true, "{v}");
    }
    assert_eq!(probe.max_inside(), 1, "two waiters overlapped");
    assert_eq!((probe.started(), probe.completed()), (REQUESTS, REQUESTS));
    assert_released(&m, &redis_key(PATH, PATH, KEY)).await;
    assert_all_empty(&m).await;
    drop(http);
    app.stop().await;
}

/// A waiter whose deadline passes while the holder is still inside gets a 409 — after waiting
/// (not at once), and not much later than its deadline.
///
/// The lower bound is the protocol's own, whatever the load: the waiter stops early only when
/// the next pause (at most 75 ms) and one more try (at most two node timeouts) would overrun
/// its deadline, which it counts from after the test's clock started. The upper bound gives a
/// loaded machine `SLACK` (5 s) past the deadline. The apps' client (500 ms node timeouts), not
/// the 200 ms one: a starved master answering late must not turn a refusal into a `503`.
pub async fn waiting_gives_up_at_its_deadline<F: Framework>() {
    const MAX_WAIT: Duration = Duration::from_secs(3);
    /// What a loaded machine may add after the deadline.
    const SLACK: Duration = Duration::from_secs(5);
    const KEY: &str = "order-2";
    let m = Masters::start(3);
    // The waiter stops before a try that could not end by the deadline, and a try is bounded
    // by two node timeouts.
    let redlock = client_of(&m).await;
    let policy = policy_of(&redlock)
        .on_contention(OnContention::wait(MAX_WAIT))
        .build()
        .expect("a valid policy");
    let probe = Probe::new();
    let app = F::serve(&App::gated(PATH, policy, &probe)).await;
    let http = http_client();

    let holder = tokio::spawn(post_key(&http, &app.url(PATH), KEY));
    probe.until_started(1).await;
    let started = Instant::now();
    let waiter = post_key(&http, &app.url(PATH), KEY).await;
    let waited = started.elapsed();
    assert_conflict(&waiter, LockPolicy::DEFAULT_TTL);
    // Retries stop early when the next pause (50 ms plus up to 25 ms of jitter) and one more
    // try (up to two node timeouts) would overrun the deadline: it waited (a 409 at once
    // takes milliseconds), and gave up by the deadline, plus slack for a loaded machine.
    let early = HTTP_NODE_TIMEOUT * 2 + Duration::from_millis(75);
    assert!(
        waited >= MAX_WAIT - early && waited >= MAX_WAIT / 2,
        "a 409 after {waited:?}: it did not wait (max wait {MAX_WAIT:?})"
    );
    assert!(
        waited <= MAX_WAIT + SLACK,
        "a 409 after {waited:?}, long after the max wait of {MAX_WAIT:?}"
    );
    assert_eq!(probe.started(), 1, "the waiter's handler ran");

    probe.open();
    let v = within("the holder", holder).await.expect("no panic").ok();
    assert_eq!(v["locked"], true, "{v}");
    assert_released(&m, &redis_key(PATH, PATH, KEY)).await;
    assert_all_empty(&m).await;
    drop(http);
    app.stop().await;
}
