//! When and how a voter reads its master's policy: on first use, after a reconnection or a
//! Sentinel failover, on every master of a Cluster, again in the background (every second
//! while it abstains, and after a check that failed), with no round trip added to a lock
//! (each acquire and extension reads it inside its script).

use std::time::Duration;

use tower_redlock::node::RedisNodeOptions;
use tower_redlock::{Redlock, Retry};

use super::{
    client, eviction_of, make_cache, refused_for_eviction, support, RedisServer, NODE_TIMEOUT, TTL,
    WITHIN,
};
use support::eventually;

/// Kills the client connections of `server` (not the tests' own).
async fn kill_clients(server: &RedisServer) {
    let _: i64 = server
        .query(redis::cmd("CLIENT").arg("KILL").arg("TYPE").arg("normal"))
        .await;
}

/// A policy changed at run time is seen after the voter's next reconnection: it abstains,
/// and votes again once the master is back to `noeviction`.
#[tokio::test]
async fn eviction_policy_change_is_seen_after_a_reconnection() {
    const KEY: &str = "eviction:payment:45";
    let server = RedisServer::start();
    let client = client(&[&server], &[]);
    client
        .try_lock(KEY, TTL)
        .await
        .expect("noeviction: it votes")
        .release()
        .await
        .expect("released");
    assert_eq!(eviction_of(&client)[0].0.as_deref(), Some("noeviction"));

    make_cache(&server, "volatile-ttl").await;
    kill_clients(&server).await;
    eventually("the voter abstains", WITHIN, || async {
        match client.try_lock(KEY, TTL).await {
            Ok(lease) => {
                lease.release().await.expect("released");
                false
            }
            Err(e) => refused_for_eviction(&e, "volatile-ttl"),
        }
    })
    .await;
    let cache = (Some("volatile-ttl".to_owned()), true, true);
    assert_eq!(eviction_of(&client), [cache]);
    eventually("nothing is left locked", WITHIN, || async {
        server.dbsize().await == 0
    })
    .await;

    // Refused requests never reach the master: the voter re-checks it every second while
    // it abstains, and votes again without a reconnection once it is fixed.
    let set = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("noeviction")
        .clone();
    let _: () = server.query(&set).await;
    eventually("the voter votes again", WITHIN, || async {
        match client.try_lock(KEY, TTL).await {
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

/// Sends `try_lock` every 50 ms for `long`: each must be refused for `policy` (the voter
/// abstains, whatever its checks meanwhile got).
async fn refused_for(client: &Redlock, policy: &str, long: Duration) {
    let start = std::time::Instant::now();
    while start.elapsed() < long {
        match client.try_lock("eviction:meanwhile", TTL).await {
            Ok(lease) => panic!("the voter voted for a master that evicts: {lease:?}"),
            Err(e) => assert!(refused_for_eviction(&e, policy), "{e}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A check that gets no answer (the master hangs past the check's bound, twice the connect
/// timeout, without a reset of the connection: a fork stall, a slow script) is not the
/// last: the voter keeps abstaining meanwhile, and votes again soon after the master is
/// fixed.
#[tokio::test]
async fn eviction_a_check_without_answer_is_tried_again() {
    let server = RedisServer::start();
    make_cache(&server, "allkeys-lru").await;
    // Checks bounded by 400 ms.
    let options = RedisNodeOptions::new().connect_timeout(Duration::from_millis(200));
    let client = Redlock::builder()
        .redis_with(&server.url(), &options)
        .node_timeout(NODE_TIMEOUT)
        .retry(Retry::never())
        .build()
        .expect("a client");
    let e = client
        .try_lock("eviction:stall", TTL)
        .await
        .expect_err("abstains");
    assert!(refused_for_eviction(&e, "allkeys-lru"), "{e}");

    // Frozen for longer than a re-check (every second while it abstains) and its bound: the
    // voter never votes meanwhile. A request sent beside a re-check times out with it, and
    // the refusals say nothing of the master, so those timeouts may suspend the voter too
    // (then it is not asked, which is as safe).
    server.freeze();
    let start = std::time::Instant::now();
    while start.elapsed() < Duration::from_millis(1_800) {
        match client.try_lock("eviction:meanwhile", TTL).await {
            Ok(lease) => panic!("the voter voted for a master that evicts: {lease:?}"),
            Err(e) => assert!(
                refused_for_eviction(&e, "allkeys-lru")
                    || (e.is_unavailable()
                        && ["suspended", "no answer"]
                            .iter()
                            .any(|why| e.to_string().contains(why))),
                "{e}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.thaw();

    let set = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("noeviction")
        .clone();
    let _: () = server.query(&set).await;
    let took = eventually("the voter votes again", WITHIN, || async {
        match client.try_lock("eviction:stall", TTL).await {
            Ok(lease) => lease.release().await.is_ok(),
            Err(_) => false,
        }
    })
    .await;
    assert!(took < Duration::from_secs(5), "re-checked soon: {took:?}");
    assert_eq!(
        eviction_of(&client),
        [(Some("noeviction".to_owned()), false, false)]
    );
}

/// An error reply to `INFO` other than a denial (`-BUSY` from a long script, `-LOADING`)
/// is a failed check, not an unknown policy: the voter keeps abstaining on a cache.
#[tokio::test(flavor = "multi_thread")]
async fn eviction_an_error_reply_keeps_the_voter_abstaining() {
    let server = RedisServer::start();
    make_cache(&server, "allkeys-lru").await;
    let threshold = redis::cmd("CONFIG")
        .arg("SET")
        .arg("busy-reply-threshold")
        .arg(100)
        .clone();
    let _: () = server.query(&threshold).await;
    let client = client(&[&server], &[]);
    let e = client
        .try_lock("eviction:busy", TTL)
        .await
        .expect_err("abstains");
    assert!(refused_for_eviction(&e, "allkeys-lru"), "{e}");

    // A script that runs until killed: every other command is answered -BUSY meanwhile.
    let mut script_conn = server.conn().await;
    let script = tokio::spawn(async move {
        redis::cmd("EVAL")
            .arg("while true do end")
            .arg(0)
            .query_async::<()>(&mut script_conn)
            .await
    });
    let probe = server.conn().await;
    eventually("the master answers BUSY", WITHIN, || {
        let mut probe = probe.clone();
        async move {
            let pong = redis::cmd("PING").query_async::<String>(&mut probe).await;
            matches!(&pong, Err(e) if e.code() == Some("BUSY"))
        }
    })
    .await;
    // Long enough for re-checks (every second while it abstains) to be answered -BUSY.
    refused_for(&client, "allkeys-lru", Duration::from_millis(2_500)).await;
    let () = redis::cmd("SCRIPT")
        .arg("KILL")
        .query_async(&mut probe.clone())
        .await
        .expect("the script is killed");
    assert!(script.await.expect("joined").is_err(), "killed");

    refused_for(&client, "allkeys-lru", Duration::from_millis(500)).await;
    assert_eq!(
        eviction_of(&client),
        [(Some("allkeys-lru".to_owned()), true, true)]
    );
}

/// `INFO` calls `server` served since its stats were last reset.
async fn info_calls(server: &RedisServer) -> u64 {
    let stats: String = server.query(redis::cmd("INFO").arg("commandstats")).await;
    stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_info:calls="))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

/// Scripts the client ran (`EVALSHA`, and `EVAL` where a script was not cached yet), less
/// the `EVALSHA`s answered `NOSCRIPT` (the `EVAL` after one is the same request).
async fn script_calls(server: &RedisServer) -> u64 {
    let stats: String = server.query(redis::cmd("INFO").arg("commandstats")).await;
    let field = |prefix: &str, name: &str| -> u64 {
        let Some(rest) = stats.lines().find_map(|l| l.strip_prefix(prefix)) else {
            return 0;
        };
        rest.split(',')
            .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
            .unwrap_or(0)
    };
    field("cmdstat_evalsha:", "calls") - field("cmdstat_evalsha:", "failed_calls")
        + field("cmdstat_eval:", "calls")
}

async fn reset_stats(server: &RedisServer) {
    let _: () = server.query(redis::cmd("CONFIG").arg("RESETSTAT")).await;
}

/// The check costs no round trip per lock: the background check sends one `INFO` per
/// connection, and each acquire and extension reads `INFO memory` inside its own script, on
/// the master (so a policy set between two acquires is seen by the second). And an evicting
/// policy without a `maxmemory` evicts nothing (on 64-bit builds): the voter votes.
#[tokio::test]
async fn eviction_check_costs_no_round_trip_per_lock() {
    let server = RedisServer::start();
    let policy = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lru")
        .clone();
    let _: () = server.query(&policy).await;
    reset_stats(&server).await;
    let client = client(&[&server], &[]);
    for i in 0..20 {
        let lease = client
            .try_lock(&format!("eviction:many:{i}"), TTL)
            .await
            .expect("no maxmemory: it votes");
        lease.extend(TTL).await.expect("extended");
        lease.release().await.expect("released");
    }
    assert_eq!(
        eviction_of(&client),
        [(Some("allkeys-lru".to_owned()), false, false)]
    );
    // One request per acquire, extension and release: no command of its own for the check.
    let requests = script_calls(&server).await;
    assert_eq!(
        requests, 60,
        "one script per acquire, extension and release"
    );
    // Read by the INFO that counts them: that one is not counted yet. One background check
    // (a second only if the loop outlived RECHECK_EVERY), one read inside each of the 40
    // votes' scripts.
    let infos = info_calls(&server).await;
    assert!(
        (41..=42).contains(&infos),
        "{infos} INFO for 20 acquires and 20 extensions"
    );
}

/// A user whose ACL denies `INFO`: the policy is unknown, and the voter votes (it warns
/// once) — even on a cache, which it cannot see.
#[tokio::test]
async fn eviction_unknown_policy_votes() {
    let server = RedisServer::start();
    make_cache(&server, "allkeys-lru").await;
    let acl = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("locker")
        .arg("on")
        .arg(">locker-secret")
        .arg("~*")
        .arg("+@all")
        .arg("-info")
        .clone();
    let _: () = server.query(&acl).await;
    let url = format!("redis://locker:locker-secret@127.0.0.1:{}", server.port());
    let client = Redlock::builder()
        .redis(&url)
        .node_timeout(NODE_TIMEOUT)
        .retry(Retry::never())
        .build()
        .expect("a client");
    let lease = client
        .try_lock("eviction:unknown", TTL)
        .await
        .expect("unknown policy: it votes");
    assert_eq!(eviction_of(&client), [(None, false, false)]);
    lease.release().await.expect("released");
}

/// A Sentinel voter checks each master it follows: the replica it fails over to is a
/// cache, and the voter abstains from then on (no new client).
#[tokio::test(flavor = "multi_thread")]
async fn eviction_sentinel_checks_the_promoted_master() {
    use support::sentinel::SentinelGroup;
    use tower_redlock::node::{RedisNode, Sentinel};

    let g = SentinelGroup::start("tr-eviction");
    let group = Sentinel::new(g.master_name(), g.sentinel_addrs()).expect("a group");
    // No tenure protection: the eviction check alone decides.
    let options = RedisNodeOptions::new().no_protection();
    let client = Redlock::builder()
        .node(RedisNode::sentinel(group, &options).expect("a voter"))
        .node_timeout(NODE_TIMEOUT)
        .retry(Retry::never())
        .build()
        .expect("a client");
    eventually("the voter locks on the master", WITHIN, || async {
        match client.try_lock("eviction:before", TTL).await {
            Ok(lease) => lease.release().await.is_ok(),
            Err(_) => false,
        }
    })
    .await;
    assert_eq!(eviction_of(&client)[0].0.as_deref(), Some("noeviction"));

    make_cache(g.replica(), "allkeys-lfu").await;
    let replica = g.replica().addr();
    g.failover().await;
    assert_eq!(g.master_addr(), replica);
    eventually(
        "the voter abstains on the promoted cache",
        WITHIN,
        || async {
            match client.try_lock("eviction:after", TTL).await {
                Ok(lease) => {
                    lease.release().await.expect("released");
                    false
                }
                Err(e) => refused_for_eviction(&e, "allkeys-lfu"),
            }
        },
    )
    .await;
    assert_eq!(
        eviction_of(&client),
        [(Some("allkeys-lfu".to_owned()), true, true)]
    );
}

/// A Cluster voter counts every master: one of three is a cache, and the voter abstains
/// for every key, naming that master.
#[cfg(feature = "cluster")]
#[tokio::test]
async fn eviction_cluster_counts_every_master() {
    use support::cluster::Cluster;
    use tower_redlock::node::{self, RedisNode};

    let c = Cluster::start(3);
    make_cache(&c[1], "volatile-random").await;
    let voter = RedisNode::cluster(
        node::Cluster::new(c.addrs()).expect("addresses"),
        &RedisNodeOptions::default(),
    )
    .expect("a cluster voter");
    let client = Redlock::builder()
        .node(voter)
        .node_timeout(NODE_TIMEOUT)
        .retry(Retry::never())
        .build()
        .expect("a client");
    // The first requests also connect (the slot map): tried until one is answered.
    eventually("the voter abstains", WITHIN, || async {
        match client.try_lock("eviction:cluster", TTL).await {
            Ok(lease) => {
                lease.release().await.expect("released");
                false
            }
            Err(e) => {
                refused_for_eviction(&e, "volatile-random") && e.to_string().contains(&c[1].addr())
            }
        }
    })
    .await;
    assert_eq!(
        eviction_of(&client),
        [(Some("volatile-random".to_owned()), true, true)]
    );
}

/// What the tracing subscriber of [`eviction_warns_once_per_change_naming_the_voter`]
/// wrote.
#[derive(Clone, Default)]
struct Logs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The warning comes once per change of the master's policy, names the voter and its
/// policy, never a key.
#[tokio::test(flavor = "current_thread")]
async fn eviction_warns_once_per_change_naming_the_voter() {
    const KEY: &str = "eviction:secret-resource";
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    // The current-thread runtime runs the voter's check task on this thread.
    let _logging = tracing::subscriber::set_default(subscriber);

    let server = RedisServer::start();
    make_cache(&server, "allkeys-lru").await;
    let client = client(&[&server], &[]);
    for _ in 0..5 {
        let e = client.try_lock(KEY, TTL).await.expect_err("abstains");
        assert!(refused_for_eviction(&e, "allkeys-lru"), "{e}");
    }
    // Checked again (a reconnection, and every second while it abstains): the same policy
    // is not warned of twice.
    reset_stats(&server).await;
    kill_clients(&server).await;
    eventually("the voter checked again", WITHIN, || async {
        let e = client.try_lock(KEY, TTL).await.expect_err("abstains");
        assert!(refused_for_eviction(&e, "allkeys-lru"), "{e}");
        info_calls(&server).await >= 2
    })
    .await;

    let text = String::from_utf8(logs.0.lock().unwrap().clone()).expect("utf-8 logs");
    let warnings: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("may evict keys"))
        .collect();
    assert_eq!(warnings.len(), 1, "one warning per change:\n{text}");
    assert!(warnings[0].contains("WARN"), "{text}");
    assert!(
        warnings[0].contains(&server.addr()),
        "names the voter: {text}"
    );
    assert!(
        warnings[0].contains("allkeys-lru"),
        "names the policy: {text}"
    );
    assert!(!text.contains("secret-resource"), "never a key: {text}");
}
