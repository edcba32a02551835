//! `redlock key` gives the key the middleware locks — on axum and on actix-web — and
//! `redlock inspect` shows its holder while the handler runs, then the key free.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tower_redlock::key::{IdempotencyKey, KeyExtractorExt};
use tower_redlock::policy::LockPolicy;
use tower_redlock_testkit::apps::{assert_held_on_quorum, client_of};
use tower_redlock_testkit::{eventually, Masters};

use crate::common::{code, everything, inspect_json, redlock, stdout};

/// The longest a step may take before the test fails (never a sleep: a bound on a wait).
const BOUND: Duration = Duration::from_secs(10);

/// The request's parts and the app's extractor, as `redlock key` flags.
const KEY_ARGS: &[&str] = &[
    "key",
    "--path",
    "/payments/7",
    "--route",
    "/payments/{id}",
    "--header",
    "idempotency-key: \"k-1\"",
    "--header",
    "x-tenant-id: acme",
    "--scope",
    "route",
    "--scope",
    "header:x-tenant-id",
];

/// What the handler waits on: it says it runs, then waits until the test lets it finish.
#[derive(Clone)]
struct Gate {
    entered: mpsc::UnboundedSender<()>,
    release: Arc<Notify>,
}

impl Gate {
    async fn pass(&self) {
        let _ = self.entered.send(());
        self.release.notified().await;
    }
}

/// Three masters, the app's policy (Idempotency-Key scoped by route and tenant header), the
/// gate, and the test's ends of it.
async fn setup() -> (
    Masters,
    LockPolicy,
    Gate,
    mpsc::UnboundedReceiver<()>,
    Arc<Notify>,
) {
    let masters = Masters::start(3);
    let extractor = IdempotencyKey::required()
        .scoped_by_route()
        .scoped_by_header("x-tenant-id");
    let policy = LockPolicy::builder(client_of(&masters).await, extractor)
        .build()
        .expect("a valid policy");
    let (entered, entered_rx) = mpsc::unbounded_channel();
    let release = Arc::new(Notify::new());
    let gate = Gate {
        entered,
        release: release.clone(),
    };
    (masters, policy, gate, entered_rx, release)
}

/// While the handler at `url` runs: the CLI's key is held on a quorum and inspect shows its
/// holder; once it returns, inspect says free.
async fn key_and_inspect_while_held(
    masters: &Masters,
    url: String,
    entered: &mut mpsc::UnboundedReceiver<()>,
    release: &Notify,
) {
    let request = tokio::spawn(
        reqwest::Client::new()
            .post(url)
            .header("idempotency-key", "\"k-1\"")
            .header("x-tenant-id", "acme")
            .send(),
    );
    tokio::time::timeout(BOUND, entered.recv())
        .await
        .expect("the handler runs")
        .expect("the gate is open");

    let out = redlock(KEY_ARGS).await;
    assert_eq!(code(&out), 0, "{}", everything(&out));
    let key = stdout(&out).trim().to_owned();
    assert!(key.starts_with("tower-redlock:"), "{key}");
    assert_held_on_quorum(masters, &key).await;

    let seen = inspect_json(masters, &key).await;
    assert_eq!(seen["key"], key.as_str(), "{seen}");
    assert_eq!(seen["summary"], "held", "{seen}");
    assert_eq!(seen["quorum"], 2, "{seen}");
    let prefix = seen["holder"]["token_prefix"].as_str().expect("a holder");
    assert_eq!(prefix.len(), 8, "{seen}");
    assert!(seen["holder"]["ttl_ms"].as_u64().unwrap() > 0, "{seen}");
    let values = masters.values(&key).await;
    let holding = values
        .iter()
        .flatten()
        .filter(|v| v.starts_with(prefix))
        .count();
    assert!(holding >= 2, "{prefix} vs {values:?}");
    let voters = seen["voters"].as_array().unwrap();
    assert_eq!(voters.len(), 3);
    assert!(voters.iter().all(|v| v["error"].is_null()), "{seen}");

    release.notify_one();
    let reply = tokio::time::timeout(BOUND, request)
        .await
        .expect("the request ends")
        .expect("the request task")
        .expect("a reply");
    assert_eq!(reply.status(), 200);
    let key = &key;
    eventually("inspect says free", BOUND, || async move {
        inspect_json(masters, key).await["summary"] == "free"
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn key_cli_matches_the_key_the_axum_middleware_locks_and_inspect_shows_the_holder() {
    use axum::{routing::post, Router};
    use tower_redlock::RedlockLayer;
    use tower_redlock_testkit::HttpApp;

    let (masters, policy, gate, mut entered, release) = setup().await;
    let handler = move || {
        let gate = gate.clone();
        async move {
            gate.pass().await;
            "paid"
        }
    };
    let router = Router::new().route(
        "/payments/{id}",
        post(handler).route_layer(RedlockLayer::new(policy)),
    );
    let app = HttpApp::serve(router).await;
    key_and_inspect_while_held(&masters, app.url("/payments/7"), &mut entered, &release).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn key_cli_matches_the_key_the_actix_middleware_locks_and_inspect_shows_the_holder() {
    use actix_web::{web, App, HttpResponse, HttpServer};
    use tower_redlock::RedlockMiddleware;

    let (masters, policy, gate, mut entered, release) = setup().await;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    let addr = listener.local_addr().expect("local addr");
    // One worker with an actix runtime of its own; the server future on the test's runtime.
    let server = HttpServer::new(move || {
        let gate = gate.clone();
        let handler = move || {
            let gate = gate.clone();
            async move {
                gate.pass().await;
                HttpResponse::Ok().body("paid")
            }
        };
        App::new().service(
            web::resource("/payments/{id}").route(
                web::post()
                    .to(handler)
                    .wrap(RedlockMiddleware::new(policy.clone())),
            ),
        )
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(1)
    .listen(listener)
    .expect("listen on the bound socket")
    .run();
    let handle = server.handle();
    let running = tokio::spawn(server);
    let url = format!("http://{addr}/payments/7");
    key_and_inspect_while_held(&masters, url, &mut entered, &release).await;
    handle.stop(true).await;
    let _ = tokio::time::timeout(BOUND, running).await;
}
