//! The subscriber of a master or a Sentinel group's master: a RESP2 pub/sub connection,
//! made again after it drops, after an idle `PING` goes unanswered, and — for a Sentinel
//! group — when the sentinels name another master.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;

use super::{error_class, keyspace, Limits, Source, BATCH};
use crate::node::wake::{Changes, Listener, Ops};

/// An idle connection is asked a `PING` this often: a silent server (partitioned, or
/// restarted behind a proxy) is noticed and the subscriber connects again.
const IDLE_PING: Duration = Duration::from_secs(5);
/// The first wait before connecting again; doubled up to `MAX_BACKOFF`.
const MIN_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// The subscriber of a master or a Sentinel group.
pub(super) struct PubSub {
    source: Source,
    name: String,
    limits: Limits,
    listener: Arc<dyn Listener>,
    /// The keys with waiters: subscribed on the connection while there is one.
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
    pub(super) fn new(
        source: Source,
        name: String,
        limits: Limits,
        listener: Arc<dyn Listener>,
    ) -> Self {
        Self {
            source,
            name,
            limits,
            listener,
            keys: HashSet::new(),
            keyspace_refused: false,
        }
    }

    pub(super) async fn run(mut self, ops: Ops) {
        let mut backoff = MIN_BACKOFF;
        loop {
            let connected = tokio::select! {
                c = connect(&self.source, &self.name, self.limits) => c,
                () = apply_until_closed(&mut self.keys, &ops) => return,
            };
            let end = match connected {
                Some((conn, db, master)) => {
                    let served = tokio::time::Instant::now();
                    let end = self.serve(conn, db, master, &ops).await;
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
            tokio::select! {
                () = wait => {}
                () = apply_until_closed(&mut self.keys, &ops) => return,
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
        ops: &Ops,
    ) -> End {
        let (mut sink, mut stream) = conn.split();
        self.keyspace_refused = false;
        let keys: Vec<Arc<str>> = self.keys.iter().cloned().collect();
        for batch in keys.chunks(BATCH) {
            if !self.subscribe(&mut sink, batch, db, true).await {
                return End::Again;
            }
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
                changes = ops.next(BATCH) => match changes {
                    None => return End::Closed,
                    Some(changes) => {
                        if !self.change(&mut sink, changes, db).await {
                            return End::Again;
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

    /// Applies a batch of changes: one `UNSUBSCRIBE` for the keys that lost their waiters,
    /// one `SUBSCRIBE` (and one for the keyspace channels) for the new ones; whether the
    /// connection is still good. (A failed unsubscribe breaks it: the next connection
    /// subscribes only the keys that still have waiters — nothing is left subscribed.)
    async fn change(
        &mut self,
        sink: &mut redis::aio::PubSubSink,
        changes: Changes,
        db: i64,
    ) -> bool {
        let (mut listen, mut leave) = (Vec::new(), Vec::new());
        for (key, on) in changes {
            if on {
                if self.keys.insert(key.clone()) {
                    listen.push(key);
                }
            } else if self.keys.remove(&key) {
                leave.push(key);
            }
        }
        if !leave.is_empty() {
            let channels: Vec<String> = leave
                .iter()
                .flat_map(|k| [k.to_string(), keyspace(db, k)])
                .collect();
            let asked = tokio::time::timeout(self.limits.response, sink.unsubscribe(&channels));
            if !matches!(asked.await, Ok(Ok(()))) {
                return false;
            }
        }
        listen.is_empty() || self.subscribe(sink, &listen, db, false).await
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

/// Applies the changes that come, without a connection, until the feed is closed.
async fn apply_until_closed(keys: &mut HashSet<Arc<str>>, ops: &Ops) {
    while let Some(changes) = ops.next(usize::MAX).await {
        for (key, on) in changes {
            if on {
                keys.insert(key);
            } else {
                keys.remove(&key);
            }
        }
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
