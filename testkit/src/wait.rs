//! Waiting in tests: [`eventually`] polls a condition under a deadline, [`warm_up`] waits
//! until a client has reached every master.

use std::fmt::Display;
use std::future::Future;
use std::time::{Duration, Instant};

use tower_redlock::Redlock;

use crate::masters::Masters;

/// Polls `check` every 10 ms until it is true; panics with `what` after `within`.
/// Returns how long it took.
pub async fn eventually<F, Fut>(what: impl Display, within: Duration, mut check: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if check().await {
            return start.elapsed();
        }
        if start.elapsed() > within {
            panic!("timed out after {within:?} waiting until {what}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Takes and releases a throw-away lock until one try reached every master, so that the
/// client's lazily made connections are up before a test looks at the masters; then waits
/// until the warm-up key is gone everywhere (a release returns once a quorum answered, the
/// last master follows in the background).
pub async fn warm_up(client: &Redlock, masters: &Masters) {
    eventually(
        "the client reaches every master",
        Duration::from_secs(10),
        || async {
            let Ok(lease) = client.try_lock("warm-up", Duration::from_secs(10)).await else {
                return false;
            };
            let value = lease.value().to_owned();
            let everywhere = masters.everywhere("warm-up", &value).await;
            lease.release().await.expect("release the warm-up lock");
            everywhere
        },
    )
    .await;
    eventually("the warm-up lock is gone", Duration::from_secs(10), || {
        masters.absent_everywhere("warm-up")
    })
    .await;
}
