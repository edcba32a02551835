//! The hash: a `LockKey` is the prefix and 128 bits of SHA-256 over
//! length-prefixed parts, and never shows the raw key.

use super::helpers::*;
use tower_redlock::key::{IdempotencyKey, KeyExtractorExt, KeyMaterial, LockKey};

#[test]
fn known_answer_pins_the_encoding() {
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
fn parts_are_length_prefixed() {
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
fn lock_key_parts() {
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
