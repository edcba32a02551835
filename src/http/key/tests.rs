//! Unit tests of the key extractors, the hash and the rejections.

use super::*;

pub(super) const SECRET: &str = "SECRET-zebra-4242";

pub(super) fn post(path: &str) -> SimpleRequest {
    SimpleRequest::new("POST", path)
}

pub(super) fn idem(value: impl AsRef<[u8]>) -> SimpleRequest {
    post("/payments").header("idempotency-key", value)
}

pub(super) fn extract(
    e: &impl KeyExtractor,
    req: &SimpleRequest,
) -> Result<Option<LockKey>, KeyRejection> {
    e.extract(req)
}

pub(super) fn key(e: &impl KeyExtractor, req: &SimpleRequest) -> LockKey {
    match e.extract(req) {
        Ok(Some(key)) => key,
        other => panic!("expected a key, got {other:?}"),
    }
}

pub(super) fn reject(e: &impl KeyExtractor, req: &SimpleRequest) -> KeyRejection {
    match e.extract(req) {
        Err(rejection) => rejection,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

/// The key an `Idempotency-Key` with unescaped content `content` must get.
pub(super) fn idem_expected(content: &[u8]) -> LockKey {
    LockKey::from_parts([TAG_HEADER, b"idempotency-key", content])
}

// --- hashing ---

#[test]
pub(super) fn known_answer_pins_the_encoding() {
    // sha256(00 00 00 00 00 00 00 03 'a' 'b' 'c'), first 16 bytes.
    let k = LockKey::from_parts(["abc"]);
    assert_eq!(k.as_str(), "tower-redlock:c3494ca1a2cf8eeb8a11ded316fb55b8");
    // Empty material: sha256 of nothing.
    assert_eq!(
        KeyMaterial::new().finish().as_str(),
        "tower-redlock:e3b0c44298fc1c149afbf4c8996fb924"
    );
}

#[test]
pub(super) fn parts_are_length_prefixed() {
    assert_ne!(
        LockKey::from_parts(["ab", "c"]),
        LockKey::from_parts(["a", "bc"])
    );
    assert_ne!(
        LockKey::from_parts(["abc"]),
        LockKey::from_parts(["abc", ""])
    );
}

#[test]
pub(super) fn lock_key_parts() {
    let k = LockKey::from_parts_with_prefix("app:", ["x"]);
    assert_eq!(k.prefix(), "app:");
    assert_eq!(k.digest_hex().len(), 32);
    assert!(k
        .digest_hex()
        .bytes()
        .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')));
    assert_eq!(k.as_str(), format!("app:{}", k.digest_hex()));
    assert_eq!(k.to_string(), k.as_str());
    assert_eq!(String::from(k.clone()), k.clone().into_string());
    let empty_prefix = LockKey::from_parts_with_prefix("", ["x"]);
    assert_eq!(empty_prefix.prefix(), "");
    assert_eq!(empty_prefix.as_str(), k.digest_hex());
}

// --- Idempotency-Key: accepted forms ---

#[test]
pub(super) fn quoted_and_bare_forms_are_the_same_key() {
    let e = IdempotencyKey::required();
    let quoted = key(&e, &idem("\"order-123\""));
    let bare = key(&e, &idem("order-123"));
    assert_eq!(quoted, bare);
    assert_eq!(quoted, idem_expected(b"order-123"));
}

#[test]
pub(super) fn bare_tokens_people_use() {
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
pub(super) fn ows_is_trimmed() {
    let e = IdempotencyKey::required();
    assert_eq!(key(&e, &idem(" \t\"abc\"\t ")), idem_expected(b"abc"));
    assert_eq!(key(&e, &idem("  abc  ")), idem_expected(b"abc"));
}

#[test]
pub(super) fn quoted_keys_may_hold_printable_ascii() {
    let e = IdempotencyKey::required();
    assert_eq!(key(&e, &idem("\"a b, c;d\"")), idem_expected(b"a b, c;d"));
    assert_eq!(key(&e, &idem("\" \"")), idem_expected(b" "));
}

#[test]
pub(super) fn escapes_are_unescaped() {
    let e = IdempotencyKey::required();
    assert_eq!(key(&e, &idem(r#""a\"b""#)), idem_expected(br#"a"b"#));
    assert_eq!(key(&e, &idem(r#""a\\b""#)), idem_expected(br"a\b"));
    assert_eq!(key(&e, &idem(r#""\\\"""#)), idem_expected(br#"\""#));
    assert_eq!(key(&e, &idem(r#""x\\""#)), idem_expected(br"x\"));
    assert_eq!(key(&e, &idem(r#""\"""#)), idem_expected(br#"""#));
}

#[test]
pub(super) fn other_header_name() {
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
pub(super) fn missing_required_and_optional() {
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
pub(super) fn empty_values() {
    for e in [IdempotencyKey::required(), IdempotencyKey::optional()] {
        for v in ["", "   ", "\t", "\"\"", " \"\" "] {
            assert!(reject(&e, &idem(v)).is_empty(), "{v:?}");
        }
    }
}

#[test]
pub(super) fn malformed_values() {
    let e = IdempotencyKey::required();
    for v in [
        "a b",
        "a,b",
        "\"a\", \"b\"",
        "a\"b",
        "\"abc",
        "\"abc\\\"",
        "\"abc\" x",
        "\"abc\"\"",
        r#""a\nb""#,
        r#""a\b""#,
        "\"a\tb\"",
        "\"a\x7fb\"",
        "\"\\",
        "\"",
        "a;b",
        "a@b",
        "(a)",
        "a\x01",
        "caf\u{e9}",
        "\"caf\u{e9}\"",
    ] {
        let r = reject(&e, &idem(v));
        assert!(r.is_malformed(), "{v:?} gave {r:?}");
        assert_eq!(r.status(), 400);
    }
}

#[test]
pub(super) fn non_utf8_bytes_are_malformed() {
    let e = IdempotencyKey::required();
    for v in [
        &b"\xff\xfe"[..],
        b"\"\xc3\x28\"",
        b"abc\x80",
        b"\"abc\xff\"",
        b"\x00",
    ] {
        assert!(reject(&e, &idem(v)).is_malformed(), "{v:?}");
    }
}

#[test]
pub(super) fn length_bound_is_255_after_unquoting() {
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
pub(super) fn custom_max_len() {
    let e = IdempotencyKey::required().max_len(4);
    assert!(key(&e, &idem("abcd")) == idem_expected(b"abcd"));
    assert!(reject(&e, &idem("abcde")).is_too_long());
    assert!(reject(&e, &idem("\"abcde\"")).is_too_long());
    let r = reject(&e, &idem("abcde"));
    assert!(r.detail().contains("4 bytes"), "{}", r.detail());
    let zero = IdempotencyKey::required().max_len(0);
    assert!(reject(&zero, &idem("a")).is_too_long());
}

#[test]
pub(super) fn duplicate_header() {
    for e in [IdempotencyKey::required(), IdempotencyKey::optional()] {
        let req = idem("\"a\"").header("Idempotency-Key", "\"a\"");
        assert!(reject(&e, &req).is_duplicate());
    }
}

// --- HeaderKey ---

#[test]
pub(super) fn header_key() {
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
pub(super) fn header_keys_agree_on_one_header_and_differ_across_headers() {
    // Same header and same value: the same key (both are "this header's
    // value"); a different header name: a different key.
    let a = key(&HeaderKey::new("x-a"), &post("/").header("x-a", "v"));
    let b = key(&HeaderKey::new("x-b"), &post("/").header("x-b", "v"));
    assert_ne!(a, b);
    let idem = IdempotencyKey::required().header_name("x-a");
    assert_eq!(key(&idem, &post("/").header("x-a", "v")), a);
}

// --- path, method, route param ---

#[test]
pub(super) fn path_and_method_path() {
    let put = post("/docs/1");
    let get = SimpleRequest::new("GET", "/docs/1?x=1");
    assert_eq!(key(&PathKey, &put), key(&PathKey, &get));
    assert_ne!(key(&MethodPathKey, &put), key(&MethodPathKey, &get));
    assert_ne!(key(&PathKey, &put), key(&PathKey, &post("/docs/2")));
    // Tags keep extractors apart: a path and a header with the same bytes.
    let h = key(&HeaderKey::new("x"), &post("/").header("x", "/docs/1"));
    assert_ne!(h, key(&PathKey, &put));
}

#[test]
pub(super) fn route_param() {
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
