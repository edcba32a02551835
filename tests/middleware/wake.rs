//! Waking waiters in the middleware (`RedlockBuilder::wake_waiters`): a duplicate of an
//! idempotent request that waits (`OnContention::Wait`) for the first one in flight gets the
//! stored response soon after the first completes — woken by the completion's release, long
//! before its next poll.

use std::time::{Duration, Instant};

use tower_redlock::policy::OnContention;
use tower_redlock::replay::Replay;
use tower_redlock::Retry;

use crate::harness::app::{App, Handler, Route};
use crate::harness::keys::{policy_of, redis_key};
use crate::harness::probe::Probe;
use crate::harness::Framework;
use crate::replay::{assert_ran, assert_replays_of, pay, BODY};
use crate::support::apps::*;
use crate::support::http::{http_client, reply, within};
use crate::support::pubsub::listening;
use crate::support::{warm_up, Masters};

/// A poll so long (8–12 s with the middleware's jitter) that a duplicate answered within it
/// was woken.
const LONG_POLL: Duration = Duration::from_secs(8);

/// The duplicates are sent at `sent`; a duplicate that is not woken tries again no sooner
/// than [`LONG_POLL`] after its failed try, itself after `sent`. So every replay read before
/// `sent + LONG_POLL` was woken — the bound is exact, with no slack to guess. The first
/// request completes (the wake-up's cause) only once the test opens its gate: if the machine
/// got there too late to leave the replays half the poll, the scenario could not be set up.
pub async fn wake_a_waiting_duplicate_gets_the_replay_when_the_first_completes<F: Framework>() {
    const DUPLICATES: usize = 5;
    const KEY: &str = "\"order-woken\"";
    let m = Masters::start(3);
    let redlock = m
        .builder()
        .node_timeout(HTTP_NODE_TIMEOUT)
        .wake_waiters(true)
        .build()
        .expect("a valid client");
    warm_up(&redlock, &m).await;
    let probe = Probe::new();
    let policy = policy_of(&redlock)
        .replay(Replay::new())
        .on_contention(OnContention::Wait(
            Retry::until(Duration::from_secs(30))
                .delay(LONG_POLL)
                .jitter(LONG_POLL / 2),
        ))
        .build()
        .expect("a valid policy");
    let app = App::new().route(Route::locked(PATH, policy).post(Handler::payment(&probe)));
    let app = F::serve(&app).await;
    let http = http_client();

    let first = tokio::spawn(reply(pay(&http, &app.url(PATH), KEY, BODY)));
    probe.until_started(1).await;
    let sent = Instant::now();
    let duplicates: Vec<_> = (0..DUPLICATES)
        .map(|_| tokio::spawn(reply(pay(&http, &app.url(PATH), KEY, BODY))))
        .collect();
    // The duplicates wait: their client listens on the key on every master.
    let lock_key = redis_key(PATH, PATH, KEY);
    listening(m.iter(), &lock_key).await;
    probe.open();
    let first = within("the first reply", first).await.expect("no panic");
    let answered = sent.elapsed();
    assert!(
        answered < LONG_POLL / 2,
        "could not set up the scenario: the first request completed {answered:?} after the \
         duplicates were sent, too close to their poll ({LONG_POLL:?}) to tell a wake-up"
    );
    assert_ran(&first);
    assert_replays_of(&first, duplicates).await;
    let last = sent.elapsed();
    assert!(
        last < LONG_POLL,
        "the last replay came {last:?} after the duplicates were sent: one waited for its \
         poll ({LONG_POLL:?}), it was not woken (the first answered after {answered:?})"
    );
    assert_eq!(probe.started(), 1, "a waiting duplicate ran the handler");
    drop(http);
    app.stop().await;
}
