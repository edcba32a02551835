//! Running the built `redlock` on a pseudo-terminal, as an operator's shell does: stdin and
//! stderr are the terminal (what `unlock`'s prompt reads and writes, and where the log
//! goes), stdout is a pipe of its own — so a test also sees that nothing of the prompt or
//! the log lands on stdout, which `--json` keeps for scripts.
//!
//! Nothing sleeps: the test waits until the terminal shows a text (a reader thread feeds
//! what the terminal shows through a channel), then types, then waits for the end of the
//! terminal (every copy of its other side closed: the process exited).

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use nix::pty::{grantpt, posix_openpt, ptsname_r, unlockpt};

/// How long a step may take on a loaded 2-core machine: far longer than it ever should.
const DEADLINE: Duration = Duration::from_secs(60);

/// A `redlock` process whose stdin and stderr are a terminal.
pub struct OnTerminal {
    child: Child,
    /// The terminal's master side: what is written here is typed, what the process writes to
    /// stderr (and the terminal's echo of what was typed) is read from it.
    keyboard: File,
    shown: Receiver<Vec<u8>>,
    screen: String,
    stdout: Option<JoinHandle<Vec<u8>>>,
}

/// What a finished run left: its exit code, its stdout, and everything the terminal showed.
#[derive(Debug)]
pub struct Finished {
    pub code: i32,
    pub stdout: String,
    pub terminal: String,
}

impl OnTerminal {
    /// Starts `redlock args…` on a new terminal, without the inherited `REDLOCK_URLS` and
    /// `RUST_LOG` (a developer's own would change what is logged), with `env` added.
    pub fn spawn(args: &[&str], env: &[(&str, &str)]) -> Self {
        let (keyboard, terminal) = new_terminal();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_redlock"));
        cmd.args(args)
            .env_remove("REDLOCK_URLS")
            .env_remove("RUST_LOG")
            .envs(env.iter().copied())
            .stdin(Stdio::from(terminal.try_clone().expect("dup the terminal")))
            .stderr(Stdio::from(terminal))
            .stdout(Stdio::piped());
        let mut child = cmd.spawn().expect("the redlock binary runs");
        // The command holds this side's last copies outside the child: once dropped, the
        // terminal ends when the child exits.
        drop(cmd);
        let mut out = child.stdout.take().expect("stdout piped");
        let stdout = std::thread::spawn(move || {
            let mut all = Vec::new();
            let _ = out.read_to_end(&mut all);
            all
        });
        let mut reader = keyboard.try_clone().expect("dup the master side");
        let (tx, shown) = channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // Linux answers EIO once the other side is closed everywhere: the end, as EOF.
            while let Ok(n @ 1..) = reader.read(&mut buf) {
                if tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        Self {
            child,
            keyboard,
            shown,
            screen: String::new(),
            stdout: Some(stdout),
        }
    }

    /// Reads what the terminal shows until `text` is on it (carriage returns dropped); panics
    /// with the screen if it does not come within the deadline or the terminal ends first.
    pub fn wait_for(&mut self, text: &str) {
        let until = Instant::now() + DEADLINE;
        while !self.screen.contains(text) {
            let left = until.saturating_duration_since(Instant::now());
            match self.shown.recv_timeout(left) {
                Ok(bytes) => self.show(&bytes),
                Err(RecvTimeoutError::Timeout) => {
                    panic!("{text:?} not shown within {DEADLINE:?}: {:?}", self.screen)
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("the terminal ended before {text:?}: {:?}", self.screen)
                }
            }
        }
    }

    /// Types `line` and Enter.
    pub fn type_line(&mut self, line: &str) {
        self.keyboard
            .write_all(format!("{line}\n").as_bytes())
            .and_then(|()| self.keyboard.flush())
            .expect("type on the terminal");
    }

    /// Waits for the terminal to end and the process to exit (within the deadline).
    pub fn finish(mut self) -> Finished {
        let until = Instant::now() + DEADLINE;
        loop {
            let left = until.saturating_duration_since(Instant::now());
            match self.shown.recv_timeout(left) {
                Ok(bytes) => self.show(&bytes),
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {
                    let _ = self.child.kill();
                    panic!(
                        "redlock still running after {DEADLINE:?}: {:?}",
                        self.screen
                    )
                }
            }
        }
        let status = self.child.wait().expect("wait for redlock");
        let stdout = self.stdout.take().expect("finished once");
        let stdout = stdout.join().expect("the stdout reader");
        Finished {
            code: status.code().expect("exited, not killed"),
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            terminal: std::mem::take(&mut self.screen),
        }
    }

    fn show(&mut self, bytes: &[u8]) {
        self.screen
            .push_str(&String::from_utf8_lossy(bytes).replace('\r', ""));
    }
}

/// A new terminal: its master side (the keyboard and screen) and the terminal itself, both
/// opened close-on-exec — a process another test starts meanwhile must not inherit a copy,
/// which would keep the terminal open after this test's process exited.
fn new_terminal() -> (File, File) {
    let master =
        posix_openpt(OFlag::O_RDWR | OFlag::O_NOCTTY | OFlag::O_CLOEXEC).expect("posix_openpt");
    grantpt(&master).expect("grantpt");
    unlockpt(&master).expect("unlockpt");
    let path = ptsname_r(&master).expect("ptsname_r");
    // std opens with O_CLOEXEC; O_NOCTTY: the test's own session keeps its terminal.
    let terminal = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(OFlag::O_NOCTTY.bits())
        .open(&path)
        .unwrap_or_else(|e| panic!("open {path}: {e}"));
    (File::from(std::os::fd::OwnedFd::from(master)), terminal)
}

impl Drop for OnTerminal {
    /// A test that panicked mid-run leaves no process behind (ours, by its handle).
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}
