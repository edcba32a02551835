//! The worker's Redlock client, from what the parent told it of the voters
//! (`CHECKER_VOTERS`, see `topology.rs`): bare masters with delayed-restart protection, a
//! Sentinel voter with its short refresh and its tenure protection, a Cluster voter — or,
//! for the negative control, a deliberately broken client.

use std::time::Duration;

use tower_redlock::node::{RedisNode, RedisNodeOptions, Sentinel};
use tower_redlock::Redlock;

use super::super::settings::Broken;
use super::WorkerConfig;

/// One voter, as the parent describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Voter {
    /// `master|URL`
    Master(String),
    /// `sentinel|NAME|REFRESH_MS|ADDR,…`
    Sentinel {
        name: String,
        refresh: Duration,
        /// The worker's own user on the sentinels (the password is the user's name).
        user: String,
        addrs: Vec<String>,
    },
    /// `cluster|ADDR,…`
    Cluster(Vec<String>),
}

/// The voters of `CHECKER_VOTERS`; panics on a malformed one.
pub(super) fn parse_voters(spec: &str) -> Vec<Voter> {
    spec.split(';')
        .map(|v| {
            let fields: Vec<&str> = v.split('|').collect();
            let list = |s: &str| s.split(',').map(str::to_owned).collect::<Vec<_>>();
            match fields[..] {
                ["master", url] => Voter::Master(url.to_owned()),
                ["sentinel", name, refresh, user, addrs] => Voter::Sentinel {
                    name: name.to_owned(),
                    refresh: Duration::from_millis(refresh.parse().expect("a refresh in ms")),
                    user: user.to_owned(),
                    addrs: list(addrs),
                },
                ["cluster", addrs] => Voter::Cluster(list(addrs)),
                _ => panic!("a malformed voter {v:?}"),
            }
        })
        .collect()
}

/// The worker's client. Must be called inside its runtime.
pub(super) fn client(config: &WorkerConfig) -> Redlock {
    let voters = match config.broken {
        None | Some(Broken::Blocking | Broken::UnclaimedRead | Broken::RowOutsideTx) => {
            config.voters.clone()
        }
        Some(Broken::Quorum1) => {
            // The negative control: one master alone, a different one per worker (while
            // there are enough), drawn by the parent's seed. Every lock it takes is
            // exclusive among the workers on that master only.
            let masters: Vec<&Voter> = config
                .voters
                .iter()
                .filter(|v| matches!(v, Voter::Master(_)))
                .collect();
            let pick = (config.seed as usize).wrapping_add(config.id) % masters.len();
            vec![masters[pick].clone()]
        }
    };
    let timeouts = |o: RedisNodeOptions| {
        o.connect_timeout(config.node_timeout * 2)
            .response_timeout(config.node_timeout * 2)
    };
    // Delayed-restart protection keeps restarts safe: a master restarted empty abstains
    // until its uptime exceeds the longest ttl (ours), so a lock it forgot can no longer be
    // valid when it votes again. Without it, a restart inside a lock's bare quorum is the
    // known Redlock hole, which this checker can then (rightly) report as an overlap. A
    // Sentinel voter's tenure protection (the same setting) keeps a promoted master out for
    // the ttl and its majority window.
    let protected = timeouts(RedisNodeOptions::new().restart_protection(config.ttl));
    // A Cluster's nodes are not restarted here: its default (no protection).
    let cluster = timeouts(RedisNodeOptions::new());
    let mut builder = Redlock::builder();
    for voter in &voters {
        builder = match voter {
            Voter::Master(url) => builder.redis_with(url, &protected),
            Voter::Sentinel {
                name,
                refresh,
                user,
                addrs,
            } => {
                let group = Sentinel::new(name, addrs)
                    .expect("a valid Sentinel group")
                    .refresh_interval(*refresh)
                    .sentinel_password(Some(user), user);
                builder.node(RedisNode::sentinel(group, &protected).expect("a Sentinel voter"))
            }
            Voter::Cluster(addrs) => {
                builder.redis_with(&format!("redis+cluster://{}", addrs.join(",")), &cluster)
            }
        };
    }
    builder
        .node_timeout(config.node_timeout)
        .retry(config.retry)
        .fencing(config.fencing)
        .build()
        .expect("a valid worker client")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_voters_the_parent_describes() {
        let voters = parse_voters(
            "master|redis://127.0.0.1:1;sentinel|g-1|200|worker-0|127.0.0.1:2,127.0.0.1:3;cluster|127.0.0.1:4",
        );
        assert_eq!(
            voters,
            [
                Voter::Master("redis://127.0.0.1:1".into()),
                Voter::Sentinel {
                    name: "g-1".into(),
                    refresh: Duration::from_millis(200),
                    user: "worker-0".into(),
                    addrs: vec!["127.0.0.1:2".into(), "127.0.0.1:3".into()],
                },
                Voter::Cluster(vec!["127.0.0.1:4".into()]),
            ]
        );
    }
}
