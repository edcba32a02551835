//! A master whose wall clock is really off: [`RedisServer::start_with_clock_offset`] runs a
//! `redis-server` with `skew/clock_offset.c` preloaded (compiled here, once per process, with
//! the machine's C compiler), so `TIME`, `PX` expiries and the scripts' clock reads are all
//! shifted by a fixed offset. (Debian's libfaketime recurses at start-up inside Debian's
//! jemalloc-linked `redis-server`; the file says why.)

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::launch::Launch;
use crate::server::RedisServer;

const SOURCE: &str = include_str!("../skew/clock_offset.c");

/// The preload library, compiled once per process into the temp dir (by the hash of its
/// source, written under a temporary name and renamed: test processes may race).
fn library() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let hash = SOURCE.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        let dir = std::env::temp_dir();
        let lib = dir.join(format!("tower-redlock-clock-offset-{hash:016x}.so"));
        if lib.exists() {
            return lib;
        }
        let src = dir.join(format!(
            "tower-redlock-clock-offset-{}.c",
            std::process::id()
        ));
        let tmp = dir.join(format!(
            "tower-redlock-clock-offset-{}.so",
            std::process::id()
        ));
        std::fs::write(&src, SOURCE).unwrap_or_else(|e| panic!("write {src:?}: {e}"));
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
        let out = Command::new(&cc)
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&tmp)
            .arg(&src)
            .output()
            .unwrap_or_else(|e| {
                panic!("run `{cc}` to build the clock-offset library ({e}): install gcc")
            });
        let _ = std::fs::remove_file(&src);
        assert!(
            out.status.success(),
            "`{cc}` could not build the clock-offset library: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::rename(&tmp, &lib).unwrap_or_else(|e| panic!("rename {tmp:?}: {e}"));
        lib
    })
}

impl RedisServer {
    /// Starts a master whose wall clock runs `offset` ahead (`ahead`) of this machine's, or
    /// behind it: its `TIME`, its expiries and its scripts' clock all see the offset.
    pub fn start_with_clock_offset(offset: Duration, ahead: bool) -> Self {
        let us = i64::try_from(offset.as_micros()).expect("an offset that fits");
        let us = if ahead { us } else { -us };
        let lib = library().to_string_lossy().into_owned();
        Self::start_launch(false, |_port| Launch {
            config: None,
            args: Vec::new(),
            env: vec![
                ("LD_PRELOAD".to_owned(), lib.clone()),
                ("TOWER_REDLOCK_CLOCK_OFFSET_US".to_owned(), us.to_string()),
            ],
        })
    }

    /// The server's `TIME`, in microseconds since 1970.
    pub async fn time_us(&self) -> i64 {
        let (s, us): (i64, i64) = self.query(&redis::cmd("TIME")).await;
        s * 1_000_000 + us
    }
}
