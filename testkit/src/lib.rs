//! The test kit of `tower-redlock` (a workspace member, never published): real
//! `redis-server` masters on free loopback ports, polling helpers, the fault proxy
//! ([`proxy`]), the TLS fixtures ([`tls_file`]), the HTTP helpers ([`http`], [`apps`]) and the
//! multi-process mutual-exclusion checker ([`checker`], and the `soak` binary for long runs).
//!
//! Every test starts its own masters (never a fixed port), so tests run in parallel. A
//! server is killed by its own child pid when it is dropped, also when a test panics.
//!
//! The integration tests of the root crate use it as `use tower_redlock_testkit as support;`.

pub mod apps;
pub mod checker;
pub mod cluster;
pub mod http;
pub mod nodes;
pub mod proxy;
pub mod sentinel;

use std::fmt::Display;
use std::future::Future;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::ops::Index;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use tower_redlock::{Redlock, RedlockBuilder, Retry};

/// How long a server may take to answer its first PING.
const START_DEADLINE: Duration = Duration::from_secs(10);
/// How many fresh ports to try when another process takes ours between probe and start.
const START_ATTEMPTS: usize = 5;
/// The per-node timeout of the test clients: modest, but generous for a shared 2-core box.
pub const NODE_TIMEOUT: Duration = Duration::from_millis(200);

static SERVER_SEQ: AtomicUsize = AtomicUsize::new(0);

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
    /// certificate of `testkit/tls` (see [`tls_file`]: issued to `127.0.0.1` by the test CA
    /// `ca.pem`; no client certificates). The plain port stays for the assertions.
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

/// Polls `check` every 10 ms until it is true; panics with `what` after `within`.
/// Returns how long it took.
pub async fn eventually<F, Fut>(what: impl Display, within: Duration, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return start.elapsed();
        }
        if start.elapsed() > within {
            panic!("timed out after {within:?} waiting until {what}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Whether `s` looks like a lock token: 32 lowercase hex digits.
pub fn is_token(s: &str) -> bool {
    s.len() == 32
        && s.bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
}

// ---------------------------------------------------------------------------------------------

/// A TLS fixture in `testkit/tls`, by file name: `ca.pem` (the test CA), `server.pem` and
/// `server-key.pem` (the masters' certificate, issued to `127.0.0.1` by that CA).
pub fn tls_file(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tls").join(name)
}

/// The version `redis-server --version` reports (`7.0.15`), if it is on `PATH`.
pub fn redis_server_version() -> Option<String> {
    let out = Command::new("redis-server")
        .arg("--version")
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    text.split_whitespace()
        .find_map(|w| w.strip_prefix("v="))
        .map(str::to_owned)
}

fn ensure_redis_server() {
    static CHECKED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    let checked = CHECKED.get_or_init(|| {
        match Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
        {
            Ok(s) if s.success() => Ok(()),
            Ok(s) => Err(format!("`redis-server --version` exited with {s}")),
            Err(e) => Err(e.to_string()),
        }
    });
    if let Err(e) = checked {
        panic!(
            "these tests need `redis-server` on PATH ({e}); install it with \
             `apt-get update && apt-get install -y redis-server`"
        );
    }
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

/// What a server is started with besides the defaults of [`spawn_and_wait`].
#[derive(Debug, Default, Clone)]
pub(crate) struct Launch {
    /// A config file, passed first (`redis-server FILE ...`); a sentinel needs one.
    pub(crate) config: Option<PathBuf>,
    /// Arguments after the defaults (a later directive overrides an earlier one).
    pub(crate) args: Vec<String>,
}

/// A fresh, empty directory under the temp dir for one topology's files (config files,
/// `nodes.conf`), removed on drop: declare it after the servers that use it.
#[derive(Debug)]
pub(crate) struct ScratchDir(PathBuf);

impl ScratchDir {
    pub(crate) fn new(kind: &str) -> Self {
        let n = SERVER_SEQ.fetch_add(1, Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("tower-redlock-{kind}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {dir:?}: {e}"));
        Self(dir)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn log_path(port: u16) -> PathBuf {
    let n = SERVER_SEQ.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!(
        "tower-redlock-test-{}-{n}-{port}.log",
        std::process::id()
    ))
}

/// The RDB file name of the server whose log is `log` (in the temp dir, beside it).
fn rdb_name(log: &Path) -> String {
    log.with_extension("rdb")
        .file_name()
        .expect("a file name")
        .to_string_lossy()
        .into_owned()
}

/// Spawns `redis-server` on `port` and waits until *this* process answers (a port race
/// could put another server there: the answer must carry our child's pid).
fn spawn_and_wait(
    port: u16,
    tls_port: Option<u16>,
    launch: &Launch,
    log: &PathBuf,
) -> Result<Child, String> {
    let log_file = std::fs::File::create(log).map_err(|e| format!("create {log:?}: {e}"))?;
    let mut command = Command::new("redis-server");
    if let Some(config) = &launch.config {
        command.arg(config);
    }
    if let Some(tls_port) = tls_port {
        let file = |name: &str| tls_file(name).to_string_lossy().into_owned();
        command
            .args(["--tls-port", &tls_port.to_string()])
            .args(["--tls-cert-file", &file("server.pem")])
            .args(["--tls-key-file", &file("server-key.pem")])
            .args(["--tls-ca-cert-file", &file("ca.pem")])
            .args(["--tls-auth-clients", "no"]);
    }
    let mut child = command
        .args(["--port", &port.to_string()])
        .args(["--bind", "127.0.0.1"])
        .args(["--save", ""])
        .args(["--appendonly", "no"])
        .args(["--daemonize", "no"])
        .args(["--protected-mode", "no"])
        .args(["--loglevel", "warning"])
        .args(["--logfile", ""])
        .args(["--dir", &std::env::temp_dir().to_string_lossy()])
        // A file of its own: a replica writes the RDB of its full sync there even with
        // `--save ""`, and a shared `dump.rdb` would be loaded by any server that restarts.
        .args(["--dbfilename", &rdb_name(log)])
        .args(&launch.args)
        .stdin(Stdio::null())
        .stdout(log_file)
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("spawn redis-server: {e}"))?;
    let pid = child.id();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let deadline = Instant::now() + START_DEADLINE;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let out = std::fs::read_to_string(log).unwrap_or_default();
            return Err(format!(
                "redis-server on port {port} exited with {status}: {}",
                out.trim()
            ));
        }
        match server_pid(addr) {
            Some(p) if p == pid => return Ok(child),
            Some(other) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "port {port} is taken by another redis-server (pid {other})"
                ));
            }
            None => {}
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "redis-server on port {port} did not answer within {START_DEADLINE:?}"
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The `process_id` of the Redis server answering at `addr`, if one answers.
fn server_pid(addr: SocketAddr) -> Option<u32> {
    let stream = TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_millis(500)))
        .ok()?;
    let mut writer = stream.try_clone().ok()?;
    writer
        .write_all(b"*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n")
        .ok()?;
    let mut reader = BufReader::new(stream);
    let mut header = String::new();
    reader.read_line(&mut header).ok()?;
    // `$<len>\r\n` then the body; `-LOADING …` or anything else: not ready yet.
    let len: usize = header.strip_prefix('$')?.trim().parse().ok()?;
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body).ok()?;
    let body = String::from_utf8_lossy(&body);
    body.lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|p| p.trim().parse().ok())
}

fn describe(cmd: &redis::Cmd) -> String {
    cmd.args_iter()
        .map(|a| match a {
            redis::Arg::Simple(b) => String::from_utf8_lossy(b).into_owned(),
            _ => "<cursor>".to_owned(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

// ---------------------------------------------------------------------------------------------

/// An axum app served on a free loopback port (`127.0.0.1:0`); the accept loop is aborted
/// on drop (connections still open end with the test's runtime).
#[derive(Debug)]
pub struct HttpApp {
    addr: SocketAddr,
    server: tokio::task::JoinHandle<()>,
}

impl HttpApp {
    /// Binds `127.0.0.1:0` and serves `router` in the background.
    pub async fn serve(router: axum::Router) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let server = tokio::spawn(async move {
            axum::serve(listener, router).await.expect("axum::serve");
        });
        Self { addr, server }
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for HttpApp {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// Takes and releases a throw-away lock until one try reached every master, so that the
/// client's lazily made connections are up before a test looks at the masters; then waits
/// until the warm-up key is gone everywhere (a release returns once a quorum answered, the
/// last master follows in the background).
pub async fn warm_up(client: &Redlock, masters: &Masters) {
    eventually(
        "the client reaches every master",
        Duration::from_secs(10),
        || async {
            let Ok(lease) = client.try_lock("warm-up", Duration::from_secs(10)).await else {
                return false;
            };
            let value = lease.value().to_owned();
            let everywhere = masters.everywhere("warm-up", &value).await;
            lease.release().await.expect("release the warm-up lock");
            everywhere
        },
    )
    .await;
    eventually("the warm-up lock is gone", Duration::from_secs(10), || {
        masters.absent_everywhere("warm-up")
    })
    .await;
}
