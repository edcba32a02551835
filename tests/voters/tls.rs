//! TLS (`rediss://`, feature `tls`) against real redis-server masters that serve TLS with the
//! test certificate in `testkit/tls` (issued to 127.0.0.1 by a test CA): the masters'
//! certificates are verified, and a certificate the client cannot verify is refused.

#![cfg(feature = "tls")]

use tower_redlock_testkit as support;

use std::time::Duration;

use support::{eventually, warm_up, Masters, RedisServer, NODE_TIMEOUT};
use tower_redlock::node::{RedisNode, RedisNodeOptions};
use tower_redlock::{Redlock, Retry};

/// A node for `server`'s TLS port that trusts the test CA (and nothing else).
fn trusting_node(server: &RedisServer) -> RedisNode {
    let ca = std::fs::read(support::tls_file("ca.pem")).expect("the test CA");
    let client = redis::Client::build_with_tls(
        server.tls_url(),
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(ca),
        },
    )
    .expect("a TLS client");
    RedisNode::from_client(client, &RedisNodeOptions::default()).expect("a node")
}

#[tokio::test(flavor = "multi_thread")]
async fn locks_extends_and_releases_over_verified_tls() {
    let masters = Masters::start_tls(3);
    let redlock = masters
        .iter()
        .fold(Redlock::builder(), |b, m| b.node(trusting_node(m)))
        .node_timeout(NODE_TIMEOUT)
        .retry(Retry::never())
        .build()
        .expect("a client");
    // The first lock on every master also makes the TLS handshakes.
    warm_up(&redlock, &masters).await;

    let lease = redlock
        .try_lock("tls:1", Duration::from_secs(10))
        .await
        .expect("locked over TLS");
    let token = lease.value().to_owned();
    eventually(
        "every master holds the token",
        Duration::from_secs(5),
        || masters.everywhere("tls:1", &token),
    )
    .await;
    lease
        .extend(Duration::from_secs(20))
        .await
        .expect("extended over TLS");
    // Extended on a quorum when it returns; the last master's answer may still be on its way.
    let extended = masters.pttls("tls:1").await;
    assert!(
        extended.iter().filter(|&&ms| ms > 10_000).count() >= 2,
        "{extended:?}"
    );
    eventually(
        "every master has the new ttl",
        Duration::from_secs(5),
        || async { masters.pttls("tls:1").await.iter().all(|&ms| ms > 10_000) },
    )
    .await;
    lease.release().await.expect("released over TLS");
    eventually("every master is empty", Duration::from_secs(5), || async {
        masters.dbsizes().await.iter().all(|&n| n == 0)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_certificate_that_cannot_be_verified_is_refused() {
    let masters = Masters::start_tls(3);
    // Default trust: the webpki roots, which do not include the test CA. A node timeout
    // (5 s) that a first connect and handshake meet even on a loaded machine: a refusal
    // reported as a timeout (the bug this guards against) still shows as one, and a slow
    // machine's handshake does not.
    let redlock = masters
        .iter()
        .fold(Redlock::builder(), |b, m| b.redis(&m.tls_url()))
        .node_timeout(Duration::from_secs(5))
        .retry(Retry::never())
        .build()
        .expect("a client");
    let err = redlock
        .try_lock("tls:2", Duration::from_secs(10))
        .await
        .expect_err("no master can be trusted");
    assert!(err.is_unavailable(), "{err:?}");
    // Refused for the certificate, at once — not timed out.
    assert!(!err.node_errors().is_empty(), "{err:?}");
    for e in err.node_errors() {
        assert!(
            !e.is_timeout() && e.to_string().contains("certificate"),
            "{e}"
        );
    }
    assert_eq!(masters.dbsizes().await, vec![0; 3], "nothing was locked");
}
