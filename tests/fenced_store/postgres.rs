//! PostgreSQL: a row guarded by a `fence` column, claimed only with a fencing token at least
//! the stored one — against a real PostgreSQL server (a throwaway cluster from the test kit,
//! [`support::PostgresServer`]) with leases from a real Redlock over three `redis-server`
//! masters (`fencing(true)`). Each write is the library's claim
//! ([`FencedTable::claim`], or [`FencedTable::claim_or_insert`] for the first write), then a
//! plain update, in the caller's transaction — the pattern of `examples/fenced_postgres.rs`:
//!
//! ```sql
//! UPDATE ledger SET fence = $2 WHERE id = $1 AND fence <= $2 RETURNING *
//! UPDATE ledger SET balance = $2 WHERE id = $1
//! ```
//!
//! Zero rows claimed means a newer holder has claimed the row: the stored fence is read and
//! the write is a [`StaleToken`] (409 `/problems/fencing-token-stale`). The read-modify-write
//! interleavings under each isolation level, and the claim's timeouts, are in
//! [`claim_postgres`](super::claim_postgres).
//!
//! What the tests show:
//! - holders one after another write in token order, and a holder writes twice with its one
//!   token (equal: accepted) — `fenced_store_postgres_sequential_holders_write_in_token_order`;
//! - Kleppmann's scenario: a holder paused until its lease ran out and a newer holder wrote
//!   is refused, the row keeps the newer write, and the caller's transaction rolled back or
//!   committed after the refusal leaves nothing of it —
//!   `fenced_store_postgres_refuses_a_stale_writer_after_a_newer_write`;
//! - the check is the claim's own, not a read before it: a stale claim that waits on the
//!   row lock of a newer, not yet committed write is refused once that commits —
//!   `fenced_store_postgres_refuses_a_stale_writer_blocked_behind_a_newer_write`;
//! - the insert-or-update form, and its limit (a row that does not exist has no fence to
//!   compare: keep rows rather than delete them) —
//!   `fenced_store_postgres_upsert_refuses_a_stale_writer`;
//! - eight writers contending, some paused past their ttl: from the history table written
//!   in the same transactions, every committed write carries a token at least the previous
//!   committed one, larger whenever the writer changed; no update is lost; stale writes were
//!   refused — `fenced_store_postgres_concurrent_writers_commit_in_token_order`.
//!
//! The client is `tokio-postgres` (the library's `postgres` feature): async on tokio like the
//! crate, kept by the rust-postgres project, no compile-time database checks or macros, and
//! small. sqlx would bring its macro and offline query machinery for two statements.

use tower_redlock_testkit as support;

use std::time::{Duration, Instant};

use support::{eventually, warm_up, Masters, PostgresServer};
use tokio_postgres::{Client, Error, NoTls, Transaction};
use tower_redlock::fenced::postgres::{FencedTable, Refused};
use tower_redlock::fenced::StaleToken;
use tower_redlock::{Lease, Redlock, Retry};

const TTL: Duration = Duration::from_secs(10);
/// The ttl of the leases that run out while their holder is paused.
pub(super) const SHORT_TTL: Duration = Duration::from_millis(300);
const RESOURCE: &str = "ledger:acct";

pub(super) const SCHEMA: &str = "
    CREATE TABLE ledger (id text PRIMARY KEY, balance bigint, fence bigint NOT NULL);
    CREATE TABLE ledger_history (seq bigserial PRIMARY KEY, fence bigint NOT NULL, writer int NOT NULL);
";

/// A fencing token as a `bigint`. Tokens look like microsecond timestamps (about 1.7·10^15
/// today), and the crate keeps its counters below 2^53: far inside a `bigint`.
pub(super) fn fence(token: u64) -> i64 {
    i64::try_from(token).expect("a fencing token beyond bigint")
}

/// The ledger's rows: key column `id`, fence column `fence`.
pub(super) fn ledger() -> FencedTable {
    FencedTable::new("ledger").expect("a plain table name")
}

/// Writes `balance` to row `id` in the caller's transaction, unless a newer holder claimed
/// it: the claim, then a plain update. `Ok(Ok(()))` written, `Ok(Err(stale))` refused (the
/// row is unchanged), `Err(_)` the database failed; any other refusal fails the test.
async fn fenced_update(
    tx: &Transaction<'_>,
    id: &str,
    balance: i64,
    token: u64,
) -> Result<Result<(), StaleToken>, Error> {
    match ledger().claim(tx, &id, token).await? {
        Ok(_) => write_balance(tx, id, balance).await,
        Err(refused) => Ok(Err(stale_only(refused))),
    }
}

/// Inserts row `id` or updates it as [`fenced_update`] does: the claim that inserts.
async fn fenced_upsert(
    tx: &Transaction<'_>,
    id: &str,
    balance: i64,
    token: u64,
) -> Result<Result<(), StaleToken>, Error> {
    match ledger().claim_or_insert(tx, &id, token).await? {
        Ok(_) => write_balance(tx, id, balance).await,
        Err(refused) => Ok(Err(stale_only(refused))),
    }
}

/// The write after a claim: plain (the claim holds the row).
pub(super) async fn write_balance(
    tx: &Transaction<'_>,
    id: &str,
    balance: i64,
) -> Result<Result<(), StaleToken>, Error> {
    let written = tx
        .execute(
            "UPDATE ledger SET balance = $2 WHERE id = $1",
            &[&id, &balance],
        )
        .await?;
    assert_eq!(written, 1, "the claimed row {id} is there");
    Ok(Ok(()))
}

fn stale_only(refused: Refused) -> StaleToken {
    match refused {
        Refused::Stale(stale) => stale,
        other => panic!("a refusal other than a stale token: {other}"),
    }
}

pub(super) async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls)
        .await
        .unwrap_or_else(|e| panic!("connect to {url}: {e}"));
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            eprintln!("postgres connection: {e}");
        }
    });
    client
}

/// Three masters, a fencing client warmed up over them, and a PostgreSQL server with the
/// tables and a connection.
pub(super) struct Setup {
    masters: Masters,
    pub(super) redlock: Redlock,
    pub(super) pg: PostgresServer,
    pub(super) db: Client,
}

impl Setup {
    pub(super) async fn new() -> Self {
        // initdb takes a second or two: meanwhile the masters start.
        let pg = std::thread::spawn(PostgresServer::start);
        let masters = Masters::start(3);
        let pg = pg.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
        let db = connect(&pg.url()).await;
        db.batch_execute(SCHEMA).await.expect("create the tables");
        let redlock = fencing_client(&masters).await;
        Self {
            masters,
            redlock,
            pg,
            db,
        }
    }

    /// Another client over the same masters (another process, as far as the lock goes).
    pub(super) async fn other_client(&self) -> Redlock {
        fencing_client(&self.masters).await
    }

    /// The row's `(balance, fence)`.
    pub(super) async fn row(&self, id: &str) -> (i64, u64) {
        let row = self
            .db
            .query_one("SELECT balance, fence FROM ledger WHERE id = $1", &[&id])
            .await
            .unwrap_or_else(|e| panic!("read row {id}: {e}; server log:\n{}", self.pg.log()));
        (row.get(0), row.get::<_, i64>(1) as u64)
    }

    async fn history_len(&self) -> i64 {
        let row = self
            .db
            .query_one("SELECT count(*) FROM ledger_history", &[])
            .await
            .expect("count the history");
        row.get(0)
    }

    /// Kleppmann's scenario up to the late write: `first` takes the lock with a short ttl
    /// and pauses (does nothing) while `second` waits for the lock, which it gets only once
    /// the first lease's keys expired. Returns both leases (the first one lost).
    pub(super) async fn overtaken(&self, second: &Redlock) -> (Lease, Lease) {
        // (Retried: on a loaded machine one try may leave no validity of a short ttl.)
        let first = self
            .redlock
            .lock_with(
                RESOURCE,
                SHORT_TTL,
                Retry::times(50).delay(Duration::from_millis(20)),
            )
            .await
            .expect("could not set up the scenario: the first lease");
        let retry = Retry::until(Duration::from_secs(5)).delay(Duration::from_millis(20));
        let newer = second
            .lock_with(RESOURCE, TTL, retry)
            .await
            .expect("the lock once the first lease ran out");
        assert!(!first.is_valid(), "a newer holder while the first is valid");
        let (t1, t2) = (token(&first), token(&newer));
        assert!(t2 > t1, "the newer holder's token {t2} after {t1}");
        (first, newer)
    }
}

async fn fencing_client(masters: &Masters) -> Redlock {
    let redlock = masters.builder().fencing(true).build().expect("a client");
    warm_up(&redlock, masters).await;
    redlock
}

pub(super) fn token(lease: &Lease) -> u64 {
    lease.fencing_token().expect("fencing is on")
}

#[tokio::test]
async fn fenced_store_postgres_sequential_holders_write_in_token_order() {
    let mut s = Setup::new().await;
    let other = s.other_client().await;
    s.db.execute("INSERT INTO ledger VALUES ('acct', 0, 0)", &[])
        .await
        .unwrap();
    let mut last = 0;
    for round in 0..4_i64 {
        let redlock = if round % 2 == 0 { &s.redlock } else { &other };
        let lease = redlock.try_lock(RESOURCE, TTL).await.expect("the lock");
        let token = token(&lease);
        assert!(token > last, "round {round}: token {token} after {last}");
        // The holder writes twice, in two transactions: its one token is accepted both times.
        for step in 0..2_i64 {
            let balance = round * 10 + step;
            let tx = s.db.transaction().await.unwrap();
            fenced_update(&tx, "acct", balance, token)
                .await
                .expect("the update")
                .unwrap_or_else(|e| panic!("round {round}, write {step}: {e}"));
            tx.commit().await.unwrap();
            assert_eq!(s.row("acct").await, (balance, token));
        }
        lease.release().await.expect("released");
        last = token;
    }
}

#[tokio::test]
async fn fenced_store_postgres_refuses_a_stale_writer_after_a_newer_write() {
    let mut s = Setup::new().await;
    let other = s.other_client().await;
    s.db.execute("INSERT INTO ledger VALUES ('acct', 0, 0)", &[])
        .await
        .unwrap();
    let (first, second) = s.overtaken(&other).await;
    let (t1, t2) = (token(&first), token(&second));

    // The newer holder writes.
    let tx = s.db.transaction().await.unwrap();
    fenced_update(&tx, "acct", 2, t2).await.unwrap().unwrap();
    tx.commit().await.unwrap();

    // The first holder wakes up and writes in a transaction that also appends to the
    // history: refused with both tokens; the caller rolls back, and nothing of it stays.
    let tx = s.db.transaction().await.unwrap();
    tx.execute(
        "INSERT INTO ledger_history (fence, writer) VALUES ($1, 1)",
        &[&fence(t1)],
    )
    .await
    .unwrap();
    let refused = fenced_update(&tx, "acct", 1, t1)
        .await
        .unwrap()
        .expect_err("the stale write is refused");
    assert_eq!((refused.token(), refused.stored()), (t1, t2));
    tx.rollback().await.unwrap();
    assert_eq!(s.history_len().await, 0);
    assert_eq!(s.row("acct").await, (2, t2));

    // A caller that commits after the refusal commits nothing of the refused write: the
    // update touched no row.
    let tx = s.db.transaction().await.unwrap();
    let refused = fenced_update(&tx, "acct", 1, t1)
        .await
        .unwrap()
        .unwrap_err();
    tx.commit().await.unwrap();
    assert_eq!(refused, StaleToken::new(t1, t2));
    assert_eq!(s.row("acct").await, (2, t2));
    // What the first holder's client is answered.
    assert_eq!(refused.to_problem_json().status(), 409);

    // The newer holder still writes (its token equals the stored one).
    let tx = s.db.transaction().await.unwrap();
    fenced_update(&tx, "acct", 3, t2).await.unwrap().unwrap();
    tx.commit().await.unwrap();
    assert_eq!(s.row("acct").await, (3, t2));
    second.release().await.unwrap();
    drop(first);
}

#[tokio::test]
async fn fenced_store_postgres_refuses_a_stale_writer_blocked_behind_a_newer_write() {
    let mut s = Setup::new().await;
    let other = s.other_client().await;
    s.db.execute("INSERT INTO ledger VALUES ('acct', 0, 0)", &[])
        .await
        .unwrap();
    let (first, second) = s.overtaken(&other).await;
    let (t1, t2) = (token(&first), token(&second));
    let watch = connect(&s.pg.url()).await;

    // The newer holder has written but not committed yet: it holds the row's lock.
    let newer = s.db.transaction().await.unwrap();
    fenced_update(&newer, "acct", 2, t2).await.unwrap().unwrap();

    // The stale writer, on its own connection, waits on that lock...
    let mut late = connect(&s.pg.url()).await;
    let late = tokio::spawn(async move {
        let tx = late.transaction().await?;
        let outcome = fenced_update(&tx, "acct", 1, t1).await?;
        tx.commit().await?;
        Ok::<_, Error>(outcome)
    });
    eventually(
        "the stale update waits on the row lock",
        Duration::from_secs(10),
        || async {
            let row = watch
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'",
                    &[],
                )
                .await
                .unwrap();
            row.get::<_, i64>(0) == 1
        },
    )
    .await;
    assert!(!late.is_finished());

    // ...and is refused once the newer write commits: the check is re-evaluated on the row
    // it would overwrite, not on what it read before.
    newer.commit().await.unwrap();
    let outcome = late.await.expect("the late writer's task").unwrap();
    assert_eq!(outcome, Err(StaleToken::new(t1, t2)));
    assert_eq!(s.row("acct").await, (2, t2));
    second.release().await.unwrap();
    drop(first);
}

#[tokio::test]
async fn fenced_store_postgres_upsert_refuses_a_stale_writer() {
    let mut s = Setup::new().await;
    let other = s.other_client().await;
    let (first, second) = s.overtaken(&other).await;
    let (t1, t2) = (token(&first), token(&second));

    // The newer holder inserts the row; the stale one's insert-or-update is refused.
    let tx = s.db.transaction().await.unwrap();
    fenced_upsert(&tx, "acct", 2, t2).await.unwrap().unwrap();
    tx.commit().await.unwrap();
    let tx = s.db.transaction().await.unwrap();
    let refused = fenced_upsert(&tx, "acct", 1, t1)
        .await
        .unwrap()
        .unwrap_err();
    tx.commit().await.unwrap();
    assert_eq!(refused, StaleToken::new(t1, t2));
    assert_eq!(s.row("acct").await, (2, t2));

    // The same holder updates through it again; the next holder too.
    let tx = s.db.transaction().await.unwrap();
    fenced_upsert(&tx, "acct", 3, t2).await.unwrap().unwrap();
    tx.commit().await.unwrap();
    second.release().await.unwrap();
    let third = other.try_lock(RESOURCE, TTL).await.expect("the lock");
    let t3 = token(&third);
    assert!(t3 > t2);
    let tx = s.db.transaction().await.unwrap();
    fenced_upsert(&tx, "acct", 4, t3).await.unwrap().unwrap();
    tx.commit().await.unwrap();
    assert_eq!(s.row("acct").await, (4, t3));
    third.release().await.unwrap();

    // The pattern's limit: a row that does not exist has no fence to compare, so any token
    // inserts it. Keep rows (a tombstone) rather than delete them.
    let tx = s.db.transaction().await.unwrap();
    fenced_upsert(&tx, "fresh", 1, t1).await.unwrap().unwrap();
    tx.commit().await.unwrap();
    assert_eq!(s.row("fresh").await, (1, t1));
    drop(first);
}

/// What one writer saw.
#[derive(Debug, Default)]
struct Tally {
    committed: usize,
    refused: usize,
    no_lock: usize,
}

/// One write of `writer`: the row claimed, its balance read from the claim and written back
/// plus one, with a history row, in one transaction; rolled back when refused.
async fn write_once(db: &mut Client, writer: i32, token: u64) -> Result<(), StaleToken> {
    let tx = db.transaction().await.unwrap();
    // The claim returns the row it holds: the balance read is the one the update
    // overwrites (no lost update when an older holder's write commits between a read and
    // the write).
    match ledger().claim(&tx, &"acct", token).await.unwrap() {
        Ok(row) => {
            let balance: i64 = row.get("balance");
            write_balance(&tx, "acct", balance + 1)
                .await
                .unwrap()
                .unwrap();
            // After the claim, under its row lock: the history's `seq` follows commit order.
            tx.execute(
                "INSERT INTO ledger_history (fence, writer) VALUES ($1, $2)",
                &[&fence(token), &writer],
            )
            .await
            .unwrap();
            tx.commit().await.unwrap();
            Ok(())
        }
        Err(refused) => {
            tx.rollback().await.unwrap();
            Err(stale_only(refused))
        }
    }
}

/// A paused holder: does nothing until another holder has written past `token` (so its
/// lease ran out), or 3 s passed (nobody else wanted the lock).
async fn pause_until_overtaken(db: &Client, token: u64) -> bool {
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let row = db
            .query_one("SELECT fence FROM ledger WHERE id = 'acct'", &[])
            .await
            .unwrap();
        if row.get::<_, i64>(0) > fence(token) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_store_postgres_concurrent_writers_commit_in_token_order() {
    const WRITERS: i32 = 8;
    const SECTIONS: i32 = 6;
    let s = Setup::new().await;
    let clients = [s.redlock.clone(), s.other_client().await];
    s.db.execute("INSERT INTO ledger VALUES ('acct', 0, 0)", &[])
        .await
        .unwrap();
    let retry = Retry::until(Duration::from_secs(3))
        .delay(Duration::from_millis(10))
        .jitter(Duration::from_millis(10));
    let writers: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let redlock = clients[writer as usize % clients.len()].clone();
            let url = s.pg.url();
            tokio::spawn(async move {
                let mut db = connect(&url).await;
                let mut tally = Tally::default();
                for section in 0..SECTIONS {
                    let Ok(lease) = redlock.lock_with(RESOURCE, SHORT_TTL, retry).await else {
                        tally.no_lock += 1;
                        continue;
                    };
                    let token = token(&lease);
                    // Each writer pauses in one of its sections (a GC, a SIGSTOP) past its
                    // lease, and writes once when it wakes; otherwise it writes twice.
                    let paused = section == writer % SECTIONS;
                    if paused && pause_until_overtaken(&db, token).await {
                        assert!(!lease.is_valid(), "overtaken while valid");
                    }
                    for _ in 0..if paused { 1 } else { 2 } {
                        match write_once(&mut db, writer, token).await {
                            Ok(()) => tally.committed += 1,
                            Err(stale) => {
                                assert_eq!(stale.token(), token);
                                assert!(stale.stored() > token, "{stale}");
                                tally.refused += 1;
                            }
                        }
                    }
                    // A lease that ran out releases nothing (and may say so).
                    let _ = lease.release().await;
                }
                tally
            })
        })
        .collect();
    let mut total = Tally::default();
    for writer in writers {
        let tally = tokio::time::timeout(Duration::from_secs(120), writer)
            .await
            .expect("the writers finish")
            .expect("no writer panicked");
        total.committed += tally.committed;
        total.refused += tally.refused;
        total.no_lock += tally.no_lock;
    }

    let history: Vec<(i64, i32)> =
        s.db.query("SELECT fence, writer FROM ledger_history ORDER BY seq", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
    assert_eq!(history.len(), total.committed, "{total:?}");
    for pair in history.windows(2) {
        let ((f0, w0), (f1, w1)) = (pair[0], pair[1]);
        assert!(
            f1 >= f0,
            "writer {w1}'s token {f1} after writer {w0}'s {f0}"
        );
        if w1 != w0 {
            assert!(
                f1 > f0,
                "writer {w1} wrote with the token {f1} of writer {w0}"
            );
        }
    }
    // Every committed write counted once: no update lost.
    let last = history.last().expect("writes were committed").0 as u64;
    assert_eq!(s.row("acct").await, (total.committed as i64, last));
    // The scenario, not the promise (token order and no lost update are checked above): enough
    // sections got the lock, and at least one paused writer was overtaken. A machine too
    // loaded to produce that fails as a set-up, never as a broken promise.
    assert!(
        total.committed >= (WRITERS * SECTIONS) as usize,
        "could not set up the scenario: too few writes committed: {total:?}"
    );
    assert!(
        total.refused >= 1,
        "could not set up the scenario: no paused writer was overtaken: {total:?}"
    );
}

/// The checker's store (`--store postgres`) claims with the library's statement: the test
/// kit spells it out (it does not turn on the library's `postgres` feature, which would turn
/// it on in every test build), and this keeps the two equal.
#[test]
fn fenced_store_postgres_the_checker_claims_with_the_library_s_statement() {
    let table = FencedTable::with_columns("fenced", "resource", "fence").expect("plain names");
    assert_eq!(support::checker::CLAIM_SQL, table.claim_sql());
}
