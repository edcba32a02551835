//! One `redis-server` master ([`RedisServer`]): started on a free loopback port (plain or
//! TLS), frozen, thawed, stopped and restarted, and queried with raw commands for the
//! tests' assertions. How the process is spawned and found ready is in `launch`.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::sync::Mutex;

use redis::aio::MultiplexedConnection;

use crate::launch::{
    ensure_redis_server, free_port, log_path, spawn_and_wait, Launch, START_ATTEMPTS,
};

/// One `redis-server` master on 127.0.0.1, killed (by its own pid) on drop.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    /// The TLS port, when started with [`RedisServer::start_tls`].
    tls_port: Option<u16>,
    log: PathBuf,
    /// The config file and extra arguments it was started with (kept for `restart`).
    launch: Launch,
    child: Mutex<Option<Child>>,
    /// A raw connection for assertions, made on first use (within the test's runtime).
    raw: Mutex<Option<MultiplexedConnection>>,
}

impl RedisServer {
    /// Starts a master on a free port and waits until it answers.
    pub fn start() -> Self {
        Self::start_with(false)
    }

    /// Starts a master that also serves TLS, on a second free port, with the test
    /// certificate of `testkit/tls` (see [`tls_file`](crate::tls_file): issued to `127.0.0.1`
    /// by the test CA `ca.pem`; no client certificates). The plain port stays for the
    /// assertions.
    pub fn start_tls() -> Self {
        Self::start_with(true)
    }

    fn start_with(tls: bool) -> Self {
        Self::start_launch(tls, |_| Launch::default())
    }

    /// Starts a server on a free port with what `launch` returns for that port (a config
    /// file, extra arguments: sentinels and cluster nodes), retrying on fresh ports.
    pub(crate) fn start_launch(tls: bool, mut launch: impl FnMut(u16) -> Launch) -> Self {
        ensure_redis_server();
        let mut last_error = String::new();
        for _ in 0..START_ATTEMPTS {
            let port = free_port();
            let tls_port = tls.then(free_port);
            let log = log_path(port);
            let launch = launch(port);
            match spawn_and_wait(port, tls_port, &launch, &log) {
                Ok(child) => {
                    return Self {
                        port,
                        tls_port,
                        log,
                        launch,
                        child: Mutex::new(Some(child)),
                        raw: Mutex::new(None),
                    }
                }
                Err(e) => {
                    let _ = std::fs::remove_file(&log);
                    last_error = e;
                }
            }
        }
        panic!("could not start redis-server after {START_ATTEMPTS} attempts: {last_error}");
    }

    /// The port it listens on (kept across `stop`/`restart`).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// `rediss://127.0.0.1:TLS_PORT`, for a server started with [`RedisServer::start_tls`].
    pub fn tls_url(&self) -> String {
        let port = self.tls_port.expect("started with start_tls");
        format!("rediss://127.0.0.1:{port}")
    }

    /// The name a `RedisNode` for this server reports (`host:port`).
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The pid of the running process (`None` once stopped).
    pub fn pid(&self) -> Option<u32> {
        self.child.lock().unwrap().as_ref().map(Child::id)
    }

    /// Freezes the server (`SIGSTOP`): its port still accepts connections, but nothing is
    /// answered until [`RedisServer::thaw`] — a master that hangs rather than one that is
    /// down. Do not query a frozen server.
    pub fn freeze(&self) {
        self.signal("STOP");
    }

    /// Resumes a frozen server (`SIGCONT`).
    pub fn thaw(&self) {
        self.signal("CONT");
    }

    fn signal(&self, sig: &str) {
        let guard = self.child.lock().unwrap();
        let pid = guard.as_ref().expect("the server is running").id();
        let status = Command::new("sh")
            .args(["-c", r#"kill -s "$0" "$1""#, sig, &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -s {sig} {pid}: {status}");
    }

    /// Kills the server (its dataset is lost); the port is kept for `restart`.
    pub fn stop(&self) {
        *self.raw.lock().unwrap() = None;
        if let Some(mut child) = self.child.lock().unwrap().take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port, with an empty dataset, and waits until it
    /// answers.
    pub fn restart(&self) {
        self.stop();
        let mut last_error = String::new();
        // The old listening socket is gone once the process is reaped; a few attempts cover a
        // slow kernel.
        for _ in 0..START_ATTEMPTS {
            match spawn_and_wait(self.port, self.tls_port, &self.launch, &self.log) {
                Ok(child) => {
                    *self.child.lock().unwrap() = Some(child);
                    return;
                }
                Err(e) => last_error = e,
            }
        }
        panic!(
            "could not restart redis-server on port {}: {last_error}",
            self.port
        );
    }

    /// A fresh multiplexed connection for raw commands.
    pub async fn conn(&self) -> MultiplexedConnection {
        redis::Client::open(self.url())
            .expect("valid url")
            .get_multiplexed_async_connection()
            .await
            .unwrap_or_else(|e| panic!("cannot connect to {}: {e}", self.url()))
    }

    /// Runs one raw command and parses the reply (over a cached connection; a broken one is
    /// replaced once).
    pub async fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> T {
        let cached = self.raw.lock().unwrap().clone();
        if let Some(mut conn) = cached {
            match cmd.query_async(&mut conn).await {
                Ok(v) => return v,
                Err(e) if e.is_io_error() || e.is_connection_dropped() => {}
                Err(e) => panic!("{} on {}: {e}", describe(cmd), self.url()),
            }
        }
        let mut conn = self.conn().await;
        *self.raw.lock().unwrap() = Some(conn.clone());
        cmd.query_async(&mut conn)
            .await
            .unwrap_or_else(|e| panic!("{} on {}: {e}", describe(cmd), self.url()))
    }

    /// `GET key`.
    pub async fn get(&self, key: &str) -> Option<String> {
        self.query(redis::cmd("GET").arg(key)).await
    }

    /// `PTTL key` (-2: absent, -1: no expiry).
    pub async fn pttl(&self, key: &str) -> i64 {
        self.query(redis::cmd("PTTL").arg(key)).await
    }

    /// `SET key value NX [PX px]`; whether it was set.
    pub async fn set_nx(&self, key: &str, value: &str, px: Option<u64>) -> bool {
        let mut cmd = redis::cmd("SET");
        cmd.arg(key).arg(value).arg("NX");
        if let Some(px) = px {
            cmd.arg("PX").arg(px);
        }
        let reply: Option<String> = self.query(&cmd).await;
        reply.is_some()
    }

    /// `DEL key`; whether it existed.
    pub async fn del(&self, key: &str) -> bool {
        let n: i64 = self.query(redis::cmd("DEL").arg(key)).await;
        n == 1
    }

    /// `DBSIZE`.
    pub async fn dbsize(&self) -> u64 {
        self.query(&redis::cmd("DBSIZE")).await
    }

    /// `SCRIPT FLUSH`: the next `EVALSHA` answers `NOSCRIPT`.
    pub async fn script_flush(&self) {
        let _: String = self.query(redis::cmd("SCRIPT").arg("FLUSH")).await;
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_file(&self.log);
        let _ = std::fs::remove_file(self.log.with_extension("rdb"));
    }
}

/// A command as text (`SET key value NX`), for the errors of raw queries.
pub(crate) fn describe(cmd: &redis::Cmd) -> String {
    cmd.args_iter()
        .map(|a| match a {
            redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
            _ => "<cursor>".to_owned(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}
