//! The fencing checks of one node : the counter the fenced acquire
//! bumps and the fenced release raises, through the [`Node`] trait only.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::node::{
    Acquire, AcquireRequest, CompleteRequest, ExtendRequest, FenceFloor, Node, ReleaseRequest,
};

use super::{Peek, LONG, T1, T2};

pub(super) const RETAIN: Duration = Duration::from_secs(60);
/// A counter far above any clock reading (microseconds in the year 2128, below 2^53).
pub(super) const BIG: u64 = 5_000_000_000_000_000;

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as u64
}

async fn fenced(node: &dyn Node, key: &str, token: &str) -> Acquire {
    let fence = format!("{key}:fence");
    node.acquire(AcquireRequest::new(key, token, LONG).fenced(&fence, RETAIN))
        .await
        .unwrap()
}

pub(super) async fn token_of(node: &dyn Node, key: &str, token: &str) -> u64 {
    match fenced(node, key, token).await {
        Acquire::Fenced { fence } => fence,
        other => panic!("expected a fenced grant, got {other:?}"),
    }
}

async fn release(node: &dyn Node, key: &str, token: &str, floor: u64) -> bool {
    let fence = format!("{key}:fence");
    node.release(ReleaseRequest::new(key, token).fenced(FenceFloor::new(&fence, floor, RETAIN)))
        .await
        .unwrap()
}

/// A first counter starts from the node's clock (µs since 1970), the lock is set, and every
/// later holder's counter is larger.
pub async fn fencing_starts_from_the_clock_and_grows(node: &dyn Node, peek: &dyn Peek) {
    let before = now_us();
    let a = token_of(node, "f1", T1).await;
    let after = now_us();
    // The same machine's clock: generous bounds, no timing.
    assert!(
        a + 5_000_000 >= before && a <= after + 5_000_000,
        "{a} not near the clock [{before}, {after}]"
    );
    assert_eq!(peek.peek("f1").await.as_deref(), Some(T1));
    assert!(release(node, "f1", T1, a).await);
    assert_eq!(peek.peek("f1").await, None);
    let b = token_of(node, "f1", T2).await;
    assert!(b > a, "{b} after {a}");
}

/// Above the clock, each holder's counter is the last one plus one; a refused acquire
/// (held) bumps nothing.
pub async fn fencing_counts_up_from_a_raised_counter(node: &dyn Node, _: &dyn Peek) {
    // A release raises the counter even where the lock is not held (an expired lease's
    // release still raises it: raising never lets a token go back).
    assert!(!release(node, "f2", T2, BIG).await);
    let a = token_of(node, "f2", T1).await;
    assert_eq!(a, BIG + 1);
    assert!(matches!(fenced(node, "f2", T2).await, Acquire::Held { .. }));
    assert!(release(node, "f2", T1, a).await);
    assert_eq!(token_of(node, "f2", T2).await, BIG + 2, "a held key bumped");
    // A release's floor below the counter leaves it as is.
    assert!(release(node, "f2", T2, 7).await);
    assert_eq!(token_of(node, "f2", T1).await, BIG + 3);
}

/// A raise that finds no counter (it expired, or was lost) starts it from the node's clock when the
/// raise's floor is below it. Take a release that comes long after its lease: its counter gone,
/// later tokens issued from a new one that expired too. It must not bring the counter back at its
/// old token, or the next holder's token would go back.
pub async fn fencing_raise_of_an_absent_counter_starts_from_the_clock(
    node: &dyn Node,
    _: &dyn Peek,
) {
    let before = now_us();
    // An old token, far below the clock; no counter exists.
    assert!(!release(node, "f7", T1, 42).await);
    let next = token_of(node, "f7", T2).await;
    assert!(
        next > before,
        "the next token {next} came from the old floor, not from the clock ({before})"
    );
    // The same for the raise right after a fenced grant.
    let floor = FenceFloor::new("f8:fence", 42, RETAIN);
    assert!(
        node.acquire(AcquireRequest::new("f8", T1, LONG))
            .await
            .unwrap()
            == Acquire::Acquired
    );
    assert!(node
        .extend(ExtendRequest::new("f8", T1, LONG).fenced(floor))
        .await
        .unwrap());
    assert!(node.release(ReleaseRequest::new("f8", T1)).await.unwrap());
    assert!(token_of(node, "f8", T2).await > before);
}

/// The fenced extension raises the counter (only where the key holds the token). A node that
/// answers `true` without raising it would let the client hand out a lease whose token a later
/// quorum may not see, and the next token could go back. Here the counter must go to the floor, and
/// a wrong token's fenced extension must change nothing.
pub async fn fencing_extend_raises_the_counter(node: &dyn Node, _: &dyn Peek) {
    let (key, fence) = ("f9", "f9:fence");
    let a = token_of(node, key, T1).await;
    assert!(a < BIG, "{a} already at the floor");
    let wrong = ExtendRequest::new(key, T2, LONG).fenced(FenceFloor::new(fence, BIG + 100, RETAIN));
    assert!(
        !node.extend(wrong).await.unwrap(),
        "extended for another token"
    );
    let right = ExtendRequest::new(key, T1, LONG).fenced(FenceFloor::new(fence, BIG, RETAIN));
    assert!(node.extend(right).await.unwrap());
    // The plain release: only the extension can have raised the counter.
    assert!(node.release(ReleaseRequest::new(key, T1)).await.unwrap());
    assert_eq!(
        token_of(node, key, T2).await,
        BIG + 1,
        "the fenced extension did not raise the counter to its floor (or the wrong token's did)"
    );
}

/// The fenced release is owner-only like the plain one; a plain acquire never answers with
/// a counter.
pub async fn fencing_release_is_owner_only(node: &dyn Node, peek: &dyn Peek) {
    let a = token_of(node, "f3", T1).await;
    assert!(!release(node, "f3", T2, a).await);
    assert_eq!(peek.peek("f3").await.as_deref(), Some(T1));
    assert!(release(node, "f3", T1, a).await);
    assert_eq!(
        node.acquire(AcquireRequest::new("f3", T2, LONG))
            .await
            .unwrap(),
        Acquire::Acquired
    );
}

/// A counter unused for its retention expires (bounded memory) and starts again from the
/// clock, never from zero.
pub async fn fencing_counters_expire_and_restart_from_the_clock(node: &dyn Node, _: &dyn Peek) {
    let short = Duration::from_millis(50);
    let (key, fence) = ("f4", "f4:fence");
    assert!(!node
        .release(ReleaseRequest::new(key, T1).fenced(FenceFloor::new(fence, BIG, short)))
        .await
        .unwrap());
    // Each try that finds the counter alive bumps it and keeps it another 50 ms: tries are
    // spaced wider than that, so the first one after its expiry sees it gone.
    let deadline = Instant::now() + LONG;
    let token = loop {
        tokio::time::sleep(short * 3).await;
        match node
            .acquire(AcquireRequest::new(key, T1, LONG).fenced(fence, short))
            .await
            .unwrap()
        {
            Acquire::Fenced { fence } if fence < BIG => break fence,
            Acquire::Fenced { .. } => {
                assert!(node.release(ReleaseRequest::new(key, T1)).await.unwrap())
            }
            other => panic!("expected a fenced grant, got {other:?}"),
        }
        assert!(Instant::now() < deadline, "the counter never expired");
    };
    let now = now_us();
    assert!(
        token + 5_000_000 >= now && token <= now + 5_000_000,
        "{token} restarted away from the clock {now}"
    );
}

/// A lock of a resource named like a counter's key (`f5:fence`) is never overwritten by the
/// counter: the fenced acquire of `f5` either keeps its counter elsewhere (a separate map, a
/// Cluster's slot-tagged key) or abstains; the fenced release leaves it alone too.
pub async fn fencing_never_overwrites_a_lock_named_like_the_counter(
    node: &dyn Node,
    peek: &dyn Peek,
) {
    assert_eq!(
        node.acquire(AcquireRequest::new("f5:fence", T1, LONG))
            .await
            .unwrap(),
        Acquire::Acquired
    );
    match node
        .acquire(AcquireRequest::new("f5", T2, LONG).fenced("f5:fence", RETAIN))
        .await
    {
        Ok(Acquire::Fenced { fence }) => {
            assert!(release(node, "f5", T2, fence).await);
        }
        Ok(other) => panic!("expected a fenced grant or an abstention, got {other:?}"),
        Err(_abstained) => assert_eq!(peek.peek("f5").await, None),
    }
    assert!(!release(node, "f5", T2, BIG).await);
    assert_eq!(peek.peek("f5:fence").await.as_deref(), Some(T1));
    assert!(node
        .release(ReleaseRequest::new("f5:fence", T1))
        .await
        .unwrap());
}

/// With idempotent work: the fenced replay acquire bumps like the fenced acquire, answers a
/// record instead once there is one (bumping nothing), and the fenced completion raises the
/// counter to the lease's token before it stores the record.
pub async fn fencing_with_records(node: &dyn Node, peek: &dyn Peek) {
    let (key, record, fence) = ("f6", "f6:record", "f6:fence");
    let replay = |token| {
        node.acquire(
            AcquireRequest::new(key, token, LONG)
                .unless_completed(record)
                .fenced(fence, RETAIN),
        )
    };
    let a = match replay(T1).await.unwrap() {
        Acquire::Fenced { fence } => fence,
        other => panic!("expected a fenced grant, got {other:?}"),
    };
    assert!(matches!(replay(T2).await.unwrap(), Acquire::Held { .. }));
    assert_eq!(peek.peek(key).await.as_deref(), Some(T1));
    // Not the holder: nothing stored (the raise alone is harmless: a counter only grows).
    let floor = FenceFloor::new(fence, BIG, RETAIN);
    assert!(!node
        .complete(CompleteRequest::new(key, record, T2, b"no", LONG).fenced(floor))
        .await
        .unwrap());
    assert!(node
        .complete(
            CompleteRequest::new(key, record, T1, b"done", LONG)
                .fenced(FenceFloor::new(fence, a, RETAIN))
        )
        .await
        .unwrap());
    assert_eq!(peek.peek(key).await, None);
    assert_eq!(
        replay(T2).await.unwrap(),
        Acquire::Completed {
            record: b"done"[..].into()
        }
    );
    // The counter was raised to BIG, and a record's answer bumped nothing.
    assert_eq!(token_of(node, key, T2).await, BIG + 1);
}
