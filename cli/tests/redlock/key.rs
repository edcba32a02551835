//! `redlock key` without Redis: the library's key for every scoping it reproduces, and its
//! exit codes for a request that passes unlocked or a rejected key.

use tower_redlock::key::{HeaderKey, KeyExtractorExt, RequestView, RouteParamKey, SimpleRequest};
use tower_redlock::node::MemoryNode;
use tower_redlock::policy::LockPolicy;
use tower_redlock::Redlock;

use crate::common::{code, everything, json, redlock, redlock_with_env, stdout};

/// An application's tenant, put into the request by its authentication layer.
struct Tenant(String);

#[tokio::test]
async fn key_cli_reproduces_extension_method_prefix_hmac_and_the_client_key_prefix() {
    let secret = "0123456789abcdef0123456789abcdef";
    let client = Redlock::builder()
        .node(MemoryNode::new())
        .key_prefix("app:")
        .build()
        .unwrap();
    let extractor = RouteParamKey::new("id")
        .scoped_by_method()
        .scoped_by_extension(|t: &Tenant| t.0.clone())
        .scoped_by_header("x-region")
        .prefix("pay:");
    let policy = LockPolicy::builder(client, extractor)
        .methods(["PUT"])
        .hmac_key(secret)
        .build()
        .unwrap();
    let req = SimpleRequest::new("PUT", "/accounts/42")
        .route("/accounts/{id}")
        .param("id", "42")
        .header("x-region", "eu")
        .extension(Tenant("acme".into()));
    let expected = policy.redis_key(&req as &dyn RequestView).unwrap().unwrap();

    let args = [
        "--key-prefix",
        "app:",
        "key",
        "--method",
        "put",
        "--path",
        "/accounts/42",
        "--route",
        "/accounts/{id}",
        "--param",
        "id=42",
        "--header",
        "x-region: eu",
        "--source",
        "route-param:id",
        "--scope",
        "method",
        "--scope",
        "extension:acme",
        "--scope",
        "header:x-region",
        "--prefix",
        "pay:",
        "--methods",
        "PUT",
        "--hmac-key-env",
        "LOCK_SECRET",
    ];
    let out = redlock_with_env(&args, &[("LOCK_SECRET", secret)]).await;
    assert_eq!(code(&out), 0, "{}", everything(&out));
    assert_eq!(stdout(&out).trim(), expected);
    assert!(expected.starts_with("app:pay:"), "{expected}");

    // The secret is read from the environment only: without it, a usage error.
    let out = redlock(&args).await;
    assert_eq!(code(&out), 2, "{}", everything(&out));
    assert!(
        everything(&out).contains("LOCK_SECRET"),
        "{}",
        everything(&out)
    );

    // Another tenant, another key.
    let other: Vec<&str> = args
        .iter()
        .map(|a| {
            if *a == "extension:acme" {
                "extension:globex"
            } else {
                a
            }
        })
        .collect();
    let out = redlock_with_env(&other, &[("LOCK_SECRET", secret)]).await;
    assert_eq!(code(&out), 0, "{}", everything(&out));
    assert_ne!(stdout(&out).trim(), expected);
}

#[tokio::test]
async fn key_cli_exits_3_for_a_request_that_passes_unlocked_and_2_for_a_rejected_key() {
    let out = redlock(&["key", "--method", "GET", "--path", "/payments"]).await;
    assert_eq!(code(&out), 3, "{}", everything(&out));
    assert!(
        everything(&out).contains("unlocked"),
        "{}",
        everything(&out)
    );

    let out = redlock(&["key", "--path", "/payments", "--optional", "--json"]).await;
    assert_eq!(code(&out), 3, "{}", everything(&out));
    assert!(json(&out)["key"].is_null());

    let out = redlock(&["key", "--path", "/payments", "--json"]).await;
    assert_eq!(code(&out), 2, "{}", everything(&out));
    let report = json(&out);
    assert!(report["key"].is_null(), "{report}");
    assert!(
        report["reason"].as_str().unwrap().starts_with("400"),
        "{report}"
    );

    let header = HeaderKey::new("x-request-id");
    let policy = LockPolicy::builder(Redlock::in_memory(), header)
        .build()
        .unwrap();
    let req = SimpleRequest::new("POST", "/jobs").header("x-request-id", "r-1");
    let expected = policy.redis_key(&req as &dyn RequestView).unwrap().unwrap();
    let out = redlock(&[
        "key",
        "--path",
        "/jobs",
        "--source",
        "header:x-request-id",
        "--header",
        "x-request-id:r-1",
        "--json",
    ])
    .await;
    assert_eq!(code(&out), 0, "{}", everything(&out));
    assert_eq!(json(&out)["key"], expected.as_str());
}
