//! Starts one voter of each kind on loopback — a Sentinel group (master, replica, three
//! sentinels), a 3-master Redis Cluster and a plain master — prints the `REDLOCK_URLS` that
//! names them, and keeps them until Ctrl-C (or SIGTERM), then stops every process it started.
//!
//! ```text
//! cargo run -p tower-redlock-testkit --bin topology
//! # in another shell, with the printed line:
//! REDLOCK_URLS='redis+sentinel://…' scripts/demo.sh
//! ```

#![allow(clippy::print_stdout)]

use tower_redlock_testkit::cluster::Cluster;
use tower_redlock_testkit::sentinel::SentinelGroup;
use tower_redlock_testkit::RedisServer;

#[tokio::main]
async fn main() {
    // The kit's start-up waits block: off the runtime's threads.
    let (group, cluster, master) = tokio::task::spawn_blocking(|| {
        (
            SentinelGroup::start("demo"),
            Cluster::start(3),
            RedisServer::start(),
        )
    })
    .await
    .expect("the voters start");
    let urls = [
        format!(
            "redis+sentinel://{}/{}",
            group.sentinel_addrs().join(","),
            group.master_name()
        ),
        format!("redis+cluster://{}", cluster.addrs().join(",")),
        master.url(),
    ];
    println!("REDLOCK_URLS={}", urls.join(","));
    println!("(Ctrl-C stops them)");

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("a SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    // Dropping them kills every process by its pid and removes their files.
    tokio::task::spawn_blocking(move || drop((group, cluster, master)))
        .await
        .expect("the voters stop");
}
