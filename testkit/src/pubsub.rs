//! A raw pub/sub connection ([`Subscriber`]): what a waiter hears when a lock is deleted
//! (with the wake-up on, every delete of a lock publishes `released` on the channel named as
//! its key: `PUBLISH` on a master, `SPUBLISH` on a Cluster). Raw RESP over TCP, so that the
//! test reads exactly what the server sent (redis-rs' async `PubSub` has no sharded
//! subscribe).

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// A raw connection subscribed to channels (plain or sharded).
pub struct Subscriber {
    conn: TcpStream,
    seen: Vec<u8>,
    /// `""` (plain) or `"s"` (sharded): the prefix of the replies' kinds.
    kind: &'static str,
}

impl Subscriber {
    /// Connects to `127.0.0.1:port` and `SUBSCRIBE`s to `channels` (bounded waits).
    pub async fn on(port: u16, channels: &[&str]) -> Self {
        Self::subscribe(port, channels, "").await
    }

    /// Connects to `127.0.0.1:port` and `SSUBSCRIBE`s to `channels` (bounded waits).
    pub async fn sharded(port: u16, channels: &[&str]) -> Self {
        Self::subscribe(port, channels, "s").await
    }

    async fn subscribe(port: u16, channels: &[&str], kind: &'static str) -> Self {
        let mut conn = TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("connect");
        let verb = format!("{}SUBSCRIBE", kind.to_uppercase());
        let mut cmd = format!("*{}\r\n${}\r\n{verb}\r\n", channels.len() + 1, verb.len());
        for c in channels {
            cmd.push_str(&format!("${}\r\n{c}\r\n", c.len()));
        }
        conn.write_all(cmd.as_bytes()).await.expect("write");
        let mut sub = Self {
            conn,
            seen: Vec::new(),
            kind,
        };
        for c in channels {
            sub.until(&format!("{kind}subscribe\r\n${}\r\n{c}\r\n", c.len()))
                .await;
        }
        sub
    }

    /// Reads until `text` has arrived (bounded), and forgets what came before it.
    pub async fn until(&mut self, text: &str) {
        let read = async {
            let mut buf = [0u8; 512];
            loop {
                if let Some(at) = find(&self.seen, text.as_bytes()) {
                    self.seen.drain(..at + text.len());
                    return;
                }
                let n = self.conn.read(&mut buf).await.expect("read");
                assert!(n > 0, "the subscriber's connection closed");
                self.seen.extend_from_slice(&buf[..n]);
            }
        };
        tokio::time::timeout(Duration::from_secs(5), read)
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no {text:?}; seen {:?}",
                    String::from_utf8_lossy(&self.seen)
                )
            });
    }

    /// The next message is a release of `key`.
    pub async fn released(&mut self, key: &str) {
        let kind = format!("{}message\r\n", self.kind);
        self.until(&kind).await;
        let head = format!("${}\r\n{key}\r\n$8\r\nreleased\r\n", key.len());
        // The message just begun must be `key`'s: nothing came between.
        let read = async {
            let mut buf = [0u8; 512];
            while self.seen.len() < head.len() {
                let n = self.conn.read(&mut buf).await.expect("read");
                self.seen.extend_from_slice(&buf[..n]);
            }
        };
        tokio::time::timeout(Duration::from_secs(5), read)
            .await
            .expect("the message");
        assert!(
            self.seen.starts_with(head.as_bytes()),
            "expected a release of {key}, got {:?}",
            String::from_utf8_lossy(&self.seen)
        );
        self.seen.drain(..head.len());
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// How many connections of `server` subscribe to the plain channel `channel` (`PUBSUB
/// NUMSUB`): a waiter's subscriber is listening once it counts.
pub async fn subscribers(server: &crate::RedisServer, channel: &str) -> i64 {
    let mut cmd = redis::cmd("PUBSUB");
    cmd.arg("NUMSUB").arg(channel);
    let (_, n): (String, i64) = server.query(&cmd).await;
    n
}

/// How many connections of `server` subscribe to the sharded channel `channel` (`PUBSUB
/// SHARDNUMSUB`).
pub async fn shard_subscribers(server: &crate::RedisServer, channel: &str) -> i64 {
    let mut cmd = redis::cmd("PUBSUB");
    cmd.arg("SHARDNUMSUB").arg(channel);
    let (_, n): (String, i64) = server.query(&cmd).await;
    n
}

/// [`shard_subscribers`] of each of `channels`, in one `PUBSUB SHARDNUMSUB` (answered by
/// `server` for its own connections, whichever node serves the channels' slots).
pub async fn shard_subscribers_each(server: &crate::RedisServer, channels: &[String]) -> Vec<i64> {
    let mut cmd = redis::cmd("PUBSUB");
    cmd.arg("SHARDNUMSUB").arg(channels);
    let counts: std::collections::HashMap<String, i64> = server.query(&cmd).await;
    (channels.iter())
        .map(|c| {
            *counts
                .get(c)
                .unwrap_or_else(|| panic!("PUBSUB SHARDNUMSUB did not count {c}"))
        })
        .collect()
}

/// The connections of `server` that have shard subscriptions (`CLIENT LIST`: `ssub` > 0):
/// their ids and their (loopback) peer ports.
pub async fn shard_subscriber_clients(server: &crate::RedisServer) -> Vec<(u64, u16)> {
    let list: String = server.query(redis::cmd("CLIENT").arg("LIST")).await;
    list.lines()
        .filter_map(|line| {
            let field = |name: &str| {
                line.split(' ')
                    .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            };
            let ssub: u64 = field("ssub")?.parse().ok()?;
            let id = field("id")?.parse().ok()?;
            let port = field("addr")?.rsplit(':').next()?.parse().ok()?;
            (ssub > 0).then_some((id, port))
        })
        .collect()
}

/// The bytes that the server listening on loopback port `port` has received but not read
/// on its connection from loopback port `peer` (the kernel's receive queue, in
/// `/proc/net/tcp`): what a frozen server has pending. `None` without such a connection.
pub fn unread_bytes(port: u16, peer: u16) -> Option<u64> {
    let table = std::fs::read_to_string("/proc/net/tcp").expect("read /proc/net/tcp");
    let end = |p: u16| format!("0100007F:{p:04X}");
    let (local, remote) = (end(port), end(peer));
    table.lines().skip(1).find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.get(1)? != &local || f.get(2)? != &remote {
            return None;
        }
        let (_, rx) = f.get(4)?.split_once(':')?;
        u64::from_str_radix(rx, 16).ok()
    })
}

/// Waits (bounded: 20 s) until every one of `servers` has a subscriber on the plain channel
/// `channel`: a waiter's subscribers are listening.
pub async fn listening<'a>(
    servers: impl IntoIterator<Item = &'a crate::RedisServer>,
    channel: &str,
) {
    until_subscribed(servers.into_iter().collect(), channel, true).await;
}

/// Waits (bounded: 20 s) until none of `servers` has a subscriber on the plain channel
/// `channel`: the waits ended and their subscriptions with them.
pub async fn not_listening<'a>(
    servers: impl IntoIterator<Item = &'a crate::RedisServer>,
    channel: &str,
) {
    until_subscribed(servers.into_iter().collect(), channel, false).await;
}

async fn until_subscribed(servers: Vec<&crate::RedisServer>, channel: &str, on: bool) {
    let what = if on { "has a" } else { "has no" };
    crate::eventually(
        format!("every server {what} subscriber on {channel}"),
        Duration::from_secs(20),
        || async {
            for s in &servers {
                if (subscribers(s, channel).await >= 1) != on {
                    return false;
                }
            }
            true
        },
    )
    .await;
}

/// How soon a woken waiter must have the lock: generous on a loaded machine, far below the
/// tests' polls (8 s and more).
pub const WOKEN_WITHIN: Duration = Duration::from_secs(3);

/// Asserts that a waiter was woken: granted within [`WOKEN_WITHIN`] of the release, well
/// before its next poll `poll`.
pub fn assert_woken(waited: Duration, poll: Duration) {
    assert!(
        waited < WOKEN_WITHIN,
        "woken {waited:?} after the release (poll {poll:?})"
    );
}

/// A waiter in a task of its own: `lock_with(key, ttl, retry)` on `redlock`, and when it was
/// answered.
pub struct Waiter {
    task: tokio::task::JoinHandle<(
        tower_redlock::Result<tower_redlock::Lease>,
        std::time::Instant,
    )>,
}

impl Waiter {
    /// Starts waiting for `key`.
    pub fn start(
        redlock: &tower_redlock::Redlock,
        key: &str,
        ttl: Duration,
        retry: tower_redlock::Retry,
    ) -> Self {
        let (redlock, key) = (redlock.clone(), key.to_owned());
        let task = tokio::spawn(async move {
            let lease = redlock.lock_with(&key, ttl, retry).await;
            (lease, std::time::Instant::now())
        });
        Self { task }
    }

    /// Starts waiting for `key` and waits until every one of `servers` has its subscriber
    /// ([`listening`]): a release from now on is heard.
    pub async fn heard<'a>(
        redlock: &tower_redlock::Redlock,
        key: &str,
        ttl: Duration,
        retry: tower_redlock::Retry,
        servers: impl IntoIterator<Item = &'a crate::RedisServer>,
    ) -> Self {
        let waiter = Self::start(redlock, key, ttl, retry);
        listening(servers, key).await;
        waiter
    }

    /// The answer, and how long after `since` it came.
    pub async fn answer(
        self,
        since: std::time::Instant,
    ) -> (tower_redlock::Result<tower_redlock::Lease>, Duration) {
        let (lease, at) = self.task.await.expect("the waiter's task");
        (lease, at.saturating_duration_since(since))
    }

    /// Asserts that it got the lock, woken by the release made at `released` (well before
    /// its poll `poll`: [`assert_woken`]), and releases it.
    pub async fn woken(self, released: std::time::Instant, poll: Duration) {
        let (lease, waited) = self.answer(released).await;
        let lease = lease.expect("the waiter gets the lock");
        assert_woken(waited, poll);
        lease.release().await.expect("released");
    }
}
