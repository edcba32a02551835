//! A Redis voter's subscriber (see `node::wake`): one connection per voter that listens on
//! the channels of the keys the client's waiters wait for, and tells the client each release
//! it hears.
//!
//! On a master or a Sentinel group's master: a RESP2 pub/sub connection, `SUBSCRIBE` to the
//! key (the scripts' `PUBLISH`) and to its keyspace channel `__keyspace@<db>__:<key>` (an
//! `expired` there is a release too, where the master has `notify-keyspace-events Kx`: the
//! keyspace channel of each key waited for, not every expiry of the database). It is
//! made again after it drops, after an idle `PING` goes unanswered, and — for a Sentinel
//! group — when the sentinels name another master; every subscription on a new connection
//! counts as a release for the keys' waiters (releases may have been missed meanwhile). On a Cluster: redis-rs' cluster
//! connection (RESP3), `SSUBSCRIBE` to the key (the scripts' `SPUBLISH`, in the key's slot).
//! Every wait here is bounded by the voter's connect or response timeout; nothing here is
//! on a lock's path.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use redis::Client;
use tokio::sync::mpsc::UnboundedReceiver;

use super::sentinel::SentinelConn;
use crate::node::wake::{Feed, Listener, Op};

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

/// An idle connection is asked a `PING` this often: a silent server (partitioned, or
/// restarted behind a proxy) is noticed and the subscriber connects again.
const IDLE_PING: Duration = Duration::from_secs(5);
/// The first wait before connecting again; doubled up to `MAX_BACKOFF`.
const MIN_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// Starts `source`'s subscriber; it ends when the returned feed is dropped.
pub(super) fn start(
    source: Source,
    name: String,
    limits: Limits,
    listener: Arc<dyn Listener>,
) -> Feed {
    let (feed, ops) = Feed::channel();
    match source {
        #[cfg(feature = "cluster")]
        Source::Cluster(cluster) => {
            tokio::spawn(super::cluster::run_wake(
                cluster, name, limits, listener, ops,
            ));
        }
        source => {
            let sub = PubSub {
                source,
                name,
                limits,
                listener,
                keys: HashSet::new(),
                keyspace_refused: false,
            };
            tokio::spawn(sub.run(ops));
        }
    }
    feed
}

/// The subscriber of a master or a Sentinel group.
struct PubSub {
    source: Source,
    name: String,
    limits: Limits,
    listener: Arc<dyn Listener>,
    /// The keys with waiters.
    keys: HashSet<Arc<str>>,
    /// The master refused the keyspace channels (ACL) on this connection: expiries do not
    /// wake, releases still do.
    keyspace_refused: bool,
}

/// What a `SUBSCRIBE` got.
enum Asked {
    Done,
    /// `NOPERM`: the ACL denies a channel (its text names the channel: the raw key, not
    /// logged).
    Refused,
    /// No answer in time, or another error: connect again.
    Broken,
}

/// Why a connection ended.
enum End {
    /// The feed was dropped: the client is gone.
    Closed,
    /// Connect again.
    Again,
}

impl PubSub {
    async fn run(mut self, mut ops: UnboundedReceiver<Op>) {
        let mut backoff = MIN_BACKOFF;
        loop {
            let connected = tokio::select! {
                c = connect(&self.source, &self.name, self.limits) => c,
                () = apply_until_closed(&mut self.keys, &mut ops) => return,
            };
            let end = match connected {
                Some((conn, db, master)) => {
                    let served = tokio::time::Instant::now();
                    let end = self.serve(conn, db, master, &mut ops).await;
                    // A connection that served a while starts the backoff over; one that
                    // broke at once (a server that refuses pub/sub) keeps doubling it.
                    if served.elapsed() >= MAX_BACKOFF {
                        backoff = MIN_BACKOFF;
                    }
                    end
                }
                None => End::Again,
            };
            if let End::Closed = end {
                return;
            }
            // Waits before connecting again, applying the changes that come meanwhile.
            let wait = tokio::time::sleep(backoff);
            tokio::pin!(wait);
            loop {
                tokio::select! {
                    () = &mut wait => break,
                    op = ops.recv() => match op {
                        Some(op) => apply(&mut self.keys, op),
                        None => return,
                    },
                }
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Subscribes to every key, then follows the changes and the messages until the
    /// connection ends.
    async fn serve(
        &mut self,
        conn: redis::aio::PubSub,
        db: i64,
        master: Option<String>,
        ops: &mut UnboundedReceiver<Op>,
    ) -> End {
        let (mut sink, mut stream) = conn.split();
        self.keyspace_refused = false;
        let keys: Vec<Arc<str>> = self.keys.iter().cloned().collect();
        if !keys.is_empty() && !self.subscribe(&mut sink, &keys, db, true).await {
            return End::Again;
        }
        let source = self.source.clone();
        let moved = async move {
            match (&source, &master) {
                (Source::Sentinel(conn), Some(addr)) => conn.master_changed(addr).await,
                _ => std::future::pending().await,
            }
        };
        tokio::pin!(moved);
        loop {
            let idle = tokio::time::sleep(IDLE_PING);
            tokio::select! {
                op = ops.recv() => match op {
                    None => return End::Closed,
                    Some(Op::Watch(key)) => {
                        if self.keys.insert(key.clone())
                            && !self.subscribe(&mut sink, &[key], db, false).await
                        {
                            return End::Again;
                        }
                    }
                    Some(Op::Unwatch(key)) => {
                        if self.keys.remove(&key) {
                            let channels = [key.to_string(), keyspace(db, &key)];
                            let asked = sink.unsubscribe(&channels);
                            if !matches!(
                                tokio::time::timeout(self.limits.response, asked).await,
                                Ok(Ok(()))
                            ) {
                                return End::Again;
                            }
                        }
                    }
                },
                msg = stream.next() => match msg {
                    None => {
                        tracing::debug!(voter = %self.name, "wake: the subscriber's connection closed");
                        return End::Again;
                    }
                    Some(msg) => self.heard(&msg, db),
                },
                () = &mut moved => return End::Again,
                () = idle => {
                    let pinged = tokio::time::timeout(self.limits.response, sink.ping::<redis::Value>());
                    if !matches!(pinged.await, Ok(Ok(_))) {
                        tracing::debug!(voter = %self.name, "wake: no answer to the idle ping");
                        return End::Again;
                    }
                }
            }
        }
    }

    /// Subscribes to `keys`, then to their keyspace channels; whether the connection is still
    /// good. `again` (after a connection was made): releases may have been missed meanwhile,
    /// so the listener is told (the first subscription of a key is not news: a release
    /// before it is the poll's). A refusal (ACL `NOPERM`) ends nothing: refused keys are
    /// asked one by one (a key another pattern allows still wakes) and poll, warned once; a
    /// refused keyspace channel stops the expiries only, until the next connection.
    async fn subscribe(
        &mut self,
        sink: &mut redis::aio::PubSubSink,
        keys: &[Arc<str>],
        db: i64,
        again: bool,
    ) -> bool {
        let channels = |ks: &[Arc<str>]| ks.iter().map(|k| k.to_string()).collect::<Vec<_>>();
        match self.ask(sink, channels(keys)).await {
            Asked::Done => {}
            Asked::Broken => return false,
            Asked::Refused if keys.len() == 1 => self.listener.refused(&keys[0]),
            Asked::Refused => {
                for key in keys {
                    match self.ask(sink, channels(std::slice::from_ref(key))).await {
                        Asked::Done => {}
                        Asked::Broken => return false,
                        Asked::Refused => self.listener.refused(key),
                    }
                }
            }
        }
        if !self.keyspace_refused {
            let spaces = keys.iter().map(|k| keyspace(db, k)).collect();
            match self.ask(sink, spaces).await {
                Asked::Done => {}
                Asked::Broken => return false,
                Asked::Refused => {
                    self.keyspace_refused = true;
                    tracing::debug!(voter = %self.name, "wake: keyspace channels refused: expiries do not wake");
                }
            }
        }
        if again {
            self.listener.subscribed(keys);
        }
        true
    }

    /// `SUBSCRIBE channels`, bounded by the response timeout.
    async fn ask(&self, sink: &mut redis::aio::PubSubSink, channels: Vec<String>) -> Asked {
        match tokio::time::timeout(self.limits.response, sink.subscribe(&channels)).await {
            Ok(Ok(())) => Asked::Done,
            Ok(Err(e)) if e.code() == Some("NOPERM") => Asked::Refused,
            Ok(Err(e)) => {
                tracing::debug!(voter = %self.name, error = %error_class(&e), "wake: subscribe failed");
                Asked::Broken
            }
            Err(_) => Asked::Broken,
        }
    }

    /// A message: the key's release, or its keyspace channel's `expired`.
    fn heard(&self, msg: &redis::Msg, db: i64) {
        let Ok(channel) = msg.get_channel::<Vec<u8>>() else {
            return;
        };
        let Ok(channel) = std::str::from_utf8(&channel) else {
            return;
        };
        let prefix = keyspace(db, "");
        match channel.strip_prefix(&prefix) {
            Some(key) if msg.get_payload_bytes() == b"expired" => self.listener.released(key),
            Some(_) => {}
            None => self.listener.released(channel),
        }
    }
}

/// Records a change of the keys without a connection.
fn apply(keys: &mut HashSet<Arc<str>>, op: Op) {
    match op {
        Op::Watch(key) => {
            keys.insert(key);
        }
        Op::Unwatch(key) => {
            keys.remove(&key);
        }
    }
}

/// Applies the changes that come until the feed is closed.
async fn apply_until_closed(keys: &mut HashSet<Arc<str>>, ops: &mut UnboundedReceiver<Op>) {
    while let Some(op) = ops.recv().await {
        apply(keys, op);
    }
}

/// A pub/sub connection to the master, with its database and (Sentinel) address; `None`
/// after a failure (logged at debug: the waiters poll meanwhile).
async fn connect(
    source: &Source,
    name: &str,
    limits: Limits,
) -> Option<(redis::aio::PubSub, i64, Option<String>)> {
    let (client, master) = match source {
        Source::Master(client) => (client.clone(), None),
        Source::Sentinel(conn) => {
            let (addr, client) = conn.master_client().await;
            (client, Some(addr))
        }
        #[cfg(feature = "cluster")]
        Source::Cluster(_) => return None,
    };
    let db = client.get_connection_info().redis_settings().db();
    match tokio::time::timeout(limits.connect, client.get_async_pubsub()).await {
        Ok(Ok(conn)) => Some((conn, db, master)),
        Ok(Err(e)) => {
            tracing::debug!(voter = %name, error = %e, "wake: cannot subscribe");
            None
        }
        Err(_) => {
            tracing::debug!(voter = %name, "wake: the subscriber's connection timed out");
            None
        }
    }
}

/// The keyspace channel of `key` in database `db`.
fn keyspace(db: i64, key: &str) -> String {
    format!("__keyspace@{db}__:{key}")
}

/// A subscription's error for the logs: its code or kind, never its text — Redis's text can
/// repeat the command's arguments (`unknown command 'SSUBSCRIBE', with args beginning
/// with: '<key>'`), and a channel is a raw lock key.
pub(super) fn error_class(e: &redis::RedisError) -> String {
    e.code()
        .map_or_else(|| format!("{:?}", e.kind()), str::to_owned)
}
