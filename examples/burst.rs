//! Sends rounds of concurrent `POST /payments` to one or more replicas of `axum_idempotent`
//! (or `actix_idempotent`), prints a table of what came back, and exits non-zero when a
//! round's answers are not the expected ones. Then prints a few of the lock's counters from
//! each replica that serves `GET /metrics` (`axum_idempotent` built with the feature
//! `metrics`).
//!
//! ```text
//! cargo run --example burst -- http://127.0.0.1:3000 http://127.0.0.1:3001
//! ```
//!
//! Environment: `REQUESTS` (per round, default 40).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::Value;

/// What one round sends: every request with one key (`Some`), or each with its own.
struct Round {
    name: &'static str,
    key: Option<String>,
    amount_cents: u64,
}

/// The answers of one round.
#[derive(Default)]
struct Tally {
    /// `200` from a handler that ran.
    executed: usize,
    /// `200` with `idempotency-replayed: true`: the stored response, no handler run.
    replayed: usize,
    conflict: usize,
    retry_after: BTreeMap<String, usize>,
    unprocessable: usize,
    /// Any other answer, by status (or `error`).
    other: BTreeMap<String, usize>,
    payment_ids: BTreeSet<String>,
    slowest: Duration,
}

/// The expected answers of a round.
#[derive(Debug, PartialEq, Eq)]
struct Counts {
    executed: usize,
    replayed: usize,
    conflict: usize,
    unprocessable: usize,
    other: usize,
    payment_ids: usize,
}

impl Tally {
    fn counts(&self) -> Counts {
        Counts {
            executed: self.executed,
            replayed: self.replayed,
            conflict: self.conflict,
            unprocessable: self.unprocessable,
            other: self.other.values().sum(),
            payment_ids: self.payment_ids.len(),
        }
    }
}

async fn burst(
    client: &reqwest::Client,
    targets: &[String],
    requests: usize,
    round: &Round,
) -> Tally {
    let fresh = uuid::Uuid::new_v4().simple().to_string();
    let body = format!(r#"{{"amount_cents":{}}}"#, round.amount_cents);
    let calls = (0..requests).map(|i| {
        let url = format!("{}/payments", targets[i % targets.len()]);
        let key = match &round.key {
            Some(key) => format!("\"{key}\""),
            None => format!("\"{fresh}-{i}\""),
        };
        let req = client
            .post(url)
            .header("Idempotency-Key", key)
            .header("content-type", "application/json")
            .body(body.clone());
        async move {
            let started = Instant::now();
            let answer = async {
                let res = req.send().await?;
                let status = res.status().as_u16();
                let header = |name: &str| {
                    res.headers()
                        .get(name)
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned)
                };
                let (retry_after, replayed) =
                    (header("retry-after"), header("idempotency-replayed"));
                let body = res.bytes().await?;
                Ok::<_, reqwest::Error>((status, retry_after, replayed, body))
            }
            .await;
            (answer, started.elapsed())
        }
    });
    let mut tally = Tally::default();
    for (answer, took) in futures_util::future::join_all(calls).await {
        tally.slowest = tally.slowest.max(took);
        let Ok((status, retry_after, replayed, body)) = answer else {
            *tally.other.entry("error".into()).or_default() += 1;
            continue;
        };
        match status {
            200 => {
                if replayed.as_deref() == Some("true") {
                    tally.replayed += 1;
                } else {
                    tally.executed += 1;
                }
                let id = serde_json::from_slice::<Value>(&body)
                    .ok()
                    .and_then(|v| v["payment_id"].as_str().map(str::to_owned));
                match id {
                    Some(id) => {
                        tally.payment_ids.insert(id);
                    }
                    None => {
                        *tally
                            .other
                            .entry("200 without payment_id".into())
                            .or_default() += 1
                    }
                }
            }
            409 => {
                tally.conflict += 1;
                let ra = retry_after.map_or("-".into(), |s| format!("{s}s"));
                *tally.retry_after.entry(ra).or_default() += 1;
            }
            422 => tally.unprocessable += 1,
            s => *tally.other.entry(s.to_string()).or_default() += 1,
        }
    }
    tally
}

/// The counters printed after the rounds, and their columns.
const COUNTERS: [(&str, &[&str], &str); 6] = [
    ("redlock_acquired_total", &[], "acquired"),
    ("redlock_contended_total", &[], "contended"),
    ("redlock_completed_total", &[], "completed"),
    (
        "redlock_replay_total",
        &["outcome=\"replayed\""],
        "replayed",
    ),
    ("redlock_recorded_total", &[], "recorded"),
    ("redlock_unavailable_total", &[], "unavailable"),
];

/// A sample of Prometheus text: the value of the first line whose series starts with `name`
/// and carries every one of `labels` (e.g. `outcome="acquired"`).
fn sample(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
        let matches = metric == name && labels.iter().all(|label| rest.contains(label));
        matches.then(|| value.parse().ok()).flatten()
    })
}

/// The `q` quantile of histogram `name`'s series with `label`, from its `_bucket` lines,
/// interpolated within the bucket as Prometheus's `histogram_quantile` does; `None` without
/// buckets or samples.
fn bucket_quantile(text: &str, name: &str, label: &str, q: f64) -> Option<f64> {
    let bucket = format!("{name}_bucket");
    let mut buckets: Vec<(f64, f64)> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{')?;
            if metric != bucket || !rest.contains(label) {
                return None;
            }
            let le = rest.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, value.parse().ok()?))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let (mut lower, mut below) = (0.0, 0.0);
    for (le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return Some(lower);
            }
            let within = count - below;
            return Some(if within > 0.0 {
                lower + (le - lower) * (rank - below) / within
            } else {
                le
            });
        }
        (lower, below) = (le, count);
    }
    None
}

/// Prints the lock's counters of every replica that serves `GET /metrics`, and their sums.
async fn print_metrics(client: &reqwest::Client, targets: &[String]) {
    let mut rows = Vec::new();
    for target in targets {
        let res = client.get(format!("{target}/metrics")).send().await;
        let text = match res {
            Ok(res) if res.status().is_success() => res.text().await.unwrap_or_default(),
            _ => continue,
        };
        rows.push((target, text));
    }
    if rows.is_empty() {
        println!("(no replica serves GET /metrics: build axum_idempotent with --features metrics)");
        println!();
        return;
    }
    println!(
        "the lock's counters, from GET /metrics of {} replica(s):",
        rows.len()
    );
    println!();
    let head: Vec<&str> = COUNTERS.iter().map(|(_, _, column)| *column).collect();
    println!(
        "| replica | {} | p50 of acquire (acquired) |",
        head.join(" | ")
    );
    println!("| --- |{} ---: |", " ---: |".repeat(COUNTERS.len()));
    let mut sums = [0.0; COUNTERS.len()];
    for (target, text) in &rows {
        let mut cells = Vec::new();
        for (sum, (name, labels, _)) in sums.iter_mut().zip(COUNTERS) {
            let value = sample(text, name, labels).unwrap_or(0.0);
            *sum += value;
            cells.push(format!("{value}"));
        }
        let labels = [r#"outcome="acquired""#, r#"quantile="0.5""#];
        // A summary's quantile, else (an exporter given buckets) estimated from the buckets.
        let p50 = sample(text, "redlock_acquire_duration_seconds", &labels)
            .or_else(|| bucket_quantile(text, "redlock_acquire_duration_seconds", labels[0], 0.5))
            .map_or("-".to_owned(), |s| match s * 1000.0 {
                ms if ms < 1.0 => format!("{:.0} µs", ms * 1000.0),
                ms => format!("{ms:.1} ms"),
            });
        println!("| {target} | {} | {p50} |", cells.join(" | "));
    }
    let sums: Vec<String> = sums.iter().map(|s| s.to_string()).collect();
    println!("| all | {} | |", sums.join(" | "));
    println!();
    println!(
        "(lock calls, each once: acquired, contended, completed: \
         answered with the key's completion record, then replayed or 422 for another body; \
         recorded: responses stored for replay)"
    );
    println!();
}

/// A short list of `map`'s entries, `-` when empty.
fn list<V: std::fmt::Display>(map: &BTreeMap<String, V>) -> String {
    if map.is_empty() {
        return "-".into();
    }
    let items: Vec<String> = map.iter().map(|(k, v)| format!("{k}: {v}")).collect();
    items.join(", ")
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let targets: Vec<String> = std::env::args().skip(1).collect();
    if targets.is_empty() {
        return Err("usage: burst URL [URL…]  (e.g. http://127.0.0.1:3000)".into());
    }
    let n: usize = std::env::var("REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;

    // Open the connections first, so that the first round's requests all arrive while its
    // one handler still runs.
    let warm_up = (0..n).map(|i| {
        client
            .get(format!("{}/health", targets[i % targets.len()]))
            .send()
    });
    futures_util::future::join_all(warm_up).await;

    let key = uuid::Uuid::new_v4().simple().to_string();
    let none = Counts {
        executed: 0,
        replayed: 0,
        conflict: 0,
        unprocessable: 0,
        other: 0,
        payment_ids: 0,
    };
    let rounds = [
        (
            Round {
                name: "one Idempotency-Key",
                key: Some(key.clone()),
                amount_cents: 1250,
            },
            Counts {
                executed: 1,
                conflict: n - 1,
                payment_ids: 1,
                ..none
            },
        ),
        (
            Round {
                name: "the same key and body, after round 1",
                key: Some(key.clone()),
                amount_cents: 1250,
            },
            Counts {
                replayed: n,
                payment_ids: 1,
                ..none
            },
        ),
        (
            Round {
                name: "the same key, another body",
                key: Some(key),
                amount_cents: 9900,
            },
            Counts {
                unprocessable: n,
                ..none
            },
        ),
        (
            Round {
                name: "a distinct key per request",
                key: None,
                amount_cents: 1250,
            },
            Counts {
                executed: n,
                payment_ids: n,
                ..none
            },
        ),
    ];

    println!(
        "{n} concurrent POST /payments per round, spread over {}",
        targets.join(" and ")
    );
    println!();
    println!("| round | 200 run | 200 replayed | 409 (Retry-After: count) | 422 | other | payment_id(s) | slowest |");
    println!("| --- | ---: | ---: | --- | ---: | --- | --- | ---: |");
    let mut failures = Vec::new();
    let mut first_ids = None;
    for (i, (round, expected)) in rounds.iter().enumerate() {
        let t = burst(&client, &targets, n, round).await;
        let ids = match t.payment_ids.len() {
            0 => "-".to_owned(),
            1 => t.payment_ids.iter().next().cloned().unwrap_or_default(),
            k => format!("{k} distinct"),
        };
        println!(
            "| {}. {} | {} | {} | {} ({}) | {} | {} | {ids} | {} ms |",
            i + 1,
            round.name,
            t.executed,
            t.replayed,
            t.conflict,
            list(&t.retry_after),
            t.unprocessable,
            list(&t.other),
            t.slowest.as_millis()
        );
        let got = t.counts();
        if got != *expected {
            failures.push(format!(
                "round {}: expected {expected:?}, got {got:?}",
                i + 1
            ));
        }
        // The replayed answers carry the payment made in round 1, not a new one.
        match i {
            0 => first_ids = Some(t.payment_ids),
            1 if first_ids.as_ref() != Some(&t.payment_ids) => failures.push(format!(
                "round 2: replayed payment_id(s) {:?}, round 1 made {:?}",
                t.payment_ids, first_ids
            )),
            _ => {}
        }
    }
    println!();
    print_metrics(&client, &targets).await;
    if !failures.is_empty() {
        for f in &failures {
            println!("UNEXPECTED: {f}");
        }
        std::process::exit(1);
    }
    println!(
        "as expected: one key ran its handler once across every replica (the duplicates in \
         flight 409, those after it replayed with the same payment_id), the key with another \
         body 422, distinct keys each ran once"
    );
    Ok(())
}
