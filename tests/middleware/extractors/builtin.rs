//! The built-in extractors, closures, trait objects and the request view.

use std::sync::Arc;

use super::helpers::*;
use tower_redlock::key::{
    key_fn, HeaderKey, IdempotencyKey, KeyExtractor, KeyExtractorExt, KeyRejection, KeySource,
    LockKey, MethodPathKey, PathKey, RequestView, SimpleRequest,
};

// --- Idempotency-Key: rejections ---

#[test]
fn empty_values() {
    for e in [IdempotencyKey::required(), IdempotencyKey::optional()] {
        for v in ["", "   ", "\t", "\"\"", " \"\" "] {
            assert!(reject(&e, &idem(v)).is_empty(), "{v:?}");
        }
    }
}

#[test]
fn malformed_values() {
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
fn non_utf8_bytes_are_malformed() {
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
fn duplicate_header() {
    for e in [IdempotencyKey::required(), IdempotencyKey::optional()] {
        let req = idem("\"a\"").header("Idempotency-Key", "\"a\"");
        assert!(reject(&e, &req).is_duplicate());
    }
}

// --- HeaderKey, path, method ---

#[test]
fn header_keys_agree_on_one_header_and_differ_across_headers() {
    // Same header and same value: the same key (both are "this header's
    // value"); a different header name: a different key.
    let a = key(&HeaderKey::new("x-a"), &post("/").header("x-a", "v"));
    let b = key(&HeaderKey::new("x-b"), &post("/").header("x-b", "v"));
    assert_ne!(a, b);
    let idem = IdempotencyKey::required().header_name("x-a");
    assert_eq!(key(&idem, &post("/").header("x-a", "v")), a);
}

#[test]
fn path_and_method_path() {
    let put = post("/docs/1");
    let get = SimpleRequest::new("GET", "/docs/1?x=1");
    assert_eq!(key(&PathKey, &put), key(&PathKey, &get));
    assert_ne!(key(&MethodPathKey, &put), key(&MethodPathKey, &get));
    assert_ne!(key(&PathKey, &put), key(&PathKey, &post("/docs/2")));
    // Tags keep extractors apart: a path and a header with the same bytes.
    let h = key(&HeaderKey::new("x"), &post("/").header("x", "/docs/1"));
    assert_ne!(h, key(&PathKey, &put));
}

// --- closures, Arc, Box ---

#[test]
fn closure_extractors() {
    let e = key_fn(|req| match req.header("x-user") {
        Some([]) => Err(KeyRejection::empty(KeySource::header("x-user"))),
        Some(u) => Ok(Some(LockKey::from_parts([&b"user"[..], u]))),
        None => Ok(None),
    });
    let req = post("/").header("x-user", "u1");
    assert_eq!(key(&e, &req), LockKey::from_parts([&b"user"[..], b"u1"]));
    assert_eq!(extract(&e, &post("/")), Ok(None));
    assert!(reject(&e, &post("/").header("x-user", "")).is_empty());

    // Under combinators the closure's key is one part of a new hash.
    let scoped =
        key_fn(|req| Ok(req.header("x-user").map(|u| LockKey::from_parts([u])))).scoped_by_route();
    let a = key(&scoped, &req.clone().route("/a"));
    let b = key(&scoped, &req.clone().route("/b"));
    assert_ne!(a, b);
    assert_eq!(a.prefix(), LockKey::DEFAULT_PREFIX);
    // A closure's custom prefix is kept, unless replaced.
    let custom = key_fn(|_| Ok(Some(LockKey::from_parts_with_prefix("c:", ["x"]))));
    assert_eq!(key(&custom, &req).prefix(), "c:");
    let custom = key_fn(|_| Ok(Some(LockKey::from_parts_with_prefix("c:", ["x"]))));
    assert_eq!(key(&custom.scoped_by_method(), &req).prefix(), "c:");
    let custom = key_fn(|_| Ok(Some(LockKey::from_parts_with_prefix("c:", ["x"]))));
    assert_eq!(
        key(&custom.scoped_by_method().prefix("d:"), &req).prefix(),
        "d:"
    );

    // Annotated closures work without `key_fn`.
    let plain = |_: &dyn RequestView| -> Result<Option<LockKey>, KeyRejection> { Ok(None) };
    assert_eq!(extract(&plain, &req), Ok(None));
}

#[test]
fn trait_objects() {
    let boxed: Box<dyn KeyExtractor> = Box::new(IdempotencyKey::required().scoped_by_route());
    let shared: Arc<dyn KeyExtractor> = Arc::new(IdempotencyKey::required().scoped_by_route());
    let req = idem("k").route("/r");
    assert_eq!(key(&boxed, &req), key(&shared, &req));
    let scoped = shared.clone().scoped_by_method();
    assert_ne!(key(&scoped, &req), key(&shared, &req));
    let extractors: Vec<Box<dyn KeyExtractor>> = vec![Box::new(PathKey), Box::new(MethodPathKey)];
    assert_eq!(extractors.len(), 2);
}

// --- the request view ---

#[test]
fn simple_request_view() {
    let req = SimpleRequest::new("PATCH", "/x?y=z")
        .header("A", "1")
        .header("a", b"\xff")
        .param("p", "v")
        .route("/{p}");
    let view: &dyn RequestView = &req;
    assert_eq!(view.method(), "PATCH");
    assert_eq!(view.path(), "/x");
    assert_eq!(view.matched_route(), Some("/{p}"));
    assert_eq!(view.header("a"), Some(&b"1"[..]));
    assert_eq!(view.header_count("A"), 2);
    assert_eq!(view.header("b"), None);
    assert_eq!(view.header_count("b"), 0);
    assert_eq!(view.path_param("p"), Some("v"));
    assert_eq!(view.path_param("q"), None);
    let by_ref: &&SimpleRequest = &&req;
    assert_eq!(by_ref.path(), "/x");
}
