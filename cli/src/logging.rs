//! The log on stderr: the library's `tracing` events (a forced release is logged at warn),
//! filtered by `-v` or, when set, `RUST_LOG`. Never on stdout, which `--json` keeps for
//! scripts.

use tracing_subscriber::EnvFilter;

/// The filter `-v`s ask for: every crate's warnings, and the library (and this command) at
/// warn, info (`-v`), debug (`-vv`) or trace (`-vvv` and more).
pub fn directives(verbose: u8) -> String {
    let level = match verbose {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    format!("warn,tower_redlock={level},redlock={level}")
}

/// Installs the subscriber: `RUST_LOG` when set and not blank (it replaces the `-v`
/// filter), else [`directives`]. A `RUST_LOG` that does not parse is reported on stderr and
/// the `-v` filter is used instead.
pub fn init(verbose: u8) {
    let default = || EnvFilter::new(directives(verbose));
    let filter = match std::env::var("RUST_LOG") {
        Ok(env) if !env.trim().is_empty() => EnvFilter::try_new(&env).unwrap_or_else(|e| {
            eprintln!(
                "redlock: RUST_LOG ignored ({e}); using {}",
                directives(verbose)
            );
            default()
        }),
        _ => default(),
    };
    // Without ANSI colours, whatever features another crate of a build turns on: the lines
    // read the same in a terminal, a pipe and a log file.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbose_cli_filter_raises_the_library_from_warn_to_info_debug_trace() {
        assert_eq!(directives(0), "warn,tower_redlock=warn,redlock=warn");
        assert_eq!(directives(1), "warn,tower_redlock=info,redlock=info");
        assert_eq!(directives(2), "warn,tower_redlock=debug,redlock=debug");
        assert_eq!(directives(7), "warn,tower_redlock=trace,redlock=trace");
        for v in 0..4 {
            assert!(EnvFilter::try_new(directives(v)).is_ok());
        }
    }
}
