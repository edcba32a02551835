//! The client's telemetry end to end: the spans of lock calls, extensions, releases and
//! completions, with their outcomes, and never a raw key (see `telemetry.rs`).

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tracing_subscriber::fmt::format::FmtSpan;

use super::telemetry::hashed;
use crate::node::MemoryNode;
use crate::{LockOrRecord, Redlock, Retry};

/// The log lines of a test, written by a `fmt` subscriber.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Runs `test` on a current-thread runtime under a `fmt` subscriber at debug that logs
/// each span as it closes; answers the log.
fn logged(test: impl std::future::Future<Output = ()>) -> String {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::DEBUG)
        .with_span_events(FmtSpan::CLOSE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tracing::subscriber::with_default(subscriber, || rt.block_on(test));
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    text
}

/// With a subscriber, every lock call, extension, release and completion closes its span
/// with its outcome; the key appears only hashed — also for a lease dropped, whose
/// release runs in the background.
#[test]
fn spans_record_outcomes_and_never_the_key() {
    let text = logged(async {
        let node = MemoryNode::new();
        let redlock = Redlock::builder().node(node.clone()).build().unwrap();
        let ttl = Duration::from_secs(10);
        let lease = redlock.lock("secret-resource", ttl).await.unwrap();
        let busy = redlock.try_lock("secret-resource", ttl).await.unwrap_err();
        assert!(busy.is_contended());
        lease.extend(ttl).await.unwrap();
        lease.release().await.unwrap();
        drop(redlock.lock("secret-resource", ttl).await.unwrap());
        for _ in 0..1000 {
            if node.get("secret-resource").is_none() {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert_eq!(node.get("secret-resource"), None, "released on drop");
        let work = || redlock.lock_unless_completed("secret-work", ttl, Retry::never());
        match work().await.unwrap() {
            LockOrRecord::Locked(lease) => lease.complete("done", ttl).await.unwrap(),
            other => panic!("first run: {other:?}"),
        }
        assert!(matches!(work().await.unwrap(), LockOrRecord::Completed(_)));
    });
    let closed = |span: &str, outcome: &str| {
        text.lines()
            .filter(|l| l.contains(&format!("{span}{{")) && l.contains("close"))
            .filter(|l| l.contains(&format!("outcome=\"{outcome}\"")))
            .count()
    };
    assert_eq!(closed("redlock.acquire", "acquired"), 3, "{text}");
    assert_eq!(closed("redlock.acquire", "contended"), 1, "{text}");
    assert_eq!(closed("redlock.acquire", "completed"), 1, "{text}");
    assert_eq!(closed("redlock.extend", "extended"), 1, "{text}");
    assert_eq!(closed("redlock.release", "released"), 2, "{text}");
    assert_eq!(closed("redlock.complete", "completed"), 1, "{text}");
    assert!(text.contains("redlock.lease{"), "{text}");
    assert!(text.contains("try counted"), "{text}");
    assert!(
        text.contains(&hashed("secret-resource").to_string()),
        "{text}"
    );
    assert!(!text.contains("secret-resource"), "{text}");
    assert!(!text.contains("secret-work"), "{text}");
}

/// A lease whose validity runs out is lost once, at its deadline: `LeaseHandle::lost`
/// resolves, the loss is logged in the lease's span with the moment (`lost_after`), and
/// neither a second look nor the release logs it again.
#[test]
fn a_lease_past_its_validity_is_lost_once_with_its_moment_on_the_span() {
    let text = logged(async {
        let redlock = Redlock::builder().node(MemoryNode::new()).build().unwrap();
        let lease = redlock
            .lock("short-lived", Duration::from_millis(50))
            .await
            .unwrap();
        let handle = lease.handle();
        assert!(!handle.is_lost() && handle.lost_at().is_none());
        handle.lost().await;
        let at = handle.lost_at().expect("lost, not released");
        assert!(at <= std::time::Instant::now());
        assert!(at >= handle.started() && at <= handle.deadline());
        assert!(handle.is_lost());
        lease.release().await.unwrap();
        assert_eq!(handle.lost_at(), Some(at), "decided once");
        // A lease released while it holds is not lost.
        let released = redlock
            .lock("released", Duration::from_secs(10))
            .await
            .unwrap();
        let handle = released.handle();
        released.release().await.unwrap();
        assert!(handle.is_lost() && handle.lost_at().is_none());
    });
    let lost: Vec<_> = text.lines().filter(|l| l.contains("lease lost")).collect();
    assert_eq!(lost.len(), 1, "{text}");
    assert!(
        lost[0].contains("redlock.lease{"),
        "not in the lease's span: {text}"
    );
    assert!(lost[0].contains("lost_after="), "{text}");
    assert!(
        text.lines().any(|l| l.contains("redlock.lease{")
            && l.contains("close")
            && l.contains("lost_after=")),
        "the span does not record the moment: {text}"
    );
}

/// The in-memory node honours a named holder as the Redis script does: a re-run of a forced
/// release spares a new holder's lock and, once it completed, its record.
#[tokio::test]
async fn a_forced_release_rerun_spares_a_new_holder_in_memory() {
    use crate::operate::ForceRelease;
    const TTL: Duration = Duration::from_secs(60);
    let redlock = Redlock::in_memory();
    let crashed = redlock.try_lock("job", TTL).await.unwrap();
    let prefix = crashed.value()[..8].to_owned();
    std::mem::forget(crashed);
    let how = ForceRelease::by("test").holder(prefix).with_record();
    let first = redlock.force_release("job", how.clone()).await.unwrap();
    assert_eq!(first.locks_deleted(), 1);

    let LockOrRecord::Locked(lease) = redlock
        .lock_unless_completed("job", TTL, Retry::never())
        .await
        .unwrap()
    else {
        panic!("nothing completed yet")
    };
    let rerun = redlock.force_release("job", how.clone()).await.unwrap();
    assert_eq!((rerun.locks_deleted(), rerun.records_deleted()), (0, 0));
    lease.complete(b"done".to_vec(), TTL).await.unwrap();
    let rerun = redlock.force_release("job", how).await.unwrap();
    assert_eq!(rerun.records_deleted(), 0, "the new holder's record went");
    let again = redlock
        .lock_unless_completed("job", TTL, Retry::never())
        .await
        .unwrap();
    assert!(
        matches!(again, LockOrRecord::Completed(_)),
        "the work would run again"
    );
}
