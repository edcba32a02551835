//! The HTTP layer: an axum handler without and with `RedlockLayer`, in process and over
//! loopback HTTP/1 (one connection, then 64); its table and targets in the report. The raw
//! HTTP/1 client here ([`connect`]) and the keys ([`next_key`]) serve the HTTP replay workload
//! too ([`crate::http_replay`]).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use axum::routing::post;
use axum::Router;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use tower::ServiceExt;
use tower_redlock::key::IdempotencyKey;
use tower_redlock::policy::LockPolicy;
use tower_redlock::{Redlock, RedlockLayer};
use tower_redlock_testkit::{HttpApp, Masters};

use crate::report::{lat_cell, mark, p, rate_cell};
use crate::{fmt_dur, median, Params};

/// One app's times (the first app, the bare handler, is the baseline of the ratios).
#[derive(Debug, Default)]
pub struct LayerRow {
    pub oneshot: Vec<Duration>,
    pub http1: Vec<Duration>,
    pub http64: Vec<Duration>,
    pub http64_rates: Vec<f64>,
}

/// The handler of every app.
async fn pay() -> &'static str {
    "paid"
}

/// The sequence of [`next_key`].
static REQUEST_SEQ: AtomicU64 = AtomicU64::new(0);

/// A fresh `Idempotency-Key` (`k-0`, `k-1`, …): a lock key no request used before.
pub fn next_key() -> String {
    format!("k-{}", REQUEST_SEQ.fetch_add(1, Ordering::Relaxed))
}

/// The HTTP layer section: an axum handler bare, behind `RedlockLayer` on a memory node, and
/// behind it on the first 3 masters. In each round, in a rotated order: in process
/// (`Router::oneshot`), over one keep-alive connection, over 64 connections.
pub async fn run(s: &Params, masters: &Masters) -> Vec<(&'static str, LayerRow)> {
    let bare = Router::new().route("/pay", post(pay));
    let mem = Router::new()
        .route("/pay", post(pay))
        .layer(RedlockLayer::new(
            LockPolicy::builder(Redlock::in_memory(), IdempotencyKey::required())
                .build()
                .expect("the policy"),
        ));
    let redis = Router::new()
        .route("/pay", post(pay))
        .layer(RedlockLayer::new(
            LockPolicy::builder(
                crate::ours(&masters.urls()[..3], s.node_timeout),
                IdempotencyKey::required(),
            )
            .build()
            .expect("the policy"),
        ));
    let apps = [
        ("bare handler", bare),
        ("+ RedlockLayer, memory node", mem),
        ("+ RedlockLayer, 3 Redis masters", redis),
    ];
    let mut served = Vec::new();
    for (name, router) in &apps {
        served.push((*name, router.clone(), HttpApp::serve(router.clone()).await));
    }
    let mut rows: Vec<(&'static str, LayerRow)> = apps
        .iter()
        .map(|(n, _)| (*n, LayerRow::default()))
        .collect();
    // Warm-up: connections to the masters, script caches.
    for (_, router, app) in &served {
        oneshot_latency(router, 100).await;
        http_conns(app.addr(), 4, Duration::from_millis(200)).await;
    }
    let k = served.len();
    for round in 0..s.rounds {
        for j in 0..k {
            let i = (j + round) % k;
            rows[i]
                .1
                .oneshot
                .extend(oneshot_latency(&served[i].1, s.count(1500)).await);
        }
        for j in 0..k {
            let i = (j + round) % k;
            let (lat, _) = http_sequential(served[i].2.addr(), s.count(500)).await;
            rows[i].1.http1.extend(lat);
        }
        for j in 0..k {
            let i = (j + round) % k;
            let (lat, rate) = http_conns(served[i].2.addr(), 64, s.dur(1.0)).await;
            rows[i].1.http64.extend(lat);
            rows[i].1.http64_rates.push(rate);
        }
    }
    rows
}

/// A `POST` to `path` with a fresh key.
fn request(path: &str) -> http::Request<Empty<Bytes>> {
    http::Request::post(path)
        .header("host", "bench")
        .header("idempotency-key", next_key())
        .body(Empty::new())
        .expect("request")
}

/// In-process: `oneshot` on a clone of the router, the response body read to its end.
async fn oneshot_latency(router: &Router, count: usize) -> Vec<Duration> {
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        let t0 = Instant::now();
        let res = router
            .clone()
            .oneshot(request("/pay"))
            .await
            .expect("infallible");
        assert!(res.status().is_success(), "status {}", res.status());
        res.into_body().collect().await.expect("body");
        out.push(t0.elapsed());
    }
    out
}

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

/// One keep-alive HTTP/1 connection to `addr` (`TCP_NODELAY`), driven by a spawned task.
pub async fn connect<B>(addr: SocketAddr) -> hyper::client::conn::http1::SendRequest<B>
where
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    let (sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .expect("handshake");
    tokio::spawn(conn);
    sender
}

/// One request over `sender`, timed from sending to the response body's end.
async fn send(sender: &mut Sender) -> Duration {
    sender.ready().await.expect("ready");
    let t0 = Instant::now();
    let res = sender
        .send_request(request("/pay"))
        .await
        .expect("response");
    assert!(res.status().is_success(), "status {}", res.status());
    res.into_body().collect().await.expect("body");
    t0.elapsed()
}

/// One keep-alive connection, one request at a time.
async fn http_sequential(addr: SocketAddr, count: usize) -> (Vec<Duration>, f64) {
    let mut sender = connect(addr).await;
    let t0 = Instant::now();
    let mut out = Vec::with_capacity(count);
    for _ in 0..count {
        out.push(send(&mut sender).await);
    }
    let rate = count as f64 / t0.elapsed().as_secs_f64();
    (out, rate)
}

/// `conns` keep-alive connections, each sending one request after the other for `dur`.
async fn http_conns(addr: SocketAddr, conns: usize, dur: Duration) -> (Vec<Duration>, f64) {
    let mut senders = Vec::with_capacity(conns);
    for _ in 0..conns {
        senders.push(connect(addr).await);
    }
    let deadline = Instant::now() + dur;
    let tasks: Vec<_> = senders
        .into_iter()
        .map(|mut sender| {
            tokio::spawn(async move {
                let mut lat = Vec::new();
                while Instant::now() < deadline {
                    let d = send(&mut sender).await;
                    if Instant::now() <= deadline {
                        lat.push(d);
                    }
                }
                lat
            })
        })
        .collect();
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("client task"));
    }
    let rate = all.len() as f64 / dur.as_secs_f64();
    (all, rate)
}

/// The HTTP layer's table: each app's latencies and rate, and their ratios to the bare
/// handler's.
pub fn table(o: &mut String, layer: &[(&'static str, LayerRow)]) {
    let _ = writeln!(o, "\n### HTTP layer: axum handler without and with `RedlockLayer` (distinct Idempotency-Keys)\n");
    let _ = writeln!(
        o,
        "| app | in-process `oneshot` p50 | p99 | HTTP, 1 connection: p50 | HTTP, 64 connections: requests/s | p50 | p99 |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|");
    let bare = &layer[0].1;
    for (i, (name, row)) in layer.iter().enumerate() {
        let r = i > 0;
        let _ = writeln!(
            o,
            "| {name} | {} | {} | {} | {} | {} | {} |",
            lat_cell(p(&row.oneshot, 50.0), p(&bare.oneshot, 50.0), r),
            lat_cell(p(&row.oneshot, 99.0), p(&bare.oneshot, 99.0), r),
            lat_cell(p(&row.http1, 50.0), p(&bare.http1, 50.0), r),
            rate_cell(median(&row.http64_rates), median(&bare.http64_rates), r),
            lat_cell(p(&row.http64, 50.0), p(&bare.http64, 50.0), r),
            lat_cell(p(&row.http64, 99.0), p(&bare.http64, 99.0), r),
        );
    }
}

/// The target for the layer on 3 Redis masters: its p50 (in process, and over one
/// connection) ≤ the bare handler's + 1.2 × `cycle`, this crate's lock cycle p50 at N=3.
pub fn targets(o: &mut String, layer: &[(&'static str, LayerRow)], cycle: Duration) {
    for (what, pick) in [
        (
            "in-process oneshot",
            (|r: &LayerRow| p(&r.oneshot, 50.0)) as fn(&LayerRow) -> Option<Duration>,
        ),
        ("HTTP, 1 connection", |r: &LayerRow| p(&r.http1, 50.0)),
    ] {
        if let (Some(bare), Some(on)) = (pick(&layer[0].1), pick(&layer[2].1)) {
            let budget = bare + cycle.mul_f64(1.2);
            let _ = writeln!(
                o,
                "- layer on (3 Redis masters), {what}: p50 {} ≤ bare {} + 1.2 × cycle p50 {} = {}: {}",
                fmt_dur(on),
                fmt_dur(bare),
                fmt_dur(cycle),
                fmt_dur(budget),
                mark(on <= budget)
            );
        }
    }
}
