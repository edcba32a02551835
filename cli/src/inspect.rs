//! `redlock inspect <RESOURCE>`: what every voter holds at a resource's key
//! ([`Redlock::inspect`]), then the summary and the quorum holder.

use std::time::Duration;

use serde::Serialize;
use tower_redlock::operate::{Holder, Inspection, Summary, VoterInspection};
use tower_redlock::Redlock;

use crate::args::{Global, InspectArgs};
use crate::exit::{self, Failure, Outcome};
use crate::output::{human, json_line, millis, table, ttl};

/// Inspects the resource and prints it; exits 0 whatever the lock's state, 2 for an invalid
/// resource.
pub async fn run(redlock: &Redlock, global: &Global, args: &InspectArgs) -> Outcome {
    let seen = redlock
        .inspect(&args.resource)
        .await
        .map_err(Failure::usage)?;
    if global.json {
        json_line(&Report::of(&seen, args.retention));
    } else {
        print!("{}", text(&seen, args.retention));
    }
    Ok(exit::OK)
}

/// The JSON of an inspection.
#[derive(Debug, Serialize)]
struct Report {
    key: String,
    quorum: usize,
    summary: &'static str,
    holder: Option<HolderJson>,
    fence: Option<u64>,
    voters: Vec<VoterJson>,
}

/// A holder in JSON: the token's first characters, the remaining ttl.
#[derive(Debug, Serialize)]
struct HolderJson {
    token_prefix: String,
    ttl_ms: Option<u64>,
}

/// One voter's answer in JSON; `error` set (and the rest null) when it did not answer.
#[derive(Debug, Serialize)]
struct VoterJson {
    voter: String,
    held: Option<bool>,
    token_prefix: Option<String>,
    ttl_ms: Option<u64>,
    fence: Option<u64>,
    record: Option<RecordJson>,
    suspended: bool,
    error: Option<String>,
}

/// A completion record in JSON.
#[derive(Debug, Serialize)]
struct RecordJson {
    size: usize,
    ttl_ms: Option<u64>,
    age_ms: Option<u64>,
}

impl Report {
    fn of(seen: &Inspection, retention: Duration) -> Self {
        Self {
            key: seen.key().to_owned(),
            quorum: seen.quorum(),
            summary: summary_word(seen.summary()),
            holder: seen.holder().map(|h| HolderJson::of(&h)),
            fence: seen.fence(),
            voters: seen
                .voters()
                .iter()
                .map(|v| VoterJson::of(v, retention))
                .collect(),
        }
    }
}

impl HolderJson {
    fn of(h: &Holder) -> Self {
        Self {
            token_prefix: h.token_prefix.clone(),
            ttl_ms: h.ttl.map(millis),
        }
    }
}

impl VoterJson {
    fn of(v: &VoterInspection, retention: Duration) -> Self {
        let key = v.key();
        let holder = key.and_then(|k| k.holder.as_ref());
        Self {
            voter: v.name().to_owned(),
            held: key.map(|k| k.holder.is_some()),
            token_prefix: holder.map(|h| h.token_prefix.clone()),
            ttl_ms: holder.and_then(|h| h.ttl).map(millis),
            fence: key.and_then(|k| k.fence),
            record: key.and_then(|k| k.record).map(|r| RecordJson {
                size: r.size,
                ttl_ms: r.ttl.map(millis),
                age_ms: r.age(retention).map(millis),
            }),
            suspended: v.is_suspended(),
            error: v.error().map(ToString::to_string),
        }
    }
}

/// The summary in one word, for JSON.
fn summary_word(summary: Summary) -> &'static str {
    match summary {
        Summary::Held => "held",
        Summary::HeldOnMinority => "held_on_minority",
        Summary::Free => "free",
        Summary::Completed => "completed",
        _ => "unknown",
    }
}

/// The inspection for people: a line per voter, then the summary.
fn text(seen: &Inspection, retention: Duration) -> String {
    let n = seen.voters().len();
    let mut rows = vec![vec![
        "VOTER".to_owned(),
        "LOCK".to_owned(),
        "TOKEN".to_owned(),
        "TTL".to_owned(),
        "FENCE".to_owned(),
        "RECORD".to_owned(),
    ]];
    for v in seen.voters() {
        let mut name = v.name().to_owned();
        if v.is_suspended() {
            name.push_str(" (suspended)");
        }
        let Some(key) = v.key() else {
            let error = v.error().map(ToString::to_string).unwrap_or_default();
            rows.push(vec![name, format!("error: {error}")]);
            continue;
        };
        let dash = || "-".to_owned();
        let record = key.record.map_or_else(dash, |r| {
            let age = r.age(retention).map_or_else(|| "?".to_owned(), human);
            format!("{} bytes, stored {age} ago", r.size)
        });
        rows.push(match &key.holder {
            Some(h) => vec![
                name,
                "held".to_owned(),
                h.token_prefix.clone(),
                ttl(h.ttl),
                key.fence.map_or_else(dash, |f| f.to_string()),
                record,
            ],
            None => vec![
                name,
                "free".to_owned(),
                dash(),
                dash(),
                key.fence.map_or_else(dash, |f| f.to_string()),
                record,
            ],
        });
    }
    let answered = seen.voters().iter().filter(|v| v.key().is_some()).count();
    let summary = match seen.summary() {
        Summary::Held => match seen.holder() {
            Some(h) => format!(
                "held on a quorum by {} (ttl {})",
                h.token_prefix,
                ttl(h.ttl)
            ),
            None => "held on a quorum".to_owned(),
        },
        Summary::HeldOnMinority => "held on a minority: no one holds the lock, and no one can \
                                    take it until those keys expire"
            .to_owned(),
        Summary::Free => "free".to_owned(),
        Summary::Completed => {
            "completed: a completion record is stored (a replay acquire answers with it)".to_owned()
        }
        _ => format!("unknown: {answered} of {n} voters answered, too few to say"),
    };
    format!(
        "key {}  (quorum {} of {n})\n{}summary: {summary}\n",
        seen.key(),
        seen.quorum(),
        table(&rows)
    )
}
