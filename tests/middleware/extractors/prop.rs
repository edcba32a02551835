//! Property tests: no input panics an extractor; the two header forms agree.

use proptest::prelude::*;
use tower_redlock::key::{
    HeaderKey, IdempotencyKey, KeyExtractor, KeyExtractorExt, PathKey, RouteParamKey, SimpleRequest,
};

fn check_extractor(e: &dyn KeyExtractor, req: &SimpleRequest) -> Result<(), TestCaseError> {
    match e.extract(req) {
        Ok(Some(k)) => {
            prop_assert_eq!(k.digest_hex().len(), 32);
            prop_assert_eq!(k.as_str().len(), k.prefix().len() + 32);
        }
        Ok(None) => {}
        Err(r) => {
            prop_assert_eq!(r.status(), 400);
            prop_assert!(!r.detail().is_empty());
        }
    }
    Ok(())
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

proptest! {
    #[test]
    fn arbitrary_header_bytes_never_panic(
        value in proptest::collection::vec(any::<u8>(), 0..600),
        second in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..8)),
    ) {
        let mut req = SimpleRequest::new("POST", "/p")
            .header("idempotency-key", &value)
            .header("x-tenant-id", &value)
            .param("id", String::from_utf8_lossy(&value));
        if let Some(second) = second {
            req = req.header("idempotency-key", second);
        }
        let extractors: [Box<dyn KeyExtractor>; 6] = [
            Box::new(IdempotencyKey::required()),
            Box::new(IdempotencyKey::optional().max_len(8)),
            Box::new(HeaderKey::new("x-tenant-id")),
            Box::new(RouteParamKey::new("id")),
            Box::new(PathKey.scoped_by_header("x-tenant-id")),
            Box::new(IdempotencyKey::required().scoped_by_route().scoped_by_header("x-tenant-id")),
        ];
        for e in &extractors {
            check_extractor(e.as_ref(), &req)?;
        }
    }

    #[test]
    fn bare_and_quoted_tokens_agree(s in "[A-Za-z0-9:/=+_.~-]{1,255}") {
        let e = IdempotencyKey::required();
        let bare = e.extract(&SimpleRequest::new("POST", "/").header("idempotency-key", &s));
        let quoted = e.extract(&SimpleRequest::new("POST", "/").header("idempotency-key", format!("\"{s}\"")));
        prop_assert!(matches!(bare, Ok(Some(_))));
        prop_assert_eq!(bare, quoted);
    }

    #[test]
    fn keys_are_deterministic(
        key in "[ -~]{1,64}",
        route in "/[a-z{}/]{0,20}",
        tenant in "[a-z0-9]{1,16}",
    ) {
        let e = IdempotencyKey::required().scoped_by_route().scoped_by_header("x-tenant-id");
        let req = || SimpleRequest::new("POST", "/x")
            .route(route.clone())
            .header("x-tenant-id", &tenant)
            .header("idempotency-key", sf_string(&key));
        let a = e.extract(&req());
        prop_assert!(matches!(a, Ok(Some(_))));
        prop_assert_eq!(a, e.extract(&req()));
    }
}
