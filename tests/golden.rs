//! Golden vectors: the byte formats other versions of this crate read during a rolling
//! deploy, pinned from 0.1 on. Each test turns a fixed input into the exact Redis key or
//! bytes a real `redis-server` holds afterwards; a change to any of them is a breaking change
//! of the stored format (see CHANGELOG.md, *Stable formats*) and must fail here first.

use std::time::Duration;

use tower_redlock::node::{RedisNode, RedisNodeOptions};
use tower_redlock::{Claim, Redlock, Retry};
use tower_redlock_testkit as support;

use support::RedisServer;

const TTL: Duration = Duration::from_secs(10);

fn client(server: &RedisServer, fencing: bool) -> Redlock {
    Redlock::builder()
        .redis(&server.url())
        .fencing(fencing)
        .build()
        .expect("a client")
}

/// The raw bytes at `key`.
async fn raw(server: &RedisServer, key: &str) -> Vec<u8> {
    server
        .query::<Option<Vec<u8>>>(redis::cmd("GET").arg(key))
        .await
        .unwrap_or_else(|| panic!("nothing at {key}"))
}

/// The lock key of request material: prefix, then the lowercase hex of the first 16 bytes of
/// SHA-256 over the parts, each its length (big-endian u64) and its bytes.
#[test]
fn golden_lock_key_derivation() {
    use tower_redlock::http::{
        IdempotencyKey, KeyExtractor, KeyExtractorExt, LockKey, SimpleRequest,
    };

    assert_eq!(
        LockKey::from_parts(["order", "42"]).as_str(),
        "tower-redlock:aa5497ca378a52a6e4e387843da9c7d0"
    );
    let req = SimpleRequest::new("POST", "/payments")
        .route("/payments")
        .header("x-tenant-id", "acme")
        .header(
            "idempotency-key",
            "\"8e03978e-40d5-43e8-bc93-6894a57f9324\"",
        );
    let plain = IdempotencyKey::required().extract(&req).unwrap().unwrap();
    assert_eq!(
        plain.as_str(),
        "tower-redlock:bcdb93459c5c7acc0125663051f4e3e6"
    );
    let scoped = IdempotencyKey::required()
        .scoped_by_route()
        .scoped_by_method()
        .scoped_by_header("x-tenant-id")
        .prefix("payments:");
    let scoped = scoped.extract(&req).unwrap().unwrap();
    assert_eq!(scoped.as_str(), "payments:be48e2e9fa5a324f82c22e60af87d3ce");
}

/// A lock is its resource name as given, holding the lease's value; a completion record sits
/// at `<resource>:record` as `TRR1\n` followed by the record's bytes.
#[tokio::test]
async fn golden_completion_record_format() {
    let server = RedisServer::start();
    let client = client(&server, false);
    let lease = client.lock("golden:lock", TTL).await.unwrap();
    assert_eq!(raw(&server, "golden:lock").await, lease.value().as_bytes());
    lease.release().await.unwrap();

    let Claim::Locked(lease) = client
        .lock_unless_completed("golden:work", TTL, Retry::never())
        .await
        .unwrap()
    else {
        panic!("nothing completed yet");
    };
    lease
        .complete(&b"done \x00\xff"[..], Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(
        raw(&server, "golden:work:record").await,
        b"TRR1\ndone \x00\xff"
    );
    assert!(
        server.get("golden:work").await.is_none(),
        "the lock is gone"
    );
}

/// A fencing counter sits at `<resource>:fence` as `TRF1:` and the token in decimal.
#[tokio::test]
async fn golden_fencing_counter_format() {
    let server = RedisServer::start();
    let client = client(&server, true);
    let lease = client.lock("golden:fenced", TTL).await.unwrap();
    let token = lease.fencing_token().expect("fencing on");
    assert_eq!(
        raw(&server, "golden:fenced:fence").await,
        format!("TRF1:{token}").as_bytes()
    );
    lease.release().await.unwrap();
    assert_eq!(
        raw(&server, "golden:fenced:fence").await,
        format!("TRF1:{token}").as_bytes()
    );
}

/// Tenure protection's two markers: `tower-redlock:restart-guard:<max ttl ms>` holding
/// `<run_id>:<ms>`, and the same key with `:repl` holding `TRT2:<master_replid>:<ms>`.
#[tokio::test]
async fn golden_tenure_markers() {
    let server = RedisServer::start();
    let options = RedisNodeOptions::new().restart_protection(Duration::from_millis(1_500));
    let client = Redlock::builder()
        .node(RedisNode::open_with(&server.url(), &options).unwrap())
        .build()
        .unwrap();
    // A young tenure abstains; the try writes the markers.
    let _ = client
        .try_lock("golden:tenure", TTL.min(Duration::from_secs(1)))
        .await;
    let info: String = server.query(redis::cmd("INFO").arg("server")).await;
    let run_id = field(&info, "run_id");
    let info: String = server.query(redis::cmd("INFO").arg("replication")).await;
    let replid = field(&info, "master_replid");

    let first = String::from_utf8(raw(&server, "tower-redlock:restart-guard:1500").await).unwrap();
    let (who, since) = first.split_once(':').expect("run_id:ms");
    assert_eq!(who, run_id);
    assert!(since.parse::<u64>().is_ok(), "{first}");
    let second =
        String::from_utf8(raw(&server, "tower-redlock:restart-guard:1500:repl").await).unwrap();
    let rest = second.strip_prefix("TRT2:").expect("tagged TRT2:");
    let (repl, since2) = rest.split_once(':').expect("replid:ms");
    assert_eq!(repl, replid);
    assert_eq!(since2, since, "one tenure, one start");
}

fn field<'a>(info: &'a str, name: &str) -> &'a str {
    info.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("{name} in INFO"))
        .trim()
}

/// The stored HTTP response (`TRH1`): magic, the request's 32-byte fingerprint, kind 0,
/// status, headers (name length u16, name, value length u32, value), body; big-endian.
#[cfg(feature = "axum")]
#[tokio::test]
async fn golden_http_record_format() {
    use axum::routing::post;
    use tower::ServiceExt;
    use tower_redlock::http::{IdempotencyKey, KeyExtractor, LockPolicy, Replay, SimpleRequest};
    use tower_redlock::RedlockLayer;

    let server = RedisServer::start();
    let redlock = client(&server, false);
    let policy = LockPolicy::builder(redlock, IdempotencyKey::required())
        .replay(Replay::new())
        .build()
        .unwrap();
    let app = axum::Router::new()
        .route(
            "/payments",
            post(|| async { ([("x-payment-id", "p-1")], "paid") }),
        )
        .layer(RedlockLayer::with_policy(policy));
    let request = || {
        axum::http::Request::post("/payments?x=1")
            .header("idempotency-key", "\"golden-1\"")
            .header("content-type", "application/json")
            .body(axum::body::Body::from(r#"{"amount":1}"#))
            .unwrap()
    };
    let response = app.clone().oneshot(request()).await.unwrap();
    assert_eq!(response.status(), 200);

    let view = SimpleRequest::new("POST", "/payments").header("idempotency-key", "\"golden-1\"");
    let lock = IdempotencyKey::required().extract(&view).unwrap().unwrap();
    let bytes = raw(&server, &format!("{}:record", lock.as_str())).await;
    let expected = [
        "545252310a",                                                       // TRR1\n
        "54524831",                                                         // TRH1
        "95056aa9611cd520367232ef1d84337d7d75dc753469bf52a911110f123b7d4a", // fingerprint
        "00",                                                               // a response
        "00c8",                                                             // 200
        "0002",                                                             // two headers
        "000c",
        "636f6e74656e742d74797065", // content-type
        "00000019",
        "746578742f706c61696e3b20636861727365743d7574662d38", // text/plain; charset=utf-8
        "000c",
        "782d7061796d656e742d6964", // x-payment-id
        "00000003",
        "702d31",   // p-1
        "70616964", // paid
    ];
    assert_eq!(hex(&bytes), expected.concat());
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
