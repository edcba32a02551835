//! Quorum: for every subset of masters pre-held by a foreign value, `try_lock` succeeds
//! exactly when the free masters make a quorum (1, 3 and 5 masters).

use std::time::Duration;

use crate::support::{eventually, warm_up, Masters};
use crate::{SECOND, TTL};

/// For every subset of masters pre-held by a foreign value, `try_lock` succeeds exactly when
/// the free masters make a quorum; a failed try leaves nothing of ours behind.
async fn every_subset(n: usize) {
    let m = Masters::start(n);
    let c = m.client();
    let q = n / 2 + 1;
    assert_eq!(c.quorum(), q);
    warm_up(&c, &m).await;

    for mask in 0u32..(1 << n) {
        let key = format!("subset-{n}-{mask:0n$b}");
        let held: Vec<usize> = (0..n).filter(|i| mask & (1 << i) != 0).collect();
        for &i in &held {
            assert!(m[i].set_nx(&key, "foreign", Some(10_000)).await);
        }
        let free = n - held.len();
        let expected = |i: usize, ours: &str| -> Option<String> {
            if held.contains(&i) {
                Some("foreign".to_owned())
            } else if ours.is_empty() {
                None
            } else {
                Some(ours.to_owned())
            }
        };

        match c.try_lock(&key, TTL).await {
            Ok(lease) => {
                assert!(free >= q, "{key}: locked with {free} free of {n}");
                let ours = lease.value().to_owned();
                eventually(
                    format!("{key}: the value is on every free master"),
                    SECOND,
                    || async {
                        let now = m.values(&key).await;
                        (0..n).all(|i| now[i] == expected(i, &ours))
                    },
                )
                .await;
                lease.release().await.unwrap();
            }
            Err(e) => {
                assert!(free < q, "{key}: not locked with {free} free of {n}: {e:?}");
                assert!(e.is_contended(), "{key}: {e:?}");
                assert!(
                    e.held_by() > n - q && e.held_by() <= held.len(),
                    "{key}: held_by {} (n {n}, held {})",
                    e.held_by(),
                    held.len()
                );
                let ra = e.retry_after().expect("retry-after");
                assert!(ra <= Duration::from_secs(10), "{ra:?}");
            }
        }
        // After the try (and the release): no master holds our token; the foreign holds
        // are untouched. (A failed try releases the masters that had not answered yet in
        // the background, so this is awaited.)
        eventually(
            format!("{key}: only the foreign holds are left"),
            SECOND,
            || async {
                let now = m.values(&key).await;
                for (i, v) in now.iter().enumerate() {
                    if held.contains(&i) {
                        assert_eq!(v.as_deref(), Some("foreign"), "{key}: master {i}");
                    }
                }
                (0..n).all(|i| now[i] == expected(i, ""))
            },
        )
        .await;
    }
}

#[tokio::test]
async fn quorum_every_subset_of_1() {
    every_subset(1).await;
}

#[tokio::test]
async fn quorum_every_subset_of_3() {
    every_subset(3).await;
}

#[tokio::test]
async fn quorum_every_subset_of_5() {
    every_subset(5).await;
}
