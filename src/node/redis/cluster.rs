//! A Redis Cluster as one voter: each request goes to the master of its key's hash slot
//! (redis-rs' cluster connection follows `MOVED`/`ASK` and the slot map).

use std::fmt;
use std::sync::OnceLock;
use std::time::Duration;

use redis::cluster::{ClusterClientBuilder, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, RedisResult, Value};

use super::options::RedisNodeOptions;
use super::sentinel::host_port;

/// A Redis Cluster, for [`RedisNode::cluster`](super::RedisNode::cluster) (feature
/// `cluster`): some of its nodes (the rest are found from them), with credentials and TLS.
///
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), tower_redlock::Error> {
/// use tower_redlock::node::{Cluster, RedisNode, RedisNodeOptions};
///
/// let cluster = Cluster::new(["10.0.2.1:7000", "10.0.2.2:7000"])?.password(None, "secret");
/// let voter = RedisNode::cluster(cluster, &RedisNodeOptions::default())?;
/// # Ok(()) }
/// ```
///
/// By URL: `redis+cluster://:secret@10.0.2.1:7000,10.0.2.2:7000` (`rediss+cluster://` for
/// TLS).
#[derive(Clone)]
pub struct Cluster {
    nodes: Vec<(String, u16)>,
    auth: Option<(Option<String>, String)>,
    tls: bool,
    #[cfg(feature = "tls")]
    certs: Option<redis::TlsCertificates>,
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster")
            .field("nodes", &self.nodes)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    /// A cluster reached through `nodes` (`host:port`, `[v6]:port`; the port defaults to
    /// 6379). No node, or an address that does not parse, is an invalid-input error.
    ///
    /// # Errors
    ///
    /// [`Error::is_invalid_input`](crate::Error::is_invalid_input): no node, or an address
    /// that does not parse.
    pub fn new<I, S>(nodes: I) -> crate::Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let nodes = nodes
            .into_iter()
            .map(|s| host_port(s.as_ref(), 6379))
            .collect::<crate::Result<Vec<_>>>()?;
        if nodes.is_empty() {
            return Err(crate::Error::invalid(
                "a Cluster voter needs at least one node address",
            ));
        }
        Ok(Self {
            nodes,
            auth: None,
            tls: false,
            #[cfg(feature = "tls")]
            certs: None,
        })
    }

    /// `AUTH` for every node of the cluster.
    pub fn password(mut self, username: Option<&str>, password: &str) -> Self {
        self.auth = Some((username.map(str::to_owned), password.to_owned()));
        self
    }

    /// TLS to every node (needs the `tls` feature; without it, building the voter is an
    /// invalid-input error).
    pub fn tls(mut self) -> Self {
        self.tls = true;
        self
    }

    /// TLS with a private CA or client certificates.
    #[cfg(feature = "tls")]
    pub fn tls_certificates(mut self, certs: redis::TlsCertificates) -> Self {
        self.tls = true;
        self.certs = Some(certs);
        self
    }

    /// The voter's name in errors and logs: `cluster:<first node>`.
    pub(super) fn name(&self) -> String {
        let (host, port) = &self.nodes[0];
        format!("cluster:{host}:{port}")
    }
}

/// The voter's connection: redis-rs' async cluster connection, made in the background.
#[derive(Clone)]
pub(crate) struct ClusterConn {
    conn: ClusterConnection,
}

impl ClusterConn {
    /// Sets the connection up; nothing is sent until the first request. Must be called
    /// inside a Tokio runtime.
    pub(super) fn start(cluster: &Cluster, options: &RedisNodeOptions) -> crate::Result<Self> {
        let client = builder(cluster, options)?
            .build()
            .map_err(|e| crate::Error::invalid(format!("{}: {e}", cluster.name())))?;
        let mut config = ClusterConfig::new().set_connection_timeout(options.connect_timeout);
        if let Some(t) = options.response_timeout {
            config = config.set_response_timeout(t);
        }
        Ok(Self {
            conn: client.get_pending_async_connection_with_config(config),
        })
    }

    pub(super) async fn query(&mut self, cmd: &Cmd) -> RedisResult<Value> {
        use redis::aio::ConnectionLike;
        self.conn.req_packed_command(cmd).await
    }
}

/// The cluster client's settings for `cluster`.
fn builder(cluster: &Cluster, options: &RedisNodeOptions) -> crate::Result<ClusterClientBuilder> {
    if cluster.tls && !cfg!(feature = "tls") {
        return Err(crate::Error::invalid(format!(
            "{} asks for TLS: enable the `tls` feature of tower-redlock",
            cluster.name()
        )));
    }
    let scheme = if cluster.tls { "rediss" } else { "redis" };
    let urls = cluster.nodes.iter().map(|(host, port)| {
        let host = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.clone()
        };
        format!("{scheme}://{host}:{port}")
    });
    // Redirections (`MOVED`, `ASK`) count as retries; the client's node timeout bounds
    // them all, so the waits between them stay short.
    let mut builder = ClusterClientBuilder::new(urls)
        .retries(3)
        .min_retry_wait(5)
        .max_retry_wait(100)
        .connection_timeout(options.connect_timeout)
        .response_timeout(options.response_timeout.unwrap_or(Duration::from_secs(1)));
    if let Some((user, pass)) = &cluster.auth {
        builder = builder.password(pass);
        if let Some(user) = user {
            builder = builder.username(user);
        }
    }
    #[cfg(feature = "tls")]
    if let Some(certs) = &cluster.certs {
        builder = builder.certs(certs.clone());
    }
    Ok(builder)
}

/// What a Cluster voter's wake-up subscriber connects with (see `redis/wake.rs`).
#[derive(Clone)]
pub(crate) struct ClusterWake {
    cluster: Cluster,
    options: RedisNodeOptions,
}

impl ClusterWake {
    pub(super) fn new(cluster: &Cluster, options: &RedisNodeOptions) -> Self {
        Self {
            cluster: cluster.clone(),
            options: options.clone(),
        }
    }

    /// The subscriber's connection: RESP3, its pushes handed to `push`; made in the
    /// background, each request bounded by `connect` and `response`.
    pub(super) fn connect(
        &self,
        push: impl redis::aio::AsyncPushSender,
        connect: Duration,
        response: Duration,
    ) -> crate::Result<ClusterConnection> {
        let client = builder(&self.cluster, &self.options)?
            .use_protocol(redis::ProtocolVersion::RESP3)
            .push_sender(push)
            .build()
            .map_err(|e| crate::Error::invalid(e.to_string()))?;
        let config = ClusterConfig::new()
            .set_connection_timeout(connect)
            .set_response_timeout(response);
        Ok(client.get_pending_async_connection_with_config(config))
    }
}

/// `aux` moved into the hash slot of `key`: `{tag}aux`, where `tag` is a short string of
/// that slot (a script's keys must share one slot).
pub(super) fn in_slot_of(key: &str, aux: &str) -> String {
    let tag = slot_tags()[usize::from(slot(key.as_bytes()))];
    format!("{{{tag}}}{aux}")
}

/// For every hash slot, the smallest number whose decimal form hashes to it.
fn slot_tags() -> &'static [u32] {
    static TAGS: OnceLock<Vec<u32>> = OnceLock::new();
    TAGS.get_or_init(|| {
        let mut tags = vec![u32::MAX; SLOTS];
        let mut left = SLOTS;
        let mut n = 0u32;
        while left > 0 {
            let s = usize::from(slot(n.to_string().as_bytes()));
            if tags[s] == u32::MAX {
                tags[s] = n;
                left -= 1;
            }
            n += 1;
        }
        tags
    })
}

const SLOTS: usize = 16384;

/// Redis Cluster's hash slot of a key: CRC16 (XMODEM) of its hash tag (the part between
/// the first `{` and the first `}` after it, when not empty), else of the whole key.
pub(super) fn slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16(hashed) % SLOTS as u16
}

fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in data {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn computes_redis_hash_slots() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        // An empty tag hashes the whole key.
        assert_eq!(slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
        assert_eq!(slot(b"foo{bar}{zap}"), slot(b"bar"));
    }

    #[test]
    fn an_aux_key_lands_in_the_slot_of_its_lock() {
        for key in ["a", "payments:42", "x{}y", "a}b", "a{b", "{tagged}rest", ""] {
            let aux = in_slot_of(key, "tower-redlock:restart-guard:60000");
            assert_eq!(slot(aux.as_bytes()), slot(key.as_bytes()), "{key} → {aux}");
        }
        assert!(slot_tags().iter().all(|&t| t != u32::MAX));
    }

    #[test]
    fn a_cluster_needs_a_node() {
        assert!(Cluster::new(Vec::<&str>::new()).is_err());
        assert!(Cluster::new(["h:x"]).is_err());
        let c = Cluster::new(["h:7000", "[::1]:7001", "h2"]).unwrap();
        assert_eq!(c.name(), "cluster:h:7000");
        assert!(!format!("{:?}", c.password(None, "hunter2")).contains("hunter2"));
    }
}
