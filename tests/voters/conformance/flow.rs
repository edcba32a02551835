//! The Redlock-level flow over three nodes of one backend: quorum, contention, every subset
//! of nodes pre-held, extension and release; and the lock's fan-out to every node.

use std::time::Duration;

use tower_redlock::node::{Acquire, AcquireRequest, ExtendRequest, Node, ReleaseRequest};
use tower_redlock::{Redlock, Retry};

use super::support::{eventually, NODE_TIMEOUT};
use super::{Backend, PeekAt, LONG, T1};

async fn peek_all<P: PeekAt>(backend: &P, key: &str) -> Vec<Option<String>> {
    let mut out = Vec::new();
    for i in 0..3 {
        out.push(backend.peek_at(i, key).await);
    }
    out
}

pub async fn redlock_flow<B: Backend>(backend: &B) {
    assert_eq!(backend.len(), 3);
    let build = || {
        (0..3)
            .fold(Redlock::builder(), |b, i| b.node(backend.node(i)))
            .node_timeout(NODE_TIMEOUT)
            .retry(Retry::never())
            .build()
            .unwrap()
    };
    let a = build();
    let b = build();
    assert_eq!(a.quorum(), 2);
    let ttl = Duration::from_secs(10);

    // Free: A locks; the value is on (at least) a quorum of nodes and nothing else is
    // stored; B is contended. (That the value reaches *every* free node is checked by
    // `lock_is_sent_to_every_node`.)
    let lease = a.try_lock("flow", ttl).await.unwrap();
    let value = lease.value().to_owned();
    let now = peek_all(backend, "flow").await;
    assert!(
        now.iter()
            .filter(|v| v.as_deref() == Some(value.as_str()))
            .count()
            >= 2,
        "{now:?}"
    );
    assert!(
        now.iter()
            .all(|v| v.is_none() || v.as_deref() == Some(value.as_str())),
        "{now:?}"
    );
    let err = b.try_lock("flow", ttl).await.unwrap_err();
    assert!(err.is_contended(), "{err:?}");
    assert!(err.held_by() >= 2, "{err:?}");
    let ra = err.retry_after().expect("a retry-after");
    assert!(ra <= ttl && ra > Duration::ZERO, "{ra:?}");

    // Every subset of nodes pre-held by a foreign value.
    for mask in 0u32..8 {
        let key = format!("flow-subset-{mask}");
        let key = key.as_str();
        let held: Vec<usize> = (0..3).filter(|i| mask & (1 << i) != 0).collect();
        for &i in &held {
            assert_eq!(
                backend
                    .node(i)
                    .acquire(AcquireRequest::new(key, "foreign", ttl))
                    .await
                    .unwrap(),
                Acquire::Acquired
            );
        }
        let free = 3 - held.len();
        match a.try_lock(key, ttl).await {
            Ok(l) => {
                assert!(
                    free >= 2,
                    "locked with only {free} free nodes (mask {mask:03b})"
                );
                let v = l.value().to_owned();
                let now = peek_all(backend, key).await;
                let ours = now
                    .iter()
                    .filter(|x| x.as_deref() == Some(v.as_str()))
                    .count();
                assert!(ours >= 2, "mask {mask:03b}: {now:?}");
                for i in 0..3 {
                    if held.contains(&i) {
                        assert_eq!(now[i].as_deref(), Some("foreign"), "mask {mask:03b}");
                    } else {
                        assert!(
                            now[i].is_none() || now[i].as_deref() == Some(v.as_str()),
                            "mask {mask:03b}: {now:?}"
                        );
                    }
                }
                l.release().await.unwrap();
            }
            Err(e) => {
                assert!(
                    free < 2,
                    "failed with {free} free nodes (mask {mask:03b}): {e:?}"
                );
                assert!(e.is_contended(), "{e:?}");
                assert!(e.held_by() >= 2 && e.held_by() <= held.len(), "{e:?}");
            }
        }
        // Nothing of ours is left; the foreign holds are untouched. (A failed try releases
        // the nodes that had not answered yet in the background, so this is awaited.)
        eventually(
            format!("mask {mask:03b}: only the foreign holds are left"),
            Duration::from_secs(1),
            || async {
                let now = peek_all(backend, key).await;
                (0..3).all(|i| {
                    let want = held.contains(&i).then_some("foreign");
                    if want.is_some() {
                        assert_eq!(now[i].as_deref(), want, "node {i}, mask {mask:03b}");
                    }
                    now[i].as_deref() == want
                })
            },
        )
        .await;
    }

    // Extension goes through the nodes.
    lease.extend(Duration::from_secs(20)).await.unwrap();
    assert_eq!(lease.extension_count(), 1);
    assert!(lease.validity() > ttl);

    // Release frees a quorum before it returns and every node soon after (a node that had
    // not answered yet is released in the background); B then gets the lock.
    lease.release().await.unwrap();
    let free = |now: Vec<Option<String>>| now.iter().filter(|v| v.is_none()).count();
    assert!(free(peek_all(backend, "flow").await) >= 2);
    let all_free = || async { free(peek_all(backend, "flow").await) == 3 };
    eventually("every node is released", Duration::from_secs(5), all_free).await;
    let lb = b.try_lock("flow", ttl).await.unwrap();
    assert_ne!(lb.value(), value);
    lb.release().await.unwrap();
    eventually("every node is released", Duration::from_secs(5), all_free).await;
}

/// Redlock sends `SET NX PX` to **all** nodes (DESIGN §2), deciding early but not
/// withholding the request from the nodes that had not answered yet: a lock taken on all
/// three free nodes survives the loss of any one of them.
pub async fn lock_reaches_every_node<B: Backend>(backend: &B) {
    let client = (0..3)
        .fold(Redlock::builder(), |b, i| b.node(backend.node(i)))
        .node_timeout(NODE_TIMEOUT)
        .retry(Retry::never())
        .build()
        .unwrap();
    // Every node runs each call once first, on the keys of the rounds (for Redis: the
    // client's connections, shared with these node handles, are up and the scripts are
    // cached — on a Cluster, by the master of each key's slot), so this checks the fan-out
    // itself. Redis-specific late-node cases are in tests/client/faults.rs.
    for i in 0..3 {
        let node = backend.node(i);
        for round in 0..3 {
            let key = format!("everywhere-{round}");
            assert_eq!(
                node.acquire(AcquireRequest::new(&key, T1, LONG))
                    .await
                    .unwrap(),
                Acquire::Acquired
            );
            assert!(node
                .extend(ExtendRequest::new(&key, T1, LONG))
                .await
                .unwrap());
            assert!(node.release(ReleaseRequest::new(&key, T1)).await.unwrap());
        }
    }
    for round in 0..3 {
        let key = format!("everywhere-{round}");
        let lease = client
            .try_lock(&key, Duration::from_secs(10))
            .await
            .unwrap();
        let value = lease.value().to_owned();
        eventually(
            format!("round {round}: the lease is on every node"),
            Duration::from_secs(2),
            || async {
                peek_all(backend, &key)
                    .await
                    .iter()
                    .all(|v| v.as_deref() == Some(value.as_str()))
            },
        )
        .await;
        lease.release().await.unwrap();
    }
}
