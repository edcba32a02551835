//! What a node is owed: the releases and completions that could not reach it while a lock of ours
//! may still be there. The node was suspended, or gave no answer until the caller's patience and
//! the background's retries ran out. Each node keeps its ledger, paid as soon as the node answers
//! again (a request's answer, or the probe that restores it), as long as this client lives. So a
//! master that froze and came back keeps none of the locks it was sent.
//!
//! A debt is small (the key, the token, the fencing token; a completion's record is shared,
//! not copied) and lapses once the lock can no longer be on the node. A ledger holds at most
//! [`MAX_OWED`] debts and [`MAX_OWED_BYTES`] of keys and records; past that the oldest lapse
//! early (their locks expire with their ttl, as without a ledger), with a warning.
//!
//! Limits, none of them a safety matter (every payment is owner-only, fenced by the token,
//! so it can never remove or overwrite another holder's lock or record):
//! - a debt lapses on this process's clock (the lock's ttl after its validity ended, as this
//!   process measured it): on a node whose clock runs slow the lock may outlive its debt,
//!   and then expires with its ttl there;
//! - debts are paid in parallel, in no particular order, and not in order with the requests of the
//!   node's next answers. A payment may reach the node after a newer request for the same key. A
//!   lock of the next holder is untouched by it, and a completion's record reaches only a node
//!   where the lock is still ours;
//! - a ledger lives in the client: a process that exits owes nothing any more.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::fencing::Fence;
use super::token::Token;
use crate::metrics;

/// The most debts a node's ledger keeps.
pub(crate) const MAX_OWED: usize = 65_536;
/// The most bytes of keys and records a node's ledger keeps (64 MiB).
pub(crate) const MAX_OWED_BYTES: usize = 64 << 20;

/// What is owed.
#[derive(Debug, Clone)]
pub(crate) enum Debt {
    /// The compare-and-delete of the token (the fenced release with a fence).
    Release,
    /// The completion record, stored where the token still holds.
    Complete {
        record_key: Arc<str>,
        record: Bytes,
        retention: Duration,
    },
}

/// One debt to one node (no `Debug`: it holds a token).
#[derive(Clone)]
pub(crate) struct Owed {
    pub(crate) key: Arc<str>,
    pub(crate) token: Token,
    /// The lease's fencing token: raised first, as the release or completion it stands for.
    pub(crate) fence: Option<Fence>,
    pub(crate) debt: Debt,
    /// After this the lock can no longer be on the node: the debt lapses.
    pub(crate) until: Instant,
}

impl Owed {
    /// What it holds, in bytes (its key and record; the rest is small and fixed).
    fn bytes(&self) -> usize {
        self.key.len()
            + match &self.debt {
                Debt::Release => 0,
                Debt::Complete {
                    record_key, record, ..
                } => record_key.len() + record.len(),
            }
    }
}

/// One node's debts, counted by the `redlock_owed_debts` and `redlock_owed_bytes` gauges.
pub(crate) struct Ledger {
    /// The node's name (the gauges' `node` label, the warning's `node` field).
    name: Arc<str>,
    debts: Mutex<Debts>,
    /// How many debts (read without the lock on every answer of the node).
    len: AtomicUsize,
    /// Whether a payment is under way (one at a time).
    paying: AtomicBool,
    /// Whether a full ledger was reported (once).
    overflowed: AtomicBool,
}

impl Drop for Ledger {
    /// The client is gone: what it still owed lapses (the locks expire with their ttl), and
    /// leaves the gauges.
    fn drop(&mut self) {
        let debts = self.debts.get_mut().unwrap_or_else(|e| e.into_inner());
        metrics::owed(&self.name, false, debts.queue.len(), debts.bytes);
    }
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("debts", &self.len.load(Relaxed))
            .finish()
    }
}

/// The debts, oldest first, and their bytes.
#[derive(Default)]
struct Debts {
    queue: VecDeque<Owed>,
    bytes: usize,
}

impl Debts {
    fn pop_front(&mut self) -> Option<Owed> {
        let d = self.queue.pop_front()?;
        self.bytes -= d.bytes();
        Some(d)
    }
}

impl Ledger {
    /// The ledger of the node `name`.
    pub(crate) fn new(name: Arc<str>) -> Self {
        Self {
            name,
            debts: Mutex::default(),
            len: AtomicUsize::new(0),
            paying: AtomicBool::new(false),
            overflowed: AtomicBool::new(false),
        }
    }

    /// Records a debt; a full ledger first drops the lapsed debts at its front, then lets
    /// its oldest lapse. (Debts are owed roughly in the order they lapse, not exactly: a
    /// lapsed debt behind a live one stays until the next payment drops it.)
    pub(crate) fn owe(&self, debt: Owed) {
        let mut debts = self.debts.lock().unwrap_or_else(|e| e.into_inner());
        let full = |d: &Debts| d.queue.len() >= MAX_OWED || d.bytes + debt.bytes() > MAX_OWED_BYTES;
        let (len, bytes) = (debts.queue.len(), debts.bytes);
        if full(&debts) {
            let now = Instant::now();
            while debts.queue.front().is_some_and(|d| d.until <= now) {
                debts.pop_front();
            }
        }
        if full(&debts) {
            while full(&debts) && debts.pop_front().is_some() {}
            if !self.overflowed.swap(true, Relaxed) {
                tracing::warn!(
                    node = %self.name,
                    "more than {MAX_OWED} releases and completions (or {MAX_OWED_BYTES} bytes) \
                     owed to this node: the oldest lapse (their locks expire with their ttl)"
                );
            }
        }
        // What lapsed, then the new debt.
        metrics::owed(
            &self.name,
            false,
            len - debts.queue.len(),
            bytes - debts.bytes,
        );
        metrics::owed(&self.name, true, 1, debt.bytes());
        debts.bytes += debt.bytes();
        debts.queue.push_back(debt);
        self.len.store(debts.queue.len(), Relaxed);
    }

    /// Whether nothing is owed (one atomic load).
    pub(crate) fn is_empty(&self) -> bool {
        self.len.load(Relaxed) == 0
    }

    /// Takes the debts that have not lapsed, to pay them, unless a payment is under way.
    /// [`Ledger::paid`] ends it.
    pub(crate) fn start_paying(&self) -> Option<Vec<Owed>> {
        if self.paying.swap(true, Relaxed) {
            return None;
        }
        let mut debts = self.debts.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        metrics::owed(&self.name, false, debts.queue.len(), debts.bytes);
        let due: Vec<Owed> = debts.queue.drain(..).filter(|d| d.until > now).collect();
        debts.bytes = 0;
        self.len.store(0, Relaxed);
        drop(debts);
        if due.is_empty() {
            self.paying.store(false, Relaxed);
            return None;
        }
        Some(due)
    }

    /// A payment ended.
    pub(crate) fn paid(&self) {
        self.paying.store(false, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn debt(key: &str, until: Instant) -> Owed {
        Owed {
            key: key.into(),
            token: Token::new(),
            fence: None,
            debt: Debt::Release,
            until,
        }
    }

    #[test]
    fn debts_are_paid_once_and_lapse() {
        let ledger = Ledger::new("n".into());
        assert!(ledger.is_empty());
        let later = Instant::now() + Duration::from_secs(60);
        ledger.owe(debt("a", later));
        ledger.owe(debt("gone", Instant::now()));
        assert!(!ledger.is_empty());
        let due = ledger.start_paying().expect("one debt due");
        assert_eq!(due.len(), 1, "the lapsed debt is not paid");
        assert_eq!(&*due[0].key, "a");
        assert!(ledger.is_empty());
        // One payment at a time: a debt owed meanwhile waits for the next.
        ledger.owe(debt("b", later));
        assert!(ledger.start_paying().is_none());
        ledger.paid();
        assert_eq!(ledger.start_paying().map(|d| d.len()), Some(1));
        ledger.paid();
        assert!(ledger.start_paying().is_none(), "nothing left");
    }

    #[test]
    fn a_full_ledger_lets_its_oldest_lapse() {
        let ledger = Ledger::new("n".into());
        let later = Instant::now() + Duration::from_secs(60);
        for i in 0..=MAX_OWED {
            ledger.owe(debt(&i.to_string(), later));
        }
        let due = ledger.start_paying().unwrap();
        assert_eq!(due.len(), MAX_OWED);
        assert_eq!(&*due[0].key, "1", "the oldest lapsed");
    }
}
