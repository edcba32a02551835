//! The server side of waking waiters (issue 30, first part): every delete of a lock — a
//! release, a fenced release, a completion, a forced release — publishes on the sharded
//! channel named as the lock's key, in the same script; a release that deletes nothing
//! publishes nothing; a user the ACL denies `SPUBLISH` still releases. Read here by a raw
//! `SSUBSCRIBE` connection (`support::pubsub`; in order: a message that should not be there would come first).

use tower_redlock::operate::ForceRelease;
use tower_redlock::{Claim, Redlock, Retry};

use super::{Masters, TTL};
use crate::support::pubsub::Subscriber;
use crate::support::NODE_TIMEOUT;

/// Each kind of delete publishes once on the key's channel; a release that finds another
/// token there publishes nothing (the next message is the next delete's).
#[tokio::test]
async fn wake_every_delete_of_a_lock_publishes_on_its_channel() {
    let m = Masters::start(1);
    let port = m[0].port();
    let mut sub = Subscriber::on(port, &["wake-job", "wake-other"]).await;
    let redlock = m.client();
    let fenced = m.builder().fencing(true).build().unwrap();

    redlock
        .try_lock("wake-job", TTL)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    sub.released("wake-job").await;
    fenced
        .try_lock("wake-job", TTL)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    sub.released("wake-job").await;

    let Claim::Locked(lease) = redlock
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
        .force_release("wake-other", ForceRelease::by("test"))
        .await
        .unwrap();
    sub.released("wake-other").await;

    // A lease whose key another holder took meanwhile: its release deletes nothing, and
    // publishes nothing — the next message is the next real release, of another key.
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
    redlock
        .try_lock("wake-job", TTL)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    sub.released("wake-job").await;
}

/// A user the ACL denies `SPUBLISH` (Redis 7's default for a new user: no channel) still
/// locks and releases: the wake-up is best effort, its waiters poll.
#[tokio::test]
async fn wake_a_user_denied_publish_still_releases() {
    let m = Masters::start(1);
    let mut acl = redis::cmd("ACL");
    acl.arg(
        &[
            "SETUSER",
            "nopub",
            "on",
            ">pw",
            "~*",
            "+@all",
            "resetchannels",
        ][..],
    );
    let () = m[0].query(&acl).await;
    let url = format!("redis://nopub:pw@127.0.0.1:{}", m[0].port());
    let redlock = Redlock::builder()
        .redis(&url)
        .node_timeout(NODE_TIMEOUT)
        .retry(Retry::never())
        .build()
        .unwrap();
    let lease = redlock.try_lock("wake-acl", TTL).await.unwrap();
    lease.release().await.unwrap();
    assert!(m[0].get("wake-acl").await.is_none());
    redlock
        .try_lock("wake-acl", TTL)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}
