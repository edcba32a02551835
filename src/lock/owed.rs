//! What a node is owed: the releases and completions that could not reach it while a lock
//! of ours may still be there — it was suspended, or gave no answer until the caller's
//! patience and the background's retries ran out. Each node keeps its ledger, paid as soon
//! as the node answers again (a request's answer, or the probe that restores it), as long as
//! this client lives: a master that froze and came back keeps none of the locks it was sent.
//!
//! A debt is small (the key, the token, the fencing token; a completion's record is shared,
//! not copied) and lapses once the lock can no longer be on the node. A ledger holds at most
//! [`MAX_OWED`] debts; past that the oldest lapse early (their locks expire with their ttl,
//! as without a ledger), with a warning.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::fencing::Fence;
use super::lease::Token;

/// The most debts a node's ledger keeps.
pub(crate) const MAX_OWED: usize = 65_536;

/// What is owed.
#[derive(Debug)]
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
pub(crate) struct Owed {
    pub(crate) key: Arc<str>,
    pub(crate) token: Token,
    /// The lease's fencing token: raised first, as the release or completion it stands for.
    pub(crate) fence: Option<Fence>,
    pub(crate) debt: Debt,
    /// After this the lock can no longer be on the node: the debt lapses.
    pub(crate) until: Instant,
}

/// One node's debts.
#[derive(Default)]
pub(crate) struct Ledger {
    debts: Mutex<VecDeque<Owed>>,
    /// How many debts (read without the lock on every answer of the node).
    len: AtomicUsize,
    /// Whether a payment is under way (one at a time).
    paying: AtomicBool,
    /// Whether a full ledger was reported (once).
    overflowed: AtomicBool,
}

impl std::fmt::Debug for Ledger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ledger")
            .field("debts", &self.len.load(Relaxed))
            .finish()
    }
}

impl Ledger {
    /// Records a debt; a full ledger lets its oldest lapse.
    pub(crate) fn owe(&self, debt: Owed, node: &str) {
        let mut debts = self.debts.lock().unwrap_or_else(|e| e.into_inner());
        if debts.len() >= MAX_OWED {
            let now = Instant::now();
            debts.retain(|d| d.until > now);
        }
        if debts.len() >= MAX_OWED {
            debts.pop_front();
            if !self.overflowed.swap(true, Relaxed) {
                tracing::warn!(
                    node,
                    "{MAX_OWED} releases and completions owed to this node: the oldest lapse \
                     (their locks expire with their ttl)"
                );
            }
        }
        debts.push_back(debt);
        self.len.store(debts.len(), Relaxed);
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
        let due: Vec<Owed> = debts.drain(..).filter(|d| d.until > now).collect();
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
        let ledger = Ledger::default();
        assert!(ledger.is_empty());
        let later = Instant::now() + Duration::from_secs(60);
        ledger.owe(debt("a", later), "n");
        ledger.owe(debt("gone", Instant::now()), "n");
        assert!(!ledger.is_empty());
        let due = ledger.start_paying().expect("one debt due");
        assert_eq!(due.len(), 1, "the lapsed debt is not paid");
        assert_eq!(&*due[0].key, "a");
        assert!(ledger.is_empty());
        // One payment at a time: a debt owed meanwhile waits for the next.
        ledger.owe(debt("b", later), "n");
        assert!(ledger.start_paying().is_none());
        ledger.paid();
        assert_eq!(ledger.start_paying().map(|d| d.len()), Some(1));
        ledger.paid();
        assert!(ledger.start_paying().is_none(), "nothing left");
    }

    #[test]
    fn a_full_ledger_lets_its_oldest_lapse() {
        let ledger = Ledger::default();
        let later = Instant::now() + Duration::from_secs(60);
        for i in 0..=MAX_OWED {
            ledger.owe(debt(&i.to_string(), later), "n");
        }
        let due = ledger.start_paying().unwrap();
        assert_eq!(due.len(), MAX_OWED);
        assert_eq!(&*due[0].key, "1", "the oldest lapsed");
    }
}
