//! A Sentinel voter counts its majority over the whole group, not over the sentinels its
//! client lists (lists are seeds: sentinels get added later, and a removed one is remembered
//! until `SENTINEL RESET`). Test names start with `sentinel_partial_list_`.

use tower_redlock_testkit as support;

use std::time::{Duration, Instant};

use support::sentinel::SentinelGroup;
use support::warnings::Warnings;
use support::{eventually, NODE_TIMEOUT};
use tower_redlock::node::{RedisNode, RedisNodeOptions, Sentinel};
use tower_redlock::{Redlock, Retry};

/// The bound of every wait for the voter to find its master or to follow a change.
const FOLLOW: Duration = Duration::from_secs(20);
/// The voter's user on the sentinels, which a test switches off on the sentinels the voter
/// must no longer reach (a zone split as the voter sees it; the sentinels still talk to one
/// another, as default users).
const USER: &str = "voter";
const PASSWORD: &str = "v-secret";

/// A client whose only voter is the group, asking the sentinels at `listed` as [`USER`].
fn client(g: &SentinelGroup, listed: &[String], refresh: Duration, connect: Duration) -> Redlock {
    let group = Sentinel::new(g.master_name(), listed)
        .expect("a valid group")
        .refresh_interval(refresh)
        .sentinel_password(Some(USER), PASSWORD);
    let options = RedisNodeOptions::new()
        .no_protection()
        .connect_timeout(connect);
    Redlock::builder()
        .node(RedisNode::sentinel(group, &options).expect("a voter"))
        .node_timeout(NODE_TIMEOUT)
        .retry(Retry::never())
        .build()
        .expect("a client")
}

/// Whether a try on a fresh key is granted (released at once), and the refusal otherwise.
async fn try_once(redlock: &Redlock, key: &str) -> Result<(), tower_redlock::Error> {
    let lease = redlock.try_lock(key, Duration::from_secs(10)).await?;
    lease.release().await.expect("released");
    Ok(())
}

/// Five sentinels, of which the client lists three. The client learns the other two from
/// the group (`SENTINEL SENTINELS`) and warns, once, that its list is short. Then a zone
/// split as the voter sees it: the listed two on the old master's side still answer, the
/// other three (one listed, the two it learned of) are out of its reach — its user is
/// switched off on them, so they keep running and keep talking to one another, as the
/// majority side of a split does (where it may promote the replica). Two of five are no
/// majority: the voter abstains within its window (two refresh intervals and two connect
/// timeouts: 800 ms here; the wait allows 5 s more for a loaded machine) and keeps
/// abstaining while the split lasts (3 s of tries, each checked to be a refusal while both
/// sentinels it hears still name the old master). Before the majority was counted over the
/// group, 2 of the 3 listed were a majority and the voter went on voting for the old master.
#[tokio::test(flavor = "current_thread")]
async fn sentinel_partial_list_split_the_listed_two_never_vote_for_the_old_master() {
    let warnings = Warnings::capture();
    let g = SentinelGroup::start_with("tr-partial", 5);
    for i in 0..5 {
        g.allow_user(i, USER, PASSWORD).await;
    }
    let (refresh, connect) = (Duration::from_millis(200), Duration::from_millis(200));
    let window = refresh * 2 + connect * 2;
    let listed = g.sentinel_addrs()[..3].to_vec();
    let redlock = client(&g, &listed, refresh, connect);

    eventually("a grant before the split", FOLLOW, || async {
        try_once(&redlock, "before").await.is_ok()
    })
    .await;

    for i in 2..5 {
        g.cut_user(i, USER).await;
    }
    let split = Instant::now();
    eventually(
        "the voter abstains",
        window + Duration::from_secs(5),
        || async {
            match try_once(&redlock, "split").await {
                Ok(()) => false,
                Err(e) => e.is_unavailable() && e.to_string().contains("majority"),
            }
        },
    )
    .await;
    let abstained = split.elapsed();

    let old = g.master_addr();
    let lasting = Instant::now();
    let mut tries = 0;
    while lasting.elapsed() < Duration::from_secs(3) {
        tries += 1;
        let err = try_once(&redlock, &format!("split-{tries}"))
            .await
            .expect_err("no vote for the old master while the split lasts");
        assert!(err.is_unavailable(), "{err}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The scenario held throughout: the sentinels the voter hears still name the old master.
    for i in 0..2 {
        let named: Option<(String, String)> = g
            .sentinel(i)
            .query(
                redis::cmd("SENTINEL")
                    .arg("get-master-addr-by-name")
                    .arg(g.master_name()),
            )
            .await;
        let named = named.map(|(ip, port)| format!("{ip}:{port}"));
        assert_eq!(
            named.as_deref(),
            Some(old.as_str()),
            "could not set up the scenario: sentinel {i} no longer names the old master"
        );
    }
    assert_eq!(
        warnings.count("lists fewer sentinels than the group has"),
        1,
        "warned once"
    );
    println!("abstained {abstained:?} after the split (window {window:?}); {tries} tries refused");
}

/// A sentinel removed from the group (stopped) but not reset away still counts: the others
/// remember it until `SENTINEL RESET`. A client listing only the one sentinel left of three
/// hears one of three — no majority: it abstains, and its error and its warning say that
/// `SENTINEL RESET` is how a removed sentinel leaves. (Counted over its list, one of one, it
/// voted.) After the reset a client started anew votes again; the client that saw the group
/// of three keeps abstaining, since only a majority of the group it saw may shrink it (a
/// sentinel restarted without its configuration also reports a smaller group).
#[tokio::test(flavor = "current_thread")]
async fn sentinel_partial_list_removed_not_reset_sentinel_makes_the_voter_abstain() {
    let warnings = Warnings::capture();
    let g = SentinelGroup::start("tr-removed");
    for i in 0..3 {
        g.allow_user(i, USER, PASSWORD).await;
    }
    g.kill_sentinel(1);
    g.kill_sentinel(2);
    let (refresh, connect) = (Duration::from_millis(200), Duration::from_millis(500));
    let left = vec![g.sentinel_addrs()[0].clone()];
    let redlock = client(&g, &left, refresh, connect);

    let reset = format!("SENTINEL RESET {}", g.master_name());
    eventually(
        "the voter abstains naming SENTINEL RESET",
        FOLLOW,
        || async {
            match try_once(&redlock, "removed").await {
                Ok(()) => panic!("a vote with one of three sentinels answering"),
                Err(e) => e.is_unavailable() && e.to_string().contains(&reset),
            }
        },
    )
    .await;
    for i in 0..20 {
        let err = try_once(&redlock, &format!("removed-{i}"))
            .await
            .expect_err("never a vote with one of three");
        assert!(err.is_unavailable(), "{err}");
    }
    assert!(warnings.count(&reset) >= 1, "the warning names {reset:?}");

    let forgotten: i64 = g
        .sentinel(0)
        .query(redis::cmd("SENTINEL").arg("RESET").arg(g.master_name()))
        .await;
    assert_eq!(forgotten, 1, "the sentinel reset its one master");
    let fresh = client(&g, &left, refresh, connect);
    eventually("a client started after the reset votes", FOLLOW, || async {
        try_once(&fresh, "after-reset").await.is_ok()
    })
    .await;
    let err = try_once(&redlock, "seen-three")
        .await
        .expect_err("the client that saw three still needs two");
    assert!(err.is_unavailable(), "{err}");
}

/// The sentinels a client learns from the group vote like listed ones: of five sentinels the
/// client lists three, and is then cut from two of those three. It still hears one listed and
/// the two it learned of — three of five, a majority — and goes on granting (20 tries after
/// the cut, each granted; a try with no answer in its node timeout on a loaded machine is
/// asked again). Counted over the one listed sentinel it still hears, it would abstain.
#[tokio::test(flavor = "multi_thread")]
async fn sentinel_partial_list_learned_sentinels_vote() {
    let g = SentinelGroup::start_with("tr-learned", 5);
    for i in 0..5 {
        g.allow_user(i, USER, PASSWORD).await;
    }
    let listed = g.sentinel_addrs()[..3].to_vec();
    let (refresh, connect) = (Duration::from_millis(200), Duration::from_millis(500));
    let redlock = client(&g, &listed, refresh, connect);
    // Asked until the voter has learned the other two: a grant while two listed ones are
    // cut shows it (set-up, bounded).
    eventually("a grant before the cut", FOLLOW, || async {
        try_once(&redlock, "before").await.is_ok()
    })
    .await;
    g.cut_user(0, USER).await;
    g.cut_user(1, USER).await;
    eventually("a grant with two listed sentinels cut", FOLLOW, || async {
        try_once(&redlock, "cut").await.is_ok()
    })
    .await;
    let window = refresh * 2 + connect * 2;
    // Past the window: every grant now rests on a confirmation made after the cut.
    tokio::time::sleep(window).await;
    let mut granted = 0;
    let start = Instant::now();
    while granted < 20 {
        match try_once(&redlock, &format!("cut-{granted}")).await {
            Ok(()) => granted += 1,
            Err(e) if e.is_timeout() => {}
            Err(e) => panic!("a refusal with three of five sentinels answering: {e}"),
        }
        assert!(
            start.elapsed() < FOLLOW,
            "could not set up the scenario: {granted} grants in {FOLLOW:?}"
        );
    }
}
