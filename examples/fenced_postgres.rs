//! Fencing where the data lives: a PostgreSQL row guarded by a `fence` column, claimed with
//! the lease's fencing token before it is read ([`FencedTable`], feature `postgres`).
//!
//! ```sql
//! CREATE TABLE ledger (id text PRIMARY KEY, balance bigint NOT NULL DEFAULT 0,
//!                      fence bigint NOT NULL DEFAULT 0);
//! -- the first statement of every transaction that reads or writes the row: the claim
//! UPDATE ledger SET fence = $2 WHERE id = $1 AND fence <= $2 RETURNING *
//! ```
//!
//! `$2` is the lease's [`fencing_token`](tower_redlock::Lease::fencing_token). One row: the
//! row is this holder's until its transaction ends — read it from what the claim returned,
//! write it with plain statements, commit. Zero rows: a newer holder has claimed it, the
//! token is stale ([`Refused::Stale`], answered `409` `/problems/fencing-token-stale`).
//! Claiming *before the read* is what makes a read-modify-write safe: a check only in the
//! write's `WHERE` lets a holder that read before a newer holder, and writes before it,
//! land a deposit the newer holder then overwrites with what it computed from the same old
//! balance (`tests/fenced_store/claim_postgres.rs` shows that loss).
//!
//! Two scenes, Kleppmann's pause in each:
//! 1. client 1 takes the lock and pauses before its transaction; client 2 takes the lock
//!    once client 1's lease ran out, claims the row, withdraws 30 and commits; client 1
//!    wakes and claims with its older token — refused, it read and wrote nothing;
//! 2. client 1 takes the lock again, claims the row and pauses *after* its claim, holding
//!    the row; client 2 takes the lock and its claim waits — until the server ends client
//!    1's idle session (`idle_in_transaction_session_timeout`), which rolls client 1's
//!    transaction back. Client 2 claims, deposits 10 and commits; client 1 wakes and its
//!    write fails: nothing of it landed. (Had client 1 woken first, its write would have
//!    landed and client 2 would have read it: no write is lost either way.)
//!
//! The table is this run's own and dropped at the end. The example is a test too (at the
//! bottom: the same code against a throwaway server); the tests of [`FencedTable`] against a
//! real server are `tests/fenced_store/claim_postgres.rs`.
//!
//! ```text
//! DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
//!     cargo run --features postgres --example fenced_postgres
//! REDLOCK_URLS=redis://127.0.0.1:7777,redis://127.0.0.1:7778,redis://127.0.0.1:7779 \
//!     DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
//!     cargo run --features postgres --example fenced_postgres
//! ```
//!
//! Without `REDLOCK_URLS` the lock is the in-memory node; without `DATABASE_URL` it says how
//! to get a server.

use std::time::Duration;

use tokio_postgres::{Client, NoTls};
use tower_redlock::fenced::postgres::{FencedTable, Refused};
use tower_redlock::node::MemoryNode;
use tower_redlock::{Lease, Redlock, Retry};

const HOW_TO: &str = "\
DATABASE_URL is not set: this example needs a PostgreSQL server, e.g.
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \\
        cargo run --features postgres --example fenced_postgres
A throwaway one (Debian: apt-get install postgresql; the binaries are in
/usr/lib/postgresql/<version>/bin; as root, run them as the postgres user):
    initdb -D /tmp/fenced-pg -A trust -U postgres
    pg_ctl -D /tmp/fenced-pg -o '-p 5433 -k /tmp' -l /tmp/fenced-pg.log start
    DATABASE_URL=postgres://postgres@127.0.0.1:5433/postgres \\
        cargo run --features postgres --example fenced_postgres
    pg_ctl -D /tmp/fenced-pg stop && rm -r /tmp/fenced-pg";

/// A client whose connection runs on a task; `quiet`: the connection's end is expected
/// (the server ends a paused holder's session).
async fn connect(url: &str, quiet: bool) -> Result<Client, tokio_postgres::Error> {
    let (db, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            if !quiet {
                eprintln!("postgres connection: {e}");
            }
        }
    });
    Ok(db)
}

/// A lease of the ledger's lock, its token, waiting for the lock until it is free.
async fn lock(redlock: &Redlock) -> Result<(Lease, u64), Box<dyn std::error::Error>> {
    let retry = Retry::until(Duration::from_secs(5)).delay(Duration::from_millis(20));
    let lease = redlock.lock_with("ledger:acct", TTL, retry).await?;
    let token = lease.fencing_token().ok_or("no fencing token")?;
    Ok((lease, token))
}

const TTL: Duration = Duration::from_millis(300);

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(url) = std::env::var("DATABASE_URL")
        .ok()
        .filter(|u| !u.trim().is_empty())
    else {
        eprintln!("{HOW_TO}");
        std::process::exit(2);
    };
    let var = std::env::var("REDLOCK_URLS").unwrap_or_default();
    let urls = Some(tower_redlock::node::split_urls(&var))
        .filter(|_| !var.trim().is_empty())
        .map(|urls| urls.into_iter().map(String::from).collect());
    run(&url, urls).await
}

/// Both scenes against the server at `url`, the lock over the Redis masters `urls` or the
/// in-memory node.
async fn run(url: &str, urls: Option<Vec<String>>) -> Result<(), Box<dyn std::error::Error>> {
    // Two clients, as two processes: the same Redis masters, or clones of one `MemoryNode`.
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

    // A table of this run's own (two sessions see it), dropped at the end.
    let name = format!("fenced_example_{}", std::process::id());
    let ledger = FencedTable::new(&name)?;
    let admin = connect(url, false).await?;
    admin
        .batch_execute(&format!(
            "CREATE TABLE {name} (id text PRIMARY KEY, balance bigint NOT NULL DEFAULT 0, \
             fence bigint NOT NULL DEFAULT 0);
             INSERT INTO {name} (id, balance) VALUES ('acct', 100);"
        ))
        .await?;
    let outcome = scenes(url, &name, &ledger, &client1, &client2).await;
    admin.batch_execute(&format!("DROP TABLE {name}")).await?;
    let (balance, fence) = outcome?;
    println!("ledger: balance {balance}, fence {fence}");
    assert_eq!(
        balance, 80,
        "100 - 30 + 10: every acknowledged write, no other"
    );
    Ok(())
}

/// Both scenes; the row's final `(balance, fence)`.
async fn scenes(
    url: &str,
    name: &str,
    ledger: &FencedTable,
    client1: &Redlock,
    client2: &Redlock,
) -> Result<(i64, i64), Box<dyn std::error::Error>> {
    let update = format!("UPDATE {name} SET balance = $2 WHERE id = $1");

    println!("-- scene 1: a holder paused before its claim");
    let (lease1, token1) = lock(client1).await?;
    println!("client 1: locked, token {token1}; pauses");
    let (lease2, token2) = lock(client2).await?;
    println!(
        "client 2: locked, token {token2} (client 1's lease valid: {})",
        lease1.is_valid()
    );
    let mut db2 = connect(url, false).await?;
    let tx = db2.transaction().await?;
    let row = ledger.claim(&tx, &"acct", token2).await??;
    let balance: i64 = row.get("balance");
    tx.execute(&update, &[&"acct", &(balance - 30)]).await?;
    tx.commit().await?;
    println!(
        "client 2: claimed, read {balance}, wrote {}: committed",
        balance - 30
    );
    lease2.release().await?;

    let mut db1 = connect(url, false).await?;
    let tx = db1.transaction().await?;
    match ledger.claim(&tx, &"acct", token1).await? {
        Ok(_) => return Err("client 1 claimed with an older token: fencing failed".into()),
        Err(refused) => {
            let answer = refused.to_problem_json();
            println!("client 1: {refused}: it read and wrote nothing; its client is answered");
            println!(
                "    {} {}",
                answer.status(),
                String::from_utf8_lossy(answer.body())
            );
            assert!(matches!(refused, Refused::Stale(s) if s.stored() == token2));
        }
    }
    drop(tx); // rolls back
    drop(lease1); // long expired: its release finds nothing of it

    println!("-- scene 2: a holder paused after its claim");
    let (lease3, token3) = lock(client1).await?;
    let mut db1 = connect(url, true).await?;
    db1.batch_execute("SET idle_in_transaction_session_timeout = '1s'")
        .await?;
    let tx1 = db1.transaction().await?;
    let row = ledger.claim(&tx1, &"acct", token3).await??;
    let read_by_1: i64 = row.get("balance");
    println!("client 1: locked, token {token3}, claimed, read {read_by_1}; pauses");

    // Client 2, meanwhile: the lock once client 1's lease ran out, then the claim, which
    // waits for the row until client 1's session is ended.
    let mut db2 = connect(url, false).await?;
    let (lease4, token4) = lock(client2).await?;
    let tx2 = db2.transaction().await?;
    tx2.batch_execute("SET LOCAL lock_timeout = '10s'").await?;
    let row = ledger.claim(&tx2, &"acct", token4).await??;
    let balance: i64 = row.get("balance");
    tx2.execute(&update, &[&"acct", &(balance + 10)]).await?;
    tx2.commit().await?;
    println!(
        "client 2: locked, token {token4}; its claim waited for client 1's session to end; \
         read {balance}, wrote {}: committed",
        balance + 10
    );
    lease4.release().await?;

    // Client 1 wakes up and writes what it computed: its session is gone.
    let late = match tx1.execute(&update, &[&"acct", &(read_by_1 + 50)]).await {
        Ok(_) => tx1.commit().await,
        Err(e) => Err(e),
    };
    match &late {
        Ok(()) => return Err("client 1's late write committed after client 2's claim".into()),
        Err(e) => println!("client 1: its late write failed ({e}): nothing of it landed"),
    }
    drop(lease3);

    let row = db2
        .query_one(
            &format!("SELECT balance, fence FROM {name} WHERE id = 'acct'"),
            &[],
        )
        .await?;
    assert!(token1 < token2 && token2 < token3 && token3 < token4);
    Ok((row.get(0), row.get(1)))
}

/// The example as a test (`cargo test --features postgres --example fenced_postgres`, and
/// the README's test command): a throwaway PostgreSQL and three redis-servers from the test
/// kit, then [`run`] — the code above, not a copy of it.
#[cfg(test)]
mod tests {
    use tower_redlock_testkit::{Masters, PostgresServer};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fenced_claim_postgres_the_example_runs_both_scenes() {
        let pg = std::thread::spawn(PostgresServer::start);
        let masters = Masters::start(3);
        let pg = pg.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        super::run(&pg.url(), Some(masters.urls()))
            .await
            .unwrap_or_else(|e| panic!("the example failed: {e}; server log:\n{}", pg.log()));
    }
}
