//! Extension: the lock kept past its ttl; an extension after expiry or after the keys
//! vanished is lost and re-creates nothing; a wrong token releases and extends nothing; the
//! extension cap.

use std::time::Duration;

use tower_redlock::node::{ExtendRequest, Node, RedisNode, ReleaseRequest};

use crate::support::{eventually, warm_up, Masters};
use crate::{gone_everywhere, ms, SECOND, TTL};

/// `PEXPIRETIME key` on every master: when the key expires, in ms on each master's clock (-2:
/// absent). Redis 7.0 or later.
async fn expiries(m: &Masters, key: &str) -> Vec<i64> {
    let mut out = Vec::new();
    for s in m.iter() {
        out.push(s.query(redis::cmd("PEXPIRETIME").arg(key)).await);
    }
    out
}

/// An extension pushes the keys' expiry forward. Asserted on each master's own clock (its
/// absolute expiry, `PEXPIRETIME`), not by reading a PTTL soon enough after the extension:
/// with the PTTL below 700 ms of the 1 s ttl when the extension is sent, the new expiry is at
/// least 300 ms later than the old one, however long the reads take.
#[tokio::test]
async fn extend_keeps_the_lock() {
    let m = Masters::start(3);
    let c = m.client();
    warm_up(&c, &m).await;
    // 3 s: the extension below comes at least 700 ms after the lock, with 2.3 s to spare
    // for a loaded machine before the lock would expire.
    let ttl = Duration::from_millis(3000);
    let lease = c.lock("extend", ttl).await.unwrap();

    eventually(
        "the PTTL drops below 2,300 ms",
        Duration::from_secs(5),
        || async {
            let p = m.pttls("extend").await;
            p.iter().filter(|p| **p > 0 && **p < 2300).count() >= 2
        },
    )
    .await;
    let old = expiries(&m, "extend").await;
    // The deadline, not the validity left: the extension's own time may eat any margin
    // of the latter, while the former must move (it counts from the extension's start).
    let before = lease.deadline();
    lease.extend(ttl).await.unwrap();
    assert_eq!(lease.extension_count(), 1);
    assert!(
        lease.deadline() > before,
        "{:?} <= {before:?}",
        lease.deadline()
    );
    let new = expiries(&m, "extend").await;
    let pushed = (0..3)
        .filter(|&i| old[i] > 0 && new[i] >= old[i] + 300)
        .count();
    assert!(
        pushed >= 2,
        "the expiry did not move forward: {old:?} -> {new:?}"
    );
    let p = m.pttls("extend").await;
    assert!(
        p.iter().filter(|p| **p <= 3000).count() == 3,
        "extended past its ttl: {p:?}"
    );

    lease.extend(Duration::from_secs(5)).await.unwrap();
    assert_eq!(lease.extension_count(), 2);
    assert!(lease.validity() > ttl);
    let p = m.pttls("extend").await;
    assert!(p.iter().filter(|p| **p > 1000).count() >= 2, "{p:?}");
    assert_eq!(m.holding("extend", lease.value()).await, 3);
    lease.release().await.unwrap();
    gone_everywhere(&m, "extend").await;
}

#[tokio::test]
async fn extend_after_expiry_is_lost_and_does_not_recreate() {
    let m = Masters::start(3);
    let c = m.client();
    warm_up(&c, &m).await;
    // 500 ms, not less: the lease's validity is the ttl less the acquisition's time, and
    // a loaded machine may eat a 100 ms ttl; the test waits for the expiry anyway.
    let lease = c.lock("expired", Duration::from_millis(500)).await.unwrap();
    eventually(
        "the lock expires everywhere",
        Duration::from_secs(3),
        || async { !lease.is_valid() && m.absent_everywhere("expired").await },
    )
    .await;
    let err = lease.extend(TTL).await.unwrap_err();
    assert!(err.is_lost(), "{err:?}");
    assert!(
        m.absent_everywhere("expired").await,
        "extend re-created the key"
    );
    assert_eq!(lease.validity(), Duration::ZERO);
    // Someone else can have it.
    c.try_lock("expired", TTL)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn extend_after_keys_vanished_is_lost_and_does_not_recreate() {
    let m = Masters::start(3);
    let c = m.client();
    warm_up(&c, &m).await;

    // Gone on every master while the lease still believes it is valid.
    let lease = c.lock("vanished", TTL).await.unwrap();
    eventually("every master holds the lock", 5 * SECOND, || {
        m.everywhere("vanished", lease.value())
    })
    .await;
    m.del_on("vanished", &[0, 1, 2]).await;
    assert!(lease.is_valid());
    let err = lease.extend(TTL).await.unwrap_err();
    assert!(err.is_lost(), "{err:?}");
    assert!(!lease.is_valid(), "a lost lease is no longer valid");
    assert!(lease.handle().is_lost());
    assert!(
        m.absent_everywhere("vanished").await,
        "extend re-created the key"
    );

    // Gone on a majority only: lost too, and not re-created there.
    let lease = c.lock("vanished-2", TTL).await.unwrap();
    eventually("every master holds the lock", 5 * SECOND, || {
        m.everywhere("vanished-2", lease.value())
    })
    .await;
    m.del_on("vanished-2", &[0, 2]).await;
    let err = lease.extend(TTL).await.unwrap_err();
    assert!(err.is_lost(), "{err:?}");
    assert_eq!(m[0].get("vanished-2").await, None);
    assert_eq!(m[2].get("vanished-2").await, None);
    lease.release().await.unwrap();
    gone_everywhere(&m, "vanished-2").await;
}

#[tokio::test]
async fn wrong_token_release_and_extend_do_nothing() {
    let m = Masters::start(3);
    let c = m.client();
    warm_up(&c, &m).await;
    let lease = c.lock("owned", TTL).await.unwrap();
    let value = lease.value().to_owned();
    eventually("every master holds the lock", 5 * SECOND, || {
        m.everywhere("owned", &value)
    })
    .await;

    let node = RedisNode::open(&m[0].url()).unwrap();
    assert!(!node
        .release(ReleaseRequest::new("owned", "wrong"))
        .await
        .unwrap());
    assert_eq!(m[0].get("owned").await.as_deref(), Some(value.as_str()));
    assert!(!node
        .extend(ExtendRequest::new(
            "owned",
            "wrong",
            Duration::from_secs(100)
        ))
        .await
        .unwrap());
    let pttl = m[0].pttl("owned").await;
    assert!(pttl > 0 && pttl <= ms(TTL), "PTTL {pttl}");
    assert_eq!(m[0].get("owned").await.as_deref(), Some(value.as_str()));

    // The owner's token does work through the same node.
    assert!(node
        .extend(ExtendRequest::new(
            "owned",
            &value,
            Duration::from_secs(100)
        ))
        .await
        .unwrap());
    assert!(m[0].pttl("owned").await > ms(TTL));
    lease.release().await.unwrap();
    gone_everywhere(&m, "owned").await;
}

#[tokio::test]
async fn extensions_are_capped() {
    let m = Masters::start(3);
    let c = m.builder().max_extensions(2).build().unwrap();
    let lease = c.lock("capped", Duration::from_secs(5)).await.unwrap();
    lease.extend(Duration::from_secs(5)).await.unwrap();
    lease.extend(Duration::from_secs(5)).await.unwrap();
    let err = lease.extend(Duration::from_secs(5)).await.unwrap_err();
    assert!(err.is_extension_limit(), "{err:?}");
    assert!(!err.is_lost());
    assert_eq!(lease.extension_count(), 2);
    assert!(lease.is_valid(), "hitting the cap does not end the lease");
    assert!(m.holding("capped", lease.value()).await >= 2);
    lease.release().await.unwrap();
    gone_everywhere(&m, "capped").await;
}
