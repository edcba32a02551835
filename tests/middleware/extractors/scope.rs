//! The combinators: scoping by route, method, header or closure, and prefixes.

use super::helpers::*;
use tower_redlock::key::{
    IdempotencyKey, KeyExtractorExt, KeySource, LockKey, PathKey, SimpleRequest,
};

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
fn prefixes() {
    let req = idem("k").route("/r");
    assert!(key(&IdempotencyKey::required(), &req)
        .as_str()
        .starts_with(LockKey::DEFAULT_PREFIX));
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
