//! Eviction switched on at run time (`CONFIG SET maxmemory-policy`) on a master whose voter
//! already checked it and found `noeviction`: no reconnection, no failover, the background
//! check not due for seconds. The acquire, extension and completion scripts read the policy
//! themselves, atomically with their write, so the very next one there is refused.

use std::time::Duration;

use tower_redlock::node::RedisNodeOptions;
use tower_redlock::{Lease, LockOrRecord, Redlock, Retry};

use super::{
    client, eviction_of, fill_until_evicted, make_cache, refused_for_eviction, support,
    RedisServer, DAY, NODE_TIMEOUT, TTL, WITHIN,
};
use support::proxy::{Fault, FaultProxy};
use support::{eventually, Masters};

/// The ttl of [`eviction_runtime_every_acquire_script_refuses`]' locks, and the tenure its
/// protected voter waits out first: short enough to wait, long enough that a key a refused
/// acquire wrongly set is still there when looked at.
const PROTECTED_TTL: Duration = Duration::from_secs(3);

/// `CONFIG SET maxmemory-policy noeviction` on `server`.
async fn policy_back(server: &RedisServer) {
    let set = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("noeviction")
        .clone();
    let _: () = server.query(&set).await;
}

/// Between two acquires, the master becomes a cache: the next acquire there is refused at
/// once — the error names the policy and nothing is set — and so is the next extension of
/// the lease taken before, whose key keeps its ttl. Set back to `noeviction`, the voter
/// votes again (its background check, every second while it abstains, sees it within
/// [`WITHIN`]).
#[tokio::test]
async fn eviction_runtime_policy_set_between_two_acquires_is_refused_at_once() {
    let server = RedisServer::start();
    let client = client(&[&server], &[]);
    let first = client
        .try_lock("eviction:runtime:first", TTL)
        .await
        .expect("noeviction: it votes");
    eventually("the first check is in", WITHIN, || async {
        eviction_of(&client) == [(Some("noeviction".to_owned()), false, false)]
    })
    .await;

    make_cache(&server, "allkeys-lru").await;
    let e = client
        .try_lock("eviction:runtime:second", TTL)
        .await
        .expect_err("the next acquire on a master that now evicts is refused");
    assert!(refused_for_eviction(&e, "allkeys-lru"), "{e}");
    assert_eq!(
        server.get("eviction:runtime:second").await,
        None,
        "nothing set"
    );

    let e = first
        .extend(TTL * 4)
        .await
        .expect_err("the next extension there is refused");
    assert!(
        e.to_string().contains("maxmemory-policy allkeys-lru"),
        "the extension's error names the policy: {e}"
    );
    let left = server.pttl("eviction:runtime:first").await;
    assert!(
        left > 0 && left <= TTL.as_millis() as i64,
        "the refused extension left the key's ttl alone: {left} ms"
    );

    policy_back(&server).await;
    eventually("the voter votes again", WITHIN, || async {
        match client.try_lock("eviction:runtime:third", TTL).await {
            Ok(lease) => lease.release().await.is_ok(),
            Err(_) => false,
        }
    })
    .await;
    assert_eq!(
        eviction_of(&client),
        [(Some("noeviction".to_owned()), false, false)]
    );
}

/// The hole the in-script check closes: a master turned into a cache after its voter's
/// check, counted in a bare quorum (the first client cut from the third master by a black
/// hole), loses the key to eviction, and a second client takes a quorum with it and the
/// third — two holders. Now the cache refuses inside the script: the first client gets no
/// lease, so the eviction hands nobody a second one.
#[tokio::test(flavor = "multi_thread")]
async fn eviction_runtime_a_new_cache_never_counts_in_a_quorum() {
    const KEY: &str = "eviction:runtime:payment";
    let m = Masters::start(3);
    let servers = [&m[0], &m[1], &m[2]];
    let proxy = FaultProxy::start(m[2].addr().parse().expect("an address")).await;
    let a = Redlock::builder()
        .redis(&m[0].url())
        .redis(&m[1].url())
        .redis(&proxy.url())
        .node_timeout(NODE_TIMEOUT)
        .retry(Retry::never())
        .build()
        .expect("a valid client");
    let b = client(&servers, &[]);
    let safe = (Some("noeviction".to_owned()), false, false);
    for c in [&a, &b] {
        eventually("both clients checked every master", WITHIN, || async {
            if let Ok(lease) = c.try_lock("eviction:runtime:warm-up", TTL).await {
                let _ = lease.release().await;
            }
            eviction_of(c) == [safe.clone(), safe.clone(), safe.clone()]
        })
        .await;
    }
    eventually("the warm-up is released", WITHIN, || {
        m.absent_everywhere("eviction:runtime:warm-up")
    })
    .await;

    make_cache(&m[0], "allkeys-lru").await;
    proxy.set(Fault::BlackHole);
    let granted = a.try_lock(KEY, TTL).await;
    if let Ok(lease) = &granted {
        // What the hole leads to, shown before the test fails.
        fill_until_evicted(&m[0], KEY).await;
        let second = b.try_lock(KEY, TTL).await;
        panic!(
            "a lease on a quorum that counted a master that evicts: {lease:?} (valid for \
             {:?}); after the eviction a second client got {second:?}",
            lease.validity()
        );
    }
    proxy.set(Fault::Pass);
    let e = granted.expect_err("checked above");
    assert!(refused_for_eviction(&e, "allkeys-lru"), "{e}");
    assert_eq!(m[0].get(KEY).await, None, "the cache holds nothing");
    eventually("nothing is left locked", WITHIN, || {
        m.absent_everywhere(KEY)
    })
    .await;
    // With the cache abstaining, the other two still make a quorum for whoever asks.
    let lease = b
        .try_lock(KEY, TTL)
        .await
        .expect("two healthy masters of three");
    assert_eq!(m[0].get(KEY).await, None, "the cache still holds nothing");
    lease.release().await.expect("released");
}

/// A voter that allows eviction (`RedisNodeOptions::allow_eviction`) is not held back by
/// the script's check: a master turned into a cache at run time still votes for it.
#[tokio::test]
async fn eviction_runtime_allowed_voter_still_votes() {
    let server = RedisServer::start();
    let client = client(&[&server], &[0]);
    client
        .try_lock("eviction:runtime:allowed", TTL)
        .await
        .expect("it votes")
        .release()
        .await
        .expect("released");
    make_cache(&server, "allkeys-lru").await;
    let lease = client
        .try_lock("eviction:runtime:allowed", TTL)
        .await
        .expect("allowed: it still votes");
    lease
        .extend(TTL + Duration::from_secs(1))
        .await
        .expect("and extends");
    lease.release().await.expect("released");
}

/// An acquire of `key`: the replay acquire (`lock_unless_completed`) when `replay`, else
/// `try_lock`.
async fn acquire(
    client: &Redlock,
    replay: bool,
    key: &str,
    ttl: Duration,
) -> tower_redlock::Result<Lease> {
    if !replay {
        return client.try_lock(key, ttl).await;
    }
    match client
        .lock_unless_completed(key, ttl, Retry::never())
        .await?
    {
        LockOrRecord::Locked(lease) => Ok(lease),
        other => panic!("nothing was completed under {key}: {other:?}"),
    }
}

/// Every acquire script checks, not only the plain one: the replay acquire, the fenced
/// acquire, both at once, and the acquire behind tenure protection — each refused at once,
/// setting nothing, on a master made a cache after its voter's check; and a fenced lease's
/// extension is refused there too.
#[tokio::test]
async fn eviction_runtime_every_acquire_script_refuses() {
    for (kind, replay, fenced, protected) in [
        ("replay", true, false, false),
        ("fenced", false, true, false),
        ("replay+fenced", true, true, false),
        ("protected", false, false, true),
    ] {
        let server = RedisServer::start();
        let options = if protected {
            RedisNodeOptions::new().restart_protection(PROTECTED_TTL)
        } else {
            RedisNodeOptions::new()
        };
        let client = Redlock::builder()
            .redis_with(&server.url(), &options)
            .node_timeout(NODE_TIMEOUT)
            .retry(Retry::never())
            .fencing(fenced)
            .build()
            .expect("a valid client");
        let ttl = if protected { PROTECTED_TTL } else { TTL };
        // A protected voter abstains until its master's tenure is older than the ttl.
        let deadline = tokio::time::Instant::now() + WITHIN;
        let first = loop {
            match acquire(&client, replay, "eviction:runtime:kinds:first", ttl).await {
                Ok(lease) => break lease,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    assert!(!e.to_string().contains("maxmemory"), "{kind}: {e}");
                    // How often to ask again, not synchronization.
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("could not set up the scenario ({kind}): {e}"),
            }
        };
        eventually("the first check is in", WITHIN, || async {
            eviction_of(&client) == [(Some("noeviction".to_owned()), false, false)]
        })
        .await;

        make_cache(&server, "allkeys-lru").await;
        let e = acquire(&client, replay, "eviction:runtime:kinds:second", ttl)
            .await
            .expect_err("the next acquire on a master that now evicts is refused");
        assert!(refused_for_eviction(&e, "allkeys-lru"), "{kind}: {e}");
        assert_eq!(
            server.get("eviction:runtime:kinds:second").await,
            None,
            "{kind}: nothing set"
        );
        if fenced {
            let e = first
                .extend(ttl * 2)
                .await
                .expect_err("the fenced extension there is refused");
            assert!(
                e.to_string().contains("maxmemory-policy allkeys-lru"),
                "{kind}: the extension's error names the policy: {e}"
            );
        }
        policy_back(&server).await;
        drop(first);
    }
}

/// A completion is a vote too: on a master that became a cache after the lease was granted
/// there, the record is refused with the policy (a record there could be evicted while a
/// duplicate counts that master's "no record"), and nothing is written there. The
/// completion stands on the other two, and a duplicate gets the record.
#[tokio::test]
async fn eviction_runtime_a_completion_is_not_stored_on_a_cache() {
    const KEY: &str = "eviction:runtime:order";
    const RECORD: &str = "shipped: parcel 9";
    let m = Masters::start(3);
    let client = client(&[&m[0], &m[1], &m[2]], &[]);
    let LockOrRecord::Locked(lease) = client
        .lock_unless_completed(KEY, TTL, Retry::never())
        .await
        .expect("three healthy masters")
    else {
        panic!("nothing ran before");
    };

    make_cache(&m[0], "allkeys-lru").await;
    lease
        .complete(RECORD, DAY)
        .await
        .expect("stored on the quorum of the other two");
    // `complete` answers once two stored it: wait until the cache's script ran and refused.
    eventually("the cache refused the completion", WITHIN, || async {
        eviction_of(&client)[0].2
    })
    .await;
    let record_key = format!("{KEY}:record");
    assert_eq!(m[0].get(&record_key).await, None, "no record on the cache");
    assert!(
        m[0].get(KEY).await.is_some(),
        "the lock stays on the cache until its ttl: the refused script deleted nothing"
    );
    for i in 1..3 {
        assert_eq!(
            m[i].get(&record_key).await.as_deref(),
            Some(format!("TRR1\n{RECORD}").as_str()),
            "the record on master {i}"
        );
    }
    match client.lock_unless_completed(KEY, TTL, Retry::never()).await {
        Ok(LockOrRecord::Completed(record)) => assert_eq!(&record[..], RECORD.as_bytes()),
        other => panic!("a duplicate gets the record, not {other:?}"),
    }
}
