//! A Sentinel-managed master group as one voter: the master is discovered through the
//! sentinels, re-checked in the background, and re-discovered after a failover.

use std::fmt;
use std::time::Duration;

use super::options::RedisNodeOptions;
use redis::{
    Client, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisConnectionInfo, RedisResult,
};

mod discovery;
mod members;

pub(crate) use self::discovery::SentinelConn;

/// The least time between two discoveries (and the shortest refresh interval).
const MIN_GAP: Duration = Duration::from_millis(50);

/// A Redis Sentinel group, for [`RedisNode::sentinel`](super::RedisNode::sentinel): the
/// sentinels' addresses and the name of the master they watch, with the master's and the
/// sentinels' credentials and TLS.
///
/// **List every sentinel.** The list is a seed: the voter also asks the sentinels the group
/// names, and counts its majority over the whole group (a client whose list is shorter warns
/// once). See [`RedisNode::sentinel`](super::RedisNode::sentinel).
///
/// ```no_run
/// # #[tokio::main] async fn main() -> Result<(), tower_redlock::Error> {
/// use tower_redlock::node::{RedisNode, RedisNodeOptions, Sentinel};
///
/// let group = Sentinel::new("payments", ["10.0.1.1:26379", "10.0.1.2:26379", "10.0.1.3:26379"])?
///     .master_password(None, "master-secret")
///     .sentinel_password(None, "sentinel-secret");
/// let voter = RedisNode::sentinel(group, &RedisNodeOptions::default())?;
/// # Ok(()) }
/// ```
///
/// The same voter by URL (what [`RedisNode::open`](super::RedisNode::open),
/// [`Redlock::new`](crate::Redlock::new) and the examples' `REDLOCK_URLS` accept):
/// `redis+sentinel://:master-secret@10.0.1.1:26379,10.0.1.2:26379,10.0.1.3:26379/payments?sentinel_password=sentinel-secret`.
#[derive(Clone)]
pub struct Sentinel {
    master_name: String,
    sentinels: Vec<(String, u16)>,
    master: RedisConnectionInfo,
    sentinel_auth: RedisConnectionInfo,
    tls: bool,
    #[cfg(feature = "tls")]
    certs: Option<redis::TlsCertificates>,
    refresh: Duration,
}

impl fmt::Debug for Sentinel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sentinel")
            .field("master_name", &self.master_name)
            .field("sentinels", &self.sentinels)
            .field("tls", &self.tls)
            .field("refresh", &self.refresh)
            .finish_non_exhaustive()
    }
}

impl Sentinel {
    /// The group whose master the sentinels know as `master_name`, through the sentinels at
    /// `sentinels` (`host:port`, `[v6]:port`; the port defaults to 26379). An empty name,
    /// no sentinel, or an address that does not parse is an invalid-input error.
    ///
    /// # Errors
    ///
    /// [`Error::is_invalid_input`](crate::Error::is_invalid_input): an empty name, no
    /// sentinel, or an address that does not parse.
    pub fn new<I, S>(master_name: &str, sentinels: I) -> crate::Result<Self>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        if master_name.is_empty() || master_name.chars().any(char::is_whitespace) {
            return Err(crate::Error::invalid(format!(
                "a Sentinel master name must be a non-empty word, not `{master_name}`"
            )));
        }
        let sentinels = sentinels
            .into_iter()
            .map(|s| host_port(s.as_ref(), 26379))
            .collect::<crate::Result<Vec<_>>>()?;
        if sentinels.is_empty() {
            return Err(crate::Error::invalid(format!(
                "the Sentinel group `{master_name}` needs at least one sentinel address"
            )));
        }
        Ok(Self {
            master_name: master_name.to_owned(),
            sentinels,
            master: RedisConnectionInfo::default(),
            sentinel_auth: RedisConnectionInfo::default(),
            tls: false,
            #[cfg(feature = "tls")]
            certs: None,
            refresh: Duration::from_secs(1),
        })
    }

    /// `AUTH` for the master (and for the replica a failover promotes).
    pub fn master_password(mut self, username: Option<&str>, password: &str) -> Self {
        self.master = with_auth(self.master, username, password);
        self
    }

    /// The master's database (default 0).
    pub fn master_db(mut self, db: i64) -> Self {
        self.master = self.master.set_db(db);
        self
    }

    /// `AUTH` for the sentinels.
    pub fn sentinel_password(mut self, username: Option<&str>, password: &str) -> Self {
        self.sentinel_auth = with_auth(self.sentinel_auth, username, password);
        self
    }

    /// TLS to the sentinels and the master (needs the `tls` feature; without it, building
    /// the voter is an invalid-input error), verified against the web PKI roots or
    /// [`tls_certificates`](Self::tls_certificates).
    pub fn tls(mut self) -> Self {
        self.tls = true;
        self
    }

    /// TLS with a private CA or client certificates, to the sentinels and the master.
    #[cfg(feature = "tls")]
    pub fn tls_certificates(mut self, certs: redis::TlsCertificates) -> Self {
        self.tls = true;
        self.certs = Some(certs);
        self
    }

    /// How often the voter asks the sentinels which master is current, besides at once
    /// after a failed request (default 1 s; at least 50 ms). A shorter period notices a
    /// failover sooner.
    ///
    /// It also sets the voter's **majority window**: twice this period plus twice the connect
    /// timeout ([`RedisNodeOptions::connect_timeout`], which bounds each question to the sentinels
    /// and to the master) — 4 s by default. The voter grants, extends and completes only while a
    /// majority of its sentinels has named its master within the window. That is a majority of the
    /// whole group, not only those listed: see [`RedisNode::sentinel`](super::RedisNode::sentinel).
    /// Otherwise it abstains. A voter cut off from most of its sentinels (a zone split) stops
    /// voting within the window, whatever the sentinels it still hears say. Releases always go
    /// through. The failover protection of a promoted master covers this window on top of the
    /// longest ttl (see [`RedisNode::sentinel`](super::RedisNode::sentinel)). **Every client of a
    /// group must use the same refresh interval, connect timeout and protection window.** Otherwise
    /// the promoted master may vote while a client with a longer window still votes on the old one.
    pub fn refresh_interval(mut self, every: Duration) -> Self {
        self.refresh = every.max(MIN_GAP);
        self
    }

    /// The majority window (see [`Sentinel::refresh_interval`]). A confirmation is dated when its
    /// discovery starts; the next lands a refresh interval and two discoveries later. A discovery
    /// is two questions (the sentinels, then the master's `ROLE`), each bounded by the connect
    /// timeout. So two take up to four connect timeouts. The window lapses in a group whose two
    /// discoveries in a row take more than a refresh interval plus two connect timeouts (3 s by
    /// default; a healthy group answers in milliseconds). Then the voter abstains until the next
    /// confirmation: safe, counted as unavailable. A window covering four connect timeouts would
    /// never lapse, at the cost of a longer failover protection.
    pub(super) fn window(&self, options: &RedisNodeOptions) -> Duration {
        self.refresh * 2 + options.connect_timeout * 2
    }

    /// The voter's name in errors and logs: `sentinel:<master name>`.
    pub(super) fn name(&self) -> String {
        format!("sentinel:{}", self.master_name)
    }

    fn client(&self, host: &str, port: u16, auth: &RedisConnectionInfo) -> RedisResult<Client> {
        let addr = if self.tls {
            ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host.to_owned(), port)
        };
        let info: ConnectionInfo = addr
            .into_connection_info()?
            .set_redis_settings(auth.clone());
        #[cfg(feature = "tls")]
        if let Some(certs) = &self.certs {
            return Client::build_with_tls(info, certs.clone());
        }
        Client::open(info)
    }
}

fn with_auth(
    info: RedisConnectionInfo,
    username: Option<&str>,
    password: &str,
) -> RedisConnectionInfo {
    let info = info.set_password(password);
    match username {
        Some(user) => info.set_username(user),
        None => info,
    }
}

/// `host:port`, `[v6]:port` or `host` (with `default_port`).
pub(super) fn host_port(s: &str, default_port: u16) -> crate::Result<(String, u16)> {
    let bad = || crate::Error::invalid(format!("`{s}` is not a `host:port` address"));
    let s = s.trim();
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or_else(bad)?;
        match after.strip_prefix(':') {
            Some(p) => (host, p.parse().map_err(|_| bad())?),
            None if after.is_empty() => (host, default_port),
            None => return Err(bad()),
        }
    } else {
        match s.rsplit_once(':') {
            Some((host, p)) if !host.contains(':') => (host, p.parse().map_err(|_| bad())?),
            Some(_) => return Err(bad()),
            None => (s, default_port),
        }
    };
    if host.is_empty() || host.contains(['/', '@', ' ', ',']) || port == 0 {
        return Err(bad());
    }
    Ok((host.to_owned(), port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_sentinel_addresses() {
        assert_eq!(
            host_port("10.0.0.1:26380", 26379).unwrap(),
            ("10.0.0.1".into(), 26380)
        );
        assert_eq!(
            host_port("sentinel-a", 26379).unwrap(),
            ("sentinel-a".into(), 26379)
        );
        assert_eq!(
            host_port("[::1]:5000", 26379).unwrap(),
            ("::1".into(), 5000)
        );
        assert_eq!(host_port("[::1]", 26379).unwrap(), ("::1".into(), 26379));
        for bad in [
            "", ":1", "h:0", "h:x", "h:70000", "::1:5", "[::1", "a b:1", "u@h:1",
        ] {
            assert!(host_port(bad, 26379).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_group_needs_a_name_and_a_sentinel() {
        assert!(Sentinel::new("", ["h:1"]).is_err());
        assert!(Sentinel::new("a b", ["h:1"]).is_err());
        assert!(Sentinel::new("m", Vec::<&str>::new()).is_err());
        let g = Sentinel::new("m", ["h:1", "[::1]:2"]).unwrap();
        assert_eq!(g.name(), "sentinel:m");
        // Credentials stay out of Debug.
        let g = g.master_password(Some("u"), "hunter2");
        assert!(!format!("{g:?}").contains("hunter2"));
    }
}
