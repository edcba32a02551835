//! Keys scoped by what the request carries besides the key: the authenticated principal (a
//! request extension an authentication layer outside the lock puts there), and the query;
//! what an extractor sees of the request (its query and peer).

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tower_redlock::key::{
    key_fn, IdempotencyKey, KeyExtractorExt, LockKey, PathKey, RequestView, SimpleRequest,
};
use tower_redlock::policy::LockPolicy;

use crate::harness::app::{App, Principal, USER_HEADER};
use crate::harness::keys::key_of;
use crate::harness::probe::Probe;
use crate::harness::Framework;
use crate::support::apps::*;
use crate::support::http::{http_client, reply, within};

/// `IdempotencyKey::required().scoped_by_extension(|p: &Principal| p.tenant.clone())`: two
/// tenants with the same `Idempotency-Key` hold two locks at once; the same tenant twice is
/// refused (409); a request without a principal (no `x-user`, so the authentication layer
/// added none) is a 400 (missing) and never runs.
pub async fn keys_are_scoped_by_the_principal<F: Framework>() {
    const KEY: &str = "\"order-tenant\"";
    let (m, redlock) = masters_and_client().await;
    let extractor =
        IdempotencyKey::required().scoped_by_extension(|p: &Principal| p.tenant.clone());
    let policy = LockPolicy::builder(redlock, extractor.clone())
        .build()
        .expect("a valid policy");
    let probe = Probe::new();
    let app = F::serve(&App::gated(PATH, policy, &probe)).await;
    let http = http_client();
    let as_tenant =
        |tenant: &str| post_with(&http, &app.url(PATH), &[KEY]).header(USER_HEADER, tenant);
    let key_of_tenant = |tenant: &str| {
        let req = SimpleRequest::new("POST", PATH)
            .header(IDEMPOTENCY_KEY, KEY)
            .extension(Principal {
                tenant: tenant.into(),
            });
        key_of(&extractor, &req)
    };

    let tenants = ["acme", "globex"].map(|t| tokio::spawn(reply(as_tenant(t))));
    probe.until_started(2).await;
    assert_eq!(probe.inside(), 2, "two tenants, one lock");
    let (acme, globex) = (key_of_tenant("acme"), key_of_tenant("globex"));
    assert_ne!(acme, globex);
    assert_held(&m, &acme).await;
    assert_held(&m, &globex).await;

    assert_conflict(&reply(as_tenant("acme")).await, LockPolicy::DEFAULT_TTL);
    let anonymous = reply(post_with(&http, &app.url(PATH), &[KEY])).await;
    assert_problem(&anonymous, 400, "/problems/lock-key-missing");
    assert_eq!(probe.started(), 2, "a refused request ran");

    probe.open();
    for (tenant, (request, key)) in ["acme", "globex"]
        .into_iter()
        .zip(tenants.into_iter().zip([acme, globex]))
    {
        let v = within("a tenant's reply", request)
            .await
            .expect("no panic")
            .ok();
        assert_eq!(v["tenant"], tenant, "{v}");
        assert_eq!(v["resource"], key, "{v}");
    }
    assert_all_empty(&m).await;
    drop(http);
    app.stop().await;
}

/// `PathKey.scoped_by(|req| req.query().map(str::to_owned))`: the same path with different
/// query strings (or none) holds different locks at once; the same query is refused.
pub async fn keys_are_scoped_by_the_query<F: Framework>() {
    const REPORTS: &str = "/reports";
    let (m, redlock) = masters_and_client().await;
    let policy = LockPolicy::builder(
        redlock,
        PathKey.scoped_by(|req| req.query().map(str::to_owned)),
    )
    .build()
    .expect("a valid policy");
    let probe = Probe::new();
    let app = F::serve(&App::gated(REPORTS, policy, &probe)).await;
    let http = http_client();
    let url = |query: &str| app.url(&format!("{REPORTS}{query}"));

    let queries = ["?week=1", "?week=2", ""];
    let requests = queries.map(|q| tokio::spawn(reply(http.post(url(q)))));
    probe.until_started(queries.len()).await;
    assert_eq!(probe.inside(), queries.len(), "different queries, one lock");
    // Three locks, each on a quorum now (the last master's SET may still be on its way).
    let sizes = m.dbsizes().await;
    assert!(
        sizes.iter().all(|&n| n <= queries.len() as u64)
            && sizes.iter().sum::<u64>() >= 2 * queries.len() as u64,
        "{sizes:?}"
    );

    assert_conflict(
        &reply(http.post(url("?week=1"))).await,
        LockPolicy::DEFAULT_TTL,
    );
    assert_eq!(probe.started(), queries.len(), "the refused request ran");

    probe.open();
    let mut resources = HashSet::new();
    for request in requests {
        let v = within("a reply", request).await.expect("no panic").ok();
        assert_eq!(v["locked"], true, "{v}");
        resources.insert(v["resource"].as_str().expect("a resource").to_owned());
    }
    assert_eq!(resources.len(), queries.len(), "one lock per query");
    assert_all_empty(&m).await;
    drop(http);
    app.stop().await;
}

/// What a key extractor sees, on either framework: the request's method, path, query and
/// client address (`peer_addr`; axum served with `ConnectInfo`).
pub async fn the_request_view_shows_the_query_and_the_peer<F: Framework>() {
    const ORDERS: &str = "/orders/zebra-42";
    let (m, redlock) = masters_and_client().await;
    type Seen = (String, Option<SocketAddr>, Option<String>);
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let extractor = key_fn({
        let seen = Arc::clone(&seen);
        move |req: &dyn RequestView| {
            let shown = format!("{} {}", req.method(), req.path());
            let query = req.query().map(str::to_owned);
            seen.lock().unwrap().push((shown, req.peer_addr(), query));
            Ok(req
                .header(IDEMPOTENCY_KEY)
                .map(|k| LockKey::from_parts([k])))
        }
    });
    let policy = LockPolicy::builder(redlock, extractor)
        .build()
        .expect("a valid policy");
    let probe = Probe::new();
    probe.open();
    let app = F::serve(&App::gated(ORDERS, policy, &probe)).await;
    let http = http_client();
    let url = format!("{}?expand=all", app.url(ORDERS));
    let v = reply(post_with(&http, &url, &["\"zebra-secret\""]))
        .await
        .ok();
    assert_eq!(v["locked"], true, "{v}");

    let seen = seen.lock().unwrap().clone();
    let (shown, peer, query) = seen.first().expect("the extractor ran");
    assert_eq!(shown, &format!("POST {ORDERS}"));
    assert_eq!(query.as_deref(), Some("expand=all"));
    let peer = peer.expect("the client's address");
    assert!(peer.ip().is_loopback() && peer.port() != 0, "{peer}");
    assert_all_empty(&m).await;
    drop(http);
    app.stop().await;
}
