//! Operating the locks on real masters: `Redlock::inspect` (held on a quorum, on a
//! minority, completed, expired; it never writes), each voter's answer in a lock error
//! (`Error::votes`: held, a frozen master, a refused port, an ACL user without `EVALSHA`, a
//! key of the wrong type, tenure protection) and `Redlock::force_release` of the key a
//! crashed holder left.

use std::time::{Duration, Instant};

use tower_redlock::node::{RedisNode, RedisNodeOptions};
use tower_redlock::operate::{ForceRelease, Summary};
use tower_redlock::{LockOrRecord, Redlock, Retry, VoteKind};

use super::{eventually, support, Masters, SECOND, TTL};
use support::warm_up;
use support::{RedisServer, NODE_TIMEOUT};

/// A token no client of ours makes: what another process left.
const FOREIGN: &str = "f0f0f0f0-crashed-holder";

/// A port nothing listens on: bound, then closed.
fn refused_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

/// The votes of `err`, as kinds in node order.
fn kinds(err: &tower_redlock::Error) -> Vec<VoteKind> {
    err.votes().map(|v| v.kind()).collect()
}

/// Asserts that `err` displays on one line, naming every voter.
fn one_line_naming_each(err: &tower_redlock::Error, names: &[String]) {
    let shown = err.to_string();
    assert!(!shown.contains('\n'), "{shown}");
    for name in names {
        assert!(shown.contains(name.as_str()), "{name} missing in: {shown}");
    }
}

/// Held on a quorum, then on a minority (the holder's keys gone from two of three), then
/// completed (a record), then after expiry: each summary as an acquire would see it, and the
/// holder's token prefix is the lease's, never the whole token.
#[tokio::test]
async fn inspect_while_held_on_a_minority_completed_and_after_expiry() {
    let m = Masters::start(3);
    let redlock = m.builder().fencing(true).build().unwrap();
    // Connected to every master: a request made while a connection is still being set up
    // may not be sent before the quorum decides, and then is not sent at all (the lock is
    // on the quorum, not on every master) — these checks read every master.
    warm_up(&redlock, &m).await;

    let seen = redlock.inspect("inspect-job").await.unwrap();
    assert_eq!(seen.summary(), Summary::Free);
    assert_eq!(seen.key(), "inspect-job");

    let lease = redlock.try_lock("inspect-job", TTL).await.unwrap();
    // A lock returns at a quorum; the last master's `SET` may land a moment later.
    eventually("every master holds the lease", 5 * SECOND, || {
        m.everywhere("inspect-job", lease.value())
    })
    .await;
    let seen = redlock.inspect("inspect-job").await.unwrap();
    assert_eq!(seen.summary(), Summary::Held);
    let holder = seen.holder().expect("a holder on a quorum");
    assert!(lease.value().starts_with(&holder.token_prefix));
    assert!(holder.token_prefix.len() < lease.value().len());
    assert!(holder.ttl.unwrap() <= TTL && holder.ttl.unwrap() > TTL / 2);
    // The largest counter: at least the lease's token (a voter counted after the decision
    // may have bumped its own higher).
    assert!(seen.fence() >= lease.fencing_token());
    for v in seen.voters() {
        let key = v.key().expect("every master answered");
        assert!(!v.is_suspended());
        let prefix = key.holder.as_ref().map(|h| &h.token_prefix);
        assert_eq!(prefix, Some(&holder.token_prefix));
        assert!(key.fence.is_some() && key.record.is_none());
    }

    // The holder's keys vanish from two masters: held on a minority.
    m.del_on("inspect-job", &[0, 1]).await;
    let seen = redlock.inspect("inspect-job").await.unwrap();
    assert_eq!(seen.summary(), Summary::HeldOnMinority);
    assert!(seen.holder().is_none());
    // A silent voter could complete a quorum with the one still holding: cannot say.
    m[1].freeze();
    let seen = redlock.inspect("inspect-job").await.unwrap();
    m[1].thaw();
    assert_eq!(seen.summary(), Summary::Unknown, "{:?}", seen.voters());
    assert!(seen.voters()[1].error().unwrap().is_timeout());
    drop(lease);

    // Work that completed: its record is on the masters.
    let lease = match redlock
        .lock_unless_completed("inspect-done", TTL, Retry::never())
        .await
        .unwrap()
    {
        LockOrRecord::Locked(lease) => lease,
        other => panic!("nothing completed yet: {other:?}"),
    };
    lease
        .complete(b"the answer".to_vec(), Duration::from_secs(600))
        .await
        .unwrap();
    // A completion returns at a quorum of records; the last one may land a moment later.
    eventually("every master has the record", 5 * SECOND, || async {
        m.values("inspect-done:record")
            .await
            .iter()
            .all(Option::is_some)
    })
    .await;
    let seen = redlock.inspect("inspect-done").await.unwrap();
    assert_eq!(seen.summary(), Summary::Completed);
    let record = seen.voters()[0].key().unwrap().record.expect("a record");
    assert!(record.size >= b"the answer".len());
    let age = record.age(Duration::from_secs(600)).expect("an age");
    assert!(age < Duration::from_secs(60), "{age:?}");

    // After expiry: free again.
    let short = redlock
        .lock_with(
            "inspect-brief",
            Duration::from_millis(300),
            // A try a loaded machine makes slower than the ttl grants nothing: try again.
            Retry::times(50).delay(Duration::from_millis(20)),
        )
        .await
        .expect("a 300 ms lock within 50 tries");
    std::mem::forget(short);
    eventually("the brief lock expired", 5 * SECOND, || async {
        redlock.inspect("inspect-brief").await.unwrap().summary() == Summary::Free
    })
    .await;
}

/// An inspection writes nothing: every master's keys, values and ttls are as they were (the
/// ttl only lower), and a user allowed only to read (`GET`, `PTTL`, `GETRANGE`, `STRLEN`)
/// can inspect.
#[tokio::test]
async fn inspect_never_writes_and_needs_only_reads() {
    let m = Masters::start(1);
    let redlock = m.client();
    let lease = redlock.try_lock("inspect-ro", TTL).await.unwrap();
    let before = (m.dbsizes().await, m.values("inspect-ro").await);
    let pttl = m.pttls("inspect-ro").await[0];
    redlock.inspect("inspect-ro").await.unwrap();
    assert_eq!((m.dbsizes().await, m.values("inspect-ro").await), before);
    assert!(m.pttls("inspect-ro").await[0] <= pttl);

    let mut acl = redis::cmd("ACL");
    acl.arg(
        &[
            "SETUSER",
            "reader",
            "on",
            ">pw",
            "~*",
            "-@all",
            "+get",
            "+pttl",
            "+getrange",
            "+strlen",
        ][..],
    );
    let () = m[0].query(&acl).await;
    let url = format!("redis://reader:pw@127.0.0.1:{}", m[0].port());
    let reader = Redlock::builder()
        .redis(&url)
        .node_timeout(NODE_TIMEOUT)
        .build()
        .unwrap();
    let seen = reader.inspect("inspect-ro").await.unwrap();
    assert_eq!(
        seen.summary(),
        Summary::Held,
        "{:?}",
        seen.voters()[0].error()
    );
    assert!(lease
        .value()
        .starts_with(&seen.holder().unwrap().token_prefix));
    // It cannot lock: its vote is a refusal, named as such.
    let err = reader.try_lock("inspect-ro-2", TTL).await.unwrap_err();
    assert_eq!(kinds(&err), [VoteKind::Denied], "{err}");
}

/// A contended error lists every voter's answer: held by another value (with the holder's
/// ttl where it was asked), in its `Display` on one line.
#[tokio::test]
async fn explain_a_contended_error_names_each_voter_held() {
    let m = Masters::start(3);
    let redlock = m.client();
    let _held = redlock.try_lock("explain-held", TTL).await.unwrap();
    let err = redlock.try_lock("explain-held", TTL).await.unwrap_err();
    assert!(err.is_contended());
    let votes: Vec<_> = err.votes().collect();
    assert_eq!(votes.len(), 3);
    let held = votes
        .iter()
        .filter(|v| matches!(v.kind(), VoteKind::Held { .. }))
        .count();
    // Decided at two "held": the third may not have been counted.
    assert!(held >= 2, "{err}");
    assert!(
        votes
            .iter()
            .any(|v| matches!(v.kind(), VoteKind::Held { remaining: Some(r) } if r <= TTL)),
        "the holder's ttl, asked once: {err}"
    );
    let names: Vec<String> = m.iter().map(RedisServer::addr).collect();
    one_line_naming_each(&err, &names);
    assert!(err.to_string().contains("held"));
}

/// An unavailable error tells the frozen master (no answer within the node timeout) from the
/// refused port (unreachable) and from the master that granted (and was released).
#[tokio::test]
async fn explain_an_unavailable_error_tells_a_frozen_master_from_a_refused_port() {
    let m = Masters::start(2);
    let port = refused_port();
    let redlock = Redlock::builder()
        .redis(&m[0].url())
        .redis(&m[1].url())
        .redis(&format!("redis://127.0.0.1:{port}"))
        .node_timeout(NODE_TIMEOUT)
        .retry(Retry::never())
        // The refused port fails every request: never suspended here, so that it is asked.
        .suspend_after(0)
        .build()
        .unwrap();
    // Connected to both masters first, so that the frozen one is silent, not unreachable.
    redlock
        .try_lock("explain-warm", TTL)
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
    m[1].freeze();
    let err = redlock.try_lock("explain-down", TTL).await.unwrap_err();
    m[1].thaw();
    assert!(err.is_unavailable(), "{err}");
    assert_eq!(
        kinds(&err),
        [VoteKind::Granted, VoteKind::Timeout, VoteKind::Unreachable],
        "{err}"
    );
    let names = vec![m[0].addr(), m[1].addr(), format!("127.0.0.1:{port}")];
    one_line_naming_each(&err, &names);
    let shown = err.to_string();
    assert!(
        shown.contains("granted") && shown.contains("timeout"),
        "{shown}"
    );
    assert!(shown.contains("unreachable"), "{shown}");
}

/// An ACL user without `EVALSHA` (the fenced acquire is a script) gets "denied" from every
/// voter, with the server's `NOPERM` refusal in the message; a key of the wrong type beside the lock
/// (the completion record's key holding a list) gets "wrong type".
#[tokio::test]
async fn explain_an_acl_refusal_and_a_wrong_type() {
    let m = Masters::start(1);
    let mut acl = redis::cmd("ACL");
    acl.arg(
        &[
            "SETUSER", "locker", "on", ">pw", "~*", "+@all", "-evalsha", "-eval",
        ][..],
    );
    let () = m[0].query(&acl).await;
    let url = format!("redis://locker:pw@127.0.0.1:{}", m[0].port());
    let fenced = Redlock::builder()
        .redis(&url)
        .fencing(true)
        .node_timeout(NODE_TIMEOUT)
        .retry(Retry::never())
        .build()
        .unwrap();
    let err = fenced.try_lock("explain-acl", TTL).await.unwrap_err();
    assert_eq!(kinds(&err), [VoteKind::Denied], "{err}");
    assert!(err.to_string().to_lowercase().contains("noperm"), "{err}");
    assert!(!err.to_string().contains("pw@"), "{err}");
    assert!(m[0].get("explain-acl").await.is_none());
    // A wrong password: denied too, not "unreachable".
    let wrong = Redlock::builder()
        .redis(&format!("redis://locker:wrong@127.0.0.1:{}", m[0].port()))
        .node_timeout(NODE_TIMEOUT)
        .retry(Retry::never())
        .build()
        .unwrap();
    let err = wrong.try_lock("explain-acl", TTL).await.unwrap_err();
    assert_eq!(kinds(&err), [VoteKind::Denied], "{err}");
    assert!(!err.to_string().contains("wrong@"), "{err}");

    let redlock = m.client();
    let mut push = redis::cmd("RPUSH");
    push.arg(&["explain-wrong:record", "x"][..]);
    let _: i64 = m[0].query(&push).await;
    let err = redlock
        .lock_unless_completed("explain-wrong", TTL, Retry::never())
        .await
        .map(|_| ())
        .unwrap_err();
    assert_eq!(kinds(&err), [VoteKind::WrongType], "{err}");
    assert!(m[0].get("explain-wrong").await.is_none());
}

/// A master behind tenure protection that just started abstains: "protected".
#[tokio::test]
async fn explain_a_young_master_behind_tenure_protection() {
    let m = Masters::start(1);
    let options = RedisNodeOptions::new().restart_protection(Duration::from_secs(30));
    let redlock = Redlock::builder()
        .node(RedisNode::open_with(&m[0].url(), &options).unwrap())
        .node_timeout(NODE_TIMEOUT)
        .retry(Retry::never())
        .build()
        .unwrap();
    let err = redlock.try_lock("explain-young", TTL).await.unwrap_err();
    assert_eq!(kinds(&err), [VoteKind::Protected], "{err}");
    assert!(err.to_string().contains("protected"), "{err}");
}

/// The key a crashed holder left (a foreign token on every master, no release ever coming)
/// blocks every lock until its ttl; `force_release` clears it on every master at once, keeps
/// the fencing counter, and with `with_record` forgets a completion record (the work runs
/// again). A master that does not answer is reported, not hidden.
#[tokio::test]
async fn force_release_frees_a_key_a_crashed_holder_left() {
    let m = Masters::start(3);
    let redlock = m.builder().fencing(true).build().unwrap();
    // Connected to every master: a request made while a connection is still being set up
    // may not be sent before the quorum decides, and then is not sent at all (the lock is
    // on the quorum, not on every master) — these checks read every master.
    warm_up(&redlock, &m).await;
    let first = redlock.try_lock("force-job", TTL).await.unwrap();
    let token = first.fencing_token().unwrap();
    std::mem::forget(first);
    for s in m.iter() {
        s.del("force-job").await;
        assert!(s.set_nx("force-job", FOREIGN, Some(600_000)).await);
    }
    assert!(redlock
        .try_lock("force-job", TTL)
        .await
        .unwrap_err()
        .is_contended());

    let cleared = redlock
        .force_release("force-job", ForceRelease::by("test").holder("f0f0f0f0"))
        .await
        .unwrap();
    assert_eq!(cleared.locks_deleted(), 3);
    assert!(cleared.is_complete());
    assert!(m.absent_everywhere("force-job").await);
    let next = redlock.try_lock("force-job", TTL).await.unwrap();
    assert!(
        next.fencing_token().unwrap() > token,
        "the counter was kept"
    );
    next.release().await.unwrap();

    // A completion record: forgotten only when asked.
    let claim = redlock
        .lock_unless_completed("force-done", TTL, Retry::never())
        .await
        .unwrap();
    let LockOrRecord::Locked(lease) = claim else {
        panic!("nothing completed yet")
    };
    lease.complete(b"done".to_vec(), TTL).await.unwrap();
    // A completion returns at a quorum; the last master's record (and its lock's delete)
    // may land a moment later.
    eventually(
        "every master has the record, no lock",
        5 * SECOND,
        || async {
            m.absent_everywhere("force-done").await
                && m.values("force-done:record")
                    .await
                    .iter()
                    .all(Option::is_some)
        },
    )
    .await;
    let kept = redlock
        .force_release("force-done", ForceRelease::by("test").any_holder())
        .await
        .unwrap();
    assert_eq!((kept.locks_deleted(), kept.records_deleted()), (0, 0));
    let forgotten = redlock
        .force_release(
            "force-done",
            ForceRelease::by("test").any_holder().with_record(),
        )
        .await
        .unwrap();
    assert_eq!(forgotten.records_deleted(), 3);
    let again = redlock
        .lock_unless_completed("force-done", TTL, Retry::never())
        .await
        .unwrap();
    assert!(
        matches!(again, LockOrRecord::Locked(_)),
        "the work runs again"
    );

    // Never a counter, nor a record key holding another resource's lock: forcing
    // `force-job:fence` (a resource named like the counter) leaves the counter, and a lock
    // at `force-other:record` is no record of `force-other`.
    let spared = redlock
        .force_release("force-job:fence", ForceRelease::by("test").any_holder())
        .await
        .unwrap();
    assert_eq!(spared.locks_deleted(), 0);
    assert!(m
        .values("force-job:fence")
        .await
        .iter()
        .all(Option::is_some));
    let other = redlock.try_lock("force-other:record", TTL).await.unwrap();
    let seen = redlock.inspect("force-other").await.unwrap();
    assert_eq!(seen.summary(), Summary::Free, "a lock is no record");
    let spared = redlock
        .force_release(
            "force-other",
            ForceRelease::by("test").any_holder().with_record(),
        )
        .await
        .unwrap();
    assert_eq!(spared.records_deleted(), 0);
    assert!(m.everywhere("force-other:record", other.value()).await);
    other.release().await.unwrap();
    // A record key of another type: no record; the lock's delete stands, no error.
    for s in m.iter() {
        assert!(s.set_nx("force-odd", FOREIGN, Some(600_000)).await);
        let mut hset = redis::cmd("HSET");
        hset.arg(&["force-odd:record", "f", "v"][..]);
        let _: i64 = s.query(&hset).await;
    }
    let odd = redlock
        .force_release(
            "force-odd",
            ForceRelease::by("test").any_holder().with_record(),
        )
        .await
        .unwrap();
    assert!(odd.is_complete(), "{odd:?}");
    assert_eq!((odd.locks_deleted(), odd.records_deleted()), (3, 0));

    // A frozen master: reported; the others cleared. Operator calls never suspend it.
    for s in m.iter() {
        assert!(s.set_nx("force-frozen", FOREIGN, Some(600_000)).await);
    }
    m[2].freeze();
    let start = Instant::now();
    let partial = redlock
        .force_release("force-frozen", ForceRelease::by("test").any_holder())
        .await
        .unwrap();
    for _ in 0..4 {
        let seen = redlock.inspect("force-frozen").await.unwrap();
        assert!(seen.voters()[2].error().unwrap().is_timeout());
    }
    let suspended = redlock.node_status()[2].is_suspended();
    m[2].thaw();
    assert!(!suspended, "an operator's timeouts suspended a voter");
    assert!(
        start.elapsed() < 20 * SECOND,
        "bounded by the node timeouts"
    );
    assert!(!partial.is_complete());
    assert_eq!(partial.locks_deleted(), 2);
    assert_eq!(partial.errors().map(|e| e.node()).collect::<Vec<_>>(), [2]);
}
