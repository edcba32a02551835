//! Redis: a read-modify-write fenced from its read. [`FencedRedis::read_for_write`] (a
//! string) and [`FencedRedis::raise_for_write`] (any type, read next with plain commands)
//! raise the stored token before the read, so a holder paused after its read cannot land a
//! write computed from what it read once the next holder has read. Every test name starts
//! with `fenced_claim_redis_`; the plain read's lost update is shown too, named for what it
//! shows, so that nobody copies it.
//!
//! The interleaving, with the tokens of a real Redlock (`.fencing(true)` over three
//! masters) and the data in a Redis of its own: holder 1 reads a balance of 100 and pauses
//! past its lease; holder 2 takes the lock and reads 100; holder 1 wakes and writes 150;
//! holder 2 writes 70.

use std::time::Duration;

use tower_redlock::fenced::StaleToken;
use tower_redlock_testkit::{Masters, RedisServer};

use super::redis::{fencing_client, lock_when_free, store};

const KEY: &str = "{account:7}";
const SHORT: Duration = Duration::from_millis(300);

/// The tokens of two holders of `account:7`, one after the other (the first lease expired
/// before the second was granted: "the pause"), the data Redis seeded with a balance of 100
/// written by an earlier holder.
async fn two_holders(m: &Masters, server: &RedisServer) -> (u64, u64) {
    let (a, b) = (fencing_client(m).await, fencing_client(m).await);
    let seed = lock_when_free(&a, "account:7", SHORT).await;
    let t0 = seed.fencing_token().expect("fencing is on");
    store(server)
        .await
        .set(KEY, "100", t0)
        .await
        .unwrap()
        .unwrap();
    let _ = seed.release().await;
    let paused = lock_when_free(&a, "account:7", SHORT).await;
    let t1 = paused.fencing_token().unwrap();
    let next = lock_when_free(&b, "account:7", SHORT).await;
    assert!(
        !paused.is_valid(),
        "holder 1's lease expired before holder 2's grant"
    );
    let t2 = next.fencing_token().unwrap();
    assert!(t0 < t1 && t1 < t2, "{t0} < {t1} < {t2}");
    (t1, t2)
}

fn balance(raw: Option<Vec<u8>>) -> u64 {
    let raw = raw.expect("a balance");
    std::str::from_utf8(&raw).unwrap().parse().unwrap()
}

/// The interleaving with the claimed read: holder 1's late write (computed from a read that
/// holder 2's raise overtook) is refused, not acknowledged; holder 2's lands. Every
/// acknowledged write is in the final state's lineage: 100 (the seed), then 70.
#[tokio::test]
async fn fenced_claim_redis_a_paused_reader_loses_no_acknowledged_write() {
    let m = Masters::start(3);
    let server = RedisServer::start();
    let (t1, t2) = two_holders(&m, &server).await;
    let mut data = store(&server).await;

    // Holder 1 reads (and raises) first — then pauses; its lease expires meanwhile.
    let seen_by_1 = balance(data.read_for_write(KEY, t1).await.unwrap().unwrap());
    // Holder 2 reads.
    let seen_by_2 = balance(data.read_for_write(KEY, t2).await.unwrap().unwrap());
    assert_eq!((seen_by_1, seen_by_2), (100, 100));
    // Holder 1 wakes and deposits 50: refused, its client told so.
    let late = data
        .set(KEY, (seen_by_1 + 50).to_string(), t1)
        .await
        .unwrap();
    assert_eq!(late, Err(StaleToken::new(t1, t2)));
    // Holder 2 withdraws 30.
    data.set(KEY, (seen_by_2 - 30).to_string(), t2)
        .await
        .unwrap()
        .expect("holder 2 writes");
    assert_eq!(server.get(KEY).await.as_deref(), Some("70"));
    assert_eq!(data.fence(KEY).await.unwrap(), Some(t2));
}

/// The same interleaving with a plain `GET` before the fenced write — the pattern fencing
/// of the writes alone allows: holder 1's deposit is **acknowledged** (the stored token, the
/// seed's, is older than both), then holder 2's write, computed from the same 100, replaces
/// it. The deposit is lost. This test shows the hole; do not copy it.
#[tokio::test]
async fn fenced_claim_redis_a_plain_read_loses_an_acknowledged_write() {
    let m = Masters::start(3);
    let server = RedisServer::start();
    let (t1, t2) = two_holders(&m, &server).await;
    let mut data = store(&server).await;

    let read = |v: Option<String>| -> u64 { v.expect("a balance").parse().unwrap() };
    let seen_by_1 = read(server.get(KEY).await);
    let seen_by_2 = read(server.get(KEY).await);
    let deposit = data
        .set(KEY, (seen_by_1 + 50).to_string(), t1)
        .await
        .unwrap();
    assert_eq!(deposit, Ok(()), "holder 1's deposit is acknowledged");
    data.set(KEY, (seen_by_2 - 30).to_string(), t2)
        .await
        .unwrap()
        .expect("holder 2 writes");
    assert_eq!(
        server.get(KEY).await.as_deref(),
        Some("70"),
        "the acknowledged deposit (150) is lost: 70 was computed from 100"
    );
}

/// A reader with an older token than the stored one is refused: nothing read, nothing
/// raised, nothing written.
#[tokio::test]
async fn fenced_claim_redis_a_stale_reader_is_refused_and_raises_nothing() {
    let server = RedisServer::start();
    let mut data = store(&server).await;
    assert_eq!(data.read_for_write(KEY, 5).await.unwrap(), Ok(None));
    assert_eq!(
        data.fence(KEY).await.unwrap(),
        Some(5),
        "an empty key's read raised"
    );
    data.set(KEY, "100", 9).await.unwrap().unwrap();
    assert_eq!(
        data.read_for_write(KEY, 8).await.unwrap(),
        Err(StaleToken::new(8, 9))
    );
    // An equal token reads (the holder reads again), a newer one raises.
    assert_eq!(
        data.read_for_write(KEY, 9)
            .await
            .unwrap()
            .unwrap()
            .as_deref(),
        Some(&b"100"[..])
    );
    data.read_for_write(KEY, 12).await.unwrap().unwrap();
    assert_eq!(data.fence(KEY).await.unwrap(), Some(12));
    assert_eq!(
        server.get(KEY).await.as_deref(),
        Some("100"),
        "a read writes no data"
    );
}

/// A hash: `raise_for_write`, then a plain `HGETALL`; a write of an older holder after the
/// raise is refused. `read_for_write` on the hash is a `WRONGTYPE` error that raises nothing.
#[tokio::test]
async fn fenced_claim_redis_raise_then_read_a_hash() {
    let server = RedisServer::start();
    let mut data = store(&server).await;
    let key = "{stock:3}";
    data.hset(key, "sku-7", "4", 1).await.unwrap().unwrap();

    let e = data
        .read_for_write(key, 2)
        .await
        .expect_err("a hash, not a string");
    assert_eq!(e.code(), Some("WRONGTYPE"), "{e}");
    assert_eq!(data.fence(key).await.unwrap(), Some(1), "nothing raised");

    data.raise_for_write(key, 2).await.unwrap().unwrap();
    let stock: Vec<(String, String)> = server.query(redis::cmd("HGETALL").arg(key)).await;
    assert_eq!(stock, [("sku-7".to_owned(), "4".to_owned())]);
    assert_eq!(
        data.hset(key, "sku-7", "5", 1).await.unwrap(),
        Err(StaleToken::new(1, 2)),
        "the older holder's write after the raise"
    );
    assert_eq!(
        data.raise_for_write(key, 1).await.unwrap(),
        Err(StaleToken::new(1, 2))
    );
    data.hset(key, "sku-7", "3", 2).await.unwrap().unwrap();
}
