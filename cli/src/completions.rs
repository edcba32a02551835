//! `redlock completions SHELL`: the completion script clap_complete generates from the
//! command line's own definition, on stdout.

use std::io::Write;

use clap::CommandFactory;

use crate::args::{Cli, CompletionsArgs};
use crate::exit::{self, Outcome};

/// Prints the script for `args.shell`.
pub fn run(args: &CompletionsArgs) -> Outcome {
    let mut script = Vec::new();
    clap_complete::generate(args.shell, &mut Cli::command(), "redlock", &mut script);
    let mut out = std::io::stdout().lock();
    // A closed pipe (`redlock completions bash | head`) is not an error worth a message.
    let _ = out.write_all(&script).and_then(|()| out.flush());
    Ok(exit::OK)
}
