//! The replicas a flood is sent to, each confined to one CPU: an axum app on an OS thread of
//! its own with a current-thread Tokio runtime, or an actix-web `HttpServer` with one worker.
//! Each builds its own client on that thread and warms it up there (through a route of its
//! own), so its Redis connections are driven by the replica's one thread too.
//!
//! Both serve `POST PATH` behind the lock middleware with the policy the test chooses, and a
//! handler that counts its runs and answers `{"payment_id":"pay_<run>"}`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, OnceLock, Weak};
use std::thread::JoinHandle;

use actix_web::dev::ServerHandle;
use actix_web::{web, App, HttpServer};
use tokio::sync::oneshot;

use crate::support::apps::PATH;
use crate::support::http::within;
use crate::support::{warm_up, Masters};
use tower_redlock::policy::LockPolicy;
use tower_redlock::{LeaseHandle, Redlock, RedlockLayer, RedlockMiddleware};

/// The route that warms a replica's client up on the replica's own thread.
const WARM_UP: &str = "/warm-up";

/// The policy of a replica's middleware, made from the replica's client.
pub type PolicyFor = fn(Redlock) -> LockPolicy;

/// How a replica runs besides its policy: the handler's work (the examples' `WORK_MS`), and
/// whether its one thread is pinned to CPU 0 (where a test may put a CPU hog beside it).
#[derive(Debug, Clone, Copy, Default)]
pub struct Setup {
    pub work: std::time::Duration,
    pub pinned: bool,
}

/// Pins the calling thread to CPU 0 (`taskset`, util-linux).
fn pin_this_thread() {
    let me = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self");
    let tid = me
        .file_name()
        .and_then(|t| t.to_str())
        .expect("a thread id")
        .to_owned();
    let status = std::process::Command::new("taskset")
        .args(["-p", "-c", "0", &tid])
        .stdout(std::process::Stdio::null())
        .status()
        .expect("run taskset");
    assert!(status.success(), "taskset -p -c 0 {tid}: {status}");
}

/// The client of a replica: the crate's defaults (`Redlock::new`: 50 ms node timeout,
/// suspension after 3 timeouts in a row). Built on the replica's thread.
fn replica_client(urls: &[String]) -> Redlock {
    Redlock::new(urls).expect("a valid client")
}

/// `GET /warm-up`: warms the replica's client up on the replica's own runtime, so that its
/// lazily made Redis connections are driven there. The replica holds the masters weakly: a
/// replica that outlives its test keeps no `redis-server` alive.
async fn warm_up_here(redlock: Redlock, masters: Weak<Masters>) -> &'static str {
    let masters = masters.upgrade().expect("the test still holds the masters");
    warm_up(&redlock, &masters).await;
    "warm"
}

/// The handler, under the lock (the `LeaseHandle` is there only if the middleware took one):
/// some async work (`work`, or a yield), then a payment id made of its run number.
async fn pay(_lease: LeaseHandle, runs: Arc<AtomicUsize>, work: std::time::Duration) -> String {
    if work.is_zero() {
        tokio::task::yield_now().await;
    } else {
        tokio::time::sleep(work).await;
    }
    let run = runs.fetch_add(1, SeqCst);
    format!("{{\"payment_id\":\"pay_{run}\"}}")
}

/// Asks a replica to warm its client up, and waits until it has.
async fn warm_up_over_http(url: &str) {
    let response = crate::support::http::send(crate::support::http::http_client().get(url)).await;
    assert_eq!(response.status().as_u16(), 200, "GET {url}");
}

/// An axum replica on an OS thread of its own, with a current-thread Tokio runtime that
/// serves the app and drives the replica's Redis connections. Stopped (runtime dropped,
/// thread joined) on drop.
pub struct AxumReplica {
    addr: SocketAddr,
    /// The replica's client.
    pub redlock: Redlock,
    /// How many times the handler ran.
    pub runs: Arc<AtomicUsize>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl AxumReplica {
    pub async fn start(masters: &Arc<Masters>, policy: PolicyFor) -> Self {
        Self::start_with(masters, policy, Setup::default()).await
    }

    pub async fn start_with(masters: &Arc<Masters>, policy: PolicyFor, setup: Setup) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let addr = listener.local_addr().expect("local addr");
        let urls = masters.urls();
        let weak = Arc::downgrade(masters);
        let runs = Arc::new(AtomicUsize::new(0));
        let counter = runs.clone();
        let (client_tx, client_rx) = oneshot::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("axum-replica".into())
            .spawn(move || {
                if setup.pinned {
                    pin_this_thread();
                }
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a current-thread runtime");
                runtime.block_on(async move {
                    let redlock = replica_client(&urls);
                    let _ = client_tx.send(redlock.clone());
                    let warm = redlock.clone();
                    let payments = axum::Router::new()
                        .route(
                            PATH,
                            axum::routing::post(move |lease| {
                                pay(lease, counter.clone(), setup.work)
                            }),
                        )
                        .layer(RedlockLayer::new(policy(redlock)));
                    let app = axum::Router::new()
                        .route(
                            WARM_UP,
                            axum::routing::get(move || warm_up_here(warm.clone(), weak.clone())),
                        )
                        .merge(payments);
                    let listener =
                        tokio::net::TcpListener::from_std(listener).expect("a Tokio listener");
                    tokio::select! {
                        served = axum::serve(listener, app) => served.expect("axum::serve"),
                        _ = stopped => {}
                    }
                });
            })
            .expect("spawn the replica's thread");
        let redlock = within("the axum replica's client", client_rx)
            .await
            .expect("the replica's thread started");
        let replica = Self {
            addr,
            redlock,
            runs,
            stop: Some(stop),
            thread: Some(thread),
        };
        warm_up_over_http(&replica.url(WARM_UP)).await;
        replica
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for AxumReplica {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            // Quick: dropping a current-thread runtime cancels its tasks at once.
            let joined = thread.join();
            if joined.is_err() && !std::thread::panicking() {
                panic!("the axum replica's thread panicked");
            }
        }
    }
}

/// An actix-web replica with one worker (one thread: at most one CPU), which builds the
/// replica's client and drives its Redis connections. Stopped on drop.
pub struct ActixReplica {
    addr: SocketAddr,
    /// The replica's client.
    pub redlock: Redlock,
    /// How many times the handler ran.
    pub runs: Arc<AtomicUsize>,
    handle: ServerHandle,
    server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl ActixReplica {
    pub async fn start(masters: &Arc<Masters>, policy: PolicyFor) -> Self {
        Self::start_with(masters, policy, Setup::default()).await
    }

    pub async fn start_with(masters: &Arc<Masters>, policy: PolicyFor, setup: Setup) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("local addr");
        let urls = masters.urls();
        let weak = Arc::downgrade(masters);
        let runs = Arc::new(AtomicUsize::new(0));
        let counter = runs.clone();
        // The app factory runs on the worker's thread: the client is built there.
        let client: Arc<OnceLock<Redlock>> = Arc::default();
        let slot = client.clone();
        let server = HttpServer::new(move || {
            // On the worker's thread (one worker): pinned with it.
            let redlock = slot
                .get_or_init(|| {
                    if setup.pinned {
                        pin_this_thread();
                    }
                    replica_client(&urls)
                })
                .clone();
            let warm = (redlock.clone(), weak.clone());
            let counter = counter.clone();
            App::new()
                .route(
                    WARM_UP,
                    web::get().to(move || warm_up_here(warm.0.clone(), warm.1.clone())),
                )
                .service(
                    web::resource(PATH).route(
                        web::post()
                            .to(move |lease| pay(lease, counter.clone(), setup.work))
                            .wrap(RedlockMiddleware::new(policy(redlock))),
                    ),
                )
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(5)
        .listen(listener)
        .expect("listen on the bound socket")
        .run();
        let handle = server.handle();
        let server = Some(tokio::spawn(server));
        warm_up_over_http(&format!("http://{addr}{WARM_UP}")).await;
        let redlock = client.get().expect("the worker built the client").clone();
        Self {
            addr,
            redlock,
            runs,
            handle,
            server,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

impl Drop for ActixReplica {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            // Sends the command at once; the server task carries it out.
            drop(self.handle.stop(false));
            drop(server);
        }
    }
}
