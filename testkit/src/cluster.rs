//! A Redis Cluster on loopback: `n` masters with `cluster-enabled yes` and no replicas,
//! joined by `redis-cli --cluster create`, each a real process on free ports (client and
//! cluster bus) bound to 127.0.0.1, killed by its own pid on drop (see [`RedisServer`]).
//!
//! Each node keeps its `nodes.conf` in a directory of its own, so a node stopped with
//! [`Cluster::stop_node`] comes back with [`Cluster::restart_node`] as the same node, owning
//! the same slots (with an empty dataset). A cluster with a node down reports
//! `cluster_state:fail` after [`NODE_TIMEOUT`] (no replica takes its slots over).

use std::ops::Index;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::launch::{free_port, Launch, ScratchDir};
use crate::sentinel::{ask, block_on, until};
use crate::server::describe;
use crate::server::RedisServer;

/// `cluster-node-timeout`: how long a node may not answer before the others deem it failing.
pub const NODE_TIMEOUT: Duration = Duration::from_millis(1000);
/// The bound of `redis-cli --cluster create` and of every wait for `cluster_state:ok`.
const SETTLE_DEADLINE: Duration = Duration::from_secs(20);
/// `MIGRATE`'s timeout: below the one second that [`ask`] waits for an answer.
const MIGRATE_TIMEOUT: Duration = Duration::from_millis(500);

/// `n` cluster masters sharing the 16384 slots. Everything is killed (by pid) and its files
/// removed on drop, also when a test panics.
#[derive(Debug)]
pub struct Cluster {
    // Field order is drop order: the nodes first, the directory of their files last.
    nodes: Vec<RedisServer>,
    /// The port each node advertises to clients instead of its own, if set
    /// ([`Cluster::announce_port`]).
    announced: Mutex<Vec<Option<u16>>>,
    dir: ScratchDir,
}

impl Cluster {
    /// Starts `n` (at least 3) cluster-enabled masters, assigns them the slots with
    /// `redis-cli --cluster create ... --cluster-replicas 0 --cluster-yes`, and waits
    /// (bounded) until every node reports `cluster_state:ok` and knows all `n`.
    pub fn start(n: usize) -> Self {
        assert!(n >= 3, "a Redis Cluster needs at least 3 masters, not {n}");
        let dir = ScratchDir::new("cluster");
        let nodes = std::thread::scope(|s| {
            let handles: Vec<_> = (0..n)
                .map(|i| {
                    let dir = &dir;
                    s.spawn(move || {
                        RedisServer::start_launch(false, |_port| {
                            // Fresh for each attempt: the bus port too (by default it would be
                            // the port + 10000, which may be taken or out of range).
                            let node_dir = dir.path().join(format!("node-{i}"));
                            let _ = std::fs::remove_dir_all(&node_dir);
                            std::fs::create_dir_all(&node_dir)
                                .unwrap_or_else(|e| panic!("create {node_dir:?}: {e}"));
                            let path = |p: &std::path::Path| p.to_string_lossy().into_owned();
                            let args = [
                                "--cluster-enabled",
                                "yes",
                                "--cluster-config-file",
                                &path(&node_dir.join("nodes.conf")),
                                "--cluster-port",
                                &free_port().to_string(),
                                "--cluster-node-timeout",
                                &NODE_TIMEOUT.as_millis().to_string(),
                                "--dir",
                                &path(&node_dir),
                            ];
                            Launch {
                                config: None,
                                args: args.iter().map(|a| a.to_string()).collect(),
                                env: Vec::new(),
                            }
                        })
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        let announced = Mutex::new(vec![None; n]);
        let cluster = Self {
            nodes,
            announced,
            dir,
        };
        cluster.create();
        block_on(cluster.wait_ok());
        cluster
    }

    /// `redis-cli --cluster create`, killed (by pid) if it has not finished in time.
    fn create(&self) {
        let out = self.dir.path().join("create.out");
        let out_file =
            std::fs::File::create(&out).unwrap_or_else(|e| panic!("create {out:?}: {e}"));
        let mut child = Command::new("redis-cli")
            .arg("--cluster")
            .arg("create")
            .args(self.addrs())
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .stdout(out_file.try_clone().expect("clone a file handle"))
            .stderr(out_file)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "spawn redis-cli ({e}): it comes with redis-server (Debian's redis-tools); \
                     see scripts/ensure-redis.sh"
                )
            });
        let deadline = Instant::now() + SETTLE_DEADLINE;
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait for redis-cli") {
                break Some(status);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        if status.is_some_and(|s| s.success()) {
            return;
        }
        let text = std::fs::read_to_string(&out).unwrap_or_default();
        match status {
            Some(s) => panic!("redis-cli --cluster create exited with {s}:\n{text}"),
            None => panic!("redis-cli --cluster create took over {SETTLE_DEADLINE:?}:\n{text}"),
        }
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    pub fn iter(&self) -> std::slice::Iter<'_, RedisServer> {
        self.nodes.iter()
    }

    /// `127.0.0.1:PORT` of every node, in start order (the index of [`Cluster::node`]).
    pub fn addrs(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::addr).collect()
    }

    /// Node `i`.
    pub fn node(&self, i: usize) -> &RedisServer {
        &self.nodes[i]
    }

    /// The pids of every running node.
    pub fn pids(&self) -> Vec<u32> {
        self.nodes.iter().filter_map(RedisServer::pid).collect()
    }

    /// Kills node `i` (by pid); its slots are served by nobody until it is restarted.
    pub fn stop_node(&self, i: usize) {
        self.nodes[i].stop();
    }

    /// Starts node `i` again on the same ports with the same `nodes.conf` (same node id and
    /// slots, empty dataset) and waits (bounded) until the cluster is ok again.
    pub async fn restart_node(&self, i: usize) {
        self.nodes[i].restart();
        self.wait_ok().await;
    }

    /// `CLUSTER KEYSLOT key`, asked of a running node.
    pub async fn slot(&self, key: &str) -> u16 {
        let cmd = redis::cmd("CLUSTER").arg("KEYSLOT").arg(key).clone();
        let mut last = String::from("no running node");
        for node in self.nodes.iter().filter(|n| n.pid().is_some()) {
            match ask(&node.addr(), &cmd).await {
                Ok(slot) => return slot,
                Err(e) => last = e,
            }
        }
        panic!("CLUSTER KEYSLOT {key}: {last}");
    }

    /// The index (as in [`Cluster::node`]) of the node that serves `key`'s slot, by
    /// `CLUSTER KEYSLOT` and `CLUSTER SLOTS` of a running node.
    pub async fn node_for_key(&self, key: &str) -> usize {
        let slot = self.slot(key).await;
        let cmd = redis::cmd("CLUSTER").arg("SLOTS").clone();
        let mut last = String::from("no running node");
        for node in self.nodes.iter().filter(|n| n.pid().is_some()) {
            let ranges: Vec<redis::Value> = match ask(&node.addr(), &cmd).await {
                Ok(r) => r,
                Err(e) => {
                    last = e;
                    continue;
                }
            };
            let owner = ranges
                .iter()
                .filter_map(slot_range)
                .find(|(start, end, _)| (*start..=*end).contains(&slot));
            let Some((_, _, (ip, port))) = owner else {
                last = format!("{} serves no range with slot {slot}", node.addr());
                continue;
            };
            return self.index_of(&ip, port).unwrap_or_else(|| {
                panic!("slot {slot} is served by {ip}:{port}, not one of ours")
            });
        }
        panic!("which node serves {key} (slot {slot}): {last}");
    }

    /// [`Cluster::node_for_key`] of each of `keys`, asked of one running node: one `CLUSTER
    /// SLOTS`, and the `CLUSTER KEYSLOT`s in one pipeline.
    pub async fn nodes_for_keys(&self, keys: &[String]) -> Vec<usize> {
        let node = (self.nodes.iter().find(|n| n.pid().is_some())).expect("a running node");
        let ranges: Vec<redis::Value> = node.query(redis::cmd("CLUSTER").arg("SLOTS")).await;
        let ranges: Vec<_> = ranges.iter().filter_map(slot_range).collect();
        let mut pipe = redis::pipe();
        for key in keys {
            pipe.cmd("CLUSTER").arg("KEYSLOT").arg(key);
        }
        let slots: Vec<u16> = pipe
            .query_async(&mut node.conn().await)
            .await
            .unwrap_or_else(|e| panic!("CLUSTER KEYSLOT of {} keys: {e}", keys.len()));
        slots
            .iter()
            .zip(keys)
            .map(|(&slot, key)| {
                let (_, _, (ip, port)) = (ranges.iter())
                    .find(|(start, end, _)| (*start..=*end).contains(&slot))
                    .unwrap_or_else(|| panic!("nobody serves slot {slot} of {key}"));
                self.index_of(ip, *port).unwrap_or_else(|| {
                    panic!("slot {slot} is served by {ip}:{port}, not one of ours")
                })
            })
            .collect()
    }

    /// The index of the node that `CLUSTER SLOTS` names `ip:port` (its own port, or the one
    /// it announces).
    fn index_of(&self, ip: &str, port: u16) -> Option<usize> {
        let addr = format!("{ip}:{port}");
        let announced = self.announced.lock().unwrap().clone();
        self.nodes.iter().zip(announced).position(|(n, a)| {
            n.addr() == addr || a.is_some_and(|a| ip == "127.0.0.1" && a == port)
        })
    }

    /// Migrates the slot of `key` from the node that serves it to node `to`, the way an
    /// operator resharding does: `CLUSTER SETSLOT <slot> IMPORTING <owner>` on `to`,
    /// `CLUSTER SETSLOT <slot> MIGRATING <to>` on the owner, `MIGRATE` of every key in the
    /// slot (`CLUSTER GETKEYSINSLOT`, keys with their TTLs), then `CLUSTER SETSLOT <slot>
    /// NODE <to>` on `to`, on the owner and on every other running node. Waits (bounded)
    /// until every running node's `CLUSTER SLOTS` names `to` for the slot. Returns the index
    /// of the former owner.
    ///
    /// The former owner drops its shard channels of the slot: each of their subscribers gets
    /// a `sunsubscribe` for each channel.
    pub async fn migrate_slot_of(&self, key: &str, to: usize) -> usize {
        let slot = self.slot(key).await;
        let from = self.node_for_key(key).await;
        assert_ne!(from, to, "slot {slot} of {key} is already on node {to}");
        assert!(
            self.nodes[to].pid().is_some(),
            "node {to} is not running: no slot can move to it"
        );
        let (src, dst) = (self.nodes[from].addr(), self.nodes[to].addr());
        let (src_id, dst_id) = (self.id(from).await, self.id(to).await);
        let setslot = |state: &str, id: &str| {
            redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg(state)
                .arg(id)
                .clone()
        };
        // Retried, bounded: each is idempotent, and one `ask` may time out on a busy machine.
        let on = |addr: String, cmd: redis::Cmd| async move {
            until(
                format!("{} on {addr}", describe(&cmd)),
                SETTLE_DEADLINE,
                || async { ask::<()>(&addr, &cmd).await },
            )
            .await;
        };
        on(dst.clone(), setslot("IMPORTING", &src_id)).await;
        on(src.clone(), setslot("MIGRATING", &dst_id)).await;

        // Moves the keys, a batch at a time, until the former owner has none left in the slot.
        let port = self.nodes[to].port();
        until(
            format!("node {from} ({src}) has no key left in slot {slot}"),
            SETTLE_DEADLINE,
            || async {
                let get = redis::cmd("CLUSTER")
                    .arg("GETKEYSINSLOT")
                    .arg(slot)
                    .arg(100)
                    .clone();
                let keys: Vec<String> = ask(&src, &get).await?;
                if keys.is_empty() {
                    return Ok(());
                }
                let mut migrate = redis::cmd("MIGRATE");
                migrate
                    .arg("127.0.0.1")
                    .arg(port)
                    .arg("")
                    .arg(0)
                    .arg(MIGRATE_TIMEOUT.as_millis() as u64)
                    .arg("KEYS")
                    .arg(&keys);
                ask::<String>(&src, &migrate).await?;
                Err(format!("{} keys moved, looking again", keys.len()))
            },
        )
        .await;

        // The new owner first, then the former one, then the others (as `redis-cli --cluster
        // reshard` does): no node ever points the slot at a node that does not claim it.
        let mut order = vec![to, from];
        order.extend((0..self.nodes.len()).filter(|i| *i != to && *i != from));
        for i in order {
            if self.nodes[i].pid().is_some() {
                on(self.nodes[i].addr(), setslot("NODE", &dst_id)).await;
            }
        }
        let cmd = redis::cmd("CLUSTER").arg("SLOTS").clone();
        until(
            format!("every node names node {to} ({dst}) for slot {slot}"),
            SETTLE_DEADLINE,
            || async {
                for node in self.nodes.iter().filter(|n| n.pid().is_some()) {
                    let ranges: Vec<redis::Value> = ask(&node.addr(), &cmd).await?;
                    let owner = ranges
                        .iter()
                        .filter_map(slot_range)
                        .find(|(start, end, _)| (*start..=*end).contains(&slot))
                        .and_then(|(_, _, (ip, port))| self.index_of(&ip, port));
                    if owner != Some(to) {
                        return Err(format!(
                            "{} names node {owner:?} for slot {slot}",
                            node.addr()
                        ));
                    }
                }
                Ok(())
            },
        )
        .await;
        from
    }

    /// `CLUSTER MYID` of node `i` (retried, bounded).
    async fn id(&self, i: usize) -> String {
        let cmd = redis::cmd("CLUSTER").arg("MYID").clone();
        let start = Instant::now();
        loop {
            match ask(&self.nodes[i].addr(), &cmd).await {
                Ok(id) => return id,
                Err(e) if start.elapsed() > SETTLE_DEADLINE => panic!("node {i}'s id: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// Makes node `i` advertise `port` to clients instead of its own (`CONFIG SET
    /// cluster-announce-port`): a [`FaultProxy`](crate::proxy::FaultProxy) in front of it
    /// then carries every request a cluster client sends it after reading the slot map.
    /// Waits (bounded) until every node's `CLUSTER SLOTS` names that port.
    pub async fn announce_port(&self, i: usize, port: u16) {
        let set = redis::cmd("CONFIG")
            .arg("SET")
            .arg("cluster-announce-port")
            .arg(port)
            .clone();
        ask::<()>(&self.nodes[i].addr(), &set)
            .await
            .unwrap_or_else(|e| panic!("announce port {port} for node {i}: {e}"));
        self.announced.lock().unwrap()[i] = Some(port);
        let cmd = redis::cmd("CLUSTER").arg("SLOTS").clone();
        until(
            format!("every node names port {port} for node {i}"),
            SETTLE_DEADLINE,
            || async {
                for node in self.nodes.iter().filter(|n| n.pid().is_some()) {
                    let ranges: Vec<redis::Value> = ask(&node.addr(), &cmd).await?;
                    if !ranges
                        .iter()
                        .filter_map(slot_range)
                        .any(|(_, _, (_, p))| p == port)
                    {
                        return Err(format!("{} does not name port {port} yet", node.addr()));
                    }
                }
                Ok(())
            },
        )
        .await;
    }

    /// Waits (bounded) until every running node reports `cluster_state:ok` and knows all
    /// nodes.
    pub async fn wait_ok(&self) {
        let n = self.nodes.len().to_string();
        until(
            "every node reports cluster_state:ok",
            SETTLE_DEADLINE,
            || async {
                for node in self.nodes.iter().filter(|n| n.pid().is_some()) {
                    let info: String = ask(&node.addr(), redis::cmd("CLUSTER").arg("INFO")).await?;
                    let field = |k: &str| {
                        info.lines()
                            .find_map(|l| l.strip_prefix(k)?.strip_prefix(':'))
                            .map(str::trim)
                            .unwrap_or("?")
                    };
                    let (state, known) = (field("cluster_state"), field("cluster_known_nodes"));
                    if state != "ok" || known != n {
                        return Err(format!(
                            "{}: cluster_state {state}, {known} known nodes",
                            node.addr()
                        ));
                    }
                }
                Ok(())
            },
        )
        .await;
    }
}

/// One range of `CLUSTER SLOTS`: `[start, end, [ip, port, id, ...], replicas...]` as
/// `(start, end, (ip, port))` of its master.
fn slot_range(range: &redis::Value) -> Option<(u16, u16, (String, u16))> {
    let redis::Value::Array(items) = range else {
        return None;
    };
    let redis::Value::Array(master) = items.get(2)? else {
        return None;
    };
    let start = redis::from_redis_value_ref(items.first()?).ok()?;
    let end = redis::from_redis_value_ref(items.get(1)?).ok()?;
    let ip = redis::from_redis_value_ref(master.first()?).ok()?;
    let port = redis::from_redis_value_ref(master.get(1)?).ok()?;
    Some((start, end, (ip, port)))
}

impl Index<usize> for Cluster {
    type Output = RedisServer;

    fn index(&self, i: usize) -> &RedisServer {
        &self.nodes[i]
    }
}
