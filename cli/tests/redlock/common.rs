//! Running the built binary, and reading its output.

use std::process::{Output, Stdio};

use serde_json::Value;
use tower_redlock_testkit::Masters;

/// `redlock args…` with stdin closed (not a terminal) and no `REDLOCK_URLS` inherited.
pub async fn redlock(args: &[&str]) -> Output {
    redlock_with_env(args, &[]).await
}

/// `redlock args…` with extra environment variables.
pub async fn redlock_with_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_redlock"));
    cmd.args(args)
        .env_remove("REDLOCK_URLS")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().await.expect("the redlock binary runs")
}

/// `--url U` for every master, and a per-voter timeout generous for a loaded CI machine (the
/// default 50 ms is for production networks).
pub fn url_args(masters: &Masters) -> Vec<String> {
    let timeout = ["--timeout".to_owned(), "1000".to_owned()];
    let urls = masters
        .urls()
        .into_iter()
        .flat_map(|u| ["--url".to_owned(), u]);
    timeout.into_iter().chain(urls).collect()
}

/// `args` followed by `more`, as `&str`s.
pub fn joined<'a>(args: &'a [&'a str], more: &'a [String]) -> Vec<&'a str> {
    args.iter()
        .copied()
        .chain(more.iter().map(String::as_str))
        .collect()
}

/// The exit code.
pub fn code(out: &Output) -> i32 {
    out.status.code().expect("exited, not killed")
}

/// Stdout as text.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Stdout and stderr together, for assertions on everything printed.
pub fn everything(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Stdout parsed as one JSON value; panics with everything printed otherwise.
pub fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", everything(out)))
}

/// `redlock inspect RESOURCE --json` over the masters.
pub async fn inspect_json(masters: &Masters, resource: &str) -> Value {
    let urls = url_args(masters);
    let out = redlock(&joined(&["inspect", resource, "--json"], &urls)).await;
    assert_eq!(code(&out), 0, "{}", everything(&out));
    json(&out)
}
