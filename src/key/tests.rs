//! Unit tests that pin the exact parts an extractor hashes (the private domain
//! tags `TAG_*`) or read a crate-private field. Everything that the public API
//! can express lives in the `middleware` integration test (`tests/middleware/extractors/`).

use super::*;
use proptest::prelude::*;

fn post(path: &str) -> SimpleRequest {
    SimpleRequest::new("POST", path)
}

fn idem(value: impl AsRef<[u8]>) -> SimpleRequest {
    post("/payments").header("idempotency-key", value)
}

fn extract(e: &impl KeyExtractor, req: &SimpleRequest) -> Result<Option<LockKey>, KeyRejection> {
    e.extract(req)
}

fn key(e: &impl KeyExtractor, req: &SimpleRequest) -> LockKey {
    match e.extract(req) {
        Ok(Some(key)) => key,
        other => panic!("expected a key, got {other:?}"),
    }
}

fn reject(e: &impl KeyExtractor, req: &SimpleRequest) -> KeyRejection {
    match e.extract(req) {
        Err(rejection) => rejection,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

/// The key an `Idempotency-Key` with unescaped content `content` must get.
fn idem_expected(content: &[u8]) -> LockKey {
    LockKey::from_parts([TAG_HEADER, b"idempotency-key", content])
}

/// Escapes `s` into an RFC 8941 string.
fn sf_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
    out
}

// --- Idempotency-Key: accepted forms ---

#[test]
fn quoted_and_bare_forms_are_the_same_key() {
    let e = IdempotencyKey::required();
    let quoted = key(&e, &idem("\"order-123\""));
    let bare = key(&e, &idem("order-123"));
    assert_eq!(quoted, bare);
    assert_eq!(quoted, idem_expected(b"order-123"));
}

#[test]
fn bare_tokens_people_use() {
    let e = IdempotencyKey::required();
    for token in [
        "8e03978e-40d5-43e8-bc93-6894a57f9324",
        "01ARZ3NDEKTSV4RRFFQ69G5FAV",
        "dGhpcyBpcyBhIGtleQ",
        "dGhpcyBpcyBhIGtleQ==",
        "a+b/c=",
        "urn:uuid:8e03978e",
        "order-123",
        "!#$%&'*+-.^_`|~:/",
    ] {
        assert_eq!(
            key(&e, &idem(token)),
            idem_expected(token.as_bytes()),
            "{token}"
        );
    }
}

#[test]
fn ows_is_trimmed() {
    let e = IdempotencyKey::required();
    assert_eq!(key(&e, &idem(" \t\"abc\"\t ")), idem_expected(b"abc"));
    assert_eq!(key(&e, &idem("  abc  ")), idem_expected(b"abc"));
}

#[test]
fn quoted_keys_may_hold_printable_ascii() {
    let e = IdempotencyKey::required();
    assert_eq!(key(&e, &idem("\"a b, c;d\"")), idem_expected(b"a b, c;d"));
    assert_eq!(key(&e, &idem("\" \"")), idem_expected(b" "));
}

#[test]
fn escapes_are_unescaped() {
    let e = IdempotencyKey::required();
    assert_eq!(key(&e, &idem(r#""a\"b""#)), idem_expected(br#"a"b"#));
    assert_eq!(key(&e, &idem(r#""a\\b""#)), idem_expected(br"a\b"));
    assert_eq!(key(&e, &idem(r#""\\\"""#)), idem_expected(br#"\""#));
    assert_eq!(key(&e, &idem(r#""x\\""#)), idem_expected(br"x\"));
    assert_eq!(key(&e, &idem(r#""\"""#)), idem_expected(br#"""#));
}

#[test]
fn other_header_name() {
    let e = IdempotencyKey::required().header_name("X-Request-Id");
    let req = post("/").header("x-request-id", "\"abc\"");
    assert_eq!(
        key(&e, &req),
        LockKey::from_parts([TAG_HEADER, b"x-request-id", b"abc"])
    );
    // Idempotency-Key is not read any more.
    assert!(reject(&e, &idem("abc")).is_missing());
    let r = reject(&e, &post("/"));
    assert_eq!(r.source_of_key(), &KeySource::header("x-request-id"));
}

// --- Idempotency-Key: rejections ---

#[test]
fn missing_required_and_optional() {
    let r = reject(&IdempotencyKey::required(), &post("/payments"));
    assert!(r.is_missing());
    assert_eq!(r.kind(), KeyRejectionKind::Missing);
    assert_eq!(r.status(), 400);
    assert!(
        r.detail().contains("`idempotency-key` header"),
        "{}",
        r.detail()
    );
    assert_eq!(
        extract(&IdempotencyKey::optional(), &post("/payments")),
        Ok(None)
    );
    assert!(IdempotencyKey::default().required);
}

#[test]
fn length_bound_is_255_after_unquoting() {
    let e = IdempotencyKey::required();
    let ok = "k".repeat(255);
    let long = "k".repeat(256);
    assert!(key(&e, &idem(&ok)) == idem_expected(ok.as_bytes()));
    assert!(key(&e, &idem(format!("\"{ok}\""))) == idem_expected(ok.as_bytes()));
    let r = reject(&e, &idem(&long));
    assert_eq!(r.kind(), KeyRejectionKind::TooLong { max: 255 });
    assert!(reject(&e, &idem(format!("\"{long}\""))).is_too_long());
    // Escapes count once: 253 + `\"` + `\\` is 257 raw bytes, 255 unescaped.
    let escaped = format!("\"{}\\\"\\\\\"", "k".repeat(253));
    assert_eq!(
        key(&e, &idem(&escaped)),
        idem_expected(format!("{}\"\\", "k".repeat(253)).as_bytes())
    );
    let escaped_long = format!("\"{}\\\"\\\\\"", "k".repeat(254));
    assert!(reject(&e, &idem(escaped_long)).is_too_long());
}

#[test]
fn custom_max_len() {
    let e = IdempotencyKey::required().max_len(4);
    assert!(key(&e, &idem("abcd")) == idem_expected(b"abcd"));
    assert!(reject(&e, &idem("abcde")).is_too_long());
    assert!(reject(&e, &idem("\"abcde\"")).is_too_long());
    let r = reject(&e, &idem("abcde"));
    assert!(r.detail().contains("4 bytes"), "{}", r.detail());
    let zero = IdempotencyKey::required().max_len(0);
    assert!(reject(&zero, &idem("a")).is_too_long());
}

// --- HeaderKey, route param ---

#[test]
fn header_key() {
    let e = HeaderKey::new("X-Tenant-Id");
    let req = post("/").header("x-tenant-id", "  acme corp ");
    assert_eq!(
        key(&e, &req),
        LockKey::from_parts([TAG_HEADER, b"x-tenant-id", b"acme corp"])
    );
    // Quotes are part of a raw value.
    let quoted = post("/").header("x-tenant-id", "\"acme corp\"");
    assert_ne!(key(&e, &quoted), key(&e, &req));

    assert!(reject(&e, &post("/")).is_missing());
    assert_eq!(extract(&e.clone().optional(), &post("/")), Ok(None));
    assert!(reject(&e.clone().optional().required(), &post("/")).is_missing());
    assert!(reject(&e, &post("/").header("x-tenant-id", " ")).is_empty());
    assert!(reject(&e, &post("/").header("x-tenant-id", b"a\xffb")).is_malformed());
    assert!(reject(&e, &post("/").header("x-tenant-id", "a\x01")).is_malformed());
    let dup = post("/")
        .header("x-tenant-id", "a")
        .header("X-TENANT-ID", "b");
    assert!(reject(&e, &dup).is_duplicate());
    assert!(
        key(&e, &post("/").header("x-tenant-id", "t".repeat(255)))
            .digest_hex()
            .len()
            == 32
    );
    assert!(reject(&e, &post("/").header("x-tenant-id", "t".repeat(256))).is_too_long());
    assert!(reject(&e.max_len(2), &post("/").header("x-tenant-id", "abc")).is_too_long());
}

#[test]
fn route_param() {
    let e = RouteParamKey::new("id");
    let req = post("/a/7").route("/a/{id}").param("id", "7");
    assert_eq!(
        key(&e, &req),
        LockKey::from_parts([TAG_ROUTE_PARAM, b"id", b"7"])
    );
    let r = reject(&e, &post("/health"));
    assert!(r.is_missing());
    assert_eq!(r.source_of_key(), &KeySource::route_param("id"));
    assert!(
        r.detail().contains("route parameter `id`"),
        "{}",
        r.detail()
    );
    assert!(reject(&e, &post("/a/").param("id", "")).is_empty());
    assert!(
        key(&e, &post("/").param("id", "i".repeat(255)))
            .digest_hex()
            .len()
            == 32
    );
    assert!(reject(&e, &post("/").param("id", "i".repeat(256))).is_too_long());
    assert!(reject(&e.max_len(1), &post("/").param("id", "12")).is_too_long());
}

// --- combinators ---

#[test]
fn scoping_order_is_deterministic() {
    let req = idem("k").route("/r").header("x-t", "t");
    let a = IdempotencyKey::required()
        .scoped_by_route()
        .scoped_by_header("x-t");
    let b = IdempotencyKey::required()
        .scoped_by_route()
        .scoped_by_header("x-t");
    assert_eq!(key(&a, &req), key(&b, &req));
    // Expected bytes, to pin that scope goes into the same single hash.
    let expected = LockKey::from_parts([
        TAG_HEADER,
        b"idempotency-key",
        b"k",
        TAG_SCOPE_ROUTE,
        b"/r",
        TAG_SCOPE_HEADER,
        b"x-t",
        b"t",
    ]);
    assert_eq!(key(&a, &req), expected);
}

proptest! {
    #[test]
    fn quoted_printable_ascii_round_trips(s in "[ -~]{1,255}") {
        let req = SimpleRequest::new("POST", "/").header("idempotency-key", sf_string(&s));
        let k = IdempotencyKey::required().extract(&req);
        prop_assert_eq!(
            k,
            Ok(Some(LockKey::from_parts([TAG_HEADER, b"idempotency-key", s.as_bytes()])))
        );
    }
}
