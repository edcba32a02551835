//! A Cluster voter's subscriber: a RESP3 cluster connection of its own whose pushes
//! (`smessage`: a release in a key's slot) go to the listener; `SSUBSCRIBE`/`SUNSUBSCRIBE` as
//! the keys come and go, concurrently (channels of different slots cannot share a command).
//!
//! - After a node's connection dropped (a disconnection push), every listed key is subscribed
//!   again, one `SSUBSCRIBE` each. That happens at once, and again 1 and 3 s later, once redis-rs
//!   has replaced the connection (a subscription confirmed on the way may have been on the one it
//!   drops). Redis-rs's own resubscription sends a node's channels in one command, refused with
//!   `CROSSSLOT` when they span several slots. The push counts as a release for every key's waiters
//!   (releases may have been missed) — before the resubscription: one between the two is the
//!   poll's.
//! - A slot that moves (a migration, a failover) ends its keys' subscriptions: the server
//!   pushes `sunsubscribe`, and redis-rs forgets the channel. A key that still has waiters
//!   is subscribed again — the cluster connection follows `MOVED` to the slot's new owner —
//!   and its waiters are told (a release during the move may have been missed).
//! - No subscription outlives its waiters: an `ssubscribe` push for a key that is not listed
//!   (an `SSUBSCRIBE` that timed out but landed, one redis-rs made again after a reconnection)
//!   has the key unsubscribed; a `SUNSUBSCRIBE` that failed is asked again (redis-rs keeps
//!   what the server confirmed and makes it again after every reconnection). A key whose
//!   `SSUBSCRIBE` failed while it has waiters is asked again after a pause.
//!
//! Ends when the feed is dropped.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use redis::cluster_async::ClusterConnection;
use redis::{PushKind, Value};
use tokio::sync::Notify;

use super::{error_class, Limits, BATCH};
use crate::node::redis::cluster::ClusterWake;
use crate::node::wake::{Changes, Listener, Ops};

/// How many `SSUBSCRIBE`s or `SUNSUBSCRIBE`s are in flight at once.
const IN_FLIGHT: usize = 64;
/// When the keys are subscribed again after a disconnection, besides at once.
const AFTER_RECONNECTION: [std::time::Duration; 2] = [
    std::time::Duration::from_secs(1),
    std::time::Duration::from_secs(3),
];
/// The pause before a failed `SSUBSCRIBE` or `SUNSUBSCRIBE` is asked again (doubling for
/// the latter).
const RETRY_PAUSE: std::time::Duration = std::time::Duration::from_secs(1);
/// How many times a failed `SUNSUBSCRIBE` is asked again: 1 + 2 + 4 + 8 + 16 s, past a
/// reconnection.
const UNSUBSCRIBE_AGAIN: u32 = 5;

/// The keys with waiters, shared with the push handler.
#[derive(Default)]
struct Keys {
    listed: Mutex<HashSet<Arc<str>>>,
    /// Listed keys whose subscription the server ended (their slot moved), or failed: to
    /// subscribe again.
    moved: Mutex<HashSet<Arc<str>>>,
    /// Keys the server says are subscribed that are not listed: to unsubscribe.
    unwanted: Mutex<HashSet<Arc<str>>>,
    /// Either set has work.
    ready: Notify,
}

impl Keys {
    fn listed(&self) -> std::sync::MutexGuard<'_, HashSet<Arc<str>>> {
        self.listed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn moved(&self) -> std::sync::MutexGuard<'_, HashSet<Arc<str>>> {
        self.moved
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn unwanted(&self) -> std::sync::MutexGuard<'_, HashSet<Arc<str>>> {
        self.unwanted
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// `keys` are to be subscribed again (now, or after a pause).
    fn subscribe_again(&self, keys: impl IntoIterator<Item = Arc<str>>) {
        self.moved().extend(keys);
        self.ready.notify_one();
    }
}

pub(super) async fn run(
    wake: ClusterWake,
    name: String,
    limits: Limits,
    listener: Arc<dyn Listener>,
    ops: Ops,
) {
    let keys: Arc<Keys> = Arc::default();
    let (heard, known) = (listener.clone(), keys.clone());
    let push = move |info: redis::PushInfo| {
        let channel = || match info.data.first() {
            Some(Value::BulkString(channel)) => std::str::from_utf8(channel).ok(),
            _ => None,
        };
        match info.kind {
            PushKind::SMessage => {
                if let Some(key) = channel() {
                    heard.released(key);
                }
            }
            PushKind::SUnsubscribe => {
                // Ours (the key left the list first), or the server's: the slot moved.
                let Some(key) = channel() else {
                    return Ok::<(), redis::aio::SendError>(());
                };
                let listed = known.listed().get(key).cloned();
                if let Some(key) = listed {
                    known.subscribe_again([key]);
                }
            }
            PushKind::SSubscribe => {
                // Ours, or one made again by redis-rs (after a reconnection, a late
                // confirmation) for a key that has no waiters any more: unsubscribed.
                let Some(key) = channel() else {
                    return Ok::<(), redis::aio::SendError>(());
                };
                if !known.listed().contains(key) {
                    known.unwanted().insert(key.into());
                    known.ready.notify_one();
                }
            }
            PushKind::Disconnection => {
                // redis-rs makes a node's subscriptions again in one `SSUBSCRIBE`, which the
                // node refuses (`CROSSSLOT`) when they span several slots: every listed key
                // is subscribed again, one command each (a duplicate is harmless), and its
                // waiters are told then.
                let all: Vec<Arc<str>> = known.listed().iter().cloned().collect();
                heard.subscribed(&all);
                known.subscribe_again(all);
                // Again once redis-rs has replaced the connection (what was confirmed on
                // the way may have been on the one it drops).
                let known = known.clone();
                tokio::spawn(async move {
                    for pause in AFTER_RECONNECTION {
                        tokio::time::sleep(pause).await;
                        let all: Vec<Arc<str>> = known.listed().iter().cloned().collect();
                        known.subscribe_again(all);
                    }
                });
            }
            _ => {}
        }
        Ok(())
    };
    let conn = match wake.connect(push, limits.connect, limits.response) {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(voter = %name, error = %e, "wake: no subscriber: waiters poll");
            return;
        }
    };
    let sub = Sub {
        conn,
        name,
        limits,
        listener,
        keys,
        ops,
    };
    loop {
        tokio::select! {
            changes = sub.ops.next(BATCH) => match changes {
                None => return,
                Some(changes) => sub.change(changes).await,
            },
            () = sub.keys.ready.notified() => {
                sub.unsubscribe_unwanted().await;
                sub.subscribe_moved().await;
            }
        }
    }
}

struct Sub {
    conn: ClusterConnection,
    name: String,
    limits: Limits,
    listener: Arc<dyn Listener>,
    keys: Arc<Keys>,
    ops: Ops,
}

impl Sub {
    /// Subscribes the keys that got waiters, unsubscribes those whose waiters left.
    async fn change(&self, changes: Changes) {
        let (mut listen, mut leave) = (Vec::new(), Vec::new());
        {
            let mut listed = self.keys.listed();
            for (key, on) in changes {
                if on {
                    if listed.insert(key.clone()) {
                        listen.push(key);
                    }
                } else if listed.remove(&key) {
                    leave.push(key);
                }
            }
        }
        for key in &leave {
            self.keys.moved().remove(key);
        }
        self.each(leave, false).await;
        self.each_new(listen).await;
    }

    /// `SSUBSCRIBE` the keys that just got waiters. The exception is a key whose waiters left by
    /// the time its turn comes (its word waits in the feed: the subscriber may have waited long on
    /// a slow node). That key is taken off the list unsubscribed, so that a waiter coming back
    /// lists and subscribes it again.
    async fn each_new(&self, keys: Vec<Arc<str>>) {
        self.ask_each(keys, true, true).await;
    }

    /// Unsubscribes the keys the server reported subscribed that have no waiters.
    async fn unsubscribe_unwanted(&self) {
        let unwanted: Vec<Arc<str>> = self.keys.unwanted().drain().collect();
        let unlisted: Vec<Arc<str>> = {
            let listed = self.keys.listed();
            unwanted
                .into_iter()
                .filter(|k| !listed.contains(k))
                .collect()
        };
        self.each(unlisted, false).await;
    }

    /// Subscribes again the listed keys whose slot moved, and tells their waiters.
    async fn subscribe_moved(&self) {
        let moved: Vec<Arc<str>> = self.keys.moved().drain().collect();
        let listed: Vec<Arc<str>> = {
            let listed = self.keys.listed();
            moved.into_iter().filter(|k| listed.contains(k)).collect()
        };
        if listed.is_empty() {
            return;
        }
        tracing::debug!(voter = %self.name, keys = listed.len(), "wake: a slot moved: subscribing its keys again");
        self.each(listed.clone(), true).await;
        self.listener.subscribed(&listed);
    }

    /// `SSUBSCRIBE` (`on`) or `SUNSUBSCRIBE` each key, [`IN_FLIGHT`] at a time, each bounded
    /// by the response timeout. A failed subscription is asked again after [`RETRY_PAUSE`]
    /// while its key is listed; a failed unsubscription by [`unsubscribe_later`].
    async fn each(&self, keys: Vec<Arc<str>>, on: bool) {
        self.ask_each(keys, on, false).await;
    }

    /// [`Sub::each`]; with `new`, keys whose waiters left are skipped (see
    /// [`Sub::each_new`]).
    async fn ask_each(&self, keys: Vec<Arc<str>>, on: bool, new: bool) {
        let ask = |key: Arc<str>| {
            let mut conn = self.conn.clone();
            let timeout = self.limits.response;
            async move {
                if new && self.ops.leaving(&key) {
                    self.keys.listed().remove(&key);
                    return (key, Ok(Ok(())));
                }
                let asked = async {
                    if on {
                        conn.ssubscribe(&*key).await
                    } else {
                        conn.sunsubscribe(&*key).await
                    }
                };
                let result = tokio::time::timeout(timeout, asked).await;
                (key, result)
            }
        };
        let mut answers = futures_util::stream::iter(keys)
            .map(ask)
            .buffer_unordered(IN_FLIGHT);
        let mut failed = Vec::new();
        while let Some((key, result)) = answers.next().await {
            let why = match result {
                Ok(Ok(())) => continue,
                Ok(Err(e)) if on && e.code() == Some("NOPERM") => {
                    self.listener.refused(&key);
                    continue;
                }
                Ok(Err(e)) => error_class(&e),
                Err(_) => "timed out".to_owned(),
            };
            tracing::debug!(voter = %self.name, error = %why, on, "wake: a (un)subscription failed");
            failed.push(key);
        }
        if failed.is_empty() {
            return;
        }
        let keys = self.keys.clone();
        if on {
            tokio::spawn(async move {
                tokio::time::sleep(RETRY_PAUSE).await;
                keys.subscribe_again(failed);
            });
        } else {
            let (conn, timeout) = (self.conn.clone(), self.limits.response);
            tokio::spawn(unsubscribe_later(conn, keys, timeout, failed));
        }
    }
}

/// Asks again for the `SUNSUBSCRIBE`s of `left` that failed, for the keys that are still unlisted.
/// A failure is an error, or a timeout (redis-rs drops a request whose caller stopped waiting
/// before it was sent). It asks after a pause that doubles, up to [`UNSUBSCRIBE_AGAIN`] times. One
/// that never lands leaves the channel in redis-rs's tracker, and subscribed if the server had it.
/// Redis-rs would make it again after every reconnection. Where the node's tracked channels span
/// several slots, that resubscription is refused whole (`CROSSSLOT`), so no `ssubscribe` push ever
/// reports it. A key listed again meanwhile is left alone. (One listed after the check and
/// unsubscribed by a late retry is subscribed again by the push handler.)
async fn unsubscribe_later(
    conn: ClusterConnection,
    keys: Arc<Keys>,
    timeout: std::time::Duration,
    mut left: Vec<Arc<str>>,
) {
    let mut pause = RETRY_PAUSE;
    for _ in 0..UNSUBSCRIBE_AGAIN {
        tokio::time::sleep(pause).await;
        pause *= 2;
        {
            let listed = keys.listed();
            left.retain(|key| !listed.contains(key));
        }
        let ask = |key: Arc<str>| {
            let mut conn = conn.clone();
            async move {
                let done = tokio::time::timeout(timeout, conn.sunsubscribe(&*key)).await;
                (key, matches!(done, Ok(Ok(()))))
            }
        };
        left = futures_util::stream::iter(std::mem::take(&mut left))
            .map(ask)
            .buffer_unordered(IN_FLIGHT)
            .filter_map(|(key, done)| std::future::ready((!done).then_some(key)))
            .collect()
            .await;
        if left.is_empty() {
            return;
        }
    }
    tracing::debug!(keys = left.len(), "wake: unsubscriptions failed for good");
}
