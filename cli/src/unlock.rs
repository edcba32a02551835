//! `redlock unlock --force <RESOURCE> --holder <PREFIX>`: deletes the lock of the named
//! holder ([`Redlock::force_release`]) — or, on a terminal only, whatever holds it
//! (`--any-holder`) — after a confirmation.

use std::io::{BufRead, IsTerminal, Write};

use serde::Serialize;
use tower_redlock::operate::{ForceRelease, ForceReleased};
use tower_redlock::Redlock;

use crate::args::{Global, UnlockArgs};
use crate::exit::{self, Failure, Outcome};
use crate::output::json_line;

/// Why `unlock` needs `--force`.
const NEEDS_FORCE: &str = "unlock deletes a lock its holder did not release: if the holder is \
    still alive, the next request takes the lock while the old holder still works (two \
    holders at once; only fencing tokens checked where the data lives stop the old one). \
    Add --force to do it anyway";

/// Why `unlock` needs `--holder`.
const NEEDS_HOLDER: &str = "name the holder to clear: --holder PREFIX, its token prefix as \
    `redlock inspect` shows it (a re-run then spares a holder that took the key meanwhile); \
    --any-holder clears whatever holds the key, on a terminal only";

/// Deletes the named holder's lock (and with `--record` the completion record) on every
/// voter; exit 1 if a voter did not answer, 2 when refused.
pub async fn run(redlock: &Redlock, global: &Global, args: &UnlockArgs) -> Outcome {
    if !args.force {
        return Err(Failure::usage(NEEDS_FORCE));
    }
    if args.holder.is_none() && !args.any_holder {
        return Err(Failure::usage(NEEDS_HOLDER));
    }
    let key = redlock.redis_key(&args.resource);
    let by = args
        .by
        .clone()
        .or_else(|| std::env::var("USER").ok().filter(|u| !u.is_empty()))
        .unwrap_or_else(|| "redlock-cli".to_owned());
    let mut how = ForceRelease::by(by.as_str());
    how = match &args.holder {
        Some(prefix) => how.holder(prefix.as_str()),
        None => how.any_holder(),
    };
    if args.record {
        how = how.with_record();
    }
    how.check().map_err(Failure::usage)?;
    // Whatever holds it: confirmed on a terminal, always.
    if args.any_holder || !args.yes {
        confirm(&args.resource, &key, redlock.node_count(), args)?;
    }
    let done = redlock
        .force_release(&args.resource, how)
        .await
        .map_err(Failure::usage)?;
    if global.json {
        json_line(&Report::of(&key, &by, &done));
    } else {
        print!("{}", text(&key, &by, args, &done));
    }
    Ok(if done.is_complete() {
        exit::OK
    } else {
        exit::VOTERS
    })
}

/// Asks on the terminal; refuses when stdin is not one.
fn confirm(resource: &str, key: &str, voters: usize, args: &UnlockArgs) -> Result<(), Failure> {
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        return Err(Failure::usage(if args.any_holder {
            "refusing --any-holder without a confirmation typed on a terminal: stdin is not a \
             terminal; name the holder with --holder PREFIX instead"
        } else {
            "refusing to force an unlock without confirmation: stdin is not a terminal; \
             add --yes"
        }));
    }
    let whose = match &args.holder {
        Some(prefix) => format!("held by {prefix}"),
        None => "whatever its holder — also one that took it a moment ago".to_owned(),
    };
    eprint!(
        "Delete the lock at {key} on {voters} voter(s), {whose}?\n\
         If the holder is alive, two holders will run at once.\n\
         Type the resource ({resource}) or yes to confirm: "
    );
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    stdin
        .lock()
        .read_line(&mut answer)
        .map_err(|e| Failure::usage(format!("cannot read the confirmation: {e}")))?;
    // Surrounding whitespace is dropped (a stray space, a terminal's carriage return); what
    // is left must be the whole resource or `yes`, exactly: no prefix, no other case. An
    // empty answer (Enter, end of input) never confirms, not even for an empty resource.
    let answer = answer.trim();
    if confirms(answer, resource) {
        Ok(())
    } else {
        Err(Failure::usage("not confirmed: nothing deleted"))
    }
}

/// Whether the trimmed `answer` confirms the unlock of `resource`.
fn confirms(answer: &str, resource: &str) -> bool {
    !answer.is_empty() && (answer == resource || answer == "yes")
}

/// The JSON of a forced release.
#[derive(Debug, Serialize)]
struct Report {
    key: String,
    by: String,
    complete: bool,
    locks_deleted: usize,
    records_deleted: usize,
    voters: Vec<VoterJson>,
}

/// What one voter deleted, or its error.
#[derive(Debug, Serialize)]
struct VoterJson {
    voter: String,
    lock: Option<bool>,
    record: Option<bool>,
    error: Option<String>,
}

impl Report {
    fn of(key: &str, by: &str, done: &ForceReleased) -> Self {
        Self {
            key: key.to_owned(),
            by: by.to_owned(),
            complete: done.is_complete(),
            locks_deleted: done.locks_deleted(),
            records_deleted: done.records_deleted(),
            voters: done
                .voters()
                .map(|(_, name, answer)| VoterJson {
                    voter: name.to_owned(),
                    lock: answer.ok().map(|f| f.lock),
                    record: answer.ok().map(|f| f.record),
                    error: answer.err().map(ToString::to_string),
                })
                .collect(),
        }
    }
}

/// The forced release for people: a line per voter, then the count.
fn text(key: &str, by: &str, args: &UnlockArgs, done: &ForceReleased) -> String {
    let record = args.record;
    let mut out = format!("forced release of {key} by {by}\n");
    // With a holder named, another holder's lock or record is spared, not absent.
    let (no_lock, no_record) = match &args.holder {
        Some(p) => (
            format!("no lock of {p}"),
            "no record deleted with it".to_owned(),
        ),
        None => ("no lock".to_owned(), "no record".to_owned()),
    };
    let width = done.voters().map(|(_, n, _)| n.len()).max().unwrap_or(0);
    for (_, name, answer) in done.voters() {
        let what = match answer {
            Ok(f) => {
                let lock = if f.lock { "lock deleted" } else { &no_lock };
                match (record, f.record) {
                    (false, _) => lock.to_owned(),
                    (true, true) => format!("{lock}, record deleted"),
                    (true, false) => format!("{lock}, {no_record}"),
                }
            }
            Err(e) => format!("error: {e}"),
        };
        out.push_str(&format!("  {name:width$}  {what}\n"));
    }
    let n = done.voters().count();
    out.push_str(&format!(
        "{} lock(s) deleted on {n} voter(s)",
        done.locks_deleted()
    ));
    if record {
        out.push_str(&format!(", {} record(s)", done.records_deleted()));
    }
    let failed = done.errors().count();
    if failed > 0 {
        out.push_str(&format!(
            "; {failed} voter(s) did not answer: run it again once they are back"
        ));
    }
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::confirms;

    #[test]
    fn force_unlock_cli_confirmation_is_the_whole_resource_or_yes_never_empty() {
        assert!(confirms("yes", "job:7") && confirms("job:7", "job:7"));
        for no in [
            "YES", "Yes", "y", "ye", "yess", "job", "job:", "job:77", "no", "",
        ] {
            assert!(!confirms(no, "job:7"), "{no:?} confirmed");
        }
        // An empty resource (refused by the library anyway) is not confirmed by Enter.
        assert!(!confirms("", ""));
    }
}
