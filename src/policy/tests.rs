use super::*;
use crate::key::{IdempotencyKey, SimpleRequest};

fn policy(b: impl FnOnce(LockPolicyBuilder) -> LockPolicyBuilder) -> crate::Result<LockPolicy> {
    b(LockPolicy::builder(
        Redlock::in_memory(),
        IdempotencyKey::required(),
    ))
    .build()
}

#[test]
fn only_unsafe_methods_are_locked_by_default() {
    let p = policy(|b| b).unwrap();
    for m in DEFAULT_LOCKED_METHODS {
        assert!(p.locks_method(m), "{m}");
        // A keyless request of a locked method is a 400.
        assert!(p.key(&SimpleRequest::new(m, "/x")).is_err(), "{m}");
    }
    for m in ["GET", "HEAD", "OPTIONS", "TRACE", "post"] {
        assert!(!p.locks_method(m), "{m}");
        // Passes through: no key read, no 400.
        assert!(
            matches!(p.key(&SimpleRequest::new(m, "/x")), Ok(None)),
            "{m}"
        );
    }
    let keyed = SimpleRequest::new("GET", "/x").header("idempotency-key", "\"k\"");
    assert!(matches!(p.key(&keyed), Ok(None)));
}

#[test]
fn replay_refuses_fail_open() {
    let e = policy(|b| {
        b.replay(Replay::new())
            .on_unavailable(OnUnavailable::FailOpen)
    })
    .unwrap_err();
    assert!(
        e.is_invalid_input() && e.to_string().contains("fail_open"),
        "{e}"
    );
    assert!(policy(|b| b.replay(Replay::new()))
        .unwrap()
        .replay()
        .is_some());
    assert!(policy(|b| b.on_unavailable(OnUnavailable::FailOpen)).is_ok());
}

#[test]
fn repeatable_after_loss_needs_replay_and_a_rule_that_may_abort() {
    use crate::policy::OnLost;
    let ok = policy(|b| {
        b.replay(Replay::new())
            .on_lost(OnLost::Abort)
            .repeatable_after_loss(true)
    });
    assert!(ok.unwrap().repeatable_after_loss());
    let hook = policy(|b| {
        b.replay(Replay::new())
            .on_lost(crate::policy::LostRule::decide(|_| OnLost::Abort))
            .repeatable_after_loss(true)
    });
    assert!(hook.is_ok());
    for b in [
        policy(|b| b.on_lost(OnLost::Abort).repeatable_after_loss(true)),
        policy(|b| b.replay(Replay::new()).repeatable_after_loss(true)),
    ] {
        let e = b.unwrap_err();
        assert!(
            e.is_invalid_input() && e.to_string().contains("repeatable_after_loss"),
            "{e}"
        );
    }
}

#[test]
fn the_method_filter_is_configurable_and_checked() {
    let p = policy(|b| b.methods(["post", "PUT"])).unwrap();
    assert!(p.locks_method("POST") && p.locks_method("PUT"));
    assert!(!p.locks_method("DELETE"));
    let p = policy(|b| b.any_method()).unwrap();
    assert!(p.locks_method("GET") && p.locks_method("BREW"));
    assert!(p.key(&SimpleRequest::new("GET", "/x")).is_err());

    let empty = policy(|b| b.methods(Vec::<String>::new())).unwrap_err();
    assert!(empty.is_invalid_input(), "{empty}");
    let bad = policy(|b| b.methods(["PO ST"])).unwrap_err();
    assert!(bad.to_string().contains("not an HTTP method"), "{bad}");
}

#[test]
fn the_fencing_header_needs_a_fencing_client_and_a_name() {
    let fenced = || {
        Redlock::builder()
            .node(crate::node::MemoryNode::new())
            .fencing(true)
            .build()
            .unwrap()
    };
    let build = |redlock: Redlock, b: fn(LockPolicyBuilder) -> LockPolicyBuilder| {
        b(LockPolicy::builder(redlock, IdempotencyKey::required())).build()
    };
    let p = build(fenced(), |b| b.fencing_header("X-Fencing-Token")).unwrap();
    assert_eq!(p.fencing_header(), Some("x-fencing-token"));
    assert_eq!(build(fenced(), |b| b).unwrap().fencing_header(), None);

    let unfenced = build(Redlock::in_memory(), |b| b.fencing_header("fencing-token"));
    let e = unfenced.unwrap_err();
    assert!(
        e.is_invalid_input() && e.to_string().contains("fencing(true)"),
        "{e}"
    );
    let bad = build(fenced(), |b| b.fencing_header("fencing token")).unwrap_err();
    assert!(bad.to_string().contains("not a header name"), "{bad}");
    let empty = build(fenced(), |b| b.fencing_header("")).unwrap_err();
    assert!(empty.is_invalid_input(), "{empty}");
    let replay = build(fenced(), |b| b.fencing_header("f").replay(Replay::new()));
    assert!(replay.unwrap().replay().is_some());
}

/// A wait must be bounded in time: a `Retry` without a `max_wait` (a count alone could wait
/// behind a holder that keeps extending for as long as the count allows), one that never
/// retries, and a zero delay are refused; `OnContention::wait` and a bounded `Retry` pass.
#[test]
fn a_wait_must_retry_within_a_time_bound() {
    use crate::policy::OnContention;
    use crate::Retry;
    use std::time::Duration;
    let second = Duration::from_secs(1);
    for refused in [
        Retry::times(5),
        Retry::never().max_wait(second),
        Retry::until(Duration::ZERO),
        Retry::until(second).delay(Duration::ZERO),
    ] {
        let e = policy(|b| b.on_contention(OnContention::Wait(refused))).unwrap_err();
        assert!(e.is_invalid_input(), "{refused:?}: {e}");
    }
    for ok in [
        OnContention::wait(second),
        OnContention::Wait(Retry::times(5).max_wait(second)),
    ] {
        assert!(policy(|b| b.on_contention(ok)).is_ok(), "{ok:?}");
    }
}
