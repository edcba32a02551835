//! The wake-up bench (issue 30): waiters on one key, polling (`wake_waiters(false)`, today's
//! default) against woken on release (`wake_waiters(true)`), measured in one run on masters it
//! starts itself. Prints markdown tables:
//!
//! - **Handoff and fairness**, on N = 3 and 5 masters: one waiter (2 processes × 1 task, each
//!   holding in turn) and 16 waiters (4 processes × 4 tasks); every task loops `lock_with(key,
//!   5 s, Retry::until(5 s))` (the default 200 ms + 50 ms poll), 2 ms of work, `release()`.
//!   The handoff runs from a holder's `release()` call to the next grant to *another* task
//!   ("handoffs": how many grants went to another task; the others are the releaser taking
//!   the key again); holds/s is set against the ideal `1 / (work + one uncontended lock
//!   cycle)`, both measured in the same run (the work as it ran: a 2 ms sleep takes about
//!   3 ms); the fairness columns are the waits' p99 and max, the calls
//!   that timed out, and the fewest holds of a task against the mean.
//! - **Cost**, on one master: commands and bytes per uncontended lock cycle (the wake-up off
//!   and on), and per release with 1, 10 and 100 subscriber connections on the key (as many
//!   client processes waiting on it).
//! - **The middleware**: 40 concurrent duplicates of one idempotent request (axum,
//!   `RedlockLayer`, replay, `OnContention::wait(10 s)`, a 100 ms handler): the time from the first
//!   response to the last replay.
//!
//! ```text
//! cargo bench -p tower-redlock-bench --bench wake
//! REDLOCK_BENCH_SCALE=0.3 cargo bench -p tower-redlock-bench --bench wake   # shorter runs
//! ```
//!
//! - **The subscriber** (`REDLOCK_BENCH_WAKE_SUBSCRIBE=1`: after the others; `=only`: alone),
//!   on 3 masters: K keys held by another client, one waiter per key spawned at once in a
//!   client with the wake-up; the time until every key's channels are subscribed on every
//!   master, then, the waiters aborted, until none is: keys per second per voter
//!   (`bench/src/wake_subscribe.rs`). `REDLOCK_BENCH_WAKE_KEYS` (`2000`) sets K,
//!   `REDLOCK_BENCH_ROUNDS` (`3`) the rounds, `REDLOCK_BENCH_WAKE_DEADLINE_S` (`60`) the bound
//!   of every wait, `REDLOCK_BENCH_WAKE_RTT_US` (`0`) a round trip added between the waiters'
//!   client and each master (a proxy; `1000` for the numbers in `BENCHMARKS.md`).
//!
//! ```text
//! REDLOCK_BENCH_WAKE_SUBSCRIBE=only cargo bench -p tower-redlock-bench --bench wake
//! ```
//!
//! `REDLOCK_BENCH_N` (`3,5`) sets the numbers of masters; `REDLOCK_BENCH_WAKE_16_ONLY=1` runs
//! only the 16-waiter rows. `REDLOCK_BENCH_OUT` also writes the report to that file. Run only by `cargo bench` (it
//! does nothing without the `--bench` argument cargo passes), never as a test.

use tower_redlock_bench as common;
use tower_redlock_testkit as support;

use std::fmt::Write as _;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::report::{machine, p};
use common::wake::{client, counters, run_child, Plan, Run, CHILD};
use common::{fmt_dur, http_layer::connect};
use support::pubsub::Subscriber;
use support::Masters;

const WORK: Duration = Duration::from_millis(2);

fn main() {
    if std::env::var_os(CHILD).is_some() {
        return run_child();
    }
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let scale: f64 = std::env::var("REDLOCK_BENCH_SCALE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1.0);
    let duration = Duration::from_secs_f64(10.0 * scale);
    let node_timeout = Duration::from_millis(50);
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let mut o = String::new();
    writeln!(o, "Machine: {}\n", machine()).unwrap();
    // `REDLOCK_BENCH_WAKE_SUBSCRIBE`: unset or `0`, not run; `1`, run after the others;
    // `only`, run alone.
    let subscribe = std::env::var("REDLOCK_BENCH_WAKE_SUBSCRIBE").unwrap_or_default();
    let only_subscribe = subscribe.trim() == "only";
    if !only_subscribe {
        handoff(&rt, &mut o, duration, node_timeout);
        if std::env::var_os("REDLOCK_BENCH_WAKE_16_ONLY").is_none() {
            rt.block_on(cost(&mut o, node_timeout));
            rt.block_on(middleware(&mut o, node_timeout));
        }
    }
    if only_subscribe || subscribe.trim() == "1" {
        let settings = common::wake_subscribe::Settings::from_env();
        rt.block_on(common::wake_subscribe::run(&mut o, settings));
    }
    println!("{o}");
    if let Ok(path) = std::env::var("REDLOCK_BENCH_OUT") {
        std::fs::write(path, &o).expect("write the report");
    }
}

/// The handoff and fairness table, on each `REDLOCK_BENCH_N` number of masters.
fn handoff(
    rt: &tokio::runtime::Runtime,
    o: &mut String,
    duration: Duration,
    node_timeout: Duration,
) {
    writeln!(
        o,
        "### Handoff and fairness: one key, 2 ms of work per hold, {duration:?} per run\n"
    )
    .unwrap();
    writeln!(
        o,
        "| N | waiters | wake-up | lock cycle | hold (work) | holds/s (× ideal) | handoffs | \
         handoff p50 | handoff p99 | wait p99 | wait max | timed out | fewest holds / mean |"
    )
    .unwrap();
    writeln!(o, "|---|---|---|---|---|---|---|---|---|---|---|---|---|").unwrap();
    let ns: Vec<usize> = std::env::var("REDLOCK_BENCH_N")
        .unwrap_or_else(|_| "3,5".into())
        .split(',')
        .map(|n| n.trim().parse().expect("REDLOCK_BENCH_N: numbers"))
        .collect();
    let only_16 = std::env::var_os("REDLOCK_BENCH_WAKE_16_ONLY").is_some();
    for n in ns {
        let masters = Masters::start(n);
        let urls = masters.urls();
        for (label, processes, tasks) in [("1 (2 × 1)", 2usize, 1usize), ("16 (4 × 4)", 4, 4)] {
            if only_16 && tasks == 1 {
                continue;
            }
            for wake in [false, true] {
                let cycle = rt.block_on(uncontended_cycle(&urls, node_timeout, wake));
                let start_ns = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap()
                    .as_nanos()
                    + 2_000_000_000;
                let plan = Plan {
                    urls: urls.clone(),
                    wake,
                    tasks,
                    key: format!("bench:wake:{n}:{processes}:{wake}"),
                    work: WORK,
                    duration,
                    start_ns,
                    node_timeout,
                };
                let run = Run::of(&plan, processes);
                let rate = run.grants as f64 / run.window.as_secs_f64();
                // The work as it ran (a 2 ms sleep takes longer: the timer's granularity).
                let work = p(&run.holding, 50.0).unwrap_or(WORK);
                let ideal = 1.0 / (work + cycle).as_secs_f64();
                let mean = run.holds.iter().sum::<usize>() as f64 / run.holds.len() as f64;
                let fewest = run.holds.iter().copied().min().unwrap_or(0);
                writeln!(
                    o,
                    "| {n} | {label} | {} | {} | {} | {rate:.0} ({:.2}×) | {} of {} | {} | {} | {} | {} | {} | {fewest} / {mean:.0} ({:.2}) |",
                    if wake { "on" } else { "off (poll)" },
                    fmt_dur(cycle),
                    fmt_dur(work),
                    rate / ideal,
                    run.handoffs.len(),
                    run.grants,
                    opt(p(&run.handoffs, 50.0)),
                    opt(p(&run.handoffs, 99.0)),
                    opt(p(&run.waits, 99.0)),
                    opt(run.waits.iter().max().copied()),
                    run.timeouts,
                    fewest as f64 / mean.max(1.0),
                )
                .unwrap();
            }
        }
    }
}

fn opt(d: Option<Duration>) -> String {
    d.map_or("—".into(), fmt_dur)
}

/// The median of 200 uncontended `lock` + `release` cycles of one client.
async fn uncontended_cycle(urls: &[String], node_timeout: Duration, wake: bool) -> Duration {
    let redlock = client(urls, node_timeout, wake);
    let mut cycles = Vec::with_capacity(200);
    for i in 0..220 {
        let t0 = Instant::now();
        let lease = redlock
            .lock(&format!("bench:wake:cycle:{wake}"), Duration::from_secs(5))
            .await
            .expect("uncontended");
        lease.release().await.expect("released");
        if i >= 20 {
            cycles.push(t0.elapsed());
        }
    }
    p(&cycles, 50.0).expect("cycles")
}

/// Commands and bytes per cycle on one master (`INFO stats`; the two `INFO` calls around a
/// run are in the counts, spread over its 500 cycles).
async fn cost(o: &mut String, node_timeout: Duration) {
    const CYCLES: u64 = 500;
    let masters = Masters::start(1);
    let urls = masters.urls();
    writeln!(
        o,
        "\n### Cost on one master, per lock + release cycle ({CYCLES} cycles)\n\n\
         | wake-up | subscribers on the key | commands | bytes in | bytes out |\n|---|---|---|---|---|"
    )
    .unwrap();
    for (wake, subs) in [
        (false, 0usize),
        (true, 0),
        (true, 1),
        (true, 10),
        (true, 100),
    ] {
        let key = format!("bench:cost:{wake}:{subs}");
        let mut listening = Vec::with_capacity(subs);
        for _ in 0..subs {
            listening.push(Subscriber::on(masters[0].port(), &[&key]).await);
        }
        let redlock = client(&urls, node_timeout, wake);
        let warm = redlock
            .lock("bench:cost:warm", Duration::from_secs(5))
            .await;
        warm.expect("warm").release().await.unwrap();
        let before = counters(&masters[0]).await;
        for _ in 0..CYCLES {
            let lease = redlock
                .lock(&key, Duration::from_secs(5))
                .await
                .expect("lock");
            lease.release().await.unwrap();
        }
        let after = counters(&masters[0]).await;
        let per = |i: usize| (after[i] - before[i]) as f64 / CYCLES as f64;
        writeln!(
            o,
            "| {} | {subs} | {:.2} | {:.0} | {:.0} |",
            if wake { "on" } else { "off" },
            per(0),
            per(1),
            per(2)
        )
        .unwrap();
        drop(listening);
    }
}

/// 40 concurrent duplicates of one idempotent request that waits: the time from the first
/// response to the last replay, the wake-up off and on.
async fn middleware(o: &mut String, node_timeout: Duration) {
    use axum::routing::post;
    use http_body_util::{BodyExt, Full};
    use tower_redlock::key::{IdempotencyKey, KeyExtractorExt};
    use tower_redlock::policy::{LockPolicy, OnContention};
    use tower_redlock::replay::Replay;
    use tower_redlock::RedlockLayer;

    const DUPLICATES: usize = 40;
    let masters = Masters::start(3);
    let urls = masters.urls();
    writeln!(
        o,
        "\n### The middleware: {DUPLICATES} concurrent duplicates of one idempotent request \
         (`OnContention::wait(10 s)`, a 100 ms handler), 3 masters\n\n\
         | wake-up | first response | last replay after the first | all replayed |\n|---|---|---|---|"
    )
    .unwrap();
    for wake in [false, true] {
        let redlock = client(&urls, node_timeout, wake);
        let policy = LockPolicy::builder(redlock, IdempotencyKey::required().scoped_by_route())
            .replay(Replay::new())
            .on_contention(OnContention::wait(Duration::from_secs(10)))
            .build()
            .expect("a policy");
        let app = axum::Router::new().route(
            "/pay",
            post(|| async {
                tokio::time::sleep(Duration::from_millis(100)).await;
                r#"{"paid":true}"#
            })
            .layer(RedlockLayer::new(policy)),
        );
        let server = support::HttpApp::serve(app).await;
        let mut senders = Vec::with_capacity(DUPLICATES);
        for _ in 0..DUPLICATES {
            senders.push(connect::<Full<bytes::Bytes>>(server.addr()).await);
        }
        let key = format!("\"order-{wake}\"");
        let t0 = Instant::now();
        let calls: Vec<_> = senders
            .into_iter()
            .map(|mut sender| {
                let key = key.clone();
                tokio::spawn(async move {
                    let req = http::Request::post("/pay")
                        .header("host", "bench")
                        .header("content-type", "application/json")
                        .header("idempotency-key", key)
                        .body(Full::new(bytes::Bytes::from_static(b"{}")))
                        .expect("request");
                    sender.ready().await.expect("ready");
                    let res = sender.send_request(req).await.expect("response");
                    let replayed = res.headers().contains_key(Replay::REPLAYED_HEADER);
                    let ok = res.status().is_success();
                    let _ = res.into_body().collect().await;
                    (Instant::now(), ok, replayed)
                })
            })
            .collect();
        let mut done = Vec::with_capacity(DUPLICATES);
        for c in calls {
            done.push(c.await.expect("a call"));
        }
        let first = done.iter().map(|d| d.0).min().expect("answers");
        let last = done.iter().map(|d| d.0).max().expect("answers");
        let replayed = done.iter().filter(|d| d.1 && d.2).count();
        writeln!(
            o,
            "| {} | {} | {} | {replayed} of {} |",
            if wake { "on" } else { "off (poll)" },
            fmt_dur(first - t0),
            fmt_dur(last - first),
            DUPLICATES - 1
        )
        .unwrap();
        drop(server);
    }
}
