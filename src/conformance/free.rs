//! The checks of the "if free" completion ([`CompleteRequest::or_if_free`]) on one node. The record
//! of a lease that may have been lost is stored where the lock is absent or holds the lease's
//! token. It is never stored where another value holds it, nor over another record. The plain
//! completion still refuses an absent lock. The replay acquire tells such a record apart
//! ([`Acquire::CompletedIfFree`]) from one stored under the lease: the client ranks it lower.

use std::time::Duration;

use crate::node::{Acquire, AcquireRequest, CompleteRequest, FenceFloor, Node, ReleaseRequest};

use super::eventually;
use super::fencing::{token_of, BIG, RETAIN};
use super::{Peek, LONG, T1, T2};

const BLOB: &[u8] = b"status 500\x00\xff outcome unknown";
const T3: &str = "00000000000000000000000000000003";

/// The replay acquire of `key` by `token`: the record, if one is stored (else it locks).
async fn replay(node: &dyn Node, key: &str, token: &str) -> Acquire {
    let record_key = format!("{key}:record");
    node.acquire(AcquireRequest::new(key, token, LONG).unless_completed(&record_key))
        .await
        .unwrap()
}

/// A record stored by the "if free" completion, as the replay acquire answers it (what it
/// has left taken out by [`told`]).
fn if_free(record: &[u8]) -> Acquire {
    Acquire::CompletedIfFree {
        record: record.to_vec().into(),
        remaining: None,
    }
}

/// `answer`, with what an "if free" record has left checked — when the node says, at most
/// its retention and more than none — and taken out, to compare with [`if_free`].
fn told(answer: Acquire) -> Acquire {
    match answer {
        Acquire::CompletedIfFree { record, remaining } => {
            assert!(
                remaining.is_none_or(|r| !r.is_zero() && r <= LONG),
                "an \"if free\" record's time left {remaining:?} is not within its retention {LONG:?}"
            );
            Acquire::CompletedIfFree {
                record,
                remaining: None,
            }
        }
        other => other,
    }
}

/// The completion of `key`'s work by `token` with `record`; `free`: the "if free" form.
async fn complete(node: &dyn Node, key: &str, token: &str, record: &[u8], free: bool) -> bool {
    let record_key = format!("{key}:record");
    let plain = CompleteRequest::new(key, &record_key, token, record, LONG);
    let request = if free { plain.or_if_free() } else { plain };
    node.complete(request).await.unwrap()
}

/// Where the lock has expired, the plain completion refuses and the "if free" one stores the
/// record (without locking anything); the same record again is stored, a different one is
/// refused (the first kept). A lock never taken at all is free too.
pub async fn completion_if_free_stores_where_the_key_expired(node: &dyn Node, peek: &dyn Peek) {
    let key = "fa";
    node.acquire(AcquireRequest::new(key, T1, Duration::from_millis(30)))
        .await
        .unwrap();
    eventually("the lock expires", LONG, || async {
        peek.peek(key).await.is_none()
    })
    .await;
    assert!(
        !complete(node, key, T1, BLOB, false).await,
        "the plain completion stored a record where the lock is absent"
    );
    assert!(
        complete(node, key, T1, BLOB, true).await,
        "the \"if free\" completion refused where the lock is absent"
    );
    assert_eq!(peek.peek(key).await, None, "a lock was set");
    assert_eq!(told(replay(node, key, T2).await), if_free(BLOB));
    assert!(
        complete(node, key, T1, BLOB, true).await,
        "the same record again (its answer lost) must answer stored"
    );
    assert!(
        !complete(node, key, T1, b"another", true).await,
        "a first record was overwritten"
    );
    assert_eq!(told(replay(node, key, T2).await), if_free(BLOB));
    assert_eq!(peek.peek(key).await, None);
    // Never locked: free as well.
    assert!(complete(node, "fb", T1, BLOB, true).await);
    assert_eq!(told(replay(node, "fb", T2).await), if_free(BLOB));
}

/// Where the lock holds the token, the "if free" completion stores the record and ends the
/// lock, as the plain one does.
pub async fn completion_if_free_ends_our_lock(node: &dyn Node, peek: &dyn Peek) {
    let key = "fo";
    node.acquire(AcquireRequest::new(key, T1, LONG))
        .await
        .unwrap();
    assert!(complete(node, key, T1, BLOB, true).await);
    assert_eq!(peek.peek(key).await, None, "the lock was not ended");
    assert_eq!(told(replay(node, key, T2).await), if_free(BLOB));
}

/// Where another client holds the lock, the "if free" completion stores nothing and that
/// holder keeps its lock (it is doing the work now).
pub async fn completion_if_free_never_takes_another_holders_lock(node: &dyn Node, peek: &dyn Peek) {
    let key = "fh";
    node.acquire(AcquireRequest::new(key, T2, LONG))
        .await
        .unwrap();
    assert!(
        !complete(node, key, T1, BLOB, true).await,
        "stored over another holder's lock"
    );
    assert_eq!(peek.peek(key).await.as_deref(), Some(T2));
    assert!(
        matches!(replay(node, key, T3).await, Acquire::Held { .. }),
        "a record was stored"
    );
    assert!(node.release(ReleaseRequest::new(key, T2)).await.unwrap());
}

/// A lock of a resource named like the record key is never taken for a record, nor
/// overwritten by one. (Not on a Cluster, whose records live at a slot-tagged key: see
/// `records_never_take_a_lock_for_one`.)
pub async fn completion_if_free_never_takes_a_lock_for_a_record(node: &dyn Node, peek: &dyn Peek) {
    node.acquire(AcquireRequest::new("fr:record", T1, LONG))
        .await
        .unwrap();
    assert!(!complete(node, "fr", T2, BLOB, true).await);
    assert_eq!(peek.peek("fr:record").await.as_deref(), Some(T1));
    assert_eq!(peek.peek("fr").await, None);
}

/// The fenced "if free" completion raises the counter as the fenced completion does — also
/// where it stores nothing — then stores as the "if free" one.
pub async fn completion_if_free_fenced_raises_the_counter(node: &dyn Node, peek: &dyn Peek) {
    let fenced = |key, token, floor| {
        let (record_key, fence) = (format!("{key}:record"), format!("{key}:fence"));
        async move {
            let floor = FenceFloor::new(&fence, floor, RETAIN);
            let request = CompleteRequest::new(key, &record_key, token, BLOB, LONG);
            node.complete(request.fenced(floor).or_if_free())
                .await
                .unwrap()
        }
    };
    // Another holder: refused, its lock kept, the counter raised all the same.
    let key = "fg";
    node.acquire(AcquireRequest::new(key, T2, LONG))
        .await
        .unwrap();
    assert!(!fenced(key, T1, BIG).await, "stored over another holder");
    assert_eq!(peek.peek(key).await.as_deref(), Some(T2));
    assert!(node.release(ReleaseRequest::new(key, T2)).await.unwrap());
    assert_eq!(
        token_of(node, key, T3).await,
        BIG + 1,
        "the counter not raised"
    );
    // Absent: stored, and the counter raised.
    let key = "fk";
    assert!(
        fenced(key, T1, BIG).await,
        "refused where the lock is absent"
    );
    assert_eq!(told(replay(node, key, T2).await), if_free(BLOB));
    assert_eq!(
        token_of(node, key, T3).await,
        BIG + 1,
        "the counter not raised"
    );
}

/// A record stored under the lease answers [`Acquire::Completed`], one stored "if free"
/// [`Acquire::CompletedIfFree`]; once the "if free" record has expired, a record stored
/// under a lease at the same key answers as stored under a lease (the mark went with its
/// record).
pub async fn completion_if_free_is_told_apart_from_a_valid_one(node: &dyn Node, _peek: &dyn Peek) {
    let key = "fv";
    node.acquire(AcquireRequest::new(key, T1, LONG))
        .await
        .unwrap();
    assert!(complete(node, key, T1, BLOB, false).await);
    assert_eq!(
        replay(node, key, T2).await,
        Acquire::Completed {
            record: BLOB.to_vec().into()
        }
    );
    let key = "fw";
    let record_key = format!("{key}:record");
    let short = Duration::from_millis(300);
    let request = CompleteRequest::new(key, &record_key, T1, BLOB, short).or_if_free();
    assert!(node.complete(request).await.unwrap());
    assert_eq!(
        replay_short(node, key, T2).await.map(told),
        Some(if_free(BLOB))
    );
    eventually("the \"if free\" record expires", LONG, || async {
        replay_short(node, key, T3).await.is_none()
    })
    .await;
    // `replay_short` locked the free key for `T3`: its completion stores under the lease.
    assert!(complete(node, key, T3, b"valid", false).await);
    assert_eq!(
        replay(node, key, T2).await,
        Acquire::Completed {
            record: b"valid"[..].into()
        }
    );
}

/// The replay acquire of `key` by `token`: the record, or `None` when it locked (for
/// `token`, which completes it).
async fn replay_short(node: &dyn Node, key: &str, token: &str) -> Option<Acquire> {
    let record_key = format!("{key}:record");
    let request = AcquireRequest::new(key, token, LONG).unless_completed(&record_key);
    match node.acquire(request).await.unwrap() {
        Acquire::Acquired => None,
        other => Some(other),
    }
}
