//! `redlock watch`: the locks held under a prefix, one JSON line per refresh.

use std::time::Duration;

use tower_redlock_testkit::apps::{assert_held, client_of};
use tower_redlock_testkit::Masters;

use crate::common::{code, everything, joined, redlock, url_args};

#[tokio::test(flavor = "multi_thread")]
async fn watch_cli_json_lists_each_key_held_under_the_prefix_with_its_ttl() {
    let masters = Masters::start(3);
    let client = client_of(&masters).await;
    let _held = client
        .try_lock("jobs:7", Duration::from_secs(30))
        .await
        .unwrap();
    let _other = client
        .try_lock("other:1", Duration::from_secs(30))
        .await
        .unwrap();
    assert_held(&masters, "jobs:7").await;
    let urls = url_args(&masters);
    let args = [
        "watch",
        "--prefix",
        "jobs:",
        "--count",
        "2",
        "--interval-ms",
        "20",
        "--json",
    ];
    let out = redlock(&joined(&args, &urls)).await;
    assert_eq!(code(&out), 0, "{}", everything(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        !text.contains('\x1b'),
        "no screen control when not a terminal"
    );
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(lines.len(), 2, "{text}");
    for refresh in &lines {
        let voters = refresh["voters"].as_array().unwrap();
        assert_eq!(voters.len(), 3, "{refresh}");
        for v in voters {
            let locks = v["locks"].as_array().expect("the voter answered");
            assert_eq!(locks.len(), 1, "only the prefix's keys: {refresh}");
            assert_eq!(locks[0]["key"], "jobs:7");
            assert!(locks[0]["ttl_ms"].as_u64().unwrap() > 0, "{refresh}");
        }
    }

    // The table for people, once.
    let args = ["watch", "--prefix", "jobs:", "--count", "1"];
    let out = redlock(&joined(&args, &urls)).await;
    assert_eq!(code(&out), 0, "{}", everything(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("jobs:7") && text.contains("3/3") && text.contains('█'),
        "{text}"
    );
}
