//! A Redis voter's subscriber (see `node::wake`): one connection per voter that listens on
//! the channels of the keys the client's waiters wait for, and tells the client each release
//! it hears.
//!
//! On a master or a Sentinel group's master: a RESP2 pub/sub connection, `SUBSCRIBE` to the key
//! (the scripts' `PUBLISH`) and to its keyspace channel `__keyspace@<db>__:<key>`. An `expired`
//! there is a release too, where the master has `notify-keyspace-events Kx`. That is the keyspace
//! channel of each key waited for, not every expiry of the database. The connection is made again
//! after it drops, after an idle `PING` goes unanswered, and — for a Sentinel group — when the
//! sentinels name another master. Every subscription on a new connection counts as a release for
//! the keys' waiters (releases may have been missed meanwhile). On a Cluster: redis-rs' cluster
//! connection (RESP3), `SSUBSCRIBE` to the key (the scripts' `SPUBLISH`, in the key's slot). Every
//! wait here is bounded by the voter's connect or response timeout; nothing here is on a lock's
//! path.
//!
//! The keys come from the client's [`Feed`]: a bounded queue of the latest word per key
//! (`node::wake`). They are taken in batches of up to [`BATCH`] keys. On a master that is one
//! `SUBSCRIBE` (and one for the keyspace channels) or `UNSUBSCRIBE` per batch. On a Cluster it is
//! concurrent `SSUBSCRIBE`s: a Cluster's channels of different slots cannot share a command.

#[cfg(feature = "cluster")]
mod cluster;
mod pubsub;

use std::sync::Arc;
use std::time::Duration;

use redis::Client;

use super::sentinel::SentinelConn;
use crate::node::wake::{Feed, Listener};

/// Where a voter's subscriber connects.
#[derive(Clone)]
pub(super) enum Source {
    /// One master.
    Master(Client),
    /// A Sentinel group's current master.
    Sentinel(SentinelConn),
    /// A Cluster: a cluster connection of its own (RESP3, with a push sender).
    #[cfg(feature = "cluster")]
    Cluster(super::cluster::ClusterWake),
}

impl Source {
    /// The wake-up's channel kind the scripts are given: `P` (`PUBLISH`) or `S` (`SPUBLISH`).
    pub(super) fn kind(&self) -> &'static str {
        match self {
            #[cfg(feature = "cluster")]
            Self::Cluster(_) => "S",
            _ => "P",
        }
    }
}

/// The timeouts of a subscriber's connection.
#[derive(Clone, Copy)]
pub(super) struct Limits {
    pub(super) connect: Duration,
    pub(super) response: Duration,
}

/// The most keys a subscriber (un)subscribes in one go: one command on a master.
const BATCH: usize = 512;

/// Starts `source`'s subscriber; it ends when the returned feed is dropped.
pub(super) fn start(
    source: Source,
    name: String,
    limits: Limits,
    listener: Arc<dyn Listener>,
) -> Feed {
    let (feed, ops) = Feed::channel(&name);
    match source {
        #[cfg(feature = "cluster")]
        Source::Cluster(cluster) => {
            tokio::spawn(cluster::run(cluster, name, limits, listener, ops));
        }
        source => {
            tokio::spawn(pubsub::PubSub::new(source, name, limits, listener).run(ops));
        }
    }
    feed
}

/// The keyspace channel of `key` in database `db`.
fn keyspace(db: i64, key: &str) -> String {
    format!("__keyspace@{db}__:{key}")
}

/// A subscription's error for the logs: its code or kind, never its text — Redis's text can
/// repeat the command's arguments (`unknown command 'SSUBSCRIBE', with args beginning
/// with: '<key>'`), and a channel is a raw lock key.
fn error_class(e: &redis::RedisError) -> String {
    e.code()
        .map_or_else(|| format!("{:?}", e.kind()), str::to_owned)
}
