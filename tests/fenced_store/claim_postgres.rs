//! PostgreSQL: a read-modify-write fenced from its read. The holder claims the row with its
//! token as the first statement of its transaction ([`FencedTable::claim`]), reads the
//! balance from what the claim returned and writes it back changed. Every test name starts
//! with `fenced_claim_postgres_`; the unclaimed read's lost update is shown too, named for
//! what it shows, so that nobody copies it.
//!
//! The interleaving, with the tokens of a real Redlock (`.fencing(true)` over three
//! masters): holder 1 reads a balance of 100 and pauses past its lease; holder 2 takes the
//! lock and reads; holder 1 wakes and deposits 50; holder 2 withdraws 30. Each acknowledged
//! write (its commit returned) must be in the final balance's lineage, under `READ
//! COMMITTED` (PostgreSQL's default), `REPEATABLE READ` and `SERIALIZABLE`.
//!
//! The paused-after-claim holder: its claim holds the row, so the next holder's claim waits
//! — until the server ends the paused session (`idle_in_transaction_session_timeout`), or
//! until the waiting claim's own `lock_timeout` ([`Refused::Busy`]). Every wait is for a
//! state the test observes (a backend waiting on a lock in `pg_stat_activity`, a session
//! gone), never a sleep.

use std::time::Duration;

use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, IsolationLevel, Transaction};
use tower_redlock::fenced::postgres::Refused;
use tower_redlock::fenced::StaleToken;
use tower_redlock_testkit::eventually;

use tower_redlock::{Lease, Redlock};

use super::postgres::{connect, fence, ledger, token, write_balance, Setup};

const LEVELS: [IsolationLevel; 3] = [
    IsolationLevel::ReadCommitted,
    IsolationLevel::RepeatableRead,
    IsolationLevel::Serializable,
];

async fn begin(db: &mut Client, level: IsolationLevel) -> Transaction<'_> {
    db.build_transaction()
        .isolation_level(level)
        .start()
        .await
        .expect("begin")
}

/// One round of a test: a row of its own (balance 100, fence 0) and two holders of the
/// lock, the first one's lease run out before the second's grant ("the pause").
struct Round {
    id: String,
    first: Lease,
    second: Lease,
    t1: u64,
    t2: u64,
}

impl Round {
    async fn new(s: &Setup, other: &Redlock, level: IsolationLevel) -> Self {
        let id = format!("acct-{level:?}");
        s.db.execute("INSERT INTO ledger VALUES ($1, 100, 0)", &[&id])
            .await
            .expect("seed the row");
        let (first, second) = s.overtaken(other).await;
        let (t1, t2) = (token(&first), token(&second));
        Self {
            id,
            first,
            second,
            t1,
            t2,
        }
    }

    /// A holder's write of `balance` after its claim, in `tx`.
    async fn write(&self, tx: &Transaction<'_>, balance: i64) {
        write_balance(tx, &self.id, balance)
            .await
            .expect("the write")
            .expect("a claimed row is written");
    }

    async fn end(self) {
        self.second
            .release()
            .await
            .expect("the second holder releases");
        drop(self.first); // long expired: its release finds nothing of it
    }
}

/// The backend pid of `db`'s session.
async fn pid(db: &Client) -> i32 {
    db.query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("pg_backend_pid")
        .get(0)
}

/// Waits until session `waiter`'s statement waits on a lock session `holder` holds (a claim
/// blocked on a claimed row).
async fn until_blocked(watch: &Client, waiter: i32, holder: i32, what: &str) {
    eventually(what, Duration::from_secs(20), || async {
        watch
            .query_one("SELECT $2 = ANY(pg_blocking_pids($1))", &[&waiter, &holder])
            .await
            .expect("read pg_blocking_pids")
            .get::<_, bool>(0)
    })
    .await;
}

/// The balance of row `id`, read from its claim with `token` (which must succeed).
async fn claim_balance(tx: &Transaction<'_>, id: &str, token: u64) -> i64 {
    let row = ledger().claim(tx, &id, token).await.expect("the claim");
    row.unwrap_or_else(|refused| panic!("the claim of {id} with {token}: {refused}"))
        .get("balance")
}

/// Holder 2's read-modify-write on its own connection: claim, read, write `balance - 30`,
/// commit; a serialization failure retries the transaction (as the docs say to). Returns
/// (what it read, how many conflicts it retried), or the refusal.
async fn withdraw(
    mut db: Client,
    id: String,
    level: IsolationLevel,
    token: u64,
    lock_timeout: Option<&'static str>,
) -> Result<(i64, usize), Refused> {
    let mut conflicts = 0;
    loop {
        let tx = begin(&mut db, level).await;
        if let Some(t) = lock_timeout {
            tx.batch_execute(&format!("SET LOCAL lock_timeout = '{t}'"))
                .await
                .unwrap();
        }
        match ledger().claim(&tx, &id, token).await.expect("the claim") {
            Ok(row) => {
                let read: i64 = row.get("balance");
                write_balance(&tx, &id, read - 30).await.unwrap().unwrap();
                tx.commit().await.expect("holder 2 commits");
                return Ok((read, conflicts));
            }
            Err(Refused::Conflict) if conflicts < 3 => conflicts += 1,
            Err(refused) => return Err(refused),
        }
    }
}

/// Holder 1 claims and reads 100, then pauses (its lease runs out); holder 2's claim waits
/// for the row; holder 1 wakes and deposits 50 — acknowledged; holder 2's claim then reads
/// 150 (under `READ COMMITTED` at once; under `REPEATABLE READ` and `SERIALIZABLE` after one
/// serialization failure and a retry of its transaction) and writes 120. Lineage: 100, 150,
/// 120 — holder 1's acknowledged deposit is in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_claim_postgres_a_paused_reader_loses_no_acknowledged_write() {
    let mut s = Setup::new().await;
    let other = s.other_client().await;
    let watch = connect(&s.pg.url()).await;
    let pid_s = pid(&s.db).await;
    for level in LEVELS {
        let r = Round::new(&s, &other, level).await;
        let (id, t1, t2) = (r.id.clone(), r.t1, r.t2);

        let tx1 = begin(&mut s.db, level).await;
        let read_by_1 = claim_balance(&tx1, &id, t1).await;
        assert_eq!(read_by_1, 100);
        // Holder 1 is paused; holder 2 (lease valid, newer token) claims: it waits.
        let db2 = connect(&s.pg.url()).await;
        let (pid1, pid2) = (pid_s, pid(&db2).await);
        let holder2 = tokio::spawn(withdraw(db2, id.clone(), level, t2, None));
        until_blocked(
            &watch,
            pid2,
            pid1,
            "holder 2's claim waits for holder 1's row",
        )
        .await;
        assert!(
            !holder2.is_finished(),
            "{level:?}: holder 2 read past the claim"
        );
        // Holder 1 wakes and deposits 50: it still holds the row, so this lands.
        r.write(&tx1, read_by_1 + 50).await;
        tx1.commit().await.expect("holder 1's commit, acknowledged");

        let (read_by_2, conflicts) = holder2.await.unwrap().expect("holder 2 writes");
        assert_eq!(
            read_by_2, 150,
            "{level:?}: holder 2 read holder 1's deposit"
        );
        let expected = usize::from(!matches!(level, IsolationLevel::ReadCommitted));
        assert_eq!(conflicts, expected, "{level:?}: serialization failures");
        assert_eq!(s.row(&id).await, (120, t2), "{level:?}");
        r.end().await;
    }
}

/// The other order: holder 2 (newer token) claims first and has not committed; holder 1
/// (older, paused before its claim) claims — it waits, then is refused with a stale token
/// once holder 2 commits (under `REPEATABLE READ` and `SERIALIZABLE` the wait ends in a
/// serialization failure first, and the retried claim is the stale refusal). Holder 1 read
/// nothing and wrote nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_claim_postgres_an_older_claim_behind_a_newer_one_is_refused() {
    let mut s = Setup::new().await;
    let other = s.other_client().await;
    let watch = connect(&s.pg.url()).await;
    let pid_s = pid(&s.db).await;
    for level in LEVELS {
        let r = Round::new(&s, &other, level).await;
        let (id, t1, t2) = (r.id.clone(), r.t1, r.t2);

        let tx2 = begin(&mut s.db, level).await;
        let read_by_2 = claim_balance(&tx2, &id, t2).await;
        let db1 = connect(&s.pg.url()).await;
        let (pid1, pid2) = (pid(&db1).await, pid_s);
        // Holder 1's read-modify-write, on its own connection: its refusal is what matters.
        let holder1 = tokio::spawn(withdraw(db1, id.clone(), level, t1, None));
        until_blocked(
            &watch,
            pid1,
            pid2,
            "holder 1's claim waits for holder 2's row",
        )
        .await;
        r.write(&tx2, read_by_2 - 30).await;
        tx2.commit().await.unwrap();

        let refused = holder1.await.unwrap().expect_err("holder 1 is refused");
        assert_eq!(
            refused,
            Refused::Stale(StaleToken::new(t1, t2)),
            "{level:?}"
        );
        assert_eq!(refused.to_problem_json().status(), 409);
        assert_eq!(s.row(&id).await, (70, t2), "{level:?}");
        r.end().await;
    }
}

/// What the claim prevents, shown with the pattern that checks the token only in the write:
/// both holders read 100 (plain `SELECT`), holder 1 writes 150 with its token — accepted,
/// the row's fence is still the seed's — and commits (its client is told "done"), holder 2
/// writes 70 with its newer token. Holder 1's acknowledged deposit is lost. Not a pattern to
/// copy: it is here so that the docs' warning is a test.
#[tokio::test]
async fn fenced_claim_postgres_unclaimed_read_loses_an_acknowledged_write() {
    let mut s = Setup::new().await;
    let other = s.other_client().await;
    let r = Round::new(&s, &other, IsolationLevel::ReadCommitted).await;
    let (id, t1, t2) = (r.id.clone(), r.t1, r.t2);
    let mut db2 = connect(&s.pg.url()).await;
    let read = "SELECT balance FROM ledger WHERE id = $1";
    let write = "UPDATE ledger SET balance = $2, fence = $3 WHERE id = $1 AND fence <= $3";

    let tx1 = s.db.transaction().await.unwrap();
    let read_by_1: i64 = tx1.query_one(read, &[&id]).await.unwrap().get(0);
    let tx2 = db2.transaction().await.unwrap();
    let read_by_2: i64 = tx2.query_one(read, &[&id]).await.unwrap().get(0);
    assert_eq!((read_by_1, read_by_2), (100, 100));
    let landed = tx1
        .execute(write, &[&id, &(read_by_1 + 50), &fence(t1)])
        .await
        .unwrap();
    tx1.commit().await.unwrap();
    assert_eq!(
        landed, 1,
        "holder 1's fenced write is accepted and acknowledged"
    );
    let landed = tx2
        .execute(write, &[&id, &(read_by_2 - 30), &fence(t2)])
        .await
        .unwrap();
    tx2.commit().await.unwrap();
    assert_eq!(landed, 1);
    assert_eq!(
        s.row(&id).await,
        (70, t2),
        "the final balance has no trace of holder 1's acknowledged deposit"
    );
    r.end().await;
}

/// Holder 1 claims, reads 100 and pauses *after* its claim, holding the row, with
/// `idle_in_transaction_session_timeout` set; holder 2 (a `lock_timeout` far longer) claims
/// and waits — until the server ends holder 1's session, which rolls it back. Holder 2
/// then claims, reads 100 and writes 70; holder 1 wakes and its write fails: not
/// acknowledged, and nothing of it is in the row. Under each isolation level (the
/// rolled-back holder changed nothing, so no serialization failure either). The idle
/// timeout is set after the claim, so it times the pause only; holder 2 must be seen
/// waiting on holder 1 within it, or the test could not set up its scenario.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_claim_postgres_a_holder_paused_after_its_claim_blocks_the_next_until_its_session_ends(
) {
    let s = Setup::new().await;
    let other = s.other_client().await;
    let watch = connect(&s.pg.url()).await;
    for level in LEVELS {
        let r = Round::new(&s, &other, level).await;
        let (id, t1, t2) = (r.id.clone(), r.t1, r.t2);
        let (mut db1, db2) = (connect(&s.pg.url()).await, connect(&s.pg.url()).await);
        let (pid1, pid2) = (pid(&db1).await, pid(&db2).await);

        let tx1 = begin(&mut db1, level).await;
        let read_by_1 = claim_balance(&tx1, &id, t1).await;
        // The pause starts: the server ends the session after 3 s of it.
        tx1.batch_execute("SET idle_in_transaction_session_timeout = '3s'")
            .await
            .unwrap();
        let holder2 = tokio::spawn(withdraw(db2, id.clone(), level, t2, Some("60s")));
        until_blocked(
            &watch,
            pid2,
            pid1,
            "could not set up the scenario: holder 2's claim seen waiting on holder 1's row \
             within holder 1's idle timeout",
        )
        .await;
        let (read_by_2, conflicts) = holder2.await.unwrap().expect("holder 2 writes");
        assert_eq!(
            (read_by_1, read_by_2, conflicts),
            (100, 100, 0),
            "{level:?}: holder 2 read what was committed, not holder 1's claim"
        );
        // Holder 2 got the row because holder 1's session ended.
        eventually(
            "holder 1's session is gone",
            Duration::from_secs(20),
            || async {
                let n: i64 = watch
                    .query_one(
                        "SELECT count(*) FROM pg_stat_activity WHERE pid = $1",
                        &[&pid1],
                    )
                    .await
                    .unwrap()
                    .get(0);
                n == 0
            },
        )
        .await;

        // Holder 1 wakes up and writes what it computed: its session is gone.
        let late = match write_balance(&tx1, &id, read_by_1 + 50).await {
            Ok(_) => tx1.commit().await,
            Err(e) => Err(e),
        };
        let e = late.expect_err("holder 1's late write was acknowledged");
        assert!(
            e.is_closed() || e.code() == Some(&SqlState::IDLE_IN_TRANSACTION_SESSION_TIMEOUT),
            "{level:?}: holder 1's write failed for another reason: {e}"
        );
        assert_eq!(s.row(&id).await, (70, t2), "{level:?}");
        r.end().await;
    }
}

/// Holder 1 claims and pauses on a session without an idle timeout; holder 2's claim, with a
/// short `lock_timeout`, waits that long and is refused ([`Refused::Busy`], answered like a
/// stale token) — it read and wrote nothing. Holder 1 wakes, deposits 50 and commits:
/// acknowledged, and in the row.
#[tokio::test]
async fn fenced_claim_postgres_a_claim_that_waits_past_lock_timeout_is_refused() {
    let mut s = Setup::new().await;
    let other = s.other_client().await;
    for level in LEVELS {
        let r = Round::new(&s, &other, level).await;
        let (id, t1, t2) = (r.id.clone(), r.t1, r.t2);

        let tx1 = begin(&mut s.db, level).await;
        let read_by_1 = claim_balance(&tx1, &id, t1).await;
        let db2 = connect(&s.pg.url()).await;
        let refused = withdraw(db2, id.clone(), level, t2, Some("200ms"))
            .await
            .expect_err("holder 2's claim times out");
        assert_eq!(refused, Refused::Busy, "{level:?}");
        assert_eq!(refused.to_problem_json().status(), 409);

        r.write(&tx1, read_by_1 + 50).await;
        tx1.commit().await.expect("holder 1's commit");
        assert_eq!(s.row(&id).await, (150, t1), "{level:?}");
        r.end().await;
    }
}
