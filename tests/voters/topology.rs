//! The test kit's Redis topologies, against real processes: a Sentinel group (master,
//! replica, three sentinels) and a Redis Cluster of three masters. Groundwork for Sentinel
//! groups and clusters as Redlock voters: these tests only check that the topologies start,
//! behave as Redis documents, and leave no process behind.

use tower_redlock_testkit as support;

use std::path::Path;
use std::time::Duration;

use support::cluster::Cluster;
use support::eventually;
use support::sentinel::SentinelGroup;

/// Whether a process with this pid exists (the kit reaps what it kills: no zombie stays).
fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[tokio::test]
async fn sentinel_group_starts_and_fails_over() {
    let group = SentinelGroup::start("tr-sentinel");
    assert_eq!(group.master_name(), "tr-sentinel");
    assert_eq!(group.sentinel_addrs().len(), 3);
    let (first_master, first_replica) = (group.master_addr(), group.replica_addr());
    assert_ne!(first_master, first_replica);
    assert_eq!(group.reported_master().await, first_master);

    // A write on the master reaches the replica.
    let _: () = group
        .master()
        .query(redis::cmd("SET").arg("k1").arg("v1"))
        .await;
    eventually("the replica has k1", Duration::from_secs(10), || async {
        group.replica().get("k1").await.as_deref() == Some("v1")
    })
    .await;
    let role: Vec<redis::Value> = group.replica().query(&redis::cmd("ROLE")).await;
    assert_eq!(
        role.first(),
        Some(&redis::Value::BulkString(b"slave".to_vec()))
    );

    // A forced failover: the replica becomes the master, every sentinel says so, and it
    // takes writes (the sentinels turn the former master into its replica some 10 s later:
    // not waited for here).
    group.failover().await;
    assert_eq!(group.master_addr(), first_replica);
    assert_eq!(group.replica_addr(), first_master);
    for i in 0..3 {
        let reply: Vec<String> = group
            .sentinel(i)
            .query(
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg("tr-sentinel"),
            )
            .await;
        assert_eq!(reply.join(":"), first_replica, "sentinel {i}");
    }
    assert_eq!(group.master().get("k1").await.as_deref(), Some("v1"));
    let _: () = group
        .master()
        .query(redis::cmd("SET").arg("k2").arg("v2"))
        .await;
    assert_eq!(group.master().get("k2").await.as_deref(), Some("v2"));

    // A killed sentinel is gone; the other two still answer.
    let pid = group.sentinel(2).pid().expect("sentinel 2 runs");
    group.kill_sentinel(2);
    assert!(!alive(pid), "sentinel 2 (pid {pid}) still runs");
    assert_eq!(group.reported_master().await, first_replica);

    // Dropping the group kills every process by its pid.
    let pids = group.pids();
    assert_eq!(pids.len(), 4, "two servers and two sentinels: {pids:?}");
    assert!(pids.iter().all(|&p| alive(p)));
    drop(group);
    for pid in pids {
        assert!(!alive(pid), "pid {pid} outlived the group");
    }
}

#[tokio::test]
async fn cluster_starts_and_routes_keys() {
    let cluster = Cluster::start(3);
    assert_eq!(cluster.len(), 3);
    assert_eq!(cluster.addrs().len(), 3);

    // A key is served by the node owning its slot; the others redirect with MOVED.
    let key = "user:42";
    let slot = cluster.slot(key).await;
    let owner = cluster.node_for_key(key).await;
    let _: () = cluster[owner]
        .query(redis::cmd("SET").arg(key).arg("v"))
        .await;
    assert_eq!(cluster[owner].get(key).await.as_deref(), Some("v"));
    let owner_addr = cluster[owner].addr();
    for other in (0..3).filter(|&i| i != owner) {
        let mut conn = cluster[other].conn().await;
        let err = redis::cmd("GET")
            .arg(key)
            .query_async::<Option<String>>(&mut conn)
            .await
            .expect_err("a node that does not own the slot redirects");
        assert_eq!(
            err.redirect_node(),
            Some((owner_addr.as_str(), slot)),
            "node {other}: {err}"
        );
    }

    // Keys with one hash tag share a slot, hence a node (and a multi-key command works).
    let a = cluster.node_for_key("{tag}a").await;
    assert_eq!(cluster.node_for_key("{tag}b").await, a);
    assert_eq!(cluster.slot("{tag}a").await, cluster.slot("{tag}b").await);
    let _: () = cluster[a]
        .query(
            redis::cmd("MSET")
                .arg("{tag}a")
                .arg("1")
                .arg("{tag}b")
                .arg("2"),
        )
        .await;

    // The slots are spread: some key lands on every node.
    let mut seen = [false; 3];
    for i in 0..200 {
        seen[cluster.node_for_key(&format!("spread:{i}")).await] = true;
        if seen.iter().all(|&s| s) {
            break;
        }
    }
    assert_eq!(seen, [true; 3], "keys land on every node");

    // A stopped node fails the cluster; restarted, it serves its slots again (empty).
    let pid = cluster.node(owner).pid().expect("the owner runs");
    cluster.stop_node(owner);
    assert!(!alive(pid), "node {owner} (pid {pid}) still runs");
    let other = (owner + 1) % 3;
    eventually(
        "the other nodes see the cluster fail",
        Duration::from_secs(10),
        || async {
            let info: String = cluster[other]
                .query(redis::cmd("CLUSTER").arg("INFO"))
                .await;
            info.contains("cluster_state:fail")
        },
    )
    .await;
    cluster.restart_node(owner).await;
    assert_eq!(cluster.node_for_key(key).await, owner);
    assert_eq!(cluster[owner].get(key).await, None);

    // Dropping the cluster kills every node by its pid.
    let pids = cluster.pids();
    assert_eq!(pids.len(), 3);
    drop(cluster);
    for pid in pids {
        assert!(!alive(pid), "pid {pid} outlived the cluster");
    }
}
