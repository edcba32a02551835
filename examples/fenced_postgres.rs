//! Fencing where the data lives: a PostgreSQL row guarded by a `fence` column.
//!
//! A fencing token protects nothing until the storage compares it. Here the database does,
//! in the write's own `WHERE`, inside the caller's transaction:
//!
//! ```sql
//! CREATE TABLE ledger (id text PRIMARY KEY, balance bigint, fence bigint NOT NULL);
//! -- 1 row: written; 0 rows: a newer holder has written, the write is stale
//! UPDATE ledger SET balance = $2, fence = $3 WHERE id = $1 AND fence <= $3;
//! -- the insert-or-update form
//! INSERT INTO ledger (id, balance, fence) VALUES ($1, $2, $3) ON CONFLICT (id)
//!     DO UPDATE SET balance = EXCLUDED.balance, fence = EXCLUDED.fence
//!     WHERE ledger.fence <= EXCLUDED.fence;
//! ```
//!
//! `$3` is the lease's [`fencing_token`](tower_redlock::Lease::fencing_token): with `<=` the
//! same holder may write again, an older one never. On zero rows the helpers read the stored
//! fence and return a [`StaleToken`] — a handler answers it as `409`
//! `/problems/fencing-token-stale`. A `SELECT` of the fence before the write would not do:
//! the pause can fall between the two. Under `READ COMMITTED` (PostgreSQL's default) the
//! `WHERE` is re-checked on the row the update would overwrite, even when it waited for a
//! newer writer's row lock; under `REPEATABLE READ` or `SERIALIZABLE` that late writer gets a
//! serialization failure (`40001`) instead — refused too: answer it as a stale token. A row
//! that does not exist has no fence to compare: keep rows (a tombstone) rather than delete them.
//!
//! The run is Kleppmann's scenario: client 1 takes the lock and pauses past its ttl, client 2
//! takes the lock and writes, client 1 wakes up and writes with its older token — refused.
//! The table is `TEMPORARY`: nothing stays in the database. The tests of this pattern against
//! a real server are `tests/fenced_store/postgres.rs`.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres cargo run --example fenced_postgres
//! REDLOCK_URLS=redis://127.0.0.1:7777,redis://127.0.0.1:7778,redis://127.0.0.1:7779 \
//!     DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres cargo run --example fenced_postgres
//! ```
//!
//! Without `REDLOCK_URLS` the lock is the in-memory node; without `DATABASE_URL` it says how
//! to get a server.

use std::time::Duration;

use tokio_postgres::{Client, Error, NoTls, Transaction};
use tower_redlock::fenced::StaleToken;
use tower_redlock::node::MemoryNode;
use tower_redlock::{Redlock, Retry};

/// A fencing token as a `bigint`. Tokens look like microsecond timestamps (about 1.7·10^15
/// today), and the crate keeps its counters below 2^53: far inside a `bigint`.
fn fence(token: u64) -> i64 {
    i64::try_from(token).expect("a fencing token beyond bigint")
}

/// The fenced update: the row's fence must be at most the token.
const UPDATE: &str = "UPDATE ledger SET balance = $2, fence = $3 WHERE id = $1 AND fence <= $3";

/// The fenced insert-or-update: a new row, or the update of [`UPDATE`].
const UPSERT: &str = "INSERT INTO ledger (id, balance, fence) VALUES ($1, $2, $3) \
     ON CONFLICT (id) DO UPDATE SET balance = EXCLUDED.balance, fence = EXCLUDED.fence \
     WHERE ledger.fence <= EXCLUDED.fence";

/// Writes `balance` to row `id` in the caller's transaction, unless a newer holder wrote it:
/// `Ok(Ok(()))` written, `Ok(Err(stale))` refused (the row is unchanged), `Err(_)` the
/// database failed (also when the row does not exist: create it with [`fenced_upsert`]).
async fn fenced_update(
    tx: &Transaction<'_>,
    id: &str,
    balance: i64,
    token: u64,
) -> Result<Result<(), StaleToken>, Error> {
    fenced_write(tx, UPDATE, id, balance, token).await
}

/// Inserts row `id` or updates it as [`fenced_update`] does.
async fn fenced_upsert(
    tx: &Transaction<'_>,
    id: &str,
    balance: i64,
    token: u64,
) -> Result<Result<(), StaleToken>, Error> {
    fenced_write(tx, UPSERT, id, balance, token).await
}

/// Runs the fenced statement `sql` (`$1` id, `$2` balance, `$3` token): one row written, or
/// the refusal.
async fn fenced_write(
    tx: &Transaction<'_>,
    sql: &str,
    id: &str,
    balance: i64,
    token: u64,
) -> Result<Result<(), StaleToken>, Error> {
    let written = tx.execute(sql, &[&id, &balance, &fence(token)]).await?;
    if written == 1 {
        return Ok(Ok(()));
    }
    stale(tx, id, token).await
}

/// The refusal of a write with `token` that touched no row: the fence stored now (fences
/// only grow, so it is larger than `token`).
async fn stale(
    tx: &Transaction<'_>,
    id: &str,
    token: u64,
) -> Result<Result<(), StaleToken>, Error> {
    let row = tx
        .query_one("SELECT fence FROM ledger WHERE id = $1", &[&id])
        .await?;
    let stored: i64 = row.get(0);
    // A fence below zero was not written by these helpers: read as 0.
    Ok(Err(StaleToken::new(
        token,
        u64::try_from(stored).unwrap_or(0),
    )))
}

/// The row's `(balance, fence)`.
async fn row(db: &Client, id: &str) -> Result<(i64, i64), Error> {
    let row = db
        .query_one("SELECT balance, fence FROM ledger WHERE id = $1", &[&id])
        .await?;
    Ok((row.get(0), row.get(1)))
}

const HOW_TO: &str = "\
DATABASE_URL is not set: this example needs a PostgreSQL server, e.g.
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres cargo run --example fenced_postgres
A throwaway one (Debian: apt-get install postgresql; the binaries are in
/usr/lib/postgresql/<version>/bin; as root, run them as the postgres user):
    initdb -D /tmp/fenced-pg -A trust -U postgres
    pg_ctl -D /tmp/fenced-pg -o '-p 5433 -k /tmp' -l /tmp/fenced-pg.log start
    DATABASE_URL=postgres://postgres@127.0.0.1:5433/postgres cargo run --example fenced_postgres
    pg_ctl -D /tmp/fenced-pg stop && rm -r /tmp/fenced-pg";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(url) = std::env::var("DATABASE_URL")
        .ok()
        .filter(|u| !u.trim().is_empty())
    else {
        eprintln!("{HOW_TO}");
        std::process::exit(2);
    };
    let (mut db, connection) = tokio_postgres::connect(&url, NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("postgres connection: {e}");
        }
    });
    db.batch_execute(
        "CREATE TEMPORARY TABLE ledger (id text PRIMARY KEY, balance bigint, fence bigint NOT NULL);
         INSERT INTO ledger VALUES ('acct', 0, 0);",
    )
    .await?;

    // Two clients, as two processes: the same Redis masters, or clones of one `MemoryNode`.
    let var = std::env::var("REDLOCK_URLS").unwrap_or_default();
    let urls = Some(tower_redlock::node::split_urls(&var)).filter(|_| !var.trim().is_empty());
    match &urls {
        Some(urls) => println!("using {} Redis voters", urls.len()),
        None => println!("REDLOCK_URLS is not set: using the in-memory node (one process only)"),
    }
    let memory = MemoryNode::new();
    let client = || {
        let builder = Redlock::builder().fencing(true);
        match &urls {
            Some(urls) => urls.iter().fold(builder, |b, url| b.redis(url)).build(),
            None => builder.node(memory.clone()).build(),
        }
    };
    let (client1, client2) = (client()?, client()?);
    let ttl = Duration::from_millis(300);

    // 1. Client 1 takes the lock, then pauses (a GC, a SIGSTOP) before it writes.
    let lease1 = client1.lock("ledger:acct", ttl).await?;
    let token1 = lease1.fencing_token().ok_or("client 1: no token")?;
    println!("client 1: locked, token {token1}; pauses");

    // 2. Meanwhile client 2 waits for the lock: it gets it once client 1's lease ran out.
    let retry = Retry::until(Duration::from_secs(5)).delay(Duration::from_millis(20));
    let lease2 = client2.lock_with("ledger:acct", ttl, retry).await?;
    let token2 = lease2.fencing_token().ok_or("client 2: no token")?;
    println!(
        "client 2: locked, token {token2} (client 1's lease valid: {})",
        lease1.is_valid()
    );

    // 3. Client 2 writes with its token, twice (the same holder): accepted.
    let tx = db.transaction().await?;
    fenced_update(&tx, "acct", 200, token2).await??;
    fenced_upsert(&tx, "acct", 250, token2).await??;
    tx.commit().await?;
    println!("client 2: wrote 250 with token {token2}: accepted");

    // 4. Client 1 wakes up and writes with its old token: refused, and it rolls back.
    let tx = db.transaction().await?;
    let late = fenced_update(&tx, "acct", 100, token1).await?;
    tx.rollback().await?;
    match &late {
        Ok(()) => println!("client 1: wrote 100 with token {token1}: ACCEPTED (fencing failed!)"),
        Err(stale) => {
            let answer = stale.to_problem_json();
            println!("client 1: {stale}: refused; its client is answered");
            println!(
                "    {} {}",
                answer.status(),
                String::from_utf8_lossy(answer.body())
            );
        }
    }

    let (balance, stored) = row(&db, "acct").await?;
    println!("ledger: balance {balance}, fence {stored}");
    lease2.release().await?;
    drop(lease1); // long expired: its release finds nothing of it

    assert!(token2 > token1, "the next holder's token must be larger");
    assert_eq!(late, Err(StaleToken::new(token1, token2)));
    assert_eq!((balance, stored), (250, fence(token2)));
    Ok(())
}
