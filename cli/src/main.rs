//! `redlock`, the command line of tower-redlock: `inspect` who holds a lock on which voter,
//! compute the Redis `key` a request locks, force an `unlock`, and `watch` the locks held
//! under a prefix; its shell `completions` and `man` page. The library's log goes to stderr
//! (`-v`, `RUST_LOG`). See the README beside this crate.

#![forbid(unsafe_code)]
#![warn(missing_docs, missing_debug_implementations)]

mod args;
mod completions;
mod exit;
mod inspect;
mod key;
mod logging;
mod man;
mod output;
mod unlock;
mod voters;
mod watch;

use std::process::ExitCode;

use clap::Parser;

use crate::args::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    logging::init(cli.global.verbose);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("redlock: cannot start the runtime: {e}");
            return ExitCode::from(exit::VOTERS);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            eprintln!("redlock: {}", failure.message);
            failure.exit_code()
        }
    }
}

/// Runs the subcommand; `key`, `completions` and `man` need no voter.
async fn run(cli: Cli) -> exit::Outcome {
    let global = &cli.global;
    match &cli.command {
        Command::Key(args) => key::run(global, args),
        Command::Completions(args) => completions::run(args),
        Command::Man(args) => man::run(args),
        Command::Inspect(args) => inspect::run(&voters::client(global)?, global, args).await,
        Command::Unlock(args) => unlock::run(&voters::client(global)?, global, args).await,
        Command::Watch(args) => watch::run(&voters::client(global)?, global, args).await,
    }
}
