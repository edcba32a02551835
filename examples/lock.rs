//! The Ruby `redlock` gem's README flow, in Rust.
//!
//! ```text
//! REDLOCK_URLS=redis://127.0.0.1:7777,redis://127.0.0.1:7778,redis://127.0.0.1:7779 \
//!     cargo run --example lock
//! cargo run --example lock   # without REDLOCK_URLS: the in-memory node
//!
//! # a Sentinel group, a Cluster and a master as the three voters:
//! REDLOCK_URLS=redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster,redis+cluster://127.0.0.1:7000,redis://127.0.0.1:6379 \
//!     cargo run --features cluster --example lock
//! ```

use std::time::Duration;

use tower_redlock::node::MemoryNode;
use tower_redlock::{Redlock, Retry};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Like the gem's defaults, but quicker to give up: one retry after 50–100 ms.
    let builder = Redlock::builder().retry(Retry::times(1).delay(Duration::from_millis(50)));
    let redlock = match std::env::var("REDLOCK_URLS") {
        Ok(urls) if !urls.trim().is_empty() => {
            // Commas separate voters; a Sentinel's or a Cluster's hosts stay together.
            let urls = tower_redlock::node::split_urls(&urls);
            println!("using {} Redis voters", urls.len());
            urls.iter().fold(builder, |b, url| b.redis(url)).build()?
        }
        _ => {
            println!("REDLOCK_URLS is not set: using the in-memory node (one process only)");
            builder.node(MemoryNode::new()).build()?
        }
    };
    println!(
        "quorum: {} of {} nodes",
        redlock.quorum(),
        redlock.node_count()
    );

    let ttl = Duration::from_secs(2);

    // Locking
    let first_try = redlock.lock("resource_key", ttl).await?;
    let second_try = redlock.lock("resource_key", ttl).await;

    // prints the lease: {resource: "resource_key", value: "…", validity: 1977 ms}
    println!("first try:  {first_try}");
    // the second try fails: the resource is held
    match &second_try {
        Ok(lease) => return Err(format!("second lock unexpectedly succeeded: {lease}").into()),
        Err(e) => println!(
            "second try: {e} (contended: {}, retry after: {:?})",
            e.is_contended(),
            e.retry_after()
        ),
    }

    // Unlocking
    first_try.release().await?;
    let second_try = redlock.lock("resource_key", ttl).await?;
    println!("after unlock: {second_try}");
    second_try.release().await?;

    // The scoped version: always releases.
    let answer = redlock
        .critical_section("resource_key", ttl)
        .run(|lease| async move {
            println!("in the critical section, {:?} left", lease.validity());
            42
        })
        .await?;
    println!("with_lock returned {answer}");
    Ok(())
}
