//! Bad input: bad resources, ttls and configurations are rejected as invalid input, lock
//! nothing and leak no password.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tower_redlock::Redlock;

use crate::support::Masters;
use crate::TTL;

#[tokio::test]
async fn bad_input_is_rejected_and_locks_nothing() {
    let m = Masters::start(1);
    let c = m.client();
    let invalid = |r: Result<Redlock, tower_redlock::Error>| {
        let e = r.unwrap_err();
        assert!(e.is_invalid_input(), "{e:?}");
        assert!(!e.to_string().is_empty());
    };

    for (resource, ttl) in [
        ("", TTL),
        ("x", Duration::ZERO),
        ("x", Duration::from_millis(1)),
        ("x", Duration::from_millis(2)),
    ] {
        let e = c.try_lock(resource, ttl).await.unwrap_err();
        assert!(e.is_invalid_input(), "{resource:?} {ttl:?}: {e:?}");
        assert!(!e.is_contended() && !e.is_unavailable());
        let e = c.lock(resource, ttl).await.unwrap_err();
        assert!(e.is_invalid_input(), "{e:?}");
        assert_eq!(e.attempts(), 0, "nothing was tried");
    }
    let long = "x".repeat(tower_redlock::Redlock::MAX_RESOURCE_LEN + 1);
    assert!(c.try_lock(&long, TTL).await.unwrap_err().is_invalid_input());
    let ran = AtomicBool::new(false);
    let e = c
        .critical_section("", TTL)
        .run(|_| async { ran.store(true, Ordering::SeqCst) })
        .await
        .unwrap_err();
    assert!(e.is_invalid_input());
    assert!(!ran.load(Ordering::SeqCst));

    // A bad ttl for an extension leaves the lease as it was.
    let lease = c.try_lock("x", TTL).await.unwrap();
    assert!(lease
        .extend(Duration::from_millis(1))
        .await
        .unwrap_err()
        .is_invalid_input());
    assert!(lease.is_valid());
    assert_eq!(lease.extension_count(), 0);
    lease.release().await.unwrap();

    // Bad configurations.
    invalid(Redlock::builder().build());
    invalid(Redlock::new(Vec::<String>::new()));
    invalid(m.builder().node_timeout(Duration::ZERO).build());
    invalid(m.builder().drift_factor(1.0).build());
    invalid(m.builder().drift_factor(f64::NAN).build());
    invalid(Redlock::new(["not a url"]));
    invalid(Redlock::new(["redis://127.0.0.1:notaport"]));
    invalid(Redlock::new(["http://127.0.0.1:6379"]));
    invalid(Redlock::new([m[0].url(), "::::".to_owned()]));
    let e = Redlock::new(["redis://user:hunter2@127.0.0.1:notaport"]).unwrap_err();
    assert!(
        !e.to_string().contains("hunter2"),
        "the password leaked: {e}"
    );

    assert_eq!(m.dbsizes().await, [0]);
}
