//! `redlock watch --prefix <P>`: the locks held under a prefix on every voter
//! ([`Redlock::scan`]), refreshed, each with a ttl bar.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tower_redlock::operate::VoterScan;
use tower_redlock::Redlock;

use crate::args::{Global, WatchArgs};
use crate::exit::{self, Outcome};
use crate::output::{human, json_line, millis, table};

/// The ttl bar's width in cells.
const BAR: usize = 12;

/// Refreshes until `--count` refreshes are shown (or forever); exit 0.
pub async fn run(redlock: &Redlock, global: &Global, args: &WatchArgs) -> Outcome {
    let clear = !global.json && std::io::stdout().is_terminal();
    let interval = Duration::from_millis(args.interval_ms.max(1));
    let mut longest = Duration::ZERO;
    let mut refresh = 0u64;
    loop {
        let scans = redlock.scan(&args.prefix, args.limit).await;
        refresh += 1;
        if global.json {
            json_line(&Refresh::of(&args.prefix, refresh, &scans));
        } else {
            longest = scans
                .iter()
                .filter_map(VoterScan::locks)
                .flatten()
                .filter_map(|h| h.holder.ttl)
                .fold(longest, Duration::max);
            let screen = text(args, redlock.quorum(), refresh, longest, &scans);
            let mut out = std::io::stdout().lock();
            if clear {
                // Home, then clear the screen: the table is redrawn in place.
                let _ = write!(out, "\x1b[H\x1b[2J");
            }
            let _ = write!(out, "{screen}");
            let _ = out.flush();
        }
        if args.count.is_some_and(|n| refresh >= n) {
            return Ok(exit::OK);
        }
        tokio::time::sleep(interval).await;
    }
}

/// One refresh in JSON: every voter's locks, or its error.
#[derive(Debug, Serialize)]
struct Refresh {
    prefix: String,
    refresh: u64,
    unix_ms: u64,
    voters: Vec<VoterJson>,
}

/// One voter's locks under the prefix, or its error.
#[derive(Debug, Serialize)]
struct VoterJson {
    voter: String,
    locks: Option<Vec<LockJson>>,
    error: Option<String>,
}

/// One lock on one voter.
#[derive(Debug, Serialize)]
struct LockJson {
    key: String,
    token_prefix: String,
    ttl_ms: Option<u64>,
}

impl Refresh {
    fn of(prefix: &str, refresh: u64, scans: &[VoterScan]) -> Self {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Self {
            prefix: prefix.to_owned(),
            refresh,
            unix_ms: millis(now),
            voters: scans
                .iter()
                .map(|v| VoterJson {
                    voter: v.name().to_owned(),
                    locks: v.locks().map(|locks| {
                        locks
                            .iter()
                            .map(|h| LockJson {
                                key: h.key.clone(),
                                token_prefix: h.holder.token_prefix.clone(),
                                ttl_ms: h.holder.ttl.map(millis),
                            })
                            .collect()
                    }),
                    error: v.error().map(ToString::to_string),
                })
                .collect(),
        }
    }
}

/// One row per lock (a key and a holder): on how many voters, the shortest ttl among them.
#[derive(Debug, Default)]
struct Row {
    voters: usize,
    ttl: Option<Duration>,
}

/// The screen for people: a header, a row per lock with its ttl bar, the voters' errors.
fn text(
    args: &WatchArgs,
    quorum: usize,
    refresh: u64,
    longest: Duration,
    scans: &[VoterScan],
) -> String {
    let mut locks: BTreeMap<(&str, &str), Row> = BTreeMap::new();
    for held in scans.iter().filter_map(VoterScan::locks).flatten() {
        let row = locks
            .entry((&held.key, &held.holder.token_prefix))
            .or_default();
        row.voters += 1;
        if let Some(ttl) = held.holder.ttl {
            row.ttl = Some(row.ttl.map_or(ttl, |t| t.min(ttl)));
        }
    }
    let n = scans.len();
    let mut out = format!(
        "redlock watch  prefix {:?}  {n} voter(s), quorum {quorum}  every {}  refresh {refresh}\n",
        args.prefix,
        human(Duration::from_millis(args.interval_ms))
    );
    if locks.is_empty() {
        out.push_str("no lock held under the prefix\n");
    } else {
        let mut rows = vec![vec![
            "KEY".to_owned(),
            "HOLDER".to_owned(),
            "VOTERS".to_owned(),
            "TTL".to_owned(),
        ]];
        for ((key, token), row) in &locks {
            let on = format!(
                "{}/{n}{}",
                row.voters,
                if row.voters >= quorum {
                    ""
                } else {
                    " (minority)"
                }
            );
            let ttl = match row.ttl {
                Some(ttl) => format!("{} {}", bar(ttl, longest), human(ttl)),
                None => format!("{} no expiry", "█".repeat(BAR)),
            };
            rows.push(vec![(*key).to_owned(), (*token).to_owned(), on, ttl]);
        }
        out.push_str(&table(&rows));
    }
    // The library's error names the voter (host:port, never a password).
    for e in scans.iter().filter_map(VoterScan::error) {
        out.push_str(&format!("error: {e}\n"));
    }
    out
}

/// `████░░░░`: `ttl` relative to the longest ttl seen.
fn bar(ttl: Duration, longest: Duration) -> String {
    let full = if longest.is_zero() {
        0
    } else {
        let share = ttl.as_secs_f64() / longest.as_secs_f64();
        ((share * BAR as f64).round() as usize).clamp(usize::from(!ttl.is_zero()), BAR)
    };
    format!("{}{}", "█".repeat(full), "░".repeat(BAR - full))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_bar_is_relative_to_the_longest_key_ttl() {
        let s = Duration::from_secs;
        assert_eq!(bar(s(10), s(10)), "█".repeat(BAR));
        assert_eq!(
            bar(s(5), s(10)),
            format!("{}{}", "█".repeat(6), "░".repeat(6))
        );
        assert_eq!(
            bar(Duration::from_millis(1), s(1000)),
            format!("█{}", "░".repeat(11))
        );
        assert_eq!(bar(s(0), s(10)), "░".repeat(BAR));
    }
}
