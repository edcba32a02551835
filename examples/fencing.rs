//! Fencing tokens: why a lock alone cannot protect storage, and what does.
//!
//! Kleppmann's critique of Redlock: client 1 takes the lock, pauses (a GC, a SIGSTOP) past
//! its validity, the lock expires, client 2 takes it and writes — then client 1 wakes up and
//! writes too, clobbering client 2's write. The remedy: every lease carries a fencing token
//! that grows with every new holder, every write carries the token, and the storage refuses
//! a token smaller than the largest it has accepted. This example runs that scenario.
//!
//! ```text
//! REDLOCK_URLS=redis://127.0.0.1:7777,redis://127.0.0.1:7778,redis://127.0.0.1:7779 \
//!     cargo run --example fencing
//! cargo run --example fencing   # without REDLOCK_URLS: the in-memory node
//! ```

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tower_redlock::node::MemoryNode;
use tower_redlock::{Redlock, Retry};

/// Storage that checks the fencing token of every write: a compare-and-set on the token.
///
/// This is what the database must do, atomically with the write: e.g. a `fence` column and
/// `UPDATE ledger SET value = $v, fence = $token WHERE id = $id AND fence <= $token` (zero
/// rows updated: stale), or a conditional write (DynamoDB `ConditionExpression`, an etcd or
/// ZooKeeper transaction comparing the stored token). Checking the lease's validity before
/// writing is not enough: the pause can fall between the check and the write.
#[derive(Default)]
struct Storage {
    /// The largest token accepted so far, and the value it wrote.
    state: Mutex<(u64, String)>,
}

/// A write refused: its `token` is smaller than the largest one `seen`.
#[derive(Debug)]
struct Stale {
    token: u64,
    seen: u64,
}

impl std::fmt::Display for Stale {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stale token {} (seen {})", self.token, self.seen)
    }
}

impl std::error::Error for Stale {}

impl Storage {
    /// Writes `value` unless a larger token than `token` was accepted before (the same
    /// token is the same holder: its second write is accepted too).
    fn write(&self, token: u64, value: &str) -> Result<(), Stale> {
        let mut state = self.lock();
        if token < state.0 {
            return Err(Stale {
                token,
                seen: state.0,
            });
        }
        *state = (token, value.to_owned());
        Ok(())
    }

    fn read(&self) -> String {
        self.lock().1.clone()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, (u64, String)> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // Each client is its own `Redlock` over the same voters: the same Redis masters, or
    // clones of one `MemoryNode` (clones share its map).
    let var = std::env::var("REDLOCK_URLS").unwrap_or_default();
    let urls = Some(tower_redlock::node::split_urls(&var)).filter(|_| !var.trim().is_empty());
    match &urls {
        Some(urls) => println!("using {} Redis voters", urls.len()),
        None => println!("REDLOCK_URLS is not set: using the in-memory node (one process only)"),
    }
    let memory = MemoryNode::new();
    let client = |fencing: bool| {
        let builder = Redlock::builder().fencing(fencing);
        match &urls {
            Some(urls) => urls.iter().fold(builder, |b, url| b.redis(url)).build(),
            None => builder.node(memory.clone()).build(),
        }
    };
    let (client1, client2) = (client(true)?, client(true)?);
    let storage = Storage::default();
    let ttl = Duration::from_millis(300);

    // 1. Client 1 takes the lock and reads its token.
    let lease1 = client1.lock("ledger", ttl).await?;
    let token1 = lease1.fencing_token().ok_or("client 1: no token")?;
    let valid = lease1.validity();
    println!("client 1: locked \"ledger\", token {token1}, valid for {valid:?}");

    // While client 1's lease is valid, client 2 cannot take the lock.
    match client2.try_lock("ledger", ttl).await {
        Err(e) if e.is_contended() => println!("client 2: try_lock while client 1 holds it: {e}"),
        other => return Err(format!("the lock must exclude client 2: {other:?}").into()),
    }

    // 2. Client 1 pauses (a stop-the-world GC, a SIGSTOP) until past its validity. The sleep
    // *is* the pause here; a margin of ttl/10 puts the deadline well behind it.
    let wake = lease1.deadline() + ttl / 10;
    println!(
        "client 1: paused (GC) for {:?}",
        wake.saturating_duration_since(Instant::now())
    );
    tokio::time::sleep_until(wake.into()).await;

    // 3. The lock expired: client 2 takes it. The nodes' keys expire a little after client
    // 1's deadline (the client counts its validity conservatively): retry, within bounds.
    let lease2 = client2
        .lock_with("ledger", ttl, Retry::until(ttl).delay(ttl / 20))
        .await?;
    let token2 = lease2.fencing_token().ok_or("client 2: no token")?;
    println!("client 2: locked \"ledger\", token {token2}");

    // 4. Client 2 writes with its token: accepted.
    storage.write(token2, "written by client 2")?;
    println!("client 2: write with token {token2}: accepted");

    // 5. Client 1 wakes up, unaware of the pause, and writes with its old token: refused.
    println!("client 1: woke up, lease valid: {}", lease1.is_valid());
    let stale = storage.write(token1, "written by client 1");
    match &stale {
        Ok(()) => println!("client 1: write with token {token1}: ACCEPTED (fencing failed!)"),
        Err(Stale { token, seen }) => {
            println!("client 1: write with token {token}: refused, storage has seen {seen}")
        }
    }

    // 6. Both release. Client 1's lock is long gone: its release can only find nothing.
    lease2.release().await?;
    println!("client 2: released");
    println!("client 1: release: {:?}", lease1.release().await);

    assert!(token2 > token1, "the next holder's token must be larger");
    assert!(stale.is_err(), "the stale write must be refused");
    assert_eq!(storage.read(), "written by client 2");
    println!("storage holds: {:?}", storage.read());

    // Without fencing, leases carry no token.
    let plain = client(false)?.lock("ledger", ttl).await?;
    let none = plain.fencing_token();
    println!("without fencing: fencing_token() = {none:?}");
    assert_eq!(none, None);
    plain.release().await?;
    Ok(())
}
