//! The checks of locks and of completion records: each gets the node as a `&dyn Node` and
//! its [`Peek`].

use std::time::{Duration, Instant};

use crate::node::{Acquire, AcquireRequest, CompleteRequest, ExtendRequest, Node, ReleaseRequest};

use super::eventually;
use super::{Peek, LONG, T1, T2};

/// The node has a name (for errors and logs).
pub async fn names_itself(node: &dyn Node, _: &dyn Peek) {
    assert!(!node.name().is_empty());
}

/// An acquire of an absent key sets it to the token: `Acquired`.
pub async fn acquire_free_key(node: &dyn Node, peek: &dyn Peek) {
    assert_eq!(
        node.acquire(AcquireRequest::new("free", T1, LONG))
            .await
            .unwrap(),
        Acquire::Acquired
    );
    assert_eq!(peek.peek("free").await.as_deref(), Some(T1));
}

/// An acquire of a key another token holds changes nothing and answers `Held` (with the
/// holder's time left, or `None`); the holder's own token answers `Acquired` or `Held` (see
/// [`Peek::own_token_acquired`](super::Peek::own_token_acquired)).
pub async fn acquire_held_key(node: &dyn Node, peek: &dyn Peek) {
    assert_eq!(
        node.acquire(AcquireRequest::new("held", T1, LONG))
            .await
            .unwrap(),
        Acquire::Acquired
    );
    match node
        .acquire(AcquireRequest::new("held", T2, Duration::from_secs(5)))
        .await
        .unwrap()
    {
        // A node may leave the holder's ttl out (the Redis node does: the client asks
        // one node for it when it returns a contended error); if given, it is right.
        Acquire::Held { remaining: Some(r) } => {
            assert!(r <= LONG, "remaining {r:?} > ttl {LONG:?}");
            assert!(r > LONG / 2, "remaining {r:?} far below the ttl {LONG:?}");
        }
        Acquire::Held { remaining: None } => {}
        other => panic!("expected Held, got {other:?}"),
    }
    // NX semantics even for the holder's own token: acquire never overwrites. A node answers
    // "held" — or "acquired" where its acquire finds the token (the `Node` contract: a
    // Cluster's connection sends again after a reset, and the second send finds the token
    // the first one set; a Redis voter's acquire is the script that does so). A try's
    // token is its own, so only a second send of that very try can find it.
    let own = node
        .acquire(AcquireRequest::new("held", T1, LONG))
        .await
        .unwrap();
    if peek.own_token_acquired() {
        assert_eq!(own, Acquire::Acquired);
    } else {
        assert!(matches!(own, Acquire::Held { .. }), "{own:?}");
    }
    assert_eq!(peek.peek("held").await.as_deref(), Some(T1));
}

/// A release with another token deletes nothing and answers `false`; so does one of an
/// absent key.
pub async fn release_wrong_token(node: &dyn Node, peek: &dyn Peek) {
    node.acquire(AcquireRequest::new("rw", T1, LONG))
        .await
        .unwrap();
    assert!(!node.release(ReleaseRequest::new("rw", T2)).await.unwrap());
    assert_eq!(peek.peek("rw").await.as_deref(), Some(T1));
    // Releasing an absent key is a plain "no".
    assert!(!node
        .release(ReleaseRequest::new("never-set", T1))
        .await
        .unwrap());
    assert_eq!(peek.peek("never-set").await, None);
}

/// A release with the holder's token deletes the key and answers `true`; the key can be
/// taken again.
pub async fn release_right_token(node: &dyn Node, peek: &dyn Peek) {
    node.acquire(AcquireRequest::new("rr", T1, LONG))
        .await
        .unwrap();
    assert!(node.release(ReleaseRequest::new("rr", T1)).await.unwrap());
    assert_eq!(peek.peek("rr").await, None);
    assert!(
        !node.release(ReleaseRequest::new("rr", T1)).await.unwrap(),
        "second release"
    );
    // Free again for anyone.
    assert_eq!(
        node.acquire(AcquireRequest::new("rr", T2, LONG))
            .await
            .unwrap(),
        Acquire::Acquired
    );
    assert_eq!(peek.peek("rr").await.as_deref(), Some(T2));
}

/// A ttl short enough to watch run out, long enough that a loaded machine's next step comes
/// before it does. A step that came after it, and saw what the expiry alone would explain,
/// fails as a scenario that could not be set up ([`in_time`]), never as a broken promise.
const SHORT: Duration = Duration::from_secs(1);

/// Panics as "could not set up the scenario" when `since` is [`SHORT`] ago or more: a key set
/// with [`SHORT`] at or after `since` may have expired before `step`.
#[track_caller]
fn in_time(since: Instant, step: &str) {
    let after = since.elapsed();
    assert!(
        after < SHORT,
        "could not set up the scenario: {step} came {after:?} after the key was set with a \
         ttl of {SHORT:?} (a loaded machine)"
    );
}

/// The new, shorter ttl applies: the key set with a 10 s ttl at or after `acquired` is gone
/// before `acquired` + 10 s — an exact bound, whatever the machine's speed.
pub async fn extend_right_token_shortens(node: &dyn Node, peek: &dyn Peek) {
    let acquired = Instant::now();
    node.acquire(AcquireRequest::new("es", T1, LONG))
        .await
        .unwrap();
    let extended = Instant::now();
    assert!(node
        .extend(ExtendRequest::new("es", T1, SHORT))
        .await
        .unwrap());
    let held = peek.peek("es").await;
    if held.is_none() {
        in_time(extended, "the peek after the extend");
    }
    assert_eq!(held.as_deref(), Some(T1));
    eventually("the extended key expires", LONG, || async {
        peek.peek("es").await.is_none()
    })
    .await;
    let gone = acquired.elapsed();
    assert!(
        gone < LONG,
        "gone {gone:?} after it was taken for {LONG:?}: the shorter ttl did not apply"
    );
}

/// An extension with the holder's token to a longer ttl keeps the key past its first ttl.
pub async fn extend_right_token_lengthens(node: &dyn Node, peek: &dyn Peek) {
    // Two keys with the same short ttl; only one is extended.
    let acquired = Instant::now();
    node.acquire(AcquireRequest::new("el", T1, SHORT))
        .await
        .unwrap();
    node.acquire(AcquireRequest::new("el-control", T1, SHORT))
        .await
        .unwrap();
    let extended = node
        .extend(ExtendRequest::new("el", T1, LONG))
        .await
        .unwrap();
    if !extended {
        in_time(acquired, "the extend");
    }
    assert!(extended);
    eventually(
        "the control key expires",
        Duration::from_secs(3),
        || async { peek.peek("el-control").await.is_none() },
    )
    .await;
    assert_eq!(peek.peek("el").await.as_deref(), Some(T1));
    match node
        .acquire(AcquireRequest::new("el", T2, LONG))
        .await
        .unwrap()
    {
        Acquire::Held { remaining: Some(r) } => {
            assert!(r > Duration::from_secs(5) && r <= LONG, "remaining {r:?}")
        }
        Acquire::Held { remaining: None } => {}
        other => panic!("expected Held, got {other:?}"),
    }
}

/// An extension with another token answers `false` and leaves the holder's ttl as it was.
pub async fn extend_wrong_token(node: &dyn Node, peek: &dyn Peek) {
    let acquired = Instant::now();
    node.acquire(AcquireRequest::new("ew", T1, SHORT))
        .await
        .unwrap();
    assert!(!node
        .extend(ExtendRequest::new("ew", T2, LONG))
        .await
        .unwrap());
    let held = peek.peek("ew").await;
    if held.is_none() {
        in_time(acquired, "the peek after the wrong-token extend");
    }
    assert_eq!(held.as_deref(), Some(T1));
    // The ttl did not change: the key still expires on its own schedule — before
    // `acquired + LONG`, which the wrong-token extend would have pushed it past.
    eventually(
        "the key expires despite the wrong-token extend",
        LONG,
        || async { peek.peek("ew").await.is_none() },
    )
    .await;
    let gone = acquired.elapsed();
    assert!(gone < LONG, "gone only {gone:?} after it was taken");
}

/// An extension of an absent key answers `false` and never creates it.
pub async fn extend_absent_key(node: &dyn Node, peek: &dyn Peek) {
    assert!(!node
        .extend(ExtendRequest::new("ea", T1, LONG))
        .await
        .unwrap());
    assert_eq!(peek.peek("ea").await, None, "extend re-created a key");
}

/// An extension of a key that expired answers `false` and never re-creates it.
pub async fn extend_expired_key(node: &dyn Node, peek: &dyn Peek) {
    node.acquire(AcquireRequest::new("ee", T1, Duration::from_millis(50)))
        .await
        .unwrap();
    eventually("the key expires", Duration::from_secs(3), || async {
        peek.peek("ee").await.is_none()
    })
    .await;
    assert!(!node
        .extend(ExtendRequest::new("ee", T1, LONG))
        .await
        .unwrap());
    assert_eq!(
        peek.peek("ee").await,
        None,
        "extend re-created an expired key"
    );
    assert_eq!(
        node.acquire(AcquireRequest::new("ee", T2, LONG))
            .await
            .unwrap(),
        Acquire::Acquired
    );
}

/// A lock expires after its ttl, and the key can then be taken by another token.
pub async fn expiry(node: &dyn Node, peek: &dyn Peek) {
    let start = Instant::now();
    assert_eq!(
        node.acquire(AcquireRequest::new("ex", T1, Duration::from_millis(50)))
            .await
            .unwrap(),
        Acquire::Acquired
    );
    let took = eventually(
        "the key can be acquired again",
        Duration::from_secs(3),
        || async {
            node.acquire(AcquireRequest::new("ex", T2, LONG))
                .await
                .unwrap()
                == Acquire::Acquired
        },
    )
    .await;
    let since_acquire = start.elapsed();
    assert!(
        since_acquire >= Duration::from_millis(45),
        "re-acquired after {since_acquire:?}, before the 50 ms ttl ran out"
    );
    assert!(took < Duration::from_secs(3));
    assert_eq!(peek.peek("ex").await.as_deref(), Some(T2));
}

// --- completion records (idempotent work) ---

const REC: &str = "rec:record";
const BLOB: &[u8] = b"status 200\x00\xff\r\n binary body";

async fn completed(node: &dyn Node, key: &str, token: &str) -> Option<Vec<u8>> {
    match node
        .acquire(AcquireRequest::new(key, token, LONG).unless_completed(REC))
        .await
        .unwrap()
    {
        Acquire::Completed { record } => Some(record.to_vec()),
        _ => None,
    }
}

/// With records: a completion stores the record and ends the lock; the replay acquire then
/// answers `Completed` with the record, locking nothing.
pub async fn records_replay_instead_of_locking(node: &dyn Node, peek: &dyn Peek) {
    let got = node
        .acquire(AcquireRequest::new("rec", T1, LONG).unless_completed(REC))
        .await;
    assert_eq!(got.unwrap(), Acquire::Acquired);
    assert_eq!(peek.peek("rec").await.as_deref(), Some(T1));
    // Another request meanwhile: held, no record yet.
    assert!(matches!(
        node.acquire(AcquireRequest::new("rec", T2, LONG).unless_completed(REC))
            .await
            .unwrap(),
        Acquire::Held { .. }
    ));
    assert!(node
        .complete(CompleteRequest::new("rec", REC, T1, BLOB, LONG))
        .await
        .unwrap());
    // The record ended the lock, and answers every later request, byte for byte,
    // without locking anything.
    assert_eq!(peek.peek("rec").await, None);
    // The same completion asked again (its answer was lost): stored, nothing changed.
    assert!(node
        .complete(CompleteRequest::new("rec", REC, T1, BLOB, LONG))
        .await
        .unwrap());
    assert_eq!(completed(node, "rec", T2).await.as_deref(), Some(BLOB));
    assert_eq!(completed(node, "rec", T2).await.as_deref(), Some(BLOB));
    assert_eq!(peek.peek("rec").await, None);
}

/// With records: a completion with another token, or of an expired lock, stores nothing and
/// answers `false`.
pub async fn records_are_fenced_by_the_token(node: &dyn Node, peek: &dyn Peek) {
    node.acquire(AcquireRequest::new("rec", T1, LONG))
        .await
        .unwrap();
    // Not the holder: nothing stored, the holder's lock untouched.
    assert!(!node
        .complete(CompleteRequest::new("rec", REC, T2, BLOB, LONG))
        .await
        .unwrap());
    assert_eq!(peek.peek("rec").await.as_deref(), Some(T1));
    assert_eq!(completed(node, "rec", T2).await, None);
    // A lease that expired before it stored: nothing stored, and the key is free.
    node.acquire(AcquireRequest::new("gone", T1, Duration::from_millis(30)))
        .await
        .unwrap();
    eventually("the lock expires", LONG, || async {
        peek.peek("gone").await.is_none()
    })
    .await;
    assert!(!node
        .complete(CompleteRequest::new("gone", REC, T1, BLOB, LONG))
        .await
        .unwrap());
    assert_eq!(completed(node, "gone", T2).await, None);
}

/// With records: a lock held at a key named like a record key is never taken for a record.
pub async fn records_never_take_a_lock_for_one(node: &dyn Node, peek: &dyn Peek) {
    // Someone locks a resource that happens to be named like a record key.
    node.acquire(AcquireRequest::new(REC, T1, LONG))
        .await
        .unwrap();
    let got = node
        .acquire(AcquireRequest::new("rec", T2, LONG).unless_completed(REC))
        .await;
    assert_eq!(got.unwrap(), Acquire::Acquired, "a lock taken for a record");
    // And the completion does not overwrite it: nothing stored, the lock kept.
    assert!(!node
        .complete(CompleteRequest::new("rec", REC, T2, BLOB, LONG))
        .await
        .unwrap());
    assert_eq!(peek.peek(REC).await.as_deref(), Some(T1));
    assert_eq!(peek.peek("rec").await.as_deref(), Some(T2));
}

/// With records: a completion asked again with the same record answers `true`; one with a
/// different record answers `false` and the first stays.
pub async fn a_first_record_is_never_overwritten(node: &dyn Node, peek: &dyn Peek) {
    node.acquire(AcquireRequest::new("rec", T1, LONG).unless_completed(REC))
        .await
        .unwrap();
    assert!(node
        .complete(CompleteRequest::new("rec", REC, T1, b"first", LONG))
        .await
        .unwrap());
    // A plain lock of the same resource (not the replay acquire) and a second record.
    node.acquire(AcquireRequest::new("rec", T2, LONG))
        .await
        .unwrap();
    assert!(!node
        .complete(CompleteRequest::new("rec", REC, T2, b"second", LONG))
        .await
        .unwrap());
    // The lock of the refused completion stays (it is not the record's).
    assert_eq!(peek.peek("rec").await.as_deref(), Some(T2));
    assert_eq!(
        completed(node, "rec", T1).await.as_deref(),
        Some(&b"first"[..])
    );
}

/// With records: a record expires after its retention, and the key can then be locked
/// again.
pub async fn records_expire(node: &dyn Node, peek: &dyn Peek) {
    node.acquire(AcquireRequest::new("rec", T1, LONG))
        .await
        .unwrap();
    let retention = Duration::from_millis(50);
    assert!(node
        .complete(CompleteRequest::new("rec", REC, T1, BLOB, retention))
        .await
        .unwrap());
    // Gone: the first request that finds no record locks (and would run) again.
    eventually("the record expires", LONG, || async {
        completed(node, "rec", T2).await.is_none()
    })
    .await;
    assert_eq!(peek.peek("rec").await.as_deref(), Some(T2));
}
