//! `redlock inspect`: each voter's answer, a voter's error, and never a credential.

use std::time::Duration;

use tower_redlock_testkit::apps::{assert_held, client_of};
use tower_redlock_testkit::Masters;

use crate::common::{code, everything, joined, json, redlock, redlock_with_env, url_args};
use crate::force::refused_port;

const PASSWORD: &str = "s3cret-Pa55word";

#[tokio::test(flavor = "multi_thread")]
async fn inspect_cli_json_reports_each_voter_and_never_prints_credentials() {
    let masters = Masters::start(3);
    let lease = client_of(&masters)
        .await
        .try_lock("invoice:7", Duration::from_secs(30))
        .await
        .unwrap();
    // The lock's last SET may land after try_lock returned (it decided on a quorum).
    assert_held(&masters, "invoice:7").await;
    // Master 0 now needs a password.
    let mut conn = redis::Client::open(masters[0].url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg(PASSWORD)
        .query_async(&mut conn)
        .await
        .unwrap();
    let with_password = |port: u16, password: &str| format!("redis://:{password}@127.0.0.1:{port}");
    let refused = refused_port();
    let urls = [
        with_password(masters[0].port(), PASSWORD),
        masters[1].url(),
        masters[2].url(),
        with_password(refused, PASSWORD),
    ];
    let flags: Vec<String> = ["--timeout", "1000"]
        .into_iter()
        .map(str::to_owned)
        .chain(urls.iter().flat_map(|u| ["--url".to_owned(), u.clone()]))
        .collect();

    let out = redlock(&joined(&["inspect", "invoice:7", "--json"], &flags)).await;
    assert_eq!(code(&out), 0, "{}", everything(&out));
    assert!(!everything(&out).contains(PASSWORD), "{}", everything(&out));
    let seen = json(&out);
    assert_eq!(seen["quorum"], 3, "{seen}");
    assert_eq!(seen["summary"], "held", "{seen}");
    let voters = seen["voters"].as_array().unwrap();
    assert_eq!(voters.len(), 4, "{seen}");
    for (i, v) in voters[..3].iter().enumerate() {
        assert_eq!(v["held"], true, "voter {i}: {seen}");
        assert!(lease
            .value()
            .starts_with(v["token_prefix"].as_str().unwrap()));
        assert!(v["ttl_ms"].as_u64().unwrap() > 0, "{seen}");
        assert!(v["error"].is_null(), "{seen}");
    }
    assert_eq!(
        voters[0]["voter"],
        format!("127.0.0.1:{}", masters[0].port())
    );
    assert_eq!(voters[3]["voter"], format!("127.0.0.1:{refused}"));
    assert!(voters[3]["error"].is_string(), "{seen}");
    assert!(voters[3]["held"].is_null(), "{seen}");

    // A wrong password, a voter in text output, the URLs from REDLOCK_URLS.
    let wrong = "Wr0ng-Pa55word";
    let list = [with_password(masters[0].port(), wrong), masters[1].url()].join(",");
    let args = ["inspect", "invoice:7", "--timeout", "1000"];
    let out = redlock_with_env(&args, &[("REDLOCK_URLS", &list)]).await;
    assert_eq!(code(&out), 0, "{}", everything(&out));
    let printed = everything(&out);
    assert!(
        !printed.contains(wrong) && !printed.contains(PASSWORD),
        "{printed}"
    );
    assert!(printed.contains("error"), "{printed}");
    assert!(
        printed.contains(&format!("127.0.0.1:{}", masters[1].port())),
        "{printed}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn inspect_cli_exits_2_without_voters_or_for_an_invalid_resource() {
    let out = redlock(&["inspect", "job"]).await;
    assert_eq!(code(&out), 2, "{}", everything(&out));
    assert!(everything(&out).contains("--url"), "{}", everything(&out));

    let masters = Masters::start(1);
    let flags = url_args(&masters);
    let out = redlock(&joined(&["inspect", ""], &flags)).await;
    assert_eq!(code(&out), 2, "{}", everything(&out));
    let out = redlock(&joined(&["inspect", "job"], &flags)).await;
    assert_eq!(code(&out), 0, "{}", everything(&out));
    assert!(
        everything(&out).contains("summary: free"),
        "{}",
        everything(&out)
    );
}
