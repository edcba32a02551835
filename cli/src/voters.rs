//! The Redlock client over the voters the global flags name.

use std::time::Duration;

use tower_redlock::node::split_urls;
use tower_redlock::Redlock;

use crate::args::Global;
use crate::exit::Failure;

/// The voters' URLs: every `--url` (or `REDLOCK_URLS`), each split with
/// [`split_urls`], which keeps a Sentinel's or a Cluster's comma-separated hosts together.
pub fn urls(global: &Global) -> Vec<String> {
    global
        .urls
        .iter()
        .flat_map(|list| split_urls(list))
        .map(str::to_owned)
        .collect()
}

/// A client of every voter with the global flags' timeout and key prefix. Nothing is
/// connected yet; a bad URL or setting is a usage error (the library's message names no
/// password).
pub fn client(global: &Global) -> Result<Redlock, Failure> {
    let urls = urls(global);
    if urls.is_empty() {
        return Err(Failure::usage(
            "no voters: give each master's URL with --url (repeatable) or REDLOCK_URLS \
             (comma-separated)",
        ));
    }
    let mut builder = urls.iter().fold(Redlock::builder(), |b, url| b.redis(url));
    if let Some(ms) = global.timeout {
        builder = builder.node_timeout(Duration::from_millis(ms));
    }
    if let Some(prefix) = &global.key_prefix {
        builder = builder.key_prefix(prefix.as_str());
    }
    let redlock = builder.build().map_err(Failure::usage)?;
    // `-v`: which voters the command asks (names are host:port, never a URL).
    let names: Vec<String> = redlock
        .node_status()
        .iter()
        .map(|s| s.name().to_owned())
        .collect();
    tracing::info!(
        voters = %names.join(","),
        quorum = redlock.quorum(),
        timeout_ms = global.timeout,
        "the client's voters"
    );
    Ok(redlock)
}
