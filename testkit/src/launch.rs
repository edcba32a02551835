//! Spawning `redis-server` processes: the arguments every server gets ([`Launch`] adds a
//! config file and more), free loopback ports, per-server log and RDB files, scratch
//! directories for the topologies, and the readiness check (the answer must come from
//! *our* child's pid).

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::tls_file;

/// How long a server may take to answer its first PING.
const START_DEADLINE: Duration = Duration::from_secs(10);
/// How many fresh ports to try when another process takes ours between probe and start.
pub(crate) const START_ATTEMPTS: usize = 5;

static SERVER_SEQ: AtomicUsize = AtomicUsize::new(0);

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

pub(crate) fn ensure_redis_server() {
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

pub(crate) fn free_port() -> u16 {
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
    /// Environment variables of the process (a clock offset's `LD_PRELOAD`).
    pub(crate) env: Vec<(String, String)>,
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

pub(crate) fn log_path(port: u16) -> PathBuf {
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
pub(crate) fn spawn_and_wait(
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
        .envs(launch.env.iter().map(|(k, v)| (k, v)))
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
