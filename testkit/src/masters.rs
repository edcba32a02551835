//! `k` independent masters ([`Masters`]) and the test clients over them: every master, the
//! [`NODE_TIMEOUT`] of 200 ms, no retries; what the masters hold, one value per master.

use std::ops::Index;
use std::time::Duration;

use tower_redlock::{Redlock, RedlockBuilder, Retry};

use crate::server::RedisServer;

/// The per-node timeout of the test clients: modest, but generous for a shared 2-core box.
pub const NODE_TIMEOUT: Duration = Duration::from_millis(200);

/// The longest a test client's try may take when a majority of its masters is silent
/// (frozen or black-holed): the node timeout, plus at most four node timeouts given back for
/// this process's own stalls (`src/lock/call.rs`, `MAX_EXCUSE`: a silent master answers no
/// other request meanwhile), plus the last look (a tenth of the node timeout), plus a second
/// for the lateness of the last timer on a loaded machine.
pub fn silent_majority_bound() -> Duration {
    NODE_TIMEOUT * 5 + NODE_TIMEOUT / 10 + Duration::from_secs(1)
}

/// `k` independent masters.
#[derive(Debug)]
pub struct Masters {
    servers: Vec<RedisServer>,
}

impl Masters {
    /// Starts `k` masters concurrently.
    pub fn start(k: usize) -> Self {
        Self::start_with(k, RedisServer::start)
    }

    /// Starts `k` masters that also serve TLS (see [`RedisServer::start_tls`]).
    pub fn start_tls(k: usize) -> Self {
        Self::start_with(k, RedisServer::start_tls)
    }

    fn start_with(k: usize, start: fn() -> RedisServer) -> Self {
        let servers = std::thread::scope(|s| {
            let handles: Vec<_> = (0..k).map(|_| s.spawn(start)).collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                .collect()
        });
        Self { servers }
    }

    pub fn len(&self) -> usize {
        self.servers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.servers.is_empty()
    }

    pub fn iter(&self) -> std::slice::Iter<'_, RedisServer> {
        self.servers.iter()
    }

    pub fn urls(&self) -> Vec<String> {
        self.servers.iter().map(RedisServer::url).collect()
    }

    /// A builder with every master, a 200 ms node timeout and no retries.
    pub fn builder(&self) -> RedlockBuilder {
        self.servers
            .iter()
            .fold(Redlock::builder(), |b, s| b.redis(&s.url()))
            .node_timeout(NODE_TIMEOUT)
            .retry(Retry::never())
    }

    /// A client over every master, with a 200 ms node timeout and no retries.
    pub fn client(&self) -> Redlock {
        self.builder().build().expect("valid test client")
    }

    /// `GET key` on every master.
    pub async fn values(&self, key: &str) -> Vec<Option<String>> {
        let mut out = Vec::with_capacity(self.len());
        for s in &self.servers {
            out.push(s.get(key).await);
        }
        out
    }

    /// `PTTL key` on every master.
    pub async fn pttls(&self, key: &str) -> Vec<i64> {
        let mut out = Vec::with_capacity(self.len());
        for s in &self.servers {
            out.push(s.pttl(key).await);
        }
        out
    }

    /// `DEL key` on the masters with the given indexes.
    pub async fn del_on(&self, key: &str, which: &[usize]) {
        for &i in which {
            self.servers[i].del(key).await;
        }
    }

    /// `DBSIZE` of every running master.
    pub async fn dbsizes(&self) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.len());
        for s in &self.servers {
            out.push(s.dbsize().await);
        }
        out
    }

    /// Whether no master holds `key`.
    pub async fn absent_everywhere(&self, key: &str) -> bool {
        self.values(key).await.iter().all(Option::is_none)
    }

    /// Whether every master holds `value` at `key`.
    pub async fn everywhere(&self, key: &str, value: &str) -> bool {
        self.values(key)
            .await
            .iter()
            .all(|v| v.as_deref() == Some(value))
    }

    /// How many masters hold `value` at `key`.
    pub async fn holding(&self, key: &str, value: &str) -> usize {
        self.values(key)
            .await
            .iter()
            .filter(|v| v.as_deref() == Some(value))
            .count()
    }
}

impl Index<usize> for Masters {
    type Output = RedisServer;

    fn index(&self, i: usize) -> &RedisServer {
        &self.servers[i]
    }
}
