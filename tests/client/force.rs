//! Issue 39 (1): a forced release names the holder it clears. An operator re-runs a forced
//! release when a voter did not answer; between the runs a new holder may have taken the key
//! (woken by the first run's release). The re-run — or a script a connection re-sends after
//! a dropped reply — deletes nothing of that new holder: not its lock, not its record. A
//! holder named badly is refused before anything is sent.

use tower_redlock::node::{ForceReleaseRequest, Forced, Node, Operated, Operation, RedisNode};
use tower_redlock::operate::ForceRelease;
use tower_redlock::{LockOrRecord, Redlock, Retry};

use super::{eventually, support, Masters, SECOND, TTL};
use support::proxy::FaultProxy;
use support::{warm_up, NODE_TIMEOUT};

/// A crashed holder's token (its prefix is what `inspect` shows an operator).
const CRASHED: &str = "f0f0f0f0c0ffee00c0ffee00c0ffee00";

/// The crashed holder's lock, on every master, for longer than the test.
async fn crashed_holder_on(m: &Masters, key: &str) {
    for s in m.iter() {
        assert!(s.set_nx(key, CRASHED, Some(600_000)).await);
    }
}

/// Waits until every master holds `token` at `key`: a lock returns at a quorum, the last
/// master's `SET` may land a moment later (the re-runs must find it there). The clients are
/// warmed up (connected to every master), so that every master is sent the `SET`.
async fn held_everywhere(m: &Masters, key: &str, token: &str) {
    eventually(
        "every master holds the new holder's lock",
        5 * SECOND,
        || m.everywhere(key, token),
    )
    .await;
}

/// The operator's forced release of the crashed holder, completion record included.
fn clear_crashed() -> ForceRelease {
    ForceRelease::by("oncall").holder("f0f0f0f0").with_record()
}

/// The first run clears the crashed holder; a new holder takes the key; the re-run deletes
/// neither the new holder's lock nor, once it completed, its record (its duplicate is
/// replayed, never run again). Fails on the forced release that deleted whatever was there.
#[tokio::test]
async fn force_rerun_spares_a_new_holders_lock_and_record() {
    const KEY: &str = "force-rerun";
    let m = Masters::start(3);
    let redlock = m.client();
    warm_up(&redlock, &m).await;
    crashed_holder_on(&m, KEY).await;

    let first = redlock.force_release(KEY, clear_crashed()).await.unwrap();
    assert_eq!(first.locks_deleted(), 3, "{first:?}");
    let LockOrRecord::Locked(lease) = redlock
        .lock_unless_completed(KEY, TTL, Retry::never())
        .await
        .unwrap()
    else {
        panic!("nothing completed yet")
    };
    held_everywhere(&m, KEY, lease.value()).await;

    let rerun = redlock.force_release(KEY, clear_crashed()).await.unwrap();
    assert!(rerun.is_complete(), "{rerun:?}");
    assert_eq!(
        rerun.locks_deleted(),
        0,
        "the re-run deleted the new holder's lock"
    );
    assert!(
        m.everywhere(KEY, lease.value()).await,
        "the new holder's lock is intact"
    );

    lease.complete(b"paid".to_vec(), TTL).await.unwrap();
    let rerun = redlock.force_release(KEY, clear_crashed()).await.unwrap();
    assert_eq!(
        rerun.records_deleted(),
        0,
        "the re-run deleted the new holder's record"
    );
    let duplicate = redlock
        .lock_unless_completed(KEY, TTL, Retry::never())
        .await
        .unwrap();
    assert!(
        matches!(duplicate, LockOrRecord::Completed(_)),
        "the duplicate would run the work again"
    );
}

/// A holder named by fewer than 8 or more than 32 characters, or not hex, and a release that
/// names no holder without choosing `any_holder()`: invalid input, nothing deleted anywhere.
/// Upper-case hex names the same holder as lower-case.
#[tokio::test]
async fn force_rerun_a_bad_holder_prefix_is_refused_and_deletes_nothing() {
    const KEY: &str = "force-bad-prefix";
    let m = Masters::start(3);
    let redlock = m.client();
    warm_up(&redlock, &m).await;
    crashed_holder_on(&m, KEY).await;
    let too_long = format!("{CRASHED}0");
    for bad in [
        "",
        "f0f0",
        "f0f0f0f",
        "zzzzzzzz",
        "f0f0f0f0-",
        "f0f0 f0f0",
        &too_long,
    ] {
        let e = redlock
            .force_release(KEY, ForceRelease::by("oncall").holder(bad).with_record())
            .await
            .unwrap_err();
        assert!(e.is_invalid_input(), "{bad:?}: {e:?}");
        assert!(e.to_string().contains("8 to 32 hex digits"), "{bad:?}: {e}");
    }
    let e = redlock
        .force_release(KEY, ForceRelease::by("oncall"))
        .await
        .unwrap_err();
    assert!(e.is_invalid_input(), "{e:?}");
    assert!(e.to_string().contains("name the holder"), "{e}");
    assert!(
        m.everywhere(KEY, CRASHED).await,
        "a refused release deleted something"
    );

    let upper = ForceRelease::by("oncall").holder("F0F0F0F0C0FFEE");
    let cleared = redlock.force_release(KEY, upper).await.unwrap();
    assert_eq!(cleared.locks_deleted(), 3, "{cleared:?}");
}

/// The first run's reply from master 0 is dropped after its script ran there (the proxy
/// resets the connection). A new holder takes the key and completes its work; then the
/// request is sent again — the very request the client made, to master 0 as a connection
/// that re-sends after a dropped reply would (`Node::operate` on a `RedisNode`), and
/// by the operator's re-run to every master: neither deletes the new holder's lock or
/// record.
#[tokio::test]
async fn force_rerun_a_resent_script_deletes_nothing_of_a_new_holder() {
    const KEY: &str = "force-resent";
    let m = Masters::start(3);
    let proxy = FaultProxy::start(m[0].addr().parse().unwrap()).await;
    let urls = [proxy.url(), m[1].url(), m[2].url()];
    let redlock = urls
        .iter()
        .fold(Redlock::builder(), |b, url| b.redis(url))
        .node_timeout(NODE_TIMEOUT)
        .build()
        .unwrap();
    warm_up(&redlock, &m).await;
    // The connections are made and the script is loaded: the next reply is the script's.
    let warm = redlock
        .force_release("force-warm", clear_crashed())
        .await
        .unwrap();
    assert!(warm.is_complete(), "{warm:?}");
    crashed_holder_on(&m, KEY).await;

    proxy.drop_next_reply();
    let first = redlock.force_release(KEY, clear_crashed()).await.unwrap();
    assert!(proxy.reply_dropped(), "the proxy dropped no reply");
    // Master 0's answer was lost (an error), or the connection ran the script again (no
    // lock left to delete): either way no deletion was reported there.
    assert!(first.locks_deleted() <= 2, "{first:?}");
    assert!(
        m.absent_everywhere(KEY).await,
        "the script ran on every master"
    );

    let lease = redlock.try_lock(KEY, TTL).await.unwrap();
    held_everywhere(&m, KEY, lease.value()).await;
    let node = RedisNode::open(&m[0].url()).unwrap();
    let record_key = format!("{KEY}:record");
    let request = ForceReleaseRequest::new(KEY)
        .with_record(&record_key)
        .holder("f0f0f0f0");
    let resent = forced(&node, request).await;
    assert!(
        !resent.lock,
        "the re-sent script deleted the new holder's lock"
    );
    let rerun = redlock.force_release(KEY, clear_crashed()).await.unwrap();
    assert!(rerun.is_complete(), "{rerun:?}");
    assert_eq!(
        rerun.locks_deleted(),
        0,
        "the re-run deleted the new holder's lock"
    );
    assert!(m.everywhere(KEY, lease.value()).await);

    // Completed: its record is spared as well, by the re-sent request and the re-run.
    lease.complete(b"paid".to_vec(), TTL).await.unwrap();
    eventually("every master has the record", 5 * SECOND, || async {
        m.values(&record_key).await.iter().all(Option::is_some)
    })
    .await;
    let resent = forced(&node, request).await;
    assert!(
        !resent.record,
        "the re-sent script deleted the new holder's record"
    );
    let rerun = redlock.force_release(KEY, clear_crashed()).await.unwrap();
    assert_eq!(
        rerun.records_deleted(),
        0,
        "the re-run deleted the new holder's record"
    );
    assert!(m.values(&record_key).await.iter().all(Option::is_some));
}

/// The first tenure marker's form (`<run_id>:<ms>`, untagged) is no lock: a forced release
/// of a resource named like it spares it, whichever holder it names.
#[tokio::test]
async fn force_release_spares_the_first_tenure_marker() {
    const KEY: &str = "force-marker";
    const MARKER: &str = "a94a8fe5ccb19ba61c4c0873d391e987982fbbd3:1733380000000";
    let m = Masters::start(3);
    let redlock = m.client();
    warm_up(&redlock, &m).await;
    for s in m.iter() {
        assert!(s.set_nx(KEY, MARKER, None).await);
    }
    for how in [
        ForceRelease::by("oncall").any_holder(),
        ForceRelease::by("oncall").holder("a94a8fe5"),
    ] {
        let spared = redlock.force_release(KEY, how).await.unwrap();
        assert_eq!(spared.locks_deleted(), 0, "{spared:?}");
    }
    assert!(
        m.everywhere(KEY, MARKER).await,
        "a tenure marker was deleted"
    );
}

/// A forced release asked of `node` directly, as the client asks it.
async fn forced(node: &RedisNode, request: ForceReleaseRequest<'_>) -> Forced {
    match node
        .operate(Operation::ForceRelease(request))
        .await
        .unwrap()
    {
        Operated::Forced(forced) => forced,
        other => panic!("a forced release answered {other:?}"),
    }
}
