//! `redlock unlock --force` on a terminal (a pseudo-terminal, `pty.rs`): the confirmation
//! typed there — the resource or `yes` — deletes the lock from the real masters, anything
//! else deletes nothing (exit 2); the library's warn line of the forced release shows on the
//! terminal (stderr), never on stdout; `-v` adds the command's info line, and `RUST_LOG`
//! replaces the filter (`off` hides even the warning). `--any-holder --yes` still asks; the
//! answer is trimmed, then must be `yes` or the whole resource; at `-vvv` the log holds no
//! password and no key, only its hash.

use std::time::Duration;

use tower_redlock::Redlock;
use tower_redlock_testkit::apps::{assert_held, client_of};
use tower_redlock_testkit::Masters;

use crate::common::url_args;
use crate::pty::{Finished, OnTerminal};

/// The prompt's last words, after which `unlock` reads the answer.
const PROMPT: &str = "or yes to confirm: ";
/// The library's warn line of a forced release (`Redlock::force_release`).
const WARNED: &str = "forced release of a lock (an operator's act)";
/// The command's `-v` line (`voters::client`).
const VOTERS_LINE: &str = "the client's voters";

/// Three masters holding `key` for a holder that crashed, the client that took it, and its
/// token prefix as `redlock inspect` shows it.
async fn stuck(key: &str) -> (Masters, Redlock, String) {
    let masters = Masters::start(3);
    let client = client_of(&masters).await;
    std::mem::forget(client.try_lock(key, Duration::from_secs(60)).await.unwrap());
    assert_held(&masters, key).await;
    let seen = client.inspect(key).await.unwrap();
    let prefix = seen.holder().expect("a holder").token_prefix;
    (masters, client, prefix)
}

/// Runs `redlock args… <urls>` on a terminal, answers the prompt with `answer`, and waits for
/// the end (off the runtime's threads: the terminal is read with blocking calls).
async fn answered(
    masters: &Masters,
    args: &[&str],
    env: &[(&str, &str)],
    answer: &str,
) -> Finished {
    answered_with(url_args(masters), args, env, answer).await
}

/// [`answered`] with the voters' flags given: `redlock args… flags…`.
async fn answered_with(
    flags: Vec<String>,
    args: &[&str],
    env: &[(&str, &str)],
    answer: &str,
) -> Finished {
    let mut argv: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    argv.extend(flags);
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let answer = answer.to_owned();
    tokio::task::spawn_blocking(move || {
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let mut run = OnTerminal::spawn(&argv, &env);
        run.wait_for(PROMPT);
        run.type_line(&answer);
        run.finish()
    })
    .await
    .expect("the terminal session")
}

#[tokio::test(flavor = "multi_thread")]
async fn force_unlock_cli_on_a_terminal_typing_the_resource_deletes_and_logs_a_warning() {
    let key = "job:tty";
    let (masters, _client, prefix) = stuck(key).await;
    let args = [
        "unlock", "--force", key, "--holder", &prefix, "--by", "oncall",
    ];
    let done = answered(&masters, &args, &[], key).await;
    assert_eq!(done.code, 0, "{done:?}");
    assert!(
        done.terminal
            .contains(&format!("Type the resource ({key})")),
        "{done:?}"
    );
    assert_eq!(done.stdout.matches("lock deleted").count(), 3, "{done:?}");
    assert!(
        masters.absent_everywhere(key).await,
        "the lock survived a confirmed unlock"
    );
    // The library's own line, through the command's subscriber: on the terminal (stderr),
    // at WARN, with who asked and the holder; not on stdout. Without -v, no info line.
    let warned = done
        .terminal
        .lines()
        .find(|l| l.contains(WARNED))
        .unwrap_or_else(|| panic!("no warn line: {done:?}"));
    assert!(
        warned.contains("WARN") && warned.contains("tower_redlock"),
        "{warned}"
    );
    assert!(
        warned.contains("by=oncall") && warned.contains(&prefix),
        "{warned}"
    );
    assert!(!done.stdout.contains(WARNED), "{done:?}");
    assert!(!done.terminal.contains(VOTERS_LINE), "{done:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn force_unlock_cli_any_holder_on_a_terminal_typing_yes_deletes_and_stdout_stays_json() {
    let key = "job:tty-any";
    let (masters, _client, _) = stuck(key).await;
    let args = [
        "unlock",
        "--force",
        key,
        "--any-holder",
        "--json",
        "--by",
        "oncall",
    ];
    let done = answered(&masters, &args, &[], "yes").await;
    assert_eq!(done.code, 0, "{done:?}");
    assert!(done.terminal.contains("whatever its holder"), "{done:?}");
    assert!(
        masters.absent_everywhere(key).await,
        "the lock survived a confirmed unlock"
    );
    // Only the JSON on stdout; the prompt and the warning on the terminal.
    let report: serde_json::Value = serde_json::from_str(&done.stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON value ({e}): {done:?}"));
    assert_eq!(report["locks_deleted"], 3, "{report}");
    assert!(done.terminal.contains(WARNED), "{done:?}");
    assert!(done.terminal.contains("holder=\"any\""), "{done:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn force_unlock_cli_on_a_terminal_any_other_answer_refuses_and_deletes_nothing() {
    let key = "job:tty-no";
    let (masters, client, prefix) = stuck(key).await;
    let holder = [
        "unlock", "--force", key, "--holder", &prefix, "--by", "oncall",
    ];
    let any = ["unlock", "--force", key, "--any-holder", "--by", "oncall"];
    // A refusal, a prefix of the resource, an empty line: none is a confirmation.
    for (args, answer) in [(&holder[..], "no"), (&any[..], "job"), (&holder[..], "")] {
        let done = answered(&masters, args, &[], answer).await;
        assert_eq!(done.code, 2, "{answer:?}: {done:?}");
        assert!(
            done.terminal.contains("not confirmed: nothing deleted"),
            "{done:?}"
        );
        assert!(!done.terminal.contains(WARNED), "released anyway: {done:?}");
        assert!(done.stdout.is_empty(), "{done:?}");
        assert!(
            masters.values(key).await.iter().all(Option::is_some),
            "{answer:?} deleted the lock"
        );
    }
    assert!(
        client.try_lock(key, Duration::from_secs(5)).await.is_err(),
        "no longer held"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn verbose_cli_v_adds_info_and_rust_log_replaces_the_filter() {
    let key = "job:tty-log";
    let (masters, client, _) = stuck(key).await;
    let unlock = |more: &'static [&'static str]| {
        let mut args = vec!["unlock", "--force", key, "--any-holder", "--by", "oncall"];
        args.extend(more);
        args
    };
    let relock = || async {
        std::mem::forget(client.try_lock(key, Duration::from_secs(60)).await.unwrap());
        assert_held(&masters, key).await;
    };

    // -v: the command's info line (the voters it asks, as host:port) and the warning.
    let done = answered(&masters, &unlock(&["-v"]), &[], "yes").await;
    assert_eq!(done.code, 0, "{done:?}");
    let info = done.terminal.lines().find(|l| l.contains(VOTERS_LINE));
    let info = info.unwrap_or_else(|| panic!("no info line with -v: {done:?}"));
    assert!(
        info.contains("INFO") && info.contains("127.0.0.1:"),
        "{info}"
    );
    assert!(!info.contains("redis://"), "a URL in the log: {info}");
    assert!(done.terminal.contains(WARNED), "{done:?}");
    assert!(
        !done.stdout.contains(VOTERS_LINE) && !done.stdout.contains(WARNED),
        "{done:?}"
    );

    // RUST_LOG=off: nothing logged, even with -vv; the unlock itself is done.
    relock().await;
    let done = answered(&masters, &unlock(&["-vv"]), &[("RUST_LOG", "off")], "yes").await;
    assert_eq!(done.code, 0, "{done:?}");
    assert!(masters.absent_everywhere(key).await);
    assert!(
        !done.terminal.contains(WARNED),
        "RUST_LOG=off showed: {done:?}"
    );
    assert!(
        !done.terminal.contains(VOTERS_LINE),
        "RUST_LOG=off showed: {done:?}"
    );

    // RUST_LOG naming the library's module alone: its warning, not the command's info.
    relock().await;
    let env = [("RUST_LOG", "tower_redlock::operate=warn")];
    let done = answered(&masters, &unlock(&["-v"]), &env, "yes").await;
    assert_eq!(done.code, 0, "{done:?}");
    assert!(done.terminal.contains(WARNED), "{done:?}");
    assert!(
        !done.terminal.contains(VOTERS_LINE),
        "-v beat RUST_LOG: {done:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn force_unlock_cli_any_holder_with_yes_still_asks_on_the_terminal() {
    let key = "job:tty-any-yes";
    let (masters, client, _) = stuck(key).await;
    let args = [
        "unlock",
        "--force",
        key,
        "--any-holder",
        "--yes",
        "--by",
        "oncall",
    ];
    // --yes does not skip the question: the prompt shows, and a refusal deletes nothing.
    let done = answered(&masters, &args, &[], "no").await;
    assert_eq!(done.code, 2, "{done:?}");
    assert!(done.terminal.contains("whatever its holder"), "{done:?}");
    assert!(
        done.terminal.contains("not confirmed: nothing deleted"),
        "{done:?}"
    );
    assert!(!done.terminal.contains(WARNED), "released anyway: {done:?}");
    assert!(done.stdout.is_empty(), "{done:?}");
    assert!(
        masters.values(key).await.iter().all(Option::is_some),
        "--any-holder --yes deleted without a typed confirmation"
    );
    assert!(client.try_lock(key, Duration::from_secs(5)).await.is_err());

    // Typed, it goes through.
    let done = answered(&masters, &args, &[], "yes").await;
    assert_eq!(done.code, 0, "{done:?}");
    assert!(done.terminal.contains(PROMPT), "{done:?}");
    assert!(masters.absent_everywhere(key).await, "{done:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn force_unlock_cli_confirmation_trims_whitespace_but_wants_yes_or_the_whole_resource() {
    let key = "job:tty-answers";
    let (masters, client, mut prefix) = stuck(key).await;
    // Not a confirmation: another case, a prefix of yes, the resource with a character more.
    let more = format!("{key}x");
    for answer in ["YES", "Yes", "y", more.as_str()] {
        let args = ["unlock", "--force", key, "--holder", &prefix];
        let done = answered(&masters, &args, &[], answer).await;
        assert_eq!(done.code, 2, "{answer:?}: {done:?}");
        assert!(
            done.terminal.contains("not confirmed: nothing deleted"),
            "{answer:?}: {done:?}"
        );
        assert!(!done.terminal.contains(WARNED), "{answer:?}: {done:?}");
        assert!(
            masters.values(key).await.iter().all(Option::is_some),
            "{answer:?} deleted the lock"
        );
    }
    // A confirmation: yes or the resource, the spaces around it dropped.
    let padded = format!("  {key} ");
    for answer in [" yes", "yes ", padded.as_str()] {
        let args = ["unlock", "--force", key, "--holder", &prefix];
        let done = answered(&masters, &args, &[], answer).await;
        assert_eq!(done.code, 0, "{answer:?}: {done:?}");
        assert_eq!(done.stdout.matches("lock deleted").count(), 3, "{done:?}");
        assert!(
            masters.absent_everywhere(key).await,
            "{answer:?} did not confirm: {done:?}"
        );
        // The next holder, crashed too, for the next answer.
        std::mem::forget(client.try_lock(key, Duration::from_secs(60)).await.unwrap());
        assert_held(&masters, key).await;
        prefix = client
            .inspect(key)
            .await
            .unwrap()
            .holder()
            .expect("a holder")
            .token_prefix;
    }
}

/// The lines of the log on the terminal (`tracing`'s: a timestamp, then the level), not the
/// prompt's, the typed answer's or the command's own messages.
fn log_lines(screen: &str) -> Vec<&str> {
    screen
        .lines()
        .filter(|l| {
            l.starts_with(|c: char| c.is_ascii_digit())
                && [" TRACE ", " DEBUG ", " INFO ", " WARN ", " ERROR "]
                    .iter()
                    .any(|level| l.contains(level))
        })
        .collect()
}

/// `GET key` on the master at `port`, which needs `password`.
async fn get_with_password(port: u16, password: &str, key: &str) -> Option<String> {
    let url = format!("redis://:{password}@127.0.0.1:{port}");
    let mut conn = redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    redis::cmd("GET")
        .arg(key)
        .query_async(&mut conn)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn verbose_cli_trace_logs_no_password_and_only_the_keys_hash() {
    const PASSWORD: &str = "tty-S3cret-pa55";
    const WRONG: &str = "tty-Wr0ng-pa55";
    let key = "invoice:tty-trace-7";
    let masters = Masters::start(4);
    let client = client_of(&masters).await;
    std::mem::forget(client.try_lock(key, Duration::from_secs(60)).await.unwrap());
    assert_held(&masters, key).await;
    let prefix = client
        .inspect(key)
        .await
        .unwrap()
        .holder()
        .expect("a holder")
        .token_prefix;
    // Every master needs the password now; the last one is given a wrong one.
    for master in masters.iter() {
        let () = master
            .query(
                redis::cmd("CONFIG")
                    .arg("SET")
                    .arg("requirepass")
                    .arg(PASSWORD),
            )
            .await;
    }
    let flags: Vec<String> = masters
        .iter()
        .enumerate()
        .flat_map(|(i, m)| {
            let password = if i == 3 { WRONG } else { PASSWORD };
            let url = format!("redis://:{password}@127.0.0.1:{}", m.port());
            ["--url".to_owned(), url]
        })
        .chain(["--timeout".to_owned(), "1000".to_owned()])
        .collect();
    let args = [
        "unlock", "--force", key, "--holder", &prefix, "-vvv", "--by", "oncall",
    ];
    let done = answered_with(flags, &args, &[], "yes").await;

    // Three voters answered, the one with the wrong password did not: exit 1.
    assert_eq!(done.code, 1, "{done:?}");
    assert_eq!(done.stdout.matches("lock deleted").count(), 3, "{done:?}");
    assert_eq!(done.stdout.matches("error:").count(), 1, "{done:?}");
    for (i, master) in masters.iter().enumerate() {
        let left = get_with_password(master.port(), PASSWORD, key).await;
        assert_eq!(left.is_some(), i == 3, "master {i}: {left:?}");
    }

    // No password, right or wrong, and no URL anywhere: terminal (prompt, log) or stdout.
    for text in [&done.terminal, &done.stdout] {
        assert!(
            !text.contains(PASSWORD) && !text.contains(WRONG),
            "a password printed: {done:?}"
        );
        assert!(!text.contains("redis://"), "a URL printed: {done:?}");
    }
    // The log, at trace: the voters line and the warning, whose key is its hash; the
    // resource (here the Redis key itself) is in no log line, only in the prompt and stdout.
    let log = log_lines(&done.terminal);
    assert!(log.iter().any(|l| l.contains(VOTERS_LINE)), "{done:?}");
    let warned = log.iter().find(|l| l.contains(WARNED));
    let warned = warned.unwrap_or_else(|| panic!("no warn line: {done:?}"));
    let hash = warned
        .split_once("key_hash=")
        .map(|(_, rest)| rest.split(' ').next().unwrap_or(""))
        .unwrap_or_else(|| panic!("no key_hash: {warned}"));
    assert!(
        hash.len() == 16 && hash.chars().all(|c| c.is_ascii_hexdigit()),
        "{warned}"
    );
    for line in &log {
        assert!(!line.contains(key), "the raw key in the log: {line}");
    }
    assert!(done
        .terminal
        .contains(&format!("Type the resource ({key})")));
    assert!(done.stdout.contains(&format!("forced release of {key}")));
}
