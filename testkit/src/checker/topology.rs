//! The voters of a run: [`MASTERS`] of them — bare masters behind fault proxies (their
//! clocks offset under the `skew` nemesis), and in place of one or two of them a Sentinel
//! group (each worker reaching its sentinels through proxies of its own) and a 3-node Redis
//! Cluster (each node behind a proxy it announces) — and what each worker is told of them.

use std::net::SocketAddr;
use std::time::Duration;

use crate::cluster::Cluster;
use crate::proxy::FaultProxy;
use crate::sentinel::SentinelGroup;
use crate::RedisServer;

use super::nemesis::Kind;
use super::settings::Settings;
use super::MASTERS;

/// How often a worker's Sentinel voter asks its sentinels for the master: its majority
/// window is twice that.
pub(super) const SENTINEL_REFRESH: Duration = Duration::from_millis(200);
/// The Sentinel group's size, and how many of its sentinels a worker lists: the voter learns
/// the others from the group, and must count its majority over all of them.
pub(super) const GROUP_SENTINELS: usize = 5;
pub(super) const LISTED_SENTINELS: usize = 3;

/// Every voter of a run, and the proxies in front of them.
pub(super) struct Topology {
    /// The bare masters: voters `0..masters.len()`.
    pub(super) masters: Vec<RedisServer>,
    /// Each bare master's clock offset, in µs (0 without the `skew` nemesis).
    pub(super) offsets_us: Vec<i64>,
    /// One proxy per bare master: the workers reach the masters only through them.
    pub(super) proxies: Vec<FaultProxy>,
    pub(super) sentinel: Option<SentinelVoter>,
    pub(super) cluster: Option<ClusterVoter>,
}

/// A Sentinel group as one voter.
pub(super) struct SentinelVoter {
    /// The voter's index.
    pub(super) voter: usize,
    pub(super) group: SentinelGroup,
    /// Per worker, one proxy per sentinel it lists (the first [`LISTED_SENTINELS`] of the
    /// group's [`GROUP_SENTINELS`]): a worker can be cut from its sentinels alone. (The master
    /// is reached directly, at the address the sentinels name.) The voter also asks the
    /// sentinels the group names, at their own addresses: a cut switches the worker's own
    /// ACL user ([`SentinelVoter::user`]) off on the sentinels it cuts, and faults its proxy
    /// to those it lists.
    pub(super) proxies: Vec<Vec<FaultProxy>>,
}

impl SentinelVoter {
    /// Worker `w`'s user on the sentinels (its password is the same word).
    pub(super) fn user(w: usize) -> String {
        format!("worker-{w}")
    }
}

/// A Redis Cluster as one voter.
pub(super) struct ClusterVoter {
    /// The voter's index.
    pub(super) voter: usize,
    pub(super) cluster: Cluster,
    /// One proxy per node, announced as the node's port: every request a worker sends to a
    /// node goes through it.
    pub(super) proxies: Vec<FaultProxy>,
}

impl Topology {
    /// Starts the voters `settings` asks for (everything at once, on threads), with a
    /// proxy in front of each; the proxies run on `rt`.
    pub(super) fn start(settings: &Settings, rt: &tokio::runtime::Runtime, run_id: &str) -> Self {
        let has = |k| settings.nemesis.contains(&k);
        let (with_sentinel, with_cluster) = (has(Kind::Sentinel), has(Kind::Cluster));
        if with_cluster {
            rt.block_on(ensure_cluster_support());
        }
        let bare = MASTERS - usize::from(with_sentinel) - usize::from(with_cluster);
        let offsets_us = if has(Kind::Skew) {
            skew_offsets(bare, settings.max_skew())
        } else {
            vec![0; bare]
        };
        let name = format!(
            "checker-{}",
            run_id.replace(|c: char| !c.is_ascii_alphanumeric(), "-")
        );
        let (masters, group, cluster) = std::thread::scope(|s| {
            let group = with_sentinel
                .then(|| s.spawn(|| SentinelGroup::start_with(&name, GROUP_SENTINELS)));
            let cluster = with_cluster.then(|| s.spawn(|| Cluster::start(3)));
            let masters: Vec<_> = offsets_us
                .iter()
                .map(|&us| {
                    s.spawn(move || match us {
                        0 => RedisServer::start(),
                        us => RedisServer::start_with_clock_offset(
                            Duration::from_micros(us.unsigned_abs()),
                            us > 0,
                        ),
                    })
                })
                .collect();
            let masters: Vec<RedisServer> = masters.into_iter().map(join).collect();
            (masters, group.map(join), cluster.map(join))
        });
        rt.block_on(async {
            let proxies = proxies_to(masters.iter().map(RedisServer::addr)).await;
            let sentinel = match group {
                Some(group) => {
                    let mut per_worker = Vec::new();
                    let listed = group.sentinel_addrs()[..LISTED_SENTINELS].to_vec();
                    for w in 0..settings.processes {
                        per_worker.push(proxies_to(listed.clone()).await);
                        let user = SentinelVoter::user(w);
                        for i in 0..GROUP_SENTINELS {
                            group.allow_user(i, &user, &user).await;
                        }
                    }
                    Some(SentinelVoter {
                        voter: bare,
                        group,
                        proxies: per_worker,
                    })
                }
                None => None,
            };
            let cluster = match cluster {
                Some(cluster) => {
                    let proxies = proxies_to(cluster.addrs()).await;
                    for (i, proxy) in proxies.iter().enumerate() {
                        cluster.announce_port(i, proxy.addr().port()).await;
                    }
                    Some(ClusterVoter {
                        voter: bare + usize::from(with_sentinel),
                        cluster,
                        proxies,
                    })
                }
                None => None,
            };
            Self {
                masters,
                offsets_us,
                proxies,
                sentinel,
                cluster,
            }
        })
    }

    /// What worker `worker` is told of the voters (`CHECKER_VOTERS`), one voter per `;`:
    /// `master|URL`, `sentinel|NAME|REFRESH_MS|USER|ADDR,…` (its own user and proxies) or
    /// `cluster|ADDR,…` (the nodes' proxies).
    pub(super) fn worker_voters(&self, worker: usize) -> String {
        let mut out: Vec<String> = self
            .proxies
            .iter()
            .map(|p| format!("master|{}", p.url()))
            .collect();
        if let Some(s) = &self.sentinel {
            let addrs: Vec<String> = s.proxies[worker]
                .iter()
                .map(|p| p.addr().to_string())
                .collect();
            out.push(format!(
                "sentinel|{}|{}|{}|{}",
                s.group.master_name(),
                SENTINEL_REFRESH.as_millis(),
                SentinelVoter::user(worker),
                addrs.join(",")
            ));
        }
        if let Some(c) = &self.cluster {
            let addrs: Vec<String> = c.proxies.iter().map(|p| p.addr().to_string()).collect();
            out.push(format!("cluster|{}", addrs.join(",")));
        }
        out.join(";")
    }

    /// One line per voter, for the report.
    pub(super) fn describe(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .masters
            .iter()
            .zip(&self.offsets_us)
            .enumerate()
            .map(|(i, (m, &us))| match us {
                0 => format!("voter {i}: master {}", m.addr()),
                us => format!(
                    "voter {i}: master {} (clock {:+.1} ms)",
                    m.addr(),
                    us as f64 / 1000.0
                ),
            })
            .collect();
        if let Some(s) = &self.sentinel {
            out.push(format!(
                "voter {}: Sentinel group {} (master {}, replica {}, {GROUP_SENTINELS} sentinels, \
                 {LISTED_SENTINELS} listed; refresh {:?})",
                s.voter,
                s.group.master_name(),
                s.group.master_addr(),
                s.group.replica_addr(),
                SENTINEL_REFRESH
            ));
        }
        if let Some(c) = &self.cluster {
            out.push(format!(
                "voter {}: Cluster of {} nodes {}",
                c.voter,
                c.cluster.len(),
                c.cluster.addrs().join(",")
            ));
        }
        out
    }

    /// How many voters (always [`MASTERS`]).
    pub(super) fn voters(&self) -> usize {
        self.masters.len()
            + usize::from(self.sentinel.is_some())
            + usize::from(self.cluster.is_some())
    }
}

fn join<T>(handle: std::thread::ScopedJoinHandle<'_, T>) -> T {
    handle
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
}

async fn proxies_to(addrs: impl IntoIterator<Item = String>) -> Vec<FaultProxy> {
    let mut out = Vec::new();
    for addr in addrs {
        let upstream: SocketAddr = addr.parse().expect("a socket address");
        out.push(FaultProxy::start(upstream).await);
    }
    out
}

/// Clock offsets (µs) for `n` masters within ±`max`: one at `+max`, one at `-max`, the rest
/// anywhere between, in random order. Any two differ by at most `2 × max`.
fn skew_offsets(n: usize, max: Duration) -> Vec<i64> {
    let max = i64::try_from(max.as_micros()).expect("an offset that fits");
    let mut rng = fastrand::Rng::new();
    let mut out: Vec<i64> = (0..n)
        .map(|i| match i {
            0 => max,
            1 => -max,
            _ => rng.i64(-max..=max),
        })
        .collect();
    rng.shuffle(&mut out);
    out
}

/// Panics with what to do when the Redlock client of this build cannot make Cluster voters.
async fn ensure_cluster_support() {
    if let Err(e) = tower_redlock::node::RedisNode::open("redis+cluster://127.0.0.1:1") {
        panic!(
            "the cluster nemesis needs Cluster voters, which this build lacks ({e}): build with \
             the testkit's `cluster` feature (cargo run -p tower-redlock-testkit --features \
             cluster --bin soak -- …) or the root crate's (cargo test --all-features)"
        );
    }
}
