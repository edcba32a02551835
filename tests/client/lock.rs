//! Locking and contention: lock, unlock and lock again; the Ruby gem's README flow; two
//! clients contending, unique tokens; interop with plain `SET NX` holders and a key prefix;
//! 16 tasks on one key never overlap.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tower_redlock::{Redlock, Retry};

use crate::support::{eventually, is_token, warm_up, Masters};
use crate::{all_empty, gone_everywhere, ms, SECOND, TTL};

// --- lock / unlock -----------------------------------------------------------------------------

#[tokio::test]
async fn lock_unlock_relock() {
    let m = Masters::start(3);
    let c = m.client();
    assert_eq!((c.node_count(), c.quorum()), (3, 2));
    warm_up(&c, &m).await;

    let ttl = Duration::from_secs(5);
    let lease = c.lock("resource_key", ttl).await.unwrap();
    assert_eq!(lease.resource(), "resource_key");
    assert_eq!(lease.key(), "resource_key", "no prefix by default");
    assert!(is_token(lease.value()), "value {:?}", lease.value());
    assert_eq!(lease.ttl(), ttl);
    assert_eq!(lease.extension_count(), 0);
    let validity = lease.validity();
    assert!(validity > Duration::ZERO && validity <= ttl, "{validity:?}");
    assert!(lease.is_valid());
    let shown = lease.to_string();
    assert!(
        shown.contains("resource_key") && shown.contains(lease.value()),
        "{shown}"
    );

    let value = lease.value().to_owned();
    eventually("every master holds the lease's value", 5 * SECOND, || {
        m.everywhere("resource_key", &value)
    })
    .await;
    for pttl in m.pttls("resource_key").await {
        assert!(pttl > 0 && pttl <= ms(ttl), "PTTL {pttl}");
    }

    lease.release().await.unwrap();
    gone_everywhere(&m, "resource_key").await;

    let again = c.lock("resource_key", ttl).await.unwrap();
    assert_ne!(again.value(), value, "a fresh token per lock");
    assert!(m.holding("resource_key", again.value()).await >= 2);
    again.release().await.unwrap();
    gone_everywhere(&m, "resource_key").await;
    assert_eq!(m.dbsizes().await, [0, 0, 0]);
}

/// The Ruby gem's README, step by step.
#[tokio::test]
async fn ruby_style_flow() {
    let m = Masters::start(3);
    let lock_manager = Redlock::new(m.urls()).unwrap();
    let ttl = Duration::from_millis(2000);

    // first_try_lock_info = lock_manager.lock("resource_key", 2000)
    let first_try_lock_info = lock_manager.lock("resource_key", ttl).await.unwrap();
    // second_try_lock_info = lock_manager.lock("resource_key", 2000) # => false
    let second_try_lock_info = lock_manager
        .lock_with("resource_key", ttl, Retry::never())
        .await;
    assert!(second_try_lock_info.unwrap_err().is_contended());
    // {validity: 1987, resource: "resource_key", value: "generated_uuid4"}
    assert!(first_try_lock_info.validity() <= ttl);
    assert_eq!(first_try_lock_info.resource(), "resource_key");

    // lock_manager.unlock(first_try_lock_info): Lease::release
    first_try_lock_info.release().await.unwrap();
    gone_everywhere(&m, "resource_key").await;
    // second_try_lock_info = lock_manager.lock("resource_key", 2000) # => lock info
    let second_try_lock_info = lock_manager.lock("resource_key", ttl).await.unwrap();
    assert!(second_try_lock_info.is_valid());
    // lock(..., extend: lock_info)
    second_try_lock_info
        .extend(Duration::from_millis(3000))
        .await
        .unwrap();
    assert!(second_try_lock_info.validity() > ttl);
    second_try_lock_info.release().await.unwrap();

    // lock_manager.lock("resource_key", 2000) do |locked| ... end
    let ran = lock_manager
        .critical_section("resource_key", ttl)
        .run(|lease| async move {
            assert!(!lease.is_lost());
            "critical code ran"
        })
        .await;
    assert_eq!(ran.unwrap(), "critical code ran");
    gone_everywhere(&m, "resource_key").await;

    // lock! raising LockError when held: `?` propagates the contended error.
    let holder = lock_manager.lock("resource_key", ttl).await.unwrap();
    let bang = async {
        let other = m.builder().build()?;
        let out = other
            .critical_section("resource_key", ttl)
            .run(|_| async { "must not run" })
            .await?;
        Ok::<_, tower_redlock::Error>(out)
    }
    .await;
    assert!(bang.unwrap_err().is_contended());
    holder.release().await.unwrap();
    // A release returns at a quorum; the last master's finishes in the background.
    all_empty(&m).await;
}

#[tokio::test]
async fn two_clients_contend_and_tokens_are_unique() {
    let m = Masters::start(3);
    let a = m.client();
    let b = m.client();
    let ttl = Duration::from_secs(5);

    let lease = a.lock("contended", ttl).await.unwrap();
    let err = b.try_lock("contended", ttl).await.unwrap_err();
    assert!(err.is_contended(), "{err:?}");
    assert!(!err.is_unavailable() && !err.is_invalid_input());
    assert!(err.held_by() >= b.quorum(), "{err:?}");
    let retry_after = err
        .retry_after()
        .expect("a contended error says when to retry");
    assert!(
        retry_after > Duration::ZERO && retry_after <= ttl,
        "{retry_after:?}"
    );
    assert_eq!(err.attempts(), 1);

    // With retries: still contended, after every try.
    let start = Instant::now();
    let err = b
        .lock_with(
            "contended",
            ttl,
            Retry::times(2)
                .delay(Duration::from_millis(20))
                .jitter(Duration::from_millis(5)),
        )
        .await
        .unwrap_err();
    assert!(err.is_contended(), "{err:?}");
    assert_eq!(err.attempts(), 3);
    assert!(start.elapsed() >= Duration::from_millis(40));
    // The contender left nothing of its own behind.
    let now = m.values("contended").await;
    assert!(
        now.iter()
            .all(|v| v.is_none() || v.as_deref() == Some(lease.value())),
        "{now:?}"
    );
    assert!(m.holding("contended", lease.value()).await >= 2, "{now:?}");

    lease.release().await.unwrap();
    let taken = b.try_lock("contended", ttl).await.unwrap();
    assert!(a
        .try_lock("contended", ttl)
        .await
        .unwrap_err()
        .is_contended());
    taken.release().await.unwrap();

    let mut seen = HashSet::new();
    for i in 0..100 {
        let client = if i % 2 == 0 { &a } else { &b };
        let lease = client.try_lock("tokens", ttl).await.unwrap();
        assert!(is_token(lease.value()));
        assert!(seen.insert(lease.value().to_owned()), "token reused");
        lease.release().await.unwrap();
    }
    assert_eq!(seen.len(), 100);
    // A release returns at a quorum; the last master's finishes in the background.
    all_empty(&m).await;
}

// --- interop -----------------------------------------------------------------------------------

#[tokio::test]
async fn interop_with_plain_set_nx_and_key_prefix() {
    let m = Masters::start(3);
    let c = m.client();
    warm_up(&c, &m).await;

    // Another client's plain `SET resource x NX PX …` blocks us.
    for s in m.iter() {
        assert!(s.set_nx("theirs", "x", Some(10_000)).await);
    }
    let err = c.try_lock("theirs", TTL).await.unwrap_err();
    assert!(err.is_contended(), "{err:?}");
    let ra = err.retry_after().unwrap();
    assert!(
        ra > Duration::from_secs(5) && ra <= Duration::from_secs(10),
        "{ra:?}"
    );
    assert_eq!(m.values("theirs").await, vec![Some("x".to_owned()); 3]);

    // … also without an expiry: contended, but no time to suggest.
    for s in m.iter() {
        assert!(s.set_nx("forever", "x", None).await);
    }
    let err = c.try_lock("forever", TTL).await.unwrap_err();
    assert!(err.is_contended(), "{err:?}");
    assert_eq!(err.retry_after(), None);
    assert_eq!(m.values("forever").await, vec![Some("x".to_owned()); 3]);

    // Our lock blocks their plain `SET resource y NX`.
    let ours = c.try_lock("ours", TTL).await.unwrap();
    eventually("our value is on every master", 5 * SECOND, || {
        m.everywhere("ours", ours.value())
    })
    .await;
    for s in m.iter() {
        assert!(
            !s.set_nx("ours", "y", None).await,
            "SET NX overwrote our lock"
        );
    }
    ours.release().await.unwrap();
    gone_everywhere(&m, "ours").await;

    // A key prefix, for clients that use one.
    let prefixed = m.builder().key_prefix("redlock:").build().unwrap();
    let lease = prefixed.try_lock("pref", TTL).await.unwrap();
    assert_eq!(lease.key(), "redlock:pref");
    assert_eq!(lease.resource(), "pref");
    assert!(m.holding("redlock:pref", lease.value()).await >= 2);
    gone_everywhere(&m, "pref").await;
    // The unprefixed client does not see it; a plain holder of the prefixed key blocks it.
    c.try_lock("pref", TTL)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    for s in m.iter() {
        assert!(s.set_nx("redlock:pref2", "x", Some(10_000)).await);
    }
    assert!(prefixed
        .try_lock("pref2", TTL)
        .await
        .unwrap_err()
        .is_contended());
    lease.release().await.unwrap();
    gone_everywhere(&m, "redlock:pref").await;
}

// --- concurrency -------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixteen_tasks_never_overlap() {
    const TASKS: usize = 16;
    const ROUNDS: usize = 4;
    let m = Masters::start(3);
    let clients: Vec<Redlock> = (0..4)
        .map(|_| {
            m.builder()
                .retry(
                    Retry::until(Duration::from_secs(30))
                        .delay(Duration::from_millis(2))
                        .jitter(Duration::from_millis(10)),
                )
                .build()
                .unwrap()
        })
        .collect();
    for c in &clients {
        warm_up(c, &m).await;
    }
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));

    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let client = clients[t % clients.len()].clone();
            let (inside, most, done) = (inside.clone(), most.clone(), done.clone());
            tokio::spawn(async move {
                for _ in 0..ROUNDS {
                    let lease = client.lock("hot", Duration::from_secs(2)).await.unwrap();
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    assert!(lease.is_valid());
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    lease.release().await.unwrap();
                    done.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    tokio::time::timeout(Duration::from_secs(60), async {
        for t in tasks {
            t.await.unwrap();
        }
    })
    .await
    .expect("the contention run finishes");

    assert_eq!(most.load(Ordering::SeqCst), 1, "two holders at once");
    assert_eq!(done.load(Ordering::SeqCst), TASKS * ROUNDS);
    // Failed tries release the masters that had not answered in the background: give those
    // releases a moment, then nothing may be left.
    eventually("no master holds a key", Duration::from_secs(2), || async {
        m.dbsizes().await == [0, 0, 0]
    })
    .await;
}

/// A key of another type (a list someone keeps under the resource's name) is held by another
/// value for every acquire — the plain `SET`, and the scripts of the guarded, replay and
/// fenced acquires, which read the key first: contended (409), not unavailable (503), and
/// the list is left alone.
#[tokio::test]
async fn a_key_of_another_type_is_held_for_every_acquire() {
    use tower_redlock::node::RedisNodeOptions;
    let m = Masters::start(3);
    for server in m.iter() {
        let _: i64 = server
            .query(redis::cmd("RPUSH").arg("listed").arg("x"))
            .await;
    }
    // The guarded voters abstain for a second first (a fresh tenure).
    let guarded = RedisNodeOptions::new().restart_protection(SECOND);
    let clients = [
        ("plain", m.client()),
        ("fenced", m.builder().fencing(true).build().unwrap()),
        (
            "guarded",
            m.iter()
                .fold(Redlock::builder(), |b, s| b.redis_with(&s.url(), &guarded))
                .node_timeout(crate::support::NODE_TIMEOUT)
                .retry(Retry::never())
                .build()
                .unwrap(),
        ),
    ];
    for (name, client) in &clients {
        eventually(format!("{name}: held"), Duration::from_secs(5), || async {
            client
                .try_lock("listed", SECOND)
                .await
                .is_err_and(|e| e.is_contended())
        })
        .await;
    }
    let replay = clients[0]
        .1
        .lock_unless_completed("listed", TTL, Retry::never())
        .await
        .unwrap_err();
    assert!(replay.is_contended(), "replay: {replay}");
    for server in m.iter() {
        let len: i64 = server.query(redis::cmd("LLEN").arg("listed")).await;
        assert_eq!(len, 1, "the list is left alone");
    }
}
