//! Replay at the HTTP level: an idempotent endpoint (`RedlockLayer::idempotent`) in an axum
//! app over loopback HTTP/1, beside a plain locked route, the same requests in process, and
//! the client-level round trips they are compared with; its table and targets in the report.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use tower::ServiceExt;
use tower_redlock::key::{IdempotencyKey, KeyExtractorExt};
use tower_redlock::policy::LockPolicy;
use tower_redlock::replay::Replay;
use tower_redlock::RedlockLayer;
use tower_redlock_testkit::{HttpApp, Masters};

use crate::http_layer::{connect, next_key};
use crate::replay::{replay_targets, single_writes, Wording};
use crate::report::{counts, workload_rows};
use crate::{Latency, Locker, Params};

/// The idempotent endpoint's response body: a small JSON answer, as a payment API returns.
const ORDER_RESPONSE: &str = concat!(
    r#"{"id":"ord_8f2c1e9a4b7d","status":"paid","amount":1999,"currency":"EUR","#,
    r#""customer":"cus_0001","created":"2026-01-01T00:00:00Z","#,
    r#""receipt":"https://example.com/receipts/ord_8f2c1e9a4b7d","#,
    r#""note":"idempotent request, replayed on retry"}"#
);

/// The request body every request carries (fingerprinted on the idempotent route).
const ORDER_REQUEST: &str = r#"{"amount":1999,"currency":"EUR","customer":"cus_0001"}"#;

async fn order() -> impl axum::response::IntoResponse {
    (
        [(http::header::CONTENT_TYPE, "application/json")],
        ORDER_RESPONSE,
    )
}

/// The HTTP replay workload at one N: sequential requests on one keep-alive connection, and
/// the client-level round trips they are compared with, all in the same rounds (see
/// [`run`]).
#[derive(Debug, Default)]
pub struct HttpReplayRow {
    /// `/bare`: the handler without a lock.
    pub bare: Latency,
    /// `/locked` (plain `RedlockLayer`, no replay), a fresh key each request: acquire,
    /// handler, release, response — one lock cycle over HTTP.
    pub plain: Latency,
    /// `/idempotent`, the one key completed before the rounds: the stored response replayed.
    pub hit: Latency,
    /// `/idempotent`, a fresh key each request: body buffered and fingerprinted, claim,
    /// handler, response stored on a quorum (the write is the release), response.
    pub first: Latency,
    /// The app's own client, `try_lock` (`acquire`: one write round on the quorum) +
    /// `release` (`cycle`), no HTTP.
    pub client: Latency,
    /// One master: `SET` of a value the size of the stored record (one round trip).
    pub write: Latency,
    /// `plain`, `hit` and `first` in process (`Router::oneshot`, no sockets): what the HTTP
    /// stack adds is the difference.
    pub plain_oneshot: Latency,
    pub hit_oneshot: Latency,
    pub first_oneshot: Latency,
    /// The stored record's size on a master (status, headers, body, fingerprint).
    pub record_len: usize,
    /// Lock keys (not completion records) left once settled: expected 0.
    pub locks_left: u64,
}

type OrderSender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

fn order_request(path: &str, key: &str) -> http::Request<Full<Bytes>> {
    http::Request::post(path)
        .header("host", "bench")
        .header("content-type", "application/json")
        .header("idempotency-key", key)
        .body(Full::new(Bytes::from_static(ORDER_REQUEST.as_bytes())))
        .expect("request")
}

/// What a request must answer for it to count: `200` with the handler's body, and the
/// replay marker exactly when a replay is expected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Ran,
    Replayed,
}

/// Where [`order_requests`] sends: over the keep-alive connection, or in process.
enum Via<'a> {
    Http(&'a mut OrderSender),
    Oneshot(&'a Router),
}

/// Up to `count` requests to `path`, one at a time `via` the connection or in process, each
/// with `key` or (`None`) a fresh key; stopping early after `budget`, or when one takes
/// longer than `cap`. The time runs from sending the request to the response body's end. A
/// wrong answer is a failure.
async fn order_requests(
    mut via: Via<'_>,
    path: &str,
    key: Option<&str>,
    expect: Expect,
    count: usize,
    budget: Duration,
    cap: Duration,
) -> Latency {
    crate::sequential(count, budget, cap, async |_| {
        let req = order_request(path, &key.map_or_else(next_key, str::to_owned));
        let (t0, res) = match &mut via {
            Via::Http(sender) => {
                sender.ready().await.ok()?;
                let t0 = Instant::now();
                let res = sender.send_request(req).await.ok()?;
                (t0, res.map(axum::body::Body::new))
            }
            Via::Oneshot(router) => {
                let t0 = Instant::now();
                let res = (*router).clone().oneshot(req).await.ok()?;
                (t0, res)
            }
        };
        let status = res.status();
        let replayed = res
            .headers()
            .get(Replay::REPLAYED_HEADER)
            .is_some_and(|v| v == "true");
        let body = res.into_body().collect().await.ok()?.to_bytes();
        let d = t0.elapsed();
        let right = status == http::StatusCode::OK
            && replayed == (expect == Expect::Replayed)
            && body == ORDER_RESPONSE.as_bytes();
        if !right && std::env::var_os("REDLOCK_BENCH_DEBUG").is_some() {
            eprintln!("{path}: {status}, replayed {replayed}, body {body:?}");
        }
        right.then_some((d, d))
    })
    .await
}

/// What the HTTP replay workloads run against (see [`run`]).
struct HttpReplayCtx<'a> {
    app: &'a Router,
    done: &'a str,
    ours: &'a Locker,
    one: &'a redis::aio::MultiplexedConnection,
    write_key: &'a str,
    record: &'a Bytes,
}

impl HttpReplayCtx<'_> {
    /// Workload `w`, up to `count` times: 0–3 over HTTP (`/bare`, `/locked`, a replay hit,
    /// a first execution), 4–6 in process (`/locked`, a replay hit, a first execution),
    /// 7 the client's `try_lock` + `release`, 8 one master's `SET` of the record's size.
    async fn run(
        &self,
        w: usize,
        sender: &mut OrderSender,
        count: usize,
        budget: Duration,
        cap: Duration,
    ) -> Latency {
        let (via, path, key, expect) = match w {
            0 => (Via::Http(sender), "/bare", None, Expect::Ran),
            1 => (Via::Http(sender), "/locked", None, Expect::Ran),
            2 => (
                Via::Http(sender),
                "/idempotent",
                Some(self.done),
                Expect::Replayed,
            ),
            3 => (Via::Http(sender), "/idempotent", None, Expect::Ran),
            4 => (Via::Oneshot(self.app), "/locked", None, Expect::Ran),
            5 => (
                Via::Oneshot(self.app),
                "/idempotent",
                Some(self.done),
                Expect::Replayed,
            ),
            6 => (Via::Oneshot(self.app), "/idempotent", None, Expect::Ran),
            7 => {
                let key = "bench:http-replay:client";
                return crate::latency(self.ours, key, count, budget, cap).await;
            }
            _ => {
                return single_writes(self.one, self.write_key, self.record, count, budget, cap)
                    .await
            }
        };
        order_requests(via, path, key, expect, count, budget, cap).await
    }
}

/// The HTTP replay workload on the first `n` masters. One axum app, served over loopback,
/// with three routes on the same handler (`order`): `/bare` (no lock), `/locked` (a plain
/// `RedlockLayer`, default policy, key `Idempotency-Key` scoped by route) and `/idempotent`
/// (`RedlockLayer::idempotent`: the same key, replay with [`Replay::new`]'s defaults, the
/// request body fingerprinted). Both layers share one client. In each round, in a rotated
/// order, one request at a time: on one keep-alive connection, the bare route, a plain
/// locked request per fresh key, replay hits on one key completed before the rounds, first
/// executions per fresh key; the last three again in process (`Router::oneshot`); then,
/// without HTTP, the client's `try_lock` + `release` and one master's `SET` of a value the
/// size of the stored record. Latencies are pooled.
///
/// [`Replay::new`]: tower_redlock::replay::Replay::new
pub async fn run(s: &Params, masters: &Masters, n: usize) -> HttpReplayRow {
    let urls = &masters.urls()[..n];
    let redlock = crate::ours(urls, s.node_timeout);
    let plain = RedlockLayer::new(
        LockPolicy::builder(
            redlock.clone(),
            IdempotencyKey::required().scoped_by_route(),
        )
        .build()
        .expect("the plain policy"),
    );
    let idempotent = RedlockLayer::new(
        LockPolicy::idempotent(redlock.clone())
            .build()
            .expect("the idempotent policy"),
    );
    let app = Router::new()
        .route("/bare", post(order))
        .route("/locked", post(order).layer(plain))
        .route("/idempotent", post(order).layer(idempotent));
    let server = HttpApp::serve(app.clone()).await;
    let mut sender: OrderSender = connect(server.addr()).await;
    let ours = Locker::Ours(redlock.clone());
    let one = redis::Client::open(urls[0].as_str())
        .expect("valid url")
        .get_multiplexed_async_connection()
        .await
        .expect("connect");

    // The replayed key, completed once; then the size of what was stored.
    let done = format!("done-{n}");
    let first = order_requests(
        Via::Http(&mut sender),
        "/idempotent",
        Some(&done),
        Expect::Ran,
        1,
        Duration::from_secs(5),
        Duration::from_secs(5),
    )
    .await;
    assert!(
        first.cycle.len() == 1,
        "the replayed key's first request: {first:?}"
    );
    let mut m0 = one.clone();
    let stored: Vec<String> = redis::cmd("KEYS")
        .arg("*:record")
        .query_async(&mut m0)
        .await
        .expect("KEYS");
    assert_eq!(stored.len(), 1, "one record stored: {stored:?}");
    let record_len: usize = redis::cmd("STRLEN")
        .arg(&stored[0])
        .query_async(&mut m0)
        .await
        .expect("STRLEN");
    let record = Bytes::from(vec![b'r'; record_len]);
    let write_key = "bench:rtt:http-record";

    // The workloads, each run by `run(w, count, budget, cap)`.
    const WORKLOADS: usize = 9;
    let ctx = HttpReplayCtx {
        app: &app,
        done: &done,
        ours: &ours,
        one: &one,
        write_key,
        record: &record,
    };
    // Warm-up: the connections to the masters, the scripts, the HTTP connection.
    let warm = Duration::from_secs(5);
    for w in 0..WORKLOADS {
        let l = ctx.run(w, &mut sender, 50, warm, warm).await;
        assert!(
            l.failures == 0 && !l.hung,
            "HTTP replay warm-up of workload {w} failed: {l:?}"
        );
    }

    let mut row = HttpReplayRow {
        record_len,
        ..HttpReplayRow::default()
    };
    let (count, budget, cap) = (s.count(600), s.dur(10.0), Duration::from_secs(5));
    for round in 0..s.rounds {
        for j in 0..WORKLOADS {
            let w = (j + round) % WORKLOADS;
            let l = ctx.run(w, &mut sender, count, budget, cap).await;
            match w {
                0 => &mut row.bare,
                1 => &mut row.plain,
                2 => &mut row.hit,
                3 => &mut row.first,
                4 => &mut row.plain_oneshot,
                5 => &mut row.hit_oneshot,
                6 => &mut row.first_oneshot,
                7 => &mut row.client,
                _ => &mut row.write,
            }
            .merge(l);
        }
    }

    // Background work (the slower masters' writes and releases) settles, then count the
    // lock keys: everything on the masters but the completion records and the write key.
    tokio::time::sleep(s.node_timeout * 4 + Duration::from_millis(300)).await;
    for m in masters.iter().take(n) {
        let keys: Vec<String> = m.query(redis::cmd("KEYS").arg("*")).await;
        let locks: Vec<_> = keys
            .iter()
            .filter(|k| !k.ends_with(":record") && *k != write_key)
            .collect();
        if !locks.is_empty() && std::env::var_os("REDLOCK_BENCH_DEBUG").is_some() {
            eprintln!("HTTP replay: locks left on {}: {locks:?}", m.addr());
        }
        row.locks_left += locks.len() as u64;
    }
    drop(sender);
    drop(server);
    row
}

/// The HTTP replay table: each workload's p50 and p99, and their ratios to one plain locked
/// request over HTTP (`/locked`) measured in the same rounds.
pub fn table(o: &mut String, node_timeout: Duration, rows: &[(usize, HttpReplayRow)]) {
    let _ = writeln!(
        o,
        "\n### Idempotent endpoints (replay), HTTP level: one axum app, one keep-alive HTTP/1 connection, one request at a time; response body {} B, request body {} B; layer defaults (ttl 30 s), node timeout {:?}\n",
        ORDER_RESPONSE.len(),
        ORDER_REQUEST.len(),
        node_timeout
    );
    let _ = writeln!(
        o,
        "| N | workload | p50 | p99 | p50 / (c) p50 | p99 / (c) p99 | failures |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|");
    for (n, row) in rows {
        let write = format!(
            "one master: `SET` of {} B, the stored record's size (one round trip)",
            row.record_len
        );
        let lines: [(&str, &Latency, &[Duration]); 10] = [
            ("`/bare`: the handler, no lock", &row.bare, &row.bare.cycle),
            (
                "(c) `/locked`: plain `RedlockLayer`, fresh key (lock + handler + release)",
                &row.plain,
                &row.plain.cycle,
            ),
            (
                "(a) `/idempotent`, replay hit (key completed before)",
                &row.hit,
                &row.hit.cycle,
            ),
            (
                "(b) `/idempotent`, first execution, fresh key (claim + handler + store)",
                &row.first,
                &row.first.cycle,
            ),
            (
                "… (c) in process (`oneshot`, no sockets)",
                &row.plain_oneshot,
                &row.plain_oneshot.cycle,
            ),
            ("… (a) in process", &row.hit_oneshot, &row.hit_oneshot.cycle),
            (
                "… (b) in process",
                &row.first_oneshot,
                &row.first_oneshot.cycle,
            ),
            (
                "client, no HTTP: `try_lock` + `release`",
                &row.client,
                &row.client.cycle,
            ),
            (
                "client, no HTTP: `try_lock` (one write round on the quorum)",
                &row.client,
                &row.client.acquire,
            ),
            (&write, &row.write, &row.write.cycle),
        ];
        workload_rows(o, *n, &row.plain.cycle, &lines);
    }
    counts(
        o,
        "\nLock keys left once settled (completion records aside)",
        rows.iter().map(|(n, r)| (*n, r.locks_left)),
    );
}

/// The HTTP level's wording: against one plain locked request, (c).
pub(crate) const HTTP: Wording = Wording {
    level: ", HTTP",
    nothing: "HTTP replay",
    hit_base: "one plain locked request p50",
    first_base: "plain locked request p50",
    unit: "(c)",
};

/// The issue's targets for an idempotent endpoint over HTTP, at one N: (a) a replay hit p50
/// ≤ 1.2× (c) one plain locked request p50; (b) a first execution p50 ≤ (c) + one write
/// round trip, taken as `try_lock`'s p50 (one write round on the quorum), and shown too
/// against one master's `SET` round trip (the stricter reading).
pub fn targets(o: &mut String, n: usize, row: &HttpReplayRow) {
    let times: [&[Duration]; 5] = [
        &row.plain.cycle,
        &row.hit.cycle,
        &row.first.cycle,
        &row.client.acquire,
        &row.write.cycle,
    ];
    replay_targets(o, n, &HTTP, times);
}
