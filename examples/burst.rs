//! Sends bursts of concurrent requests to one or more replicas of `axum_idempotent` (or
//! `actix_idempotent`) and prints what came back.
//!
//! ```text
//! cargo run --example burst -- http://127.0.0.1:3000 http://127.0.0.1:3001
//! ```
//!
//! Environment: `REQUESTS` (per round, default 40).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

#[derive(Default)]
struct Tally {
    ok: usize,
    conflict: usize,
    retry_after: BTreeMap<String, usize>,
    unavailable: usize,
    bad_request: usize,
    other: usize,
    slowest: Duration,
}

async fn burst(
    client: &reqwest::Client,
    targets: &[String],
    requests: usize,
    same_key: bool,
) -> Tally {
    let round = uuid::Uuid::new_v4().simple().to_string();
    let calls = (0..requests).map(|i| {
        let url = format!("{}/payments", targets[i % targets.len()]);
        let key = if same_key {
            format!("\"{round}\"")
        } else {
            format!("\"{round}-{i}\"")
        };
        let client = client.clone();
        async move {
            let started = Instant::now();
            let res = client.post(url).header("Idempotency-Key", key).send().await;
            (res, started.elapsed())
        }
    });
    let mut tally = Tally::default();
    for (res, took) in futures_util::future::join_all(calls).await {
        tally.slowest = tally.slowest.max(took);
        match res {
            Ok(r) => match r.status().as_u16() {
                200 => tally.ok += 1,
                409 => {
                    tally.conflict += 1;
                    let ra = r
                        .headers()
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or("-")
                        .to_owned();
                    *tally.retry_after.entry(ra).or_default() += 1;
                }
                503 => tally.unavailable += 1,
                400 => tally.bad_request += 1,
                _ => tally.other += 1,
            },
            Err(_) => tally.other += 1,
        }
    }
    tally
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let targets: Vec<String> = std::env::args().skip(1).collect();
    if targets.is_empty() {
        return Err("usage: burst URL [URL…]  (e.g. http://127.0.0.1:3000)".into());
    }
    let requests: usize = std::env::var("REQUESTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(40);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()?;

    println!(
        "{requests} concurrent POST /payments per round, spread over {}",
        targets.join(" and ")
    );
    println!();
    println!("| round | 200 | 409 (Retry-After: count) | 503 | 400 | other | slowest |");
    println!("| --- | ---: | --- | ---: | ---: | ---: | ---: |");
    let rounds = [
        ("one Idempotency-Key", true),
        ("the same key again, after round 1", true),
        ("a distinct key per request", false),
    ];
    let mut failed = false;
    for (name, same_key) in rounds {
        let t = burst(&client, &targets, requests, same_key).await;
        let ra: Vec<String> = t
            .retry_after
            .iter()
            .map(|(k, v)| format!("{k}s: {v}"))
            .collect();
        println!(
            "| {name} | {} | {} ({}) | {} | {} | {} | {} ms |",
            t.ok,
            t.conflict,
            if ra.is_empty() {
                "-".into()
            } else {
                ra.join(", ")
            },
            t.unavailable,
            t.bad_request,
            t.other,
            t.slowest.as_millis()
        );
        let expected_ok = if same_key { 1 } else { requests };
        failed |= t.ok != expected_ok || t.other > 0;
    }
    println!();
    if failed {
        println!("UNEXPECTED: a same-key round should give exactly one 200, a distinct-key round only 200s");
        std::process::exit(1);
    }
    println!("as expected: one 200 per key at a time, across every replica; the rest 409 with Retry-After");
    Ok(())
}
