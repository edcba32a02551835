//! How a command ends: the exit codes, and a failure with its message.

use std::fmt;
use std::process::ExitCode;

/// Done (for `inspect`: whatever the lock's state).
pub const OK: u8 = 0;
/// A voter did not answer, or a lock error.
pub const VOTERS: u8 = 1;
/// A usage error or bad input (the code clap uses for its own usage errors).
pub const USAGE: u8 = 2;
/// `key`: the request passes through unlocked.
pub const UNLOCKED: u8 = 3;

/// A command that could not do its work: the exit code and what to tell the user (already
/// free of credentials: the library redacts its errors, and the CLI never prints a URL).
#[derive(Debug)]
pub struct Failure {
    /// The exit code.
    pub code: u8,
    /// The message, printed on stderr.
    pub message: String,
}

impl Failure {
    /// A usage error or bad input (exit 2).
    pub fn usage(message: impl fmt::Display) -> Self {
        Self {
            code: USAGE,
            message: message.to_string(),
        }
    }

    /// The exit code for the process.
    pub fn exit_code(&self) -> ExitCode {
        ExitCode::from(self.code)
    }
}

/// What a command returns: its exit code, or a failure to report.
pub type Outcome = Result<u8, Failure>;
