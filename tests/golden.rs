//! Golden vectors: the byte formats other versions of this crate read during a rolling
//! deploy, pinned from 0.1 on. Each test turns a fixed input into the exact Redis key or
//! bytes a real `redis-server` holds afterwards; a change to any of them is a breaking change
//! of the stored format (see CHANGELOG.md, *Stable formats*) and must fail here first. The
//! options that change what is stored are here too: keyed lock keys (`hmac_key_…`) and
//! sealed responses (`record_transform_…`).

use std::time::Duration;

use tower_redlock::node::{RedisNode, RedisNodeOptions};
use tower_redlock::{LockOrRecord, Redlock, Retry};
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
    use tower_redlock::key::{
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

    let LockOrRecord::Locked(lease) = client
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
    use tower_redlock::key::{IdempotencyKey, KeyExtractor, SimpleRequest};
    use tower_redlock::policy::LockPolicy;
    use tower_redlock::replay::Replay;
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
        .layer(RedlockLayer::new(policy));
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

/// The record of a request stopped on a lost lease (`OnLost::Abort`): magic, the request's
/// fingerprint, kind 3 ("outcome unknown"), nothing else.
#[cfg(feature = "axum")]
#[tokio::test]
async fn golden_http_record_of_a_request_stopped_on_a_lost_lease() {
    use axum::routing::post;
    use tower::ServiceExt;
    use tower_redlock::key::{IdempotencyKey, KeyExtractor, SimpleRequest};
    use tower_redlock::policy::{LockPolicy, OnLost};
    use tower_redlock::replay::Replay;
    use tower_redlock::RedlockLayer;

    let server = RedisServer::start();
    let redlock = client(&server, false);
    let policy = LockPolicy::builder(redlock, IdempotencyKey::required())
        .replay(Replay::new())
        // 1 s: the one try's own time on a loaded machine leaves the lease validity to run out
        // while the handler runs (a try slower than the ttl would answer 503 unavailable).
        .ttl(Duration::from_secs(1))
        .keep_alive(false)
        .on_lost(OnLost::Abort)
        .build()
        .unwrap();
    // A handler that never ends: its lease runs out and it is stopped.
    let app = axum::Router::new()
        .route("/payments", post(std::future::pending::<&'static str>))
        .layer(RedlockLayer::new(policy));
    let request = axum::http::Request::post("/payments?x=1")
        .header("idempotency-key", "\"golden-1\"")
        .header("content-type", "application/json")
        .body(axum::body::Body::from(r#"{"amount":1}"#))
        .unwrap();
    let response = app.oneshot(request).await.unwrap();
    assert_eq!(response.status(), 503);

    let view = SimpleRequest::new("POST", "/payments").header("idempotency-key", "\"golden-1\"");
    let lock = IdempotencyKey::required().extract(&view).unwrap().unwrap();
    let record = format!("{}:record", lock.as_str());
    // Written in the background once the handler is stopped.
    support::eventually("the record is written", Duration::from_secs(10), || async {
        let exists: i64 = server.query(redis::cmd("EXISTS").arg(&record)).await;
        exists == 1
    })
    .await;
    let bytes = raw(&server, &record).await;
    let expected = [
        "545252310a",                                                       // TRR1\n
        "54524831",                                                         // TRH1
        "95056aa9611cd520367232ef1d84337d7d75dc753469bf52a911110f123b7d4a", // fingerprint
        "03",                                                               // outcome unknown
    ];
    assert_eq!(hex(&bytes), expected.concat());
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The secret of the keyed tests (32 bytes).
#[cfg(feature = "axum")]
const SECRET: &[u8; 32] = b"0123456789abcdef0123456789abcdef";

/// The raw completion record [`keys_left_by`] leaves.
#[cfg(feature = "axum")]
async fn record_left_by(secret: Option<&[u8]>) -> Vec<u8> {
    let (keys, server) = run_keyed(secret).await;
    raw(&server, &keys[0]).await
}

/// Sends one replayed `POST /pay` with `Idempotency-Key: "golden-1"` through an axum app
/// whose policy keys lock keys with `secret` (none: unkeyed), and answers the Redis keys
/// it left (the completion record's).
#[cfg(feature = "axum")]
async fn keys_left_by(secret: Option<&[u8]>) -> Vec<String> {
    run_keyed(secret).await.0
}

/// [`keys_left_by`], and the server (still running).
#[cfg(feature = "axum")]
async fn run_keyed(secret: Option<&[u8]>) -> (Vec<String>, RedisServer) {
    use axum::routing::post;
    use tower::ServiceExt;
    use tower_redlock::key::IdempotencyKey;
    use tower_redlock::policy::LockPolicy;
    use tower_redlock::replay::Replay;
    use tower_redlock::RedlockLayer;

    let server = RedisServer::start();
    let mut policy = LockPolicy::builder(client(&server, false), IdempotencyKey::required())
        .replay(Replay::new());
    if let Some(secret) = secret {
        policy = policy.hmac_key(secret);
    }
    let app = axum::Router::new()
        .route("/pay", post(|| async { "paid" }))
        .layer(RedlockLayer::new(policy.build().unwrap()));
    let request = axum::http::Request::post("/pay")
        .header("idempotency-key", "\"golden-1\"")
        .body(axum::body::Body::empty())
        .unwrap();
    assert_eq!(app.oneshot(request).await.unwrap().status(), 200);
    let keys = server.query(redis::cmd("KEYS").arg("*")).await;
    (keys, server)
}

/// A keyed lock key: the extractor's prefix, then the hex of the first 16 bytes of
/// HMAC-SHA-256(secret, the unkeyed key) — checked against Python's `hmac` module.
#[cfg(feature = "axum")]
#[tokio::test]
async fn hmac_key_golden_vector() {
    let plain = keys_left_by(None).await;
    assert_eq!(
        plain,
        ["tower-redlock:fc2cf9c4a91358ba7f67406ed96e4689:record"]
    );
    let keyed = keys_left_by(Some(SECRET)).await;
    assert_eq!(
        keyed,
        ["tower-redlock:5b4bd4e47b57e2ec2922256a30ed9006:record"]
    );
}

/// Another secret, another key; the same secret in another instance, the same key; and
/// nothing of the unkeyed key or the raw value is left in Redis.
#[cfg(feature = "axum")]
#[tokio::test]
async fn hmac_key_depends_on_the_secret_only() {
    let plain = keys_left_by(None).await;
    let a = keys_left_by(Some(SECRET)).await;
    let again = keys_left_by(Some(SECRET)).await;
    let b = keys_left_by(Some(b"another secret of 32 bytes......")).await;
    assert_eq!(
        a, again,
        "every instance with the secret locks the same key"
    );
    assert_ne!(a, b);
    for keys in [&a, &b] {
        assert_ne!(keys, &plain);
        assert!(keys.iter().all(|k| !k.contains("golden-1")), "{keys:?}");
        assert!(keys[0].starts_with("tower-redlock:"), "the prefix stays");
    }
}

/// A secret under 16 bytes is refused at build, with what to do.
#[test]
fn hmac_key_too_short_is_refused() {
    use tower_redlock::key::IdempotencyKey;
    use tower_redlock::node::MemoryNode;
    use tower_redlock::policy::LockPolicy;

    let redlock = Redlock::builder().node(MemoryNode::new()).build().unwrap();
    for secret in [&b""[..], b"fifteen bytes!!"] {
        let e = LockPolicy::builder(redlock.clone(), IdempotencyKey::required())
            .hmac_key(secret)
            .build()
            .unwrap_err();
        assert!(e.is_invalid_input(), "{e}");
        assert!(e.to_string().contains("at least 16"), "{e}");
    }
    let ok = LockPolicy::builder(redlock, IdempotencyKey::required()).hmac_key([7u8; 16]);
    assert!(ok.build().is_ok());
}

/// A stand-in cipher for the transform tests: XOR with a byte, and a mark in front.
#[cfg(feature = "axum")]
struct Xor {
    byte: u8,
    /// Fail to seal (or, `open_fails`, to open) on purpose.
    seal_fails: bool,
    open_fails: bool,
}

#[cfg(feature = "axum")]
impl tower_redlock::replay::RecordTransform for Xor {
    fn seal(&self, response: &[u8]) -> Result<Vec<u8>, tower_redlock::replay::TransformError> {
        if self.seal_fails {
            return Err("no key to seal with".into());
        }
        Ok([
            b"X1".as_slice(),
            &response.iter().map(|b| b ^ self.byte).collect::<Vec<_>>(),
        ]
        .concat())
    }
    fn open(&self, sealed: &[u8]) -> Result<Vec<u8>, tower_redlock::replay::TransformError> {
        let body = sealed.strip_prefix(b"X1").ok_or("not sealed by X1")?;
        if self.open_fails {
            return Err("the key was rotated away".into());
        }
        Ok(body.iter().map(|b| b ^ self.byte).collect())
    }
}

#[cfg(feature = "axum")]
fn xor(byte: u8) -> Xor {
    Xor {
        byte,
        seal_fails: false,
        open_fails: false,
    }
}

/// An axum app on `server` storing responses through `transform`; its handler counts runs
/// and answers a secret.
#[cfg(feature = "axum")]
fn sealed_app(
    server: &RedisServer,
    transform: Xor,
    runs: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> axum::Router {
    use axum::routing::post;
    use tower_redlock::key::IdempotencyKey;
    use tower_redlock::policy::LockPolicy;
    use tower_redlock::replay::Replay;
    use tower_redlock::RedlockLayer;

    let policy = LockPolicy::builder(client(server, false), IdempotencyKey::required())
        .replay(Replay::new().transform(transform))
        .build()
        .unwrap();
    axum::Router::new()
        .route(
            "/pay",
            post(move || {
                runs.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                async { "card 4111-1111" }
            }),
        )
        .layer(RedlockLayer::new(policy))
}

/// Sends `POST /pay` with `Idempotency-Key: "sealed-1"`: the status, the body and whether
/// it was a replay.
#[cfg(feature = "axum")]
async fn pay_once(app: &axum::Router) -> (u16, String, bool) {
    pay_with(app, "").await
}

/// [`pay_once`] with a request body.
#[cfg(feature = "axum")]
async fn pay_with(app: &axum::Router, body: &'static str) -> (u16, String, bool) {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let request = axum::http::Request::post("/pay")
        .header("idempotency-key", "\"sealed-1\"")
        .body(axum::body::Body::from(body))
        .unwrap();
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status().as_u16();
    let replayed = response.headers().contains_key("idempotency-replayed");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        String::from_utf8_lossy(&body).into_owned(),
        replayed,
    )
}

/// The record's raw bytes (`TRR1\n` and the `TRH1` record): the one key `*:record`.
#[cfg(feature = "axum")]
async fn only_record(server: &RedisServer) -> Vec<u8> {
    let keys: Vec<String> = server.query(redis::cmd("KEYS").arg("*:record")).await;
    assert_eq!(keys.len(), 1, "{keys:?}");
    raw(server, &keys[0]).await
}

/// Sealed on the way in (Redis keeps kind 2 and the sealed bytes, never the body), opened on
/// replay: the duplicate gets the response, the handler runs once.
#[cfg(feature = "axum")]
#[tokio::test]
async fn record_transform_seals_what_redis_keeps_and_opens_on_replay() {
    let server = RedisServer::start();
    let runs = std::sync::Arc::default();
    let app = sealed_app(&server, xor(0x5a), std::sync::Arc::clone(&runs));
    assert_eq!(pay_once(&app).await, (200, "card 4111-1111".into(), false));
    let stored = only_record(&server).await;
    assert_eq!(&stored[..9], b"TRR1\nTRH1");
    assert_eq!(stored[9 + 32], 2, "kind 2: sealed");
    assert_eq!(&stored[9 + 33..9 + 35], b"X1", "what seal gave follows");
    let plain = b"card 4111-1111";
    assert!(
        !stored.windows(plain.len()).any(|w| w == plain),
        "the body is not in Redis"
    );
    // The golden part: the sealed response is the XOR of the kind-0 encoding.
    let opened: Vec<u8> = stored[9 + 35..].iter().map(|b| b ^ 0x5a).collect();
    assert_eq!(
        hex(&opened),
        [
            "00c8",
            "0001",
            "000c",
            "636f6e74656e742d74797065",
            "00000019",
            "746578742f706c61696e3b20636861727365743d7574662d38",
            "636172642034313131",
            "2d31313131",
        ]
        .concat()
    );
    assert_eq!(pay_once(&app).await, (200, "card 4111-1111".into(), true));
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// An app whose transform cannot open (its key rotated away) what another app on `server`
/// stored for `POST /pay` (`runs` counts both apps' handler runs).
#[cfg(feature = "axum")]
async fn stored_then_unopenable(
    server: &RedisServer,
    runs: &std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> axum::Router {
    let writer = sealed_app(server, xor(0x5a), std::sync::Arc::clone(runs));
    assert_eq!(pay_once(&writer).await.0, 200);
    let rotated = Xor {
        open_fails: true,
        ..xor(0x5a)
    };
    sealed_app(server, rotated, std::sync::Arc::clone(runs))
}

/// A record the transform cannot open (another key) is answered completed-not-stored (409):
/// the handler never runs again.
#[cfg(feature = "axum")]
#[tokio::test]
async fn record_transform_that_cannot_open_never_runs_twice() {
    let server = RedisServer::start();
    let runs = std::sync::Arc::default();
    let reader = stored_then_unopenable(&server, &runs).await;
    let (status, body, replayed) = pay_once(&reader).await;
    assert_eq!((status, replayed), (409, false), "{body}");
    assert!(body.contains("completed"), "{body}");
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A response the transform cannot seal is not stored: the key is marked completed, a
/// duplicate gets 409 (never a second run), and nothing of the response is in Redis.
#[cfg(feature = "axum")]
#[tokio::test]
async fn record_transform_that_cannot_seal_marks_the_key_completed() {
    let server = RedisServer::start();
    let runs = std::sync::Arc::default();
    let failing = Xor {
        seal_fails: true,
        ..xor(0x5a)
    };
    let app = sealed_app(&server, failing, std::sync::Arc::clone(&runs));
    assert_eq!(pay_once(&app).await, (200, "card 4111-1111".into(), false));
    let stored = only_record(&server).await;
    assert_eq!(stored.len(), 9 + 32 + 1, "completed, no response");
    assert_eq!(stored[9 + 32], 1, "kind 1: completed, not stored");
    assert_eq!(pay_once(&app).await.0, 409);
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// A reused key with another request is `422` without opening the sealed record (its
/// fingerprint is in the clear): also where the record cannot be opened.
#[cfg(feature = "axum")]
#[tokio::test]
async fn record_transform_another_request_is_422_without_opening() {
    let server = RedisServer::start();
    let runs = std::sync::Arc::default();
    let reader = stored_then_unopenable(&server, &runs).await;
    let (status, body, _) = pay_with(&reader, "another order").await;
    assert_eq!(status, 422, "{body}");
    assert_eq!(runs.load(std::sync::atomic::Ordering::SeqCst), 1);
}

/// With a secret, the request fingerprint the record keeps (it hashes the path and query,
/// where an id may sit) is keyed too: the same request leaves another fingerprint.
#[cfg(feature = "axum")]
#[tokio::test]
async fn hmac_key_keys_the_stored_fingerprint_too() {
    let fingerprint = |record: Vec<u8>| record[9..41].to_vec();
    let plain = fingerprint(record_left_by(None).await);
    let keyed = fingerprint(record_left_by(Some(SECRET)).await);
    let again = fingerprint(record_left_by(Some(SECRET)).await);
    assert_ne!(plain, keyed);
    assert_eq!(
        keyed, again,
        "every instance with the secret judges requests alike"
    );
}

/// The replay acquire of 0.1 as a client of that release sends it to a voter without
/// tenure protection (two keys: the lock, the record), less the eviction check and the
/// tenure block, which do not run then: the record's format as that release reads it.
const REPLAY_ACQUIRE_0_1: &str = r#"local record = redis.call('get', KEYS[2])
if record and string.sub(record, 1, 5) == 'TRR1\n' then
  return {2, string.sub(record, 6)}
end
local held = redis.pcall('get', KEYS[1])
local mine, set = held == ARGV[1], false
if not held then
  redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2])
  mine, set = true, true
end
if mine then
  return {1}
end
return {0, redis.call('pttl', KEYS[1])}
"#;

/// A record stored "if free" (by a lease that may have been lost) sits at `<resource>:record`
/// in the very format of one stored under a lease, `TRR1\n` and its bytes, with a mark beside
/// it at `<resource>:record:if-free` holding `TRR1\nif-free:` and the lowercase hex SHA-1 of
/// the record's bytes (the mark names its record), for as long as the record. A
/// client of the previous release (0.1) — its replay acquire, then its decoding — reads the
/// record as it reads any record: the answer, never a second run (a rolling deploy). A record
/// stored under a lease has no mark.
#[tokio::test]
async fn golden_if_free_record_and_its_mark() {
    use tower_redlock::node::{CompleteRequest, Node};

    let server = RedisServer::start();
    let node = RedisNode::open(&server.url()).unwrap();
    let token = "00000000000000000000000000000001";
    let record = &b"late \x00\xff"[..];
    let stored = node
        .complete(
            CompleteRequest::new(
                "golden:lost",
                "golden:lost:record",
                token,
                record,
                Duration::from_secs(60),
            )
            .or_if_free(),
        )
        .await
        .unwrap();
    assert!(stored, "stored where the key is free");
    assert_eq!(
        raw(&server, "golden:lost:record").await,
        b"TRR1\nlate \x00\xff"
    );
    assert_eq!(
        raw(&server, "golden:lost:record:if-free").await,
        format!(
            "TRR1\nif-free:{}",
            "85adaeeeb0a634e1af5232772b8ef65717cd0285"
        )
        .as_bytes()
    );
    let record_ttl: i64 = server
        .query(redis::cmd("PTTL").arg("golden:lost:record"))
        .await;
    let mark_ttl: i64 = server
        .query(redis::cmd("PTTL").arg("golden:lost:record:if-free"))
        .await;
    assert!(
        record_ttl > 0 && (record_ttl - mark_ttl).abs() < 1000,
        "{record_ttl} {mark_ttl}"
    );

    // The previous release's replay acquire answers the record, and locks nothing.
    let answer: redis::Value = server
        .query(
            redis::cmd("EVAL")
                .arg(REPLAY_ACQUIRE_0_1)
                .arg(2)
                .arg("golden:lost")
                .arg("golden:lost:record")
                .arg("00000000000000000000000000000002")
                .arg(10_000),
        )
        .await;
    let redis::Value::Array(items) = answer else {
        panic!("{answer:?}");
    };
    assert_eq!(items[0], redis::Value::Int(2));
    assert_eq!(items[1], redis::Value::BulkString(record.to_vec()));
    assert!(server.get("golden:lost").await.is_none(), "locked");

    // Under a lease: no mark.
    let client = client(&server, false);
    let LockOrRecord::Locked(lease) = client
        .lock_unless_completed("golden:valid", TTL, Retry::never())
        .await
        .unwrap()
    else {
        panic!("nothing completed yet");
    };
    lease
        .complete("done", Duration::from_secs(60))
        .await
        .unwrap();
    let marks: i64 = server
        .query(redis::cmd("EXISTS").arg("golden:valid:record:if-free"))
        .await;
    assert_eq!(marks, 0);
}
