//! One request to one voter: a [`Voter`] (a node as the client holds it), and a [`Call`] to it. The
//! call is the node's call, bounded by the node timeout as this process experiences it, and
//! reported to the node's health (and counted in the metrics). A suspended voter is probed here,
//! and what a voter is owed (see `owed.rs`) is paid here when it answers again.
//!
//! A timer that fires late means this process did not run (a blocked thread, a starved CPU, a
//! flooded runtime). The node is not blamed for that time, and the request gets it back before it
//! may time out. It gets up to [`MAX_EXCUSE`] node timeouts in all, or [`MAX_EXCUSE_ANSWERING`]
//! while the node answers other requests meanwhile (its answer to this one is then queued behind
//! our own backlog). A timer that fires on time while the node keeps answering other requests waits
//! another node timeout, within the same bound: a flooded process reads its replies late, on time
//! by its timers. Otherwise a timer on time gets one last look a few milliseconds later. That way
//! an answer already in the socket, whose reader may be queued behind this request, still counts.
//! So a master that answers is neither counted as failed nor suspended because this process was
//! busy: only a node silent for a whole node timeout is.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use tracing::Instrument;

use super::health::Health;
use super::owed::{Debt, Ledger, Owed};
use super::telemetry::{self, Background};
use crate::error::NodeError;
use crate::metrics;
use crate::node::{AnyNode, CallError, CompleteRequest, FenceFloor, NodeFuture, ReleaseRequest};

/// One node as the client holds it: the node, its name, its recent timeouts, and what it
/// is owed (see `owed.rs`).
#[derive(Debug)]
pub(crate) struct Voter {
    pub(crate) node: AnyNode,
    pub(crate) name: Arc<str>,
    pub(crate) health: Health,
    pub(crate) owed: Ledger,
}

impl Drop for Voter {
    /// The client is gone: a node it had suspended is no longer counted suspended by it.
    fn drop(&mut self) {
        if self.health.reported_suspended() {
            metrics::node_suspended(&self.name, false);
        }
    }
}

/// One node's answer: its index, and its result or why it has none.
pub(crate) type Answer<T> = (usize, Result<T, NodeError>);

/// The most time a request is given back for stalls of this process, in node timeouts.
pub(crate) const MAX_EXCUSE: u32 = 4;
/// ... and while the node keeps answering other requests meanwhile: a saturated replica
/// reads answers up to seconds late (measured by the storms of `tests/flood/`) from masters that are
/// fine. Either way at most [`MAX_EXCUSE_TIME`] in all.
pub(crate) const MAX_EXCUSE_ANSWERING: u32 = 100;
/// The most time a request is given back for stalls, whatever the node timeout.
pub(crate) const MAX_EXCUSE_TIME: Duration = Duration::from_secs(5);

/// How late a timer may fire before it counts as a stall of this process: the timer wheel's
/// millisecond plus a tenth of the node timeout.
fn stall_threshold(timeout: Duration) -> Duration {
    timeout / 10 + Duration::from_millis(1)
}

pin_project_lite::pin_project! {
    /// One request to one node, bounded by the node timeout as this process experiences it,
    /// and reported to the node's health.
    pub(crate) struct Call<F> {
        #[pin]
        call: F,
        #[pin]
        timer: tokio::time::Sleep,
        voter: Arc<Voter>,
        pub(super) index: usize,
        timeout: Duration,
        // The time given back for stalls so far.
        excused: Duration,
        // Whether it was polled: a request never polled was never sent.
        pub(super) started: bool,
        // Whether the on-time timer's last look was given.
        looked: bool,
        // The node's answer count when the request was made.
        answers: u64,
        // A suspended node's probe.
        probe: bool,
    }
}

impl<F> Call<F> {
    pub(super) fn new(
        call: F,
        voter: Arc<Voter>,
        index: usize,
        timeout: Duration,
        probe: bool,
    ) -> Self {
        Self {
            answers: voter.health.answers(),
            call,
            timer: tokio::time::sleep(timeout),
            voter,
            index,
            timeout,
            excused: Duration::ZERO,
            started: false,
            looked: false,
            probe,
        }
    }
}

impl<T, F: Future<Output = Result<T, CallError>>> Future for Call<F> {
    type Output = Answer<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Answer<T>> {
        let mut this = self.project();
        *this.started = true;
        let (i, v) = (*this.index, &**this.voter);
        if let Poll::Ready(r) = this.call.poll(cx) {
            return Poll::Ready(match r {
                Ok(x) => {
                    heard_from(this.voter, i, *this.timeout);
                    (i, Ok(x))
                }
                Err(e) => {
                    if e.is_local() {
                        // The voter abstained without asking the node: nothing heard.
                    } else if e.is_timeout() || e.is_unreachable() {
                        no_answer(this.voter, i, *this.timeout, *this.probe);
                    } else {
                        // A reply, if an error reply: the node is there.
                        heard_from(this.voter, i, *this.timeout);
                    }
                    let e = NodeError::from_source(i, v.name.clone(), e);
                    failed(v, &e, *this.probe);
                    (i, Err(e))
                }
            });
        }
        loop {
            ready!(this.timer.as_mut().poll(cx));
            // The timer's own clock (paused in users' tests with `tokio::time::pause`).
            let now = tokio::time::Instant::now();
            let late = now.saturating_duration_since(this.timer.deadline());
            // While the node answers other requests, its answer to this one is likely queued
            // behind our own backlog: a longer excuse.
            let answering = v.health.answers() != *this.answers;
            let times = if answering {
                MAX_EXCUSE_ANSWERING
            } else {
                MAX_EXCUSE
            };
            let budget = this.timeout.saturating_mul(times).min(MAX_EXCUSE_TIME);
            if late > stall_threshold(*this.timeout) && *this.excused < budget {
                // This process was stalled: give the node that time back, so that its answer
                // — likely read by now, or about to be — is not lost to our own delay.
                let back = late.min(*this.timeout).min(budget - *this.excused);
                *this.excused += back;
                this.timer.as_mut().reset(now + back);
                continue;
            }
            if answering && *this.excused < budget {
                // On time, but the node answered other requests since this one was made (or
                // last looked at): it is alive and answers in order, and this answer is queued
                // behind those — in the node, or in our own backlog of replies to read. Wait
                // another node timeout, for as long as it keeps answering: a node is failed
                // (and suspended) for its own silence, never for our queueing.
                *this.answers = v.health.answers();
                let more = (*this.timeout).min(budget - *this.excused);
                *this.excused += more;
                this.timer.as_mut().reset(now + more);
                continue;
            }
            if !*this.looked {
                // On time: one last look after the runtime had a turn to read the sockets.
                *this.looked = true;
                let look = stall_threshold(*this.timeout);
                *this.excused += look;
                this.timer.as_mut().reset(now + look);
                continue;
            }
            no_answer(this.voter, i, *this.timeout, *this.probe);
            let waited = *this.timeout + *this.excused;
            let e = NodeError::timeout(i, v.name.clone(), waited);
            failed(v, &e, *this.probe);
            return Poll::Ready((i, Err(e)));
        }
    }
}

/// A request to node `i` got no answer: counted against its health, which may suspend it —
/// then a task probes it until it answers again.
fn no_answer(voter: &Arc<Voter>, i: usize, timeout: Duration, probe: bool) {
    if voter.health.timed_out(probe) {
        tracing::warn!(node = %voter.name, "node suspended: no answer for a node timeout; probing it");
        report_suspended(voter);
        start_probing(voter, i, timeout);
    }
}

/// The node answered (a reply, even an error reply): if that restored it, say so; if it is
/// owed releases or completions, pay them.
fn heard_from(voter: &Arc<Voter>, i: usize, timeout: Duration) {
    if voter.health.answered() {
        tracing::info!(node = %voter.name, "node restored: it answered again");
        report_suspended(voter);
    }
    if !voter.owed.is_empty() {
        pay(voter, i, timeout);
    }
}

/// How many of a node's debts are paid at once.
const PAYING_AT_ONCE: usize = 32;

/// Pays what node `i` is owed (see `owed.rs`), in a task: every debt sent, each a request
/// bounded by the node timeout and reported to the node's health like any other; a debt
/// that got no answer is owed again (while it has not lapsed), paid at the node's next
/// answer. Debts owed while a payment ran are paid right after it, unless some of it got no
/// answer (then the node's next answer pays them: no loop against a node that is gone).
fn pay(voter: &Arc<Voter>, i: usize, timeout: Duration) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let Some(debts) = voter.owed.start_paying() else {
        return;
    };
    // Made before the task: it ends the payment also if the task is dropped unpolled or
    // midway (the runtime shutting down), and owes again what was not sent.
    let mut paying = Paying {
        voter: voter.clone(),
        debts: debts.into_iter(),
    };
    let payment = async move {
        let voter = paying.voter.clone();
        let mut sent = FuturesUnordered::new();
        let mut unanswered = false;
        loop {
            // Once the node is suspended again, the rest waits for its next answer.
            while sent.len() < PAYING_AT_ONCE && !(unanswered && voter.health.is_suspended()) {
                let Some(debt) = paying.debts.next() else {
                    break;
                };
                let debt = Arc::new(debt);
                let (node, owed) = (voter.clone(), debt.clone());
                let call = async move { settle(&node.node, &owed).await };
                let request = Call::new(call, voter.clone(), i, timeout, false);
                sent.push(request.map(move |(_, answer)| (debt, answer)));
            }
            let Some((debt, answer)) = sent.next().await else {
                break;
            };
            if answer.is_err_and(|e| e.is_transient()) {
                unanswered = true;
                let debt = Arc::try_unwrap(debt).unwrap_or_else(|d| (*d).clone());
                voter.owed.owe(debt);
            }
        }
        drop(paying);
        if !unanswered && !voter.owed.is_empty() {
            pay(&voter, i, timeout);
        }
    };
    rt.spawn(payment.instrument(telemetry::background(Background::Owed)));
}

/// A node's payment under way: when dropped, what it did not send is owed again and the
/// payment ends.
struct Paying {
    voter: Arc<Voter>,
    debts: std::vec::IntoIter<Owed>,
}

impl Drop for Paying {
    fn drop(&mut self) {
        for debt in self.debts.by_ref() {
            self.voter.owed.owe(debt);
        }
        self.voter.owed.paid();
    }
}

/// Sends one debt to `node`: the release or the completion it stands for (the fenced form
/// with a fence; the plain one where the node keeps no counters).
async fn settle(node: &AnyNode, d: &Owed) -> Result<bool, CallError> {
    if let Some(f) = &d.fence {
        match ask(node, d, Some(f.floor())).await {
            Err(e) if e.is_unsupported() => {}
            answer => return answer,
        }
    }
    ask(node, d, None).await
}

/// The request `d` stands for, to `node`: with `fence`, its fenced form.
fn ask<'a>(node: &'a AnyNode, d: &'a Owed, fence: Option<FenceFloor<'a>>) -> NodeFuture<'a, bool> {
    let token = d.token.as_str();
    match &d.debt {
        Debt::Release => {
            let request = ReleaseRequest::new(&d.key, token);
            Box::pin(node.release(fence.map_or(request, |f| request.fenced(f)), None))
        }
        Debt::Complete {
            record_key,
            record,
            retention,
        } => {
            let request = CompleteRequest::new(&d.key, record_key, token, record, *retention);
            node.complete(fence.map_or(request, |f| request.fenced(f)))
        }
    }
}

/// Counts the node in or out of the clients that suspend it (`redlock_node_suspended`), when
/// its state changed since the last report.
pub(crate) fn report_suspended(voter: &Voter) {
    voter
        .health
        .report_suspended(|suspended| metrics::node_suspended(&voter.name, suspended));
}

/// A request failed: logged at debug and counted (not a suspended node's probes).
fn failed(voter: &Voter, e: &NodeError, probe: bool) {
    tracing::debug!(node = %voter.name, error = %e, "node request failed");
    if !probe {
        metrics::node_failed(&voter.name, e.vote());
    }
}

/// Probes a suspended node in a task of its own, after each backoff, until it answers (its
/// reply restores it, whoever gets it) or the client is gone. It runs whether or not locks
/// are taken, so an idle client's `node_status` recovers too.
fn start_probing(voter: &Arc<Voter>, i: usize, timeout: Duration) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        // No runtime: `Health::admit` lets an in-band probe through after a while.
        return;
    };
    if !voter.health.start_probing() {
        return;
    }
    let weak = Arc::downgrade(voter);
    rt.spawn(async move {
        loop {
            let Some(backoff) = weak.upgrade().map(|v| v.health.backoff()) else {
                return;
            };
            tokio::time::sleep(backoff).await;
            let Some(v) = weak.upgrade() else {
                return;
            };
            v.health.probing_alive();
            if v.health.is_suspended() {
                let node = v.clone();
                let call = async move {
                    let probe = ReleaseRequest::new(PROBE_KEY, PROBE_TOKEN);
                    node.node.release(probe, None).await
                };
                let answered = Call::new(call, v.clone(), i, timeout, true).await.1.is_ok();
                if !answered {
                    continue;
                }
            }
            if !v.health.stop_probing() {
                return;
            }
        }
    });
}

/// The key and token of a probe: a compare-and-delete of a key nobody holds, whose answer —
/// any answer — shows that the node is back.
const PROBE_KEY: &str = "tower-redlock:probe";
const PROBE_TOKEN: &str = "-";
