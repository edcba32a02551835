//! The connection behind a Redis voter: one master, a Sentinel group's current master, or a
//! Cluster (each request routed to its key's slot).

use std::borrow::Cow;

use redis::aio::ConnectionManager;
use redis::{Cmd, RedisError, RedisResult, Value};

use super::sentinel::SentinelConn;

#[derive(Clone)]
pub(super) enum Conn {
    Manager(ConnectionManager),
    Sentinel(SentinelConn),
    #[cfg(feature = "cluster")]
    Cluster(super::cluster::ClusterConn),
}

impl Conn {
    /// Whether the connection may send a request a second time on its own (after a dropped
    /// connection): redis-rs' cluster connection retries, the others never do.
    pub(super) fn sends_again(&self) -> bool {
        match self {
            #[cfg(feature = "cluster")]
            Self::Cluster(_) => true,
            _ => false,
        }
    }

    /// A key a script reads or writes next to the lock `key`: as it is, except on a Cluster,
    /// where it is put in `key`'s hash slot (a script's keys must share one).
    pub(super) fn aux_key<'a>(&self, key: &str, aux: &'a str) -> Cow<'a, str> {
        match self {
            #[cfg(feature = "cluster")]
            Self::Cluster(_) => Cow::Owned(super::cluster::in_slot_of(key, aux)),
            _ => {
                let _ = key;
                Cow::Borrowed(aux)
            }
        }
    }
}

/// Sends `cmd`, a vote or not (see `Script::votes`: a Sentinel voter without a recent
/// majority refuses votes).
pub(super) async fn query(conn: &mut Conn, cmd: &Cmd, votes: bool) -> RedisResult<Value> {
    // The inherent methods: the `ConnectionLike` trait's boxes its future on every call
    // (measured in bench/benches/profile.rs: 0.79x -> 0.90x of the limit's throughput).
    let v = match conn {
        Conn::Manager(c) => c.send_packed_command(cmd).await?,
        Conn::Sentinel(c) => Box::pin(c.query(cmd, votes)).await?,
        #[cfg(feature = "cluster")]
        Conn::Cluster(c) => c.query(cmd).await?,
    };
    v.extract_error()
}

/// A voter's refusal made here, without sending anything (a Sentinel voter without a recent
/// majority): neither a reply nor a silence of the node (see [`is_abstention`]).
pub(crate) fn abstention(detail: String) -> RedisError {
    RedisError::from((redis::ErrorKind::Client, "abstains", detail))
}

/// Whether `e` is an [`abstention`].
pub(crate) fn is_abstention(e: &RedisError) -> bool {
    e.kind() == redis::ErrorKind::Client && e.to_string().starts_with("abstains")
}

/// Whether `e` means no reply came and the connection is gone: redis-rs makes a new one for
/// the next request (maybe to another server, or one restarted with another configuration).
/// A timeout counts (an I/O error); an error reply never does.
pub(crate) fn connection_lost(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_dropped()
        || e.is_connection_refusal()
        || e.is_unrecoverable_error()
}
