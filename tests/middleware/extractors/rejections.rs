//! What a rejection says: its texts, and never the raw key.

use super::helpers::*;
use tower_redlock::key::{IdempotencyKey, KeyRejection, KeyRejectionKind, KeySource};

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
