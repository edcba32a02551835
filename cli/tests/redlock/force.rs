//! `redlock unlock --force --holder PREFIX` frees a key a crashed holder left; without
//! `--force`, without a holder named, with a bad prefix, without `--yes` and no terminal to
//! confirm on, or with `--any-holder` off a terminal, it deletes nothing; a re-run spares a
//! holder that took the key meanwhile.

use std::time::Duration;

use tower_redlock::Redlock;
use tower_redlock_testkit::apps::{assert_held, client_of};
use tower_redlock_testkit::Masters;

use crate::common::{code, everything, joined, redlock, url_args};

#[tokio::test(flavor = "multi_thread")]
async fn force_unlock_cli_frees_a_key_a_crashed_holder_left() {
    let masters = Masters::start(3);
    let client = client_of(&masters).await;
    let key = "job:stuck";
    // A holder that crashed: its lease is never released, its keys live 60 s.
    std::mem::forget(client.try_lock(key, Duration::from_secs(60)).await.unwrap());
    assert_held(&masters, key).await;
    assert!(client.try_lock(key, Duration::from_secs(5)).await.is_err());
    let urls = url_args(&masters);
    let held_everywhere = || async { masters.values(key).await.iter().all(Option::is_some) };

    let out = redlock(&joined(&["unlock", key], &urls)).await;
    assert_eq!(code(&out), 2, "{}", everything(&out));
    assert!(everything(&out).contains("--force"), "{}", everything(&out));
    assert!(held_everywhere().await, "deleted without --force");

    let out = redlock(&joined(&["unlock", "--force", key], &urls)).await;
    assert_eq!(code(&out), 2, "{}", everything(&out));
    assert!(
        everything(&out).contains("--holder"),
        "{}",
        everything(&out)
    );
    assert!(held_everywhere().await, "deleted without a holder named");

    let prefix = holder_of(&client, key).await;
    let out = redlock(&joined(
        &["unlock", "--force", key, "--holder", &prefix],
        &urls,
    ))
    .await;
    assert_eq!(code(&out), 2, "{}", everything(&out));
    assert!(everything(&out).contains("--yes"), "{}", everything(&out));
    assert!(held_everywhere().await, "deleted without confirmation");

    for bad in ["f0f0", "zzzzzzzz"] {
        let out = redlock(&joined(
            &["unlock", "--force", key, "--holder", bad, "--yes"],
            &urls,
        ))
        .await;
        assert_eq!(code(&out), 2, "{}", everything(&out));
        assert!(
            everything(&out).contains("8 to 32 hex digits"),
            "{}",
            everything(&out)
        );
        assert!(held_everywhere().await, "deleted with a bad prefix {bad}");
    }

    let out = redlock(&joined(
        &["unlock", "--force", key, "--any-holder", "--yes"],
        &urls,
    ))
    .await;
    assert_eq!(code(&out), 2, "{}", everything(&out));
    assert!(
        everything(&out).contains("terminal"),
        "{}",
        everything(&out)
    );
    assert!(
        held_everywhere().await,
        "--any-holder off a terminal deleted"
    );

    let unlock = [
        "unlock", "--force", key, "--holder", &prefix, "--yes", "--by", "test",
    ];
    let out = redlock(&joined(&unlock, &urls)).await;
    assert_eq!(code(&out), 0, "{}", everything(&out));
    let printed = everything(&out);
    assert_eq!(printed.matches("lock deleted").count(), 3, "{printed}");
    assert!(masters.absent_everywhere(key).await);
    let lease = client.try_lock(key, Duration::from_secs(5)).await.unwrap();
    // A lock returns at a quorum; the last master's `SET` may land a moment later.
    assert_held(&masters, key).await;

    // The operator runs it again (say a voter had not answered): the new holder is spared.
    let out = redlock(&joined(&unlock, &urls)).await;
    assert_eq!(code(&out), 0, "{}", everything(&out));
    let printed = everything(&out);
    let spared = format!("no lock of {prefix}");
    assert_eq!(printed.matches(&spared).count(), 3, "{printed}");
    assert!(
        masters.everywhere(key, lease.value()).await,
        "the re-run deleted the new holder"
    );
    lease.release().await.unwrap();
}

/// The holder's token prefix, as `redlock inspect` shows it.
async fn holder_of(client: &Redlock, key: &str) -> String {
    let seen = client.inspect(key).await.unwrap();
    seen.holder().expect("a holder").token_prefix
}

#[tokio::test(flavor = "multi_thread")]
async fn force_unlock_cli_json_reports_a_voter_that_did_not_answer_and_exits_1() {
    let masters = Masters::start(2);
    let client = client_of(&masters).await;
    std::mem::forget(
        client
            .try_lock("job:half", Duration::from_secs(60))
            .await
            .unwrap(),
    );
    assert_held(&masters, "job:half").await;
    let refused = refused_port();
    let mut urls = url_args(&masters);
    urls.extend(["--url".to_owned(), format!("redis://127.0.0.1:{refused}")]);
    let prefix = holder_of(&client, "job:half").await;
    let out = redlock(&joined(
        &[
            "unlock", "--force", "job:half", "--holder", &prefix, "--yes", "--json",
        ],
        &urls,
    ))
    .await;
    assert_eq!(code(&out), 1, "{}", everything(&out));
    let done = crate::common::json(&out);
    assert_eq!(done["complete"], false, "{done}");
    assert_eq!(done["locks_deleted"], 2, "{done}");
    assert!(done["voters"][2]["error"].is_string(), "{done}");
    assert!(masters.absent_everywhere("job:half").await);
}

/// A loopback port nothing listens on (bound, then closed).
pub fn refused_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}
