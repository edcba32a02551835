//! Real crashes: the replica is a process of its own (this test binary, started again to run
//! [`replica_entry`]), killed with `SIGKILL` at a point of its request; the retry goes to a
//! replica in this process.
//!
//! The child prints `LISTEN <addr>` once it serves, and `REACHED <point>` when its handler
//! stops there; a line `go` on its stdin lets the handler go on.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use super::web::{each, Replica, Served, Variant};
use super::{app, pay, spawn_pay};
use tower_redlock_testkit as support;

use support::Masters;

/// Where the child learns what to serve: `<variant> <postgres url> <redis url>...`.
const REPLICA_ENV: &str = "TOWER_REDLOCK_DURABLE_REPLICA";

/// A replica process: does nothing unless started by [`ReplicaProcess::start`].
#[test]
fn replica_entry() {
    let Ok(config) = std::env::var(REPLICA_ENV) else {
        return;
    };
    let mut parts = config.split(' ');
    let variant = Variant::parse(parts.next().expect("a variant"));
    let pg = parts.next().expect("a postgres url").to_owned();
    let redis: Vec<String> = parts.map(str::to_owned).collect();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async move {
        let redlock = redis
            .iter()
            .fold(tower_redlock::Redlock::builder(), |b, url| b.redis(url))
            .node_timeout(Duration::from_millis(200))
            .build()
            .unwrap();
        let (hooks, mut reached) = app::Hooks::new();
        let policy = app::policy(variant.driver, redlock, &pg, Duration::from_secs(5));
        let served = Served::start(variant, &pg, policy, hooks.clone()).await;
        println!("LISTEN {}", served.addr());
        tokio::spawn(async move {
            while let Some(point) = reached.recv().await {
                println!("REACHED {point}");
            }
        });
        let go = hooks.go.clone();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines() {
                if line.is_ok_and(|l| l.trim() == "go") {
                    go.add_permits(1);
                }
            }
        });
        // Served until killed.
        std::future::pending::<()>().await;
    });
}

/// A replica in a process of its own, killed on drop.
struct ReplicaProcess {
    child: Child,
    stdin: ChildStdin,
    lines: mpsc::Receiver<String>,
    url: String,
}

impl ReplicaProcess {
    fn start(variant: Variant, masters: &Masters, db: &app::Db) -> Self {
        let exe = std::env::current_exe().expect("the path of this test binary");
        let config = [variant.name(), db.url.clone()]
            .into_iter()
            .chain(masters.urls())
            .collect::<Vec<_>>()
            .join(" ");
        let mut child = Command::new(exe)
            .args([
                "--exact",
                "crash::replica_entry",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(REPLICA_ENV, config)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the replica process");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        let mut replica = Self {
            child,
            stdin,
            lines,
            url: String::new(),
        };
        let addr = replica.line("LISTEN ");
        replica.url = format!("http://{addr}/payments");
        replica
    }

    /// The rest of the next line that has `prefix`, after it, within the deadline.
    fn line(&mut self, prefix: &str) -> String {
        let deadline = std::time::Instant::now() + support::http::DEADLINE;
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    // The harness prints its `test …` line before ours, without a newline.
                    if let Some(at) = line.find(prefix) {
                        return line[at + prefix.len()..].to_owned();
                    }
                    seen.push(line);
                }
                Err(e) => panic!("the replica printed no {prefix:?} line ({e}), only {seen:?}"),
            }
        }
    }

    fn go(&mut self) {
        writeln!(self.stdin, "go").expect("write to the replica");
    }

    /// `SIGKILL`, and reaped.
    fn kill(&mut self) {
        self.child.kill().expect("kill the replica");
        self.child.wait().expect("reap the replica");
    }
}

impl Drop for ReplicaProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until the key row holds a response.
async fn until_stored(db: &app::Db) {
    support::http::within("the response stored in the row", async {
        while db.key_rows().await.1 < 1 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// Retries until the answer is not `409` in flight (the killed replica's lock lasts its ttl).
async fn after_the_ttl(url: &str, body: &str) -> support::http::Reply {
    support::http::within("an answer after the killed replica's lock", async {
        loop {
            let reply = pay(url, "k-1", body, "ok").await;
            let in_flight = reply.status == 409 && reply.header("retry-after").is_some();
            if !in_flight {
                return reply;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
}

/// The replica commits, stores the response in the row, and is killed (`SIGKILL`) while its
/// Redis record is still to be written (every master frozen): the retry, once the dead
/// replica's lock ran out, is the first response replayed from the row — the same payment.
// Multi-threaded: the test's blocking reads of the child's lines leave a worker to send.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_a_replica_killed_after_its_commit_and_before_the_redis_record_is_replayed() {
    each(|v, pg| async move {
        let (masters, db) = (Masters::start(3), app::Db::create(&pg).await);
        let mut replica = ReplicaProcess::start(v, &masters, &db);
        let first = spawn_pay(&replica.url, "k-1", "10 EUR", "commit-then-wait");
        assert_eq!(replica.line("REACHED "), "committed");
        masters.iter().for_each(|m| m.freeze());
        replica.go();
        until_stored(&db).await;
        replica.kill();
        masters.iter().for_each(|m| m.thaw());
        // The first request dies with its replica (its connection reset: no answer to read).
        first.abort();
        let stored: Vec<u8> = sqlx::query_scalar("SELECT record FROM tower_redlock_keys")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert!(!stored.is_empty());

        let here = Replica::start(v, &masters, &db, Duration::from_secs(5)).await;
        let retry = after_the_ttl(&here.url(), "10 EUR").await;
        assert_eq!(retry.status, 201, "{}", retry.text());
        assert_eq!(retry.header("idempotency-replayed"), Some("true"));
        let id: i64 = sqlx::query_scalar("SELECT id FROM payments")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(
            retry.text(),
            format!("payment {id}"),
            "the original payment"
        );
        assert_eq!(db.payments().await, 1);
    })
    .await;
}

/// The replica is killed (`SIGKILL`) right after its commit, before the response reached
/// the row: a retry finds the row without a response — `409` + `Retry-After` while the
/// response may still come (the lock's ttl and the store's timeout), then `409`
/// completed-not-stored — never a second run; another payload is `422`.
// Multi-threaded: the test's blocking reads of the child's lines leave a worker to send.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_a_replica_killed_right_after_its_commit_never_runs_again() {
    each(|v, pg| async move {
        let (masters, db) = (Masters::start(3), app::Db::create(&pg).await);
        let mut replica = ReplicaProcess::start(v, &masters, &db);
        let first = spawn_pay(&replica.url, "k-1", "10 EUR", "commit-then-wait");
        assert_eq!(replica.line("REACHED "), "committed");
        replica.kill();
        drop(first);
        assert_eq!(db.key_rows().await, (1, 0), "committed, no response");

        let here = Replica::start(v, &masters, &db, Duration::from_secs(5)).await;
        let reused = after_the_ttl(&here.url(), "99 EUR").await;
        assert_eq!(reused.status, 422, "another payload: {}", reused.text());
        let retry = after_the_ttl(&here.url(), "10 EUR").await;
        assert_eq!(retry.status, 409, "{}", retry.text());
        assert!(retry.header("retry-after").is_none());
        assert!(retry.text().contains("idempotency-completed-not-stored"));
        assert_eq!(db.payments().await, 1, "never a second run");
    })
    .await;
}

/// As above, with a rebuild hook ([`Durable::rebuild`](tower_redlock::durable::Durable::rebuild))
/// that reads the payment by the key's hash: the retry gets the payment's response, rebuilt
/// and replayed — stored in the row and on the voters, so the next retry replays it too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_a_row_without_its_response_is_rebuilt_by_the_hook() {
    each(|v, pg| async move {
        let (masters, db) = (Masters::start(3), app::Db::create(&pg).await);
        let mut replica = ReplicaProcess::start(v, &masters, &db);
        let first = spawn_pay(&replica.url, "k-1", "10 EUR", "commit-then-wait");
        assert_eq!(replica.line("REACHED "), "committed");
        replica.kill();
        first.abort();
        assert_eq!(db.key_rows().await, (1, 0), "committed, no response");

        let policy = app::policy_of(masters.client(), app::rebuilding(v.driver, &db.url.clone()));
        let here = Replica::with_policy(v, &db, policy).await;
        let retry = after_the_ttl(&here.url(), "10 EUR").await;
        let id: i64 = sqlx::query_scalar("SELECT id FROM payments")
            .fetch_one(&db.pool)
            .await
            .unwrap();
        assert_eq!(retry.status, 201, "{}", retry.text());
        assert_eq!(retry.text(), format!("payment {id}"));
        assert_eq!(retry.header("idempotency-replayed"), Some("true"));
        assert_eq!(
            db.key_rows().await,
            (1, 1),
            "the rebuilt response is in the row"
        );
        super::assert_replayed(&pay(&here.url(), "k-1", "10 EUR", "ok").await, &retry);
        assert_eq!(db.payments().await, 1, "never a second run");
    })
    .await;
}
