//! What the handlers report back to the test: the [`Probe`] that gated handlers pass (how many
//! started, how many are inside at once, finished, cancelled, and the gate that holds them
//! inside their critical section), and the [`Streams`] a streaming handler takes its response
//! body from. One probe may be shared by several apps, axum and actix-web alike.

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tokio::sync::{mpsc, watch, Semaphore};

use crate::support::http::within;

/// How many gated handlers started, are inside, finished or were dropped, and the gate that
/// holds them inside until the test lets them out.
pub struct Probe {
    started: watch::Sender<usize>,
    inside: AtomicUsize,
    max_inside: AtomicUsize,
    completed: AtomicUsize,
    cancelled: AtomicUsize,
    /// Closed: every handler passes. Otherwise each permit lets one handler out.
    gate: Semaphore,
}

impl Probe {
    /// A probe with the gate shut.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            started: watch::Sender::new(0),
            inside: AtomicUsize::new(0),
            max_inside: AtomicUsize::new(0),
            completed: AtomicUsize::new(0),
            cancelled: AtomicUsize::new(0),
            gate: Semaphore::new(0),
        })
    }

    /// A probe whose handlers pass straight through.
    pub fn open_gate() -> Arc<Self> {
        let probe = Self::new();
        probe.open();
        probe
    }

    /// The critical section of a handler: enter, wait at the gate, leave. A handler dropped
    /// at the gate (its request was cancelled) leaves without completing, and counts as
    /// cancelled.
    pub async fn pass(&self) {
        struct Inside<'a> {
            probe: &'a Probe,
            completed: bool,
        }
        impl Drop for Inside<'_> {
            fn drop(&mut self) {
                self.probe.inside.fetch_sub(1, SeqCst);
                let count = if self.completed {
                    &self.probe.completed
                } else {
                    &self.probe.cancelled
                };
                count.fetch_add(1, SeqCst);
            }
        }
        let now = self.inside.fetch_add(1, SeqCst) + 1;
        let mut inside = Inside {
            probe: self,
            completed: false,
        };
        self.max_inside.fetch_max(now, SeqCst);
        self.started.send_modify(|n| *n += 1);
        if let Ok(permit) = self.gate.acquire().await {
            permit.forget();
        }
        inside.completed = true;
    }

    /// Lets every handler, waiting or to come, through.
    pub fn open(&self) {
        self.gate.close();
    }

    /// Lets one handler through.
    pub fn let_one_out(&self) {
        self.gate.add_permits(1);
    }

    /// Waits until `n` handlers have started.
    pub async fn until_started(&self, n: usize) {
        let mut started = self.started.subscribe();
        within(
            format!("{n} handler(s) to start"),
            started.wait_for(|s| *s >= n),
        )
        .await
        .expect("the probe lives");
    }

    pub fn started(&self) -> usize {
        *self.started.borrow()
    }

    /// Handlers inside the critical section now.
    pub fn inside(&self) -> usize {
        self.inside.load(SeqCst)
    }

    /// The most handlers that were inside at once.
    pub fn max_inside(&self) -> usize {
        self.max_inside.load(SeqCst)
    }

    pub fn completed(&self) -> usize {
        self.completed.load(SeqCst)
    }

    /// Handlers dropped before they finished (their request was cancelled).
    pub fn cancelled(&self) -> usize {
        self.cancelled.load(SeqCst)
    }

    /// The client gives up on `request` (its connection is closed), and the server drops
    /// the handler: waits until this probe counted `n` handlers dropped.
    pub async fn client_gives_up<T: std::fmt::Debug>(
        &self,
        request: tokio::task::JoinHandle<T>,
        n: usize,
    ) {
        request.abort();
        assert!(within("the aborted request", request)
            .await
            .expect_err("aborted")
            .is_cancelled());
        crate::support::eventually(
            "the server drops the handler of the closed connection",
            crate::support::apps::RELEASED_WITHIN,
            || async { self.cancelled() == n },
        )
        .await;
    }
}

/// Where a streaming handler takes its response body from: the receiving end of a channel
/// the test writes ([`Streams::next`]); without one it answers [`NOT_STREAMED`].
#[derive(Default)]
pub struct Streams {
    next: Mutex<Option<mpsc::Receiver<Bytes>>>,
    served: AtomicUsize,
}

/// The body of a streaming handler that had no stream waiting for it.
pub const NOT_STREAMED: &str = "not streamed";

impl Streams {
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// The writing end of the next streamed body: each `Bytes` is a chunk, dropping it ends
    /// the body.
    pub fn next(&self) -> mpsc::Sender<Bytes> {
        let (tx, rx) = mpsc::channel(1);
        *self.next.lock().unwrap() = Some(rx);
        tx
    }

    /// The handler's side: counts a request served, and takes the body waiting for it.
    pub fn take(&self) -> Option<mpsc::Receiver<Bytes>> {
        self.served.fetch_add(1, SeqCst);
        self.next.lock().unwrap().take()
    }

    /// How many requests the streaming handler served.
    pub fn served(&self) -> usize {
        self.served.load(SeqCst)
    }
}
