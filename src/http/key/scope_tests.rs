//! Unit tests of the combinators, prefixes, closures and the request view.

use super::tests::*;
use super::*;

#[test]
fn scoped_by_route() {
    let e = IdempotencyKey::required().scoped_by_route();
    let on = |path: &str, route: &str| post(path).route(route).header("idempotency-key", "\"k\"");
    let pay = key(&e, &on("/payments/1", "/payments/{id}"));
    assert_eq!(pay, key(&e, &on("/payments/2", "/payments/{id}")));
    assert_eq!(pay, key(&e, &on("/payments/1", "/payments/{id}")));
    assert_ne!(pay, key(&e, &on("/refunds/1", "/refunds/{id}")));
    assert_ne!(
        pay,
        key(
            &IdempotencyKey::required(),
            &on("/payments/1", "/payments/{id}")
        )
    );
    // No route known: the path scopes.
    let by_path = |path: &str| post(path).header("idempotency-key", "\"k\"");
    assert_ne!(key(&e, &by_path("/a")), key(&e, &by_path("/b")));
    assert_eq!(key(&e, &by_path("/a")), key(&e, &on("/x", "/a")));
    // Rejections and pass-through come from the inner extractor.
    assert!(reject(&e, &post("/payments")).is_missing());
    let opt = IdempotencyKey::optional().scoped_by_route();
    assert_eq!(extract(&opt, &post("/payments")), Ok(None));
}

#[test]
fn scoped_by_method() {
    let e = IdempotencyKey::required().scoped_by_method();
    let put = SimpleRequest::new("PUT", "/").header("idempotency-key", "k");
    let del = SimpleRequest::new("DELETE", "/").header("idempotency-key", "k");
    assert_ne!(key(&e, &put), key(&e, &del));
    assert_eq!(key(&e, &put), key(&e, &put.clone()));
}

#[test]
fn scoped_by_header() {
    let e = IdempotencyKey::required().scoped_by_header("X-Tenant-Id");
    let t = |tenant: &str| idem("\"k\"").header("x-tenant-id", tenant);
    assert_ne!(key(&e, &t("acme")), key(&e, &t("globex")));
    assert_eq!(key(&e, &t("acme")), key(&e, &t(" acme")));
    let r = reject(&e, &idem("\"k\""));
    assert!(r.is_missing());
    assert_eq!(r.source_of_key(), &KeySource::header("x-tenant-id"));
    assert!(reject(&e, &t("acme").header("x-tenant-id", "acme")).is_duplicate());
    assert!(reject(&e, &t("")).is_empty());
    // The key's own rejection comes first.
    assert!(reject(&e, &post("/").header("x-tenant-id", "acme")).is_missing());
    // No key: the tenant header is not needed.
    let opt = IdempotencyKey::optional().scoped_by_header("x-tenant-id");
    assert_eq!(extract(&opt, &post("/")), Ok(None));
}

#[test]
fn scoped_by_closure() {
    let e = PathKey.scoped_by(|req| req.header("x-v").map(<[u8]>::to_vec));
    let none = key(&e, &post("/a"));
    let empty = key(&e, &post("/a").header("x-v", ""));
    let v1 = key(&e, &post("/a").header("x-v", "1"));
    assert_ne!(none, empty);
    assert_ne!(empty, v1);
    assert_ne!(none, key(&PathKey, &post("/a")));
    assert_eq!(v1, key(&e, &post("/a").header("x-v", "1")));
    // Two optional scopes cannot collide by shifting values.
    let two = PathKey
        .scoped_by(|req| req.header("x-a").map(<[u8]>::to_vec))
        .scoped_by(|req| req.header("x-b").map(<[u8]>::to_vec));
    let only_a = key(&two, &post("/").header("x-a", "scope:fn"));
    let only_b = key(&two, &post("/").header("x-b", "scope:fn"));
    assert_ne!(only_a, only_b);
}

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

#[test]
fn prefixes() {
    let req = idem("k").route("/r");
    assert!(key(&IdempotencyKey::required(), &req)
        .as_str()
        .starts_with(DEFAULT_KEY_PREFIX));
    let p = key(&IdempotencyKey::required().prefix("myapp:"), &req);
    assert_eq!(p.prefix(), "myapp:");
    assert_eq!(
        p.digest_hex(),
        key(&IdempotencyKey::required(), &req).digest_hex()
    );
    // Outermost wins; the prefix survives later scoping.
    let outer = IdempotencyKey::required().prefix("a:").prefix("b:");
    assert_eq!(key(&outer, &req).prefix(), "b:");
    let inner = IdempotencyKey::required().prefix("a:").scoped_by_route();
    assert_eq!(key(&inner, &req).prefix(), "a:");
    // `None` keeps no prefix state around.
    assert_eq!(
        extract(&IdempotencyKey::optional().prefix("a:"), &post("/")),
        Ok(None)
    );
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
    assert_eq!(a.prefix(), DEFAULT_KEY_PREFIX);
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

// --- nothing leaks the raw key ---

#[test]
fn lock_key_never_shows_the_raw_key() {
    let e = IdempotencyKey::required().scoped_by_route();
    let k = key(&e, &idem(format!("\"{SECRET}\"")));
    for shown in [
        format!("{k}"),
        format!("{k:?}"),
        format!("{k:#?}"),
        k.as_str().to_owned(),
    ] {
        assert!(!shown.contains(SECRET), "{shown}");
        assert!(!shown.contains("zebra"), "{shown}");
    }
    let mut material = KeyMaterial::new();
    material.push(SECRET);
    assert!(!format!("{material:?}").contains("zebra"));
    let req = idem(SECRET).param("id", SECRET);
    assert!(!format!("{req:?}").contains("zebra"), "{req:?}");
}

#[test]
fn rejections_never_show_the_raw_key() {
    let e = IdempotencyKey::required().max_len(30);
    let cases = [
        idem(format!("\"{SECRET}")),                    // unterminated
        idem(format!("{SECRET} x")),                    // space
        idem(format!("\"{SECRET}\\n\"")),               // bad escape
        idem(format!("\"{SECRET}\" trailing")),         // trailing garbage
        idem(format!("{SECRET}{SECRET}")),              // too long
        idem(SECRET).header("idempotency-key", SECRET), // duplicate
    ];
    let mut kinds = Vec::new();
    for req in &cases {
        let r = reject(&e, req);
        kinds.push(r.kind());
        for shown in [
            r.to_string(),
            format!("{r:?}"),
            format!("{r:#?}"),
            r.detail(),
            r.title().to_owned(),
            r.code().to_owned(),
        ] {
            assert!(!shown.contains("zebra"), "{shown}");
        }
        assert_eq!(r.status(), 400);
    }
    assert!(kinds
        .iter()
        .any(|k| matches!(k, KeyRejectionKind::TooLong { .. })));
    assert!(kinds
        .iter()
        .any(|k| matches!(k, KeyRejectionKind::Duplicate)));
    assert!(kinds
        .iter()
        .any(|k| matches!(k, KeyRejectionKind::Malformed { .. })));
}

#[test]
fn rejection_texts() {
    let h = || KeySource::header("idempotency-key");
    let all = [
        KeyRejection::missing(h()),
        KeyRejection::empty(h()),
        KeyRejection::too_long(h(), 255),
        KeyRejection::malformed(h(), "the quoted key has no closing quote"),
        KeyRejection::duplicate(h()),
        KeyRejection::missing(KeySource::route_param("id")),
        KeyRejection::missing(KeySource::other("`session` cookie")),
    ];
    let mut titles = std::collections::HashSet::new();
    for r in &all {
        assert_eq!(r.status(), 400);
        assert!(!r.title().is_empty());
        assert!(r.code().starts_with("key-"));
        assert!(r.detail().ends_with('.'), "{}", r.detail());
        assert_eq!(r.detail(), r.to_string());
        titles.insert(r.title());
        let _: &dyn std::error::Error = r;
    }
    assert_eq!(titles.len(), 5);
    assert_eq!(
        all[0].detail(),
        "The request has no `idempotency-key` header, which this endpoint requires."
    );
    assert_eq!(
        all[2].detail(),
        "The `idempotency-key` header is longer than 255 bytes."
    );
    assert_eq!(
        all[3].detail(),
        "The `idempotency-key` header is malformed: the quoted key has no closing quote."
    );
    assert_eq!(
        all[6].detail(),
        "The request has no `session` cookie, which this endpoint requires."
    );
    assert!(all[1].is_empty() && all[4].is_duplicate() && all[2].is_too_long());
}

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
