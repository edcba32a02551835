use super::*;

fn bulk(s: &str) -> Value {
    Value::BulkString(s.as_bytes().to_vec())
}

#[test]
fn hashes_match_sources() {
    for s in [
        &SET,
        &HSET,
        &XADD,
        &FENCE,
        &READ_FOR_WRITE,
        &RAISE_FOR_WRITE,
    ] {
        assert_eq!(
            redis::Script::new(s.source).get_hash(),
            s.sha1,
            "{}",
            s.source
        );
    }
}

#[test]
fn fenced_replies_parse_into_outcomes() {
    let written = Value::Array(vec![Value::Int(1)]);
    assert_eq!(outcome(7, written).unwrap(), Ok(None));
    let appended = Value::Array(vec![Value::Int(1), bulk("1-0")]);
    assert_eq!(outcome(7, appended).unwrap(), Ok(Some(bulk("1-0"))));
    let stale = Value::Array(vec![Value::Int(0), bulk("18446744073709551615")]);
    assert_eq!(
        outcome(7, stale).unwrap(),
        Err(StaleToken::new(7, u64::MAX))
    );
}

#[test]
fn fenced_odd_replies_are_errors_not_panics() {
    let odd = [
        Value::Nil,
        Value::Int(1),
        Value::Okay,
        Value::Array(vec![]),
        Value::Array(vec![Value::Int(2)]),
        Value::Array(vec![Value::Int(0)]),
        Value::Array(vec![Value::Int(1), bulk("a"), bulk("b")]),
        Value::Array(vec![Value::Int(0), bulk("")]),
        Value::Array(vec![Value::Int(0), bulk("-1")]),
        Value::Array(vec![Value::Int(0), bulk("+5")]),
        Value::Array(vec![Value::Int(0), bulk("18446744073709551616")]),
        Value::Array(vec![Value::Int(0), Value::Int(5)]),
        Value::Array(vec![Value::Int(0), Value::BulkString(vec![0xff])]),
    ];
    for v in odd {
        let e = outcome(1, v.clone()).expect_err(&format!("{v:?}"));
        assert_eq!(e.kind(), ErrorKind::UnexpectedReturnType, "{v:?}");
    }
    assert!(decimal(&Value::Nil).is_err());
    assert_eq!(decimal(&bulk("0")).unwrap(), 0);
    assert!(string(Value::Int(3)).is_err());
    assert!(string(Value::BulkString(vec![0xff])).is_err());
    assert_eq!(string(bulk("1-0")).unwrap(), "1-0");
}

/// A handler's future must be `Send` (axum, `tokio::spawn`): so are the writes' over the
/// usual connections. Compiled, never run.
#[allow(dead_code)]
fn futures_are_send(mut s: FencedRedis<redis::aio::ConnectionManager>) {
    fn send<T: Send>(_: &T) {}
    send(&s);
    send(&s.set("k", "v", 1));
    send(&s.hset("k", "f", b"v".to_vec(), 1));
    send(&s.xadd("k", &[("f", "v")], 1));
    send(&s.fence("k"));
    send(&s.read_for_write("k", 1));
    send(&s.raise_for_write("k", 1));
}

#[test]
fn fenced_token_key_has_its_own_suffix() {
    // Not the lock's counter (`<resource>:fence`), and in the slot of a hash-tagged key.
    assert_eq!(token_key("{order:1}"), "{order:1}:fenced-token");
    assert!(!token_key("a").ends_with(":fence"));
}
