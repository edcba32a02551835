//! Waiting in tests: [`eventually`] polls a condition under a deadline, [`warm_up`] waits
//! until a client has reached every master.

use std::time::Duration;

use tower_redlock::Redlock;

use crate::masters::Masters;

/// Polls a condition under a deadline: the conformance kit's (one definition).
pub use tower_redlock::conformance::eventually;

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
