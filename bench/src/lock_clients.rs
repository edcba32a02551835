//! The lock clients side by side: the limit, this crate and the peer crates, on healthy
//! masters (single-task cycles, 64 tasks on their own keys, 32 tasks on one key) and with one
//! master slowed, then black-holed behind a fault proxy; and their table and targets in the
//! report.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tower_redlock_testkit::proxy::{Fault, FaultProxy};
use tower_redlock_testkit::Masters;

use crate::report::{fault_cell, lat_cell, mark, p, rate_cell};
use crate::{median, Extras, Latency, Limit, Locker, Params, Rate};

/// The peer crates to run beside the limit and this crate.
#[derive(Debug, Clone, Copy)]
pub struct Peers {
    pub rslock: bool,
    pub redlock_rs: bool,
}

/// The clients, in table order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Who {
    Limit,
    Ours,
    Rslock,
    RedlockRs,
}

impl Who {
    pub fn name(self) -> &'static str {
        match self {
            Who::Limit => "limit (raw redis-rs)",
            Who::Ours => "tower-redlock",
            Who::Rslock => "rslock 0.10",
            Who::RedlockRs => "redlock-rs 2.0",
        }
    }

    pub fn prefix(self) -> &'static str {
        match self {
            Who::Limit => "bench:limit",
            Who::Ours => "bench:ours",
            Who::Rslock => "bench:rslock",
            Who::RedlockRs => "bench:redlockrs",
        }
    }
}

/// A client of either kind.
#[derive(Clone)]
enum Client {
    Async(Locker),
    Sync(Arc<redlock::RedLock>),
}

/// Every client's [`Row`] at every N, in table order.
pub type Table = BTreeMap<(usize, Who), Row>;

/// Everything measured for one client at one N.
#[derive(Debug, Default)]
pub struct Row {
    /// Acquisitions only, each lock released in the background (a busy loop).
    pub healthy_acquire: Latency,
    pub healthy: Latency,
    pub many: Vec<Rate>,
    pub one_key: Vec<Rate>,
    pub slowed: Fault2,
    pub black: Fault2,
    pub keys_left: u64,
}

/// The clients over `urls`, connected and warmed up (script caches, connections).
async fn clients(s: &Params, peers: Peers, urls: &[String]) -> Vec<(Who, Client)> {
    let limit = Limit::connect(urls, s.node_timeout, Extras::default()).await;
    let mut out = vec![
        (Who::Limit, Client::Async(Locker::Limit(Arc::new(limit)))),
        (
            Who::Ours,
            Client::Async(Locker::Ours(crate::ours(urls, s.node_timeout))),
        ),
    ];
    if peers.rslock {
        out.push((
            Who::Rslock,
            Client::Async(Locker::Rslock(crate::rslock(urls))),
        ));
    }
    if peers.redlock_rs {
        out.push((
            Who::RedlockRs,
            Client::Sync(Arc::new(crate::redlock_rs(urls))),
        ));
    }
    for (who, c) in &out {
        let key = format!("{}:warmup", who.prefix());
        let w = run_latency(c, &key, 50, Duration::from_secs(5), Duration::from_secs(5)).await;
        assert!(
            w.failures == 0 && !w.hung,
            "{} failed its warm-up: {w:?}",
            who.name()
        );
    }
    out
}

/// Single-task lock + release cycles ([`crate::latency`]); redlock-rs, which may block for
/// good, on a detached thread (reported as hung after `budget + cap`).
async fn run_latency(
    c: &Client,
    key: &str,
    cycles: usize,
    budget: Duration,
    cap: Duration,
) -> Latency {
    match c {
        Client::Async(l) => crate::latency(l, key, cycles, budget, cap).await,
        Client::Sync(m) => {
            let (m, key) = (m.clone(), key.to_owned());
            let (tx, rx) = tokio::sync::oneshot::channel();
            // A detached thread: redlock-rs has no timeout and may block for good (it ends
            // when its connection is reset).
            std::thread::spawn(move || {
                let _ = tx.send(crate::latency_sync(&m, &key, cycles, budget));
            });
            match tokio::time::timeout(budget + cap, rx).await {
                Ok(Ok(l)) => l,
                _ => Latency {
                    hung: true,
                    ..Latency::default()
                },
            }
        }
    }
}

/// Acquisitions timed alone, each lock released in the background (see
/// [`crate::acquire_hot`]); redlock-rs, which blocks, releases in line.
async fn run_acquire(
    c: &Client,
    prefix: &str,
    count: usize,
    budget: Duration,
    cap: Duration,
) -> Latency {
    match c {
        Client::Async(l) => crate::acquire_hot(l, prefix, count, budget, cap).await,
        Client::Sync(_) => run_latency(c, &format!("{prefix}:0"), count, budget, cap).await,
    }
}

/// The healthy masters, the first `n`: in each round, in a rotated order, every client's
/// single-task cycles and acquisitions, then 64 tasks on their own keys, then 32 tasks on one
/// key.
pub async fn healthy(s: &Params, peers: Peers, masters: &Masters, n: usize) -> Vec<(Who, Row)> {
    let urls = &masters.urls()[..n];
    let clients = clients(s, peers, urls).await;
    let mut rows: Vec<(Who, Row)> = clients.iter().map(|(w, _)| (*w, Row::default())).collect();
    let k = clients.len();
    for round in 0..s.rounds {
        for j in 0..k {
            let i = (j + round) % k;
            let (who, c) = &clients[i];
            let key = format!("{}:lat", who.prefix());
            let l = run_latency(c, &key, s.count(600), s.dur(10.0), Duration::from_secs(5)).await;
            rows[i].1.healthy.merge(l);
            let prefix = format!("{}:acq", who.prefix());
            let a = run_acquire(c, &prefix, s.count(300), s.dur(5.0), Duration::from_secs(5)).await;
            rows[i].1.healthy_acquire.merge(a);
        }
        for j in 0..k {
            let i = (j + round) % k;
            let (who, c) = &clients[i];
            let prefix = format!("{}:many", who.prefix());
            let dur = s.dur(1.0);
            let r = match c {
                Client::Async(l) => crate::throughput(l, &prefix, 64, dur).await,
                Client::Sync(m) => {
                    let m = m.clone();
                    tokio::task::spawn_blocking(move || {
                        crate::throughput_sync(&m, &prefix, 64, dur)
                    })
                    .await
                    .expect("redlock-rs throughput")
                }
            };
            rows[i].1.many.push(r);
        }
        for j in 0..k {
            let i = (j + round) % k;
            let (who, c) = &clients[i];
            let key = format!("{}:one", who.prefix());
            let dur = s.dur(1.0);
            let r = match c {
                Client::Async(l) => crate::one_key(l, &key, 32, dur).await,
                Client::Sync(m) => {
                    let m = m.clone();
                    tokio::task::spawn_blocking(move || crate::one_key_sync(&m, &key, 32, dur))
                        .await
                        .expect("redlock-rs one key")
                }
            };
            rows[i].1.one_key.push(r);
        }
    }
    rows
}

/// Under one fault: the acquisitions alone, then whole cycles.
#[derive(Debug, Default)]
pub struct Fault2 {
    pub acquire: Latency,
    pub cycle: Latency,
}

/// One master (index 0) behind a fault proxy: slowed by 2 ms each way, then black-holed.
pub fn faults(
    s: &Params,
    peers: Peers,
    rt: &tokio::runtime::Runtime,
    proxy_rt: &tokio::runtime::Runtime,
    masters: &Masters,
    n: usize,
) -> Vec<(Who, (Fault2, Fault2))> {
    let upstream: SocketAddr = masters[0].addr().parse().expect("address");
    let proxy = proxy_rt.block_on(FaultProxy::start(upstream));
    let mut urls = masters.urls()[..n].to_vec();
    urls[0] = proxy.url();
    let clients = rt.block_on(clients(s, peers, &urls));
    let mut out: Vec<(Who, (Fault2, Fault2))> = clients
        .iter()
        .map(|(w, _)| (*w, (Fault2::default(), Fault2::default())))
        .collect();

    proxy.set(Fault::Latency(Duration::from_millis(2)));
    rt.block_on(async {
        for (i, (who, c)) in clients.iter().enumerate() {
            let key = format!("{}:slow", who.prefix());
            out[i].1 .0.acquire = run_acquire(
                c,
                &format!("{key}:acq"),
                s.count(300),
                s.dur(2.0),
                Duration::from_secs(5),
            )
            .await;
            out[i].1 .0.cycle =
                run_latency(c, &key, s.count(150), s.dur(2.0), Duration::from_secs(5)).await;
        }
    });

    // Let the slowed phase's background work (late SETs and their releases) finish under
    // that fault: a partition that starts while a release is on its way strands the key on
    // that master for a ttl, for every client, and would be counted as left over.
    std::thread::sleep(s.node_timeout * 4 + Duration::from_millis(100));
    proxy.set(Fault::BlackHole);
    rt.block_on(async {
        for (i, (who, c)) in clients.iter().enumerate() {
            let key = format!("{}:black", who.prefix());
            // The steady state of a dead master, as in production where it stays dead for
            // seconds or more: each client first works against it for 4 node timeouts (this
            // crate suspends a master after 3 timeouts in a row; the limit and the peers have
            // nothing to learn, and redlock-rs would block here for good). Without this, the
            // whole measurement would fit inside the first node timeout.
            if let Client::Async(l) = c {
                crate::acquire_hot(
                    l,
                    &format!("{key}:warm"),
                    usize::MAX,
                    s.node_timeout * 4,
                    Duration::from_secs(3),
                )
                .await;
            }
            // A client that waits for every node pays the dead one's timeout each time:
            // a small budget bounds it. A client that blocks for good is reported as hung.
            out[i].1 .1.acquire = run_acquire(
                c,
                &format!("{key}:acq"),
                s.count(300),
                s.dur(2.0),
                Duration::from_secs(3),
            )
            .await;
            out[i].1 .1.cycle =
                run_latency(c, &key, s.count(30), s.dur(2.0), Duration::from_secs(3)).await;
        }
    });
    // Reset: stalled traffic is dropped (never reaches the master), blocked clients fail.
    proxy.set(Fault::Reset);
    std::thread::sleep(Duration::from_millis(200));
    drop(clients);
    drop(proxy);
    out
}

/// Keys under `prefix` on the first `n` masters.
pub async fn keys_left(masters: &Masters, n: usize, prefix: &str) -> u64 {
    let mut total = 0;
    for m in masters.iter().take(n) {
        let keys: Vec<String> = m.query(redis::cmd("KEYS").arg(format!("{prefix}:*"))).await;
        if !keys.is_empty() && std::env::var_os("REDLOCK_BENCH_DEBUG").is_some() {
            eprintln!("left on {}: {keys:?}", m.addr());
        }
        total += keys.len() as u64;
    }
    total
}

/// The lock clients' table: one row a client and N, each client's ratios to the limit's.
pub fn table(o: &mut String, node_timeout: Duration, table: &Table) {
    let _ = writeln!(
        o,
        "### Lock clients: lock + release cycles, ttl {:?}, node timeout {:?}\n",
        crate::TTL,
        node_timeout
    );
    let _ = writeln!(
        o,
        "| N | client | acquire p50 | cycle p50 | cycle p99 | 64 tasks: cycles/s | contended, 32 tasks on 1 key: successes/s | overlaps | 1 master +2 ms: acquire p50 | cycle p50 | 1 master black-holed: acquire p50 | cycle p50 | keys left |"
    );
    let _ = writeln!(o, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (&(n, who), row) in table {
        let base = table.get(&(n, Who::Limit));
        let r = who != Who::Limit;
        let bl = |f: &dyn Fn(&Row) -> Option<Duration>| base.and_then(f);
        let many = median(&row.many.iter().map(Rate::per_sec).collect::<Vec<_>>());
        let one = median(&row.one_key.iter().map(Rate::per_sec).collect::<Vec<_>>());
        let overlaps: u64 = row.one_key.iter().map(|r| r.overlaps).sum();
        let base_many = base.map_or(0.0, |b| {
            median(&b.many.iter().map(Rate::per_sec).collect::<Vec<_>>())
        });
        let base_one = base.map_or(0.0, |b| {
            median(&b.one_key.iter().map(Rate::per_sec).collect::<Vec<_>>())
        });
        let _ = writeln!(
            o,
            "| {n} | {} | {} | {} | {} | {} | {} | {overlaps} | {} | {} | {} | {} | {} |",
            who.name(),
            lat_cell(
                p(&row.healthy_acquire.acquire, 50.0),
                bl(&|b| p(&b.healthy_acquire.acquire, 50.0)),
                r
            ),
            lat_cell(
                p(&row.healthy.cycle, 50.0),
                bl(&|b| p(&b.healthy.cycle, 50.0)),
                r
            ),
            lat_cell(
                p(&row.healthy.cycle, 99.0),
                bl(&|b| p(&b.healthy.cycle, 99.0)),
                r
            ),
            rate_cell(many, base_many, r),
            rate_cell(one, base_one, r),
            fault_cell(
                &row.slowed.acquire,
                bl(&|b| p(&b.slowed.acquire.acquire, 50.0)),
                r,
                true
            ),
            fault_cell(
                &row.slowed.cycle,
                bl(&|b| p(&b.slowed.cycle.cycle, 50.0)),
                r,
                false
            ),
            fault_cell(
                &row.black.acquire,
                bl(&|b| p(&b.black.acquire.acquire, 50.0)),
                r,
                true
            ),
            fault_cell(
                &row.black.cycle,
                bl(&|b| p(&b.black.cycle.cycle, 50.0)),
                r,
                false
            ),
            row.keys_left,
        );
    }
}

/// The targets for this crate against the limit, at each of `ns`: the cycle, the
/// 64-task throughput, the contended rate, and the acquisitions with one master slowed or
/// black-holed.
pub fn targets(o: &mut String, ns: &[usize], table: &Table) {
    for &n in ns {
        let (Some(lim), Some(us)) = (table.get(&(n, Who::Limit)), table.get(&(n, Who::Ours)))
        else {
            continue;
        };
        let ratio = |a: Option<Duration>, b: Option<Duration>| match (a, b) {
            (Some(a), Some(b)) if !b.is_zero() => a.as_secs_f64() / b.as_secs_f64(),
            _ => f64::NAN,
        };
        let c = ratio(p(&us.healthy.cycle, 50.0), p(&lim.healthy.cycle, 50.0));
        let _ = writeln!(
            o,
            "- N={n}: cycle p50 ≤ 1.10× the limit: {c:.2}× — {}",
            mark(c <= 1.10)
        );
        let t = median(&us.many.iter().map(Rate::per_sec).collect::<Vec<_>>())
            / median(&lim.many.iter().map(Rate::per_sec).collect::<Vec<_>>());
        let _ = writeln!(
            o,
            "- N={n}: 64-task throughput ≥ 0.90× the limit: {t:.2}× — {}",
            mark(t >= 0.90)
        );
        if n == 3 || n == 5 {
            let c = median(&us.one_key.iter().map(Rate::per_sec).collect::<Vec<_>>())
                / median(&lim.one_key.iter().map(Rate::per_sec).collect::<Vec<_>>());
            let _ = writeln!(
                o,
                "- N={n}: contended (32 tasks, one key) ≥ 0.95× the limit: {c:.2}× — {}",
                mark(c >= 0.95)
            );
        }
        let own = p(&us.healthy_acquire.acquire, 50.0);
        let lim_own = p(&lim.healthy_acquire.acquire, 50.0);
        for (what, l, ll) in [
            ("slowed", &us.slowed, &lim.slowed),
            ("black-holed", &us.black, &lim.black),
        ] {
            let f = ratio(p(&l.acquire.acquire, 50.0), own);
            let fl = ratio(p(&ll.acquire.acquire, 50.0), lim_own);
            let _ = writeln!(
                o,
                "- N={n}: one {what} master: acquire p50 ≤ 1.2× our all-healthy acquire p50: {f:.2}× — {} (the limit's own: {fl:.2}×)",
                mark(f <= 1.2)
            );
        }
    }
}
