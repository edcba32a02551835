//! A throwaway PostgreSQL server ([`PostgresServer`]): a fresh cluster (`initdb`) in a
//! scratch directory, one `postgres` process on a free loopback port, stopped by its own pid
//! and removed on drop — also when a test panics.
//!
//! PostgreSQL refuses to run as root. As root, `initdb` and the server run as the `postgres`
//! OS user (Debian's package creates it), in a directory chowned to it: the child switches
//! its uid and gid itself before `exec`, so the pid we hold is the server's own (no `su` or
//! `runuser` in between whose death would leave the server running). As any other user they
//! run as that user. The binaries come from Debian's newest versioned directory
//! (`/usr/lib/postgresql/<version>/bin`), else from `PATH`.
//!
//! The cluster is built for speed, not durability: `fsync`, `synchronous_commit` and
//! `full_page_writes` off, `trust` authentication, TCP on 127.0.0.1 only, the Unix socket in
//! the scratch directory.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::launch::{free_port, ScratchDir, START_ATTEMPTS};

/// How long a started server may take to accept connections (a shared 2-core box).
const START_DEADLINE: Duration = Duration::from_secs(30);
/// How long an immediate shutdown may take before the server is killed.
const STOP_DEADLINE: Duration = Duration::from_secs(10);

/// One PostgreSQL server on 127.0.0.1 with a fresh cluster: superuser `postgres`, database
/// `postgres`, no password ([`url`](Self::url)).
#[derive(Debug)]
pub struct PostgresServer {
    port: u16,
    child: Option<Child>,
    /// Removed after the server stopped (fields drop after `Drop::drop`).
    dir: ScratchDir,
}

impl PostgresServer {
    /// Makes a cluster with `initdb` and starts a server on a free port; returns once it
    /// accepts connections (its `postmaster.pid` names our child and says `ready`, what
    /// `pg_ctl -w` waits for), within 30 s. Panics, with the server's log, otherwise.
    pub fn start() -> Self {
        let bin = bin_dir().unwrap_or_else(|| {
            panic!(
                "these tests need PostgreSQL (`initdb` under /usr/lib/postgresql/*/bin or on \
                 PATH); install it with `apt-get update && apt-get install -y postgresql` \
                 (scripts/test.sh does when it runs as root)"
            )
        });
        let user = RunAs::detect();
        let dir = ScratchDir::new("postgres");
        user.give(dir.path());
        let data = dir.path().join("data");
        let out = user
            .command(&bin.join("initdb"), dir.path())
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C"])
            .arg("--no-sync")
            .output()
            .unwrap_or_else(|e| panic!("run {:?}: {e}", bin.join("initdb")));
        assert!(
            out.status.success(),
            "initdb exited with {}: {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let mut last_error = String::new();
        for _ in 0..START_ATTEMPTS {
            let port = free_port();
            match spawn_and_wait(&bin, &user, dir.path(), &data, port) {
                Ok(child) => {
                    return Self {
                        port,
                        child: Some(child),
                        dir,
                    }
                }
                // Another process took the port between the probe and the bind: the server
                // exits, and the next attempt takes a fresh port.
                Err(e) => last_error = e,
            }
        }
        panic!("could not start postgres after {START_ATTEMPTS} attempts: {last_error}");
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:PORT/postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// The server's log so far (for a failing test's message).
    pub fn log(&self) -> String {
        std::fs::read_to_string(log_path(self.dir.path())).unwrap_or_default()
    }
}

impl Drop for PostgresServer {
    /// An immediate shutdown (`SIGQUIT` to our child, as `pg_ctl stop -m immediate` sends):
    /// the server ends its backends and exits; killed after 10 s if it has not.
    fn drop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let pid = child.id().to_string();
        let _ = Command::new("sh")
            .args(["-c", r#"kill -s QUIT "$0""#, &pid])
            .status();
        let deadline = Instant::now() + STOP_DEADLINE;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// Who runs `initdb` and the server: the `postgres` OS user when we are root, else us.
#[derive(Debug, Clone, Copy)]
enum RunAs {
    Me,
    User { uid: u32, gid: u32 },
}

impl RunAs {
    fn detect() -> Self {
        if id(&["-u"]) != Some(0) {
            return Self::Me;
        }
        match (id(&["-u", "postgres"]), id(&["-g", "postgres"])) {
            (Some(uid), Some(gid)) => Self::User { uid, gid },
            _ => panic!(
                "PostgreSQL refuses to run as root and there is no `postgres` OS user to run it \
                 as (Debian's postgresql package creates one)"
            ),
        }
    }

    /// Hands `dir` to the user who runs the server.
    fn give(&self, dir: &Path) {
        if let Self::User { uid, gid } = *self {
            std::os::unix::fs::chown(dir, Some(uid), Some(gid))
                .unwrap_or_else(|e| panic!("chown {dir:?} to the postgres user: {e}"));
        }
    }

    /// `program`, run as this user from `cwd` (a directory the user may enter).
    fn command(&self, program: &Path, cwd: &Path) -> Command {
        let mut command = Command::new(program);
        command.current_dir(cwd).stdin(Stdio::null());
        if let Self::User { uid, gid } = *self {
            command.uid(uid).gid(gid);
        }
        command
    }
}

/// `id ARGS` as a number (`id -u`, `id -g postgres`).
fn id(args: &[&str]) -> Option<u32> {
    let out = Command::new("id").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8(out.stdout).ok()?.trim().parse().ok()
}

/// The directory of `initdb`, `postgres` and friends: the newest of Debian's
/// `/usr/lib/postgresql/<version>/bin`, else the one on `PATH` that has `initdb`.
fn bin_dir() -> Option<PathBuf> {
    let version =
        |name: &str| -> Option<Vec<u32>> { name.split('.').map(|p| p.parse().ok()).collect() };
    let debian = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let version = version(entry.file_name().to_str()?)?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .max_by(|a, b| a.0.cmp(&b.0))
        .map(|(_, bin)| bin);
    debian.or_else(|| {
        std::env::split_paths(&std::env::var_os("PATH")?).find(|d| d.join("initdb").is_file())
    })
}

fn log_path(dir: &Path) -> PathBuf {
    dir.join("postgres.log")
}

/// Starts the server of the cluster in `data` on `port` and waits until it accepts
/// connections: its `postmaster.pid` names our child (not a server left over from before)
/// with our port, and its status line says `ready`.
fn spawn_and_wait(
    bin: &Path,
    user: &RunAs,
    dir: &Path,
    data: &Path,
    port: u16,
) -> Result<Child, String> {
    let log = log_path(dir);
    let log_file = std::fs::File::create(&log).map_err(|e| format!("create {log:?}: {e}"))?;
    let log_err = log_file
        .try_clone()
        .map_err(|e| format!("clone {log:?}: {e}"))?;
    let setting = |name: &str, value: &str| ["-c".to_owned(), format!("{name}={value}")];
    let mut child = user
        .command(&bin.join("postgres"), dir)
        .arg("-D")
        .arg(data)
        .args(["-p", &port.to_string()])
        .arg("-k")
        .arg(dir)
        .args(setting("listen_addresses", "127.0.0.1"))
        .args(setting("fsync", "off"))
        .args(setting("synchronous_commit", "off"))
        .args(setting("full_page_writes", "off"))
        .args(setting("shared_buffers", "16MB"))
        .stdout(log_file)
        .stderr(log_err)
        .spawn()
        .map_err(|e| format!("spawn {:?}: {e}", bin.join("postgres")))?;
    let pid = child.id().to_string();
    let port = port.to_string();
    let deadline = Instant::now() + START_DEADLINE;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            let out = std::fs::read_to_string(&log).unwrap_or_default();
            return Err(format!(
                "postgres on port {port} exited with {status}: {}",
                out.trim()
            ));
        }
        // Lines 1, 4 and 8 of `postmaster.pid`: the pid, the port and the status.
        let lock = std::fs::read_to_string(data.join("postmaster.pid")).unwrap_or_default();
        let lines: Vec<&str> = lock.lines().map(str::trim).collect();
        if lines.len() >= 8 && lines[0] == pid && lines[3] == port && lines[7] == "ready" {
            return Ok(child);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            let out = std::fs::read_to_string(&log).unwrap_or_default();
            return Err(format!(
                "postgres on port {port} was not ready within {START_DEADLINE:?}: {}",
                out.trim()
            ));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
