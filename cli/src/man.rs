//! `redlock man [SUBCOMMAND]`: the man page clap_mangen renders from the command line's own
//! definition, as roff on stdout — redlock(1), or redlock-SUBCOMMAND(1).

use std::io::Write;

use clap::CommandFactory;
use roff::{bold, roman, Roff};

use crate::args::{Cli, ManArgs, EXIT_CODES};
use crate::exit::{self, Failure, Outcome};

/// Prints the page; exit 2 for a subcommand redlock does not have.
pub fn run(args: &ManArgs) -> Outcome {
    let page = render(args.subcommand.as_deref())?;
    let mut out = std::io::stdout().lock();
    // A closed pipe (`redlock man | head`) is not an error worth a message.
    let _ = out.write_all(page.as_bytes()).and_then(|()| out.flush());
    Ok(exit::OK)
}

/// The roff of redlock(1), or of redlock-SUBCOMMAND(1) (with the global flags among its
/// options). redlock(1) has EXIT STATUS, a paragraph per code, instead of the `--help` text
/// clap_mangen would put under EXTRA (whose lines roff would run together), and ENVIRONMENT;
/// both before VERSION, in man-pages(7)'s order.
fn render(subcommand: Option<&str>) -> Result<String, Failure> {
    // Built, so that a subcommand carries the global flags and its `redlock-…` name.
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut page = Vec::new();
    let rendered = match subcommand {
        None => man(cmd.clone().after_help(None::<&str>)).render(&mut page),
        Some(name) => match cmd.find_subcommand(name) {
            Some(sub) => man(sub.clone()).render(&mut page),
            None => {
                let names: Vec<&str> = cmd.get_subcommands().map(|s| s.get_name()).collect();
                return Err(Failure::usage(format!(
                    "no subcommand {name:?}: expected one of {}",
                    names.join(", ")
                )));
            }
        },
    };
    rendered.map_err(|e| Failure::usage(format!("cannot render the man page: {e}")))?;
    let mut page = String::from_utf8_lossy(&page).into_owned();
    if subcommand.is_none() {
        let at = page.find("\n.SH VERSION").map_or(page.len(), |i| i + 1);
        page.insert_str(at, &(exit_status() + &environment()));
    }
    Ok(page)
}

/// A page whose footer names redlock and its version, also for a subcommand.
fn man(cmd: clap::Command) -> clap_mangen::Man {
    clap_mangen::Man::new(cmd).source(concat!("redlock ", env!("CARGO_PKG_VERSION")))
}

/// `.SH "EXIT STATUS"`, a tagged paragraph per line of [`EXIT_CODES`] (`  0  done …`).
fn exit_status() -> String {
    let mut roff = Roff::new();
    roff.control("SH", ["EXIT STATUS"]);
    for line in EXIT_CODES.lines().skip(1) {
        let (code, meaning) = line
            .trim()
            .split_once(char::is_whitespace)
            .unwrap_or(("", ""));
        roff.control("TP", [])
            .text([bold(code)])
            .text([roman(meaning.trim())]);
    }
    // `to_roff`: the page already starts with the apostrophe preamble `render` adds.
    roff.to_roff()
}

/// `.SH ENVIRONMENT`: the variables redlock reads.
fn environment() -> String {
    let mut roff = Roff::new();
    roff.control("SH", ["ENVIRONMENT"]);
    for (name, meaning) in [
        (
            "REDLOCK_URLS",
            "The voters' URLs, comma-separated, when no --url is given.",
        ),
        (
            "RUST_LOG",
            "The log filter (tracing-subscriber's EnvFilter syntax, e.g. off, \
             tower_redlock=debug); when set, it replaces the one -v chooses. The log goes to \
             stderr, never stdout.",
        ),
        ("USER", "Who asks, for unlock without --by."),
    ] {
        roff.control("TP", [])
            .text([bold(name)])
            .text([roman(meaning)]);
    }
    roff.to_roff()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn man_cli_exit_status_has_a_paragraph_per_exit_code() {
        let section = exit_status();
        assert!(section.starts_with(".SH \"EXIT STATUS\""), "{section}");
        assert_eq!(section.matches(".TP").count(), 4, "{section}");
        assert!(section.contains("lock's state"), "{section}");
        for code in ["0", "1", "2", "3"] {
            assert!(section.contains(&format!("\\fB{code}\\fR")), "{section}");
        }
    }
}
