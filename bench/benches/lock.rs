//! Criterion micro-benchmarks of one lock + release cycle: the raw limit, this crate's client
//! over Redis masters (also with fencing tokens: a script instead of `SET`), rslock, and this crate's client over the in-process memory node (its
//! own CPU cost, with no network at all).
//!
//! ```text
//! cargo bench -p tower-redlock-bench --bench lock
//! cargo bench -p tower-redlock-bench --bench lock -- 'cycle/N=3'      # a subset
//! ```
//!
//! Starts its own `redis-server` masters (see `tests/support`). For the side-by-side table
//! with ratios, the fault cases and the peers' throughput, see `bench/benches/compare.rs`.

use tower_redlock_bench as common;
use tower_redlock_testkit as support;

use std::sync::Arc;
use std::time::Duration;

use common::{Extras, Limit, Locker};
use criterion::{criterion_group, criterion_main, Criterion};
use support::Masters;
use tower_redlock::Redlock;

const NODE_TIMEOUT: Duration = Duration::from_millis(50);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn cycles(c: &mut Criterion) {
    let rt = runtime();
    let masters = Masters::start(5);
    for n in [3, 5] {
        let urls = masters.urls()[..n].to_vec();
        let lockers: Vec<(&str, Locker)> = rt.block_on(async {
            vec![
                (
                    "limit",
                    Locker::Limit(Arc::new(
                        Limit::connect(&urls, NODE_TIMEOUT, Extras::default()).await,
                    )),
                ),
                (
                    "tower-redlock",
                    Locker::Ours(common::ours(&urls, NODE_TIMEOUT)),
                ),
                (
                    "tower-redlock (fencing)",
                    Locker::Ours(common::ours_with(&urls, NODE_TIMEOUT, true)),
                ),
                ("rslock", Locker::Rslock(common::rslock(&urls))),
            ]
        });
        let mut group = c.benchmark_group(format!("cycle/N={n}"));
        group
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(3));
        for (name, l) in &lockers {
            let key = format!("bench:criterion:{name}");
            group.bench_function(*name, |b| {
                b.to_async(&rt).iter(|| async {
                    let held = l.acquire(&key).await.expect("an uncontended lock");
                    l.release(&key, held).await;
                })
            });
        }
        group.finish();
    }
    drop(masters);
}

fn memory(c: &mut Criterion) {
    let rt = runtime();
    let redlock = rt.block_on(async { Redlock::in_memory() });
    let mut group = c.benchmark_group("memory node");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    group.bench_function("try_lock + release", |b| {
        b.to_async(&rt).iter(|| async {
            let lease = redlock
                .try_lock("bench:memory", Duration::from_secs(10))
                .await
                .expect("an uncontended lock");
            lease.release().await.expect("release");
        })
    });
    group.bench_function("try_lock, held (contended answer)", |b| {
        let held = rt.block_on(redlock.try_lock("bench:memory:held", Duration::from_secs(60)));
        b.to_async(&rt).iter(|| async {
            let err = redlock
                .try_lock("bench:memory:held", Duration::from_secs(10))
                .await
                .expect_err("held");
            assert!(err.is_contended());
        });
        drop(held);
    });
    group.finish();
}

criterion_group!(benches, cycles, memory);
criterion_main!(benches);
