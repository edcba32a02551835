//! The completion records a replay acquire's nodes answered with, and the one answer they
//! make ([`Redlock::lock_unless_completed`](crate::Redlock::lock_unless_completed)).
//!
//! A record is stored either under a valid lease (the plain completion, [`Lease::complete`]) or "if
//! free". An "if free" record is stored by a lease that may have been lost (the middleware's
//! `OnLost` paths), on every node where the lock still holds the lease's token or is absent. Such a
//! record can land beside another holder's lock, and that holder later stores its own record under
//! a valid lease on a quorum. So records of one key may differ from node to node, and the answer
//! must not depend on which node answers first:
//!
//! 1. A record stored under a valid lease found on a quorum of nodes is the answer, at once
//!    (the fast path: every node agrees).
//! 2. Otherwise the answer waits for every asked node (each bounded by the node timeout),
//!    and needs a quorum of them to have answered: a record on a quorum of nodes is then
//!    among the answers. Fewer answers: unavailable (too few nodes to know).
//! 3. A node that says "held" (a live lock of another caller, with no record there): that
//!    holder may still store the key's record: contended, try again later.
//! 4. Records stored under a valid lease take precedence over records stored "if free":
//!    one such value is the answer. Two such values (neither on a quorum: two lost leases
//!    each stored on some nodes while it was valid there), and every node answered: the
//!    outcome is unknown; with a node missing, unavailable (the missing one could tip a
//!    value to a quorum).
//! 5. Only records stored "if free": with every node's answer, one value is the answer and
//!    two that differ make the outcome unknown; with a node missing, unavailable (it could
//!    hold another value, or a valid-lease record that outranks them).
//!
//! Rule 5's answer could still change. Another lost lease of the key, whose lock had expired
//! everywhere, may store its own "if free" record later on the nodes that were free. Duplicates
//! after it would then get outcome-unknown where this one got the record. So a try answered by rule
//! 5 first copies the record, "if free" and for as long as it has left, to the nodes where it
//! locked. Those are every node that had no record: rule 5 needs every node's answer, and none said
//! "held". Only then does it release the rest. The key is then taken on every node, and no later
//! "if free" record lands anywhere (`Records::copy_for`; test
//! `lost_lease_one_answer_a_later_lost_lease_cannot_change_an_answer`). A copy that misses one of
//! those nodes within the node timeout makes the answer unavailable (try again).
//!
//! [`Lease::complete`]: crate::Lease::complete

use std::time::Duration;

use bytes::Bytes;

/// One distinct record: its bytes, how it was stored, on how many nodes, and the longest
/// any of them has left (where the nodes said).
struct Seen {
    record: Bytes,
    if_free: bool,
    nodes: usize,
    remaining: Option<Duration>,
}

/// The records answered so far, by value. Usually one value on every node.
#[derive(Default)]
pub(crate) struct Records {
    seen: Vec<Seen>,
}

/// What a replay acquire's records answer.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The key's record.
    Record(Bytes),
    /// Records of lost leases that differ: the work ran, its outcome is unknown.
    Unknown,
    /// Another caller holds the lock on some node: its record may still come.
    Contended,
    /// Too few nodes answered to know which record is the key's.
    Unavailable(&'static str),
}

impl Records {
    /// Counts one node's record; `if_free` when it was stored "if free", with what it has
    /// left when the node said.
    pub(crate) fn add(&mut self, record: Bytes, if_free: bool, remaining: Option<Duration>) {
        match self
            .seen
            .iter_mut()
            .find(|s| s.if_free == if_free && s.record == record)
        {
            Some(s) => {
                s.nodes += 1;
                s.remaining = s.remaining.max(remaining);
            }
            None => self.seen.push(Seen {
                record,
                if_free,
                nodes: 1,
                remaining,
            }),
        }
    }

    /// When the answer `record` rests on records stored "if free" alone (rule 5), how long to keep
    /// the copies the answering try makes of it where it locked. That is the longest time any node
    /// said it has left. It is so that no later "if free" record — of another lost lease still
    /// storing its own — can land there and change the answer. `None` when a record stored under a
    /// valid lease answered (no later "if free" record outranks it), or no node said how long.
    pub(crate) fn copy_for(&self, record: &Bytes) -> Option<Duration> {
        match &self.seen[..] {
            [one] if one.if_free && one.record == *record => one.remaining,
            _ => None,
        }
    }

    /// Whether any node answered with a record.
    pub(crate) fn any(&self) -> bool {
        !self.seen.is_empty()
    }

    /// How many nodes answered with a record.
    pub(crate) fn nodes(&self) -> usize {
        self.seen.iter().map(|s| s.nodes).sum()
    }

    /// A record stored under a valid lease on `quorum` nodes: the answer, whatever the
    /// other nodes say (rule 1).
    pub(crate) fn settled(&self, quorum: usize) -> Option<&Bytes> {
        self.seen
            .iter()
            .find(|s| !s.if_free && s.nodes >= quorum)
            .map(|s| &s.record)
    }

    /// The answer, once every asked node has answered or run out of time: `None` without
    /// any record. `answers` is how many of the `n` nodes answered (with a record, a vote
    /// for or "held"); `held`, whether one said "held".
    pub(crate) fn verdict(
        &self,
        quorum: usize,
        n: usize,
        answers: usize,
        held: bool,
    ) -> Option<Verdict> {
        if self.seen.is_empty() {
            return None;
        }
        if let Some(record) = self.settled(quorum) {
            return Some(Verdict::Record(record.clone()));
        }
        if answers < quorum {
            return Some(Verdict::Unavailable(
                "nodes answered with completion records, but too few nodes answered to know \
                 which record is the key's",
            ));
        }
        if held {
            return Some(Verdict::Contended);
        }
        let every = answers >= n;
        let mut valid = self.seen.iter().filter(|s| !s.if_free);
        let mut free = self.seen.iter().filter(|s| s.if_free);
        Some(match (valid.next(), valid.next()) {
            (Some(one), None) => Verdict::Record(one.record.clone()),
            (Some(_), Some(_)) if every => Verdict::Unknown,
            (Some(_), Some(_)) => Verdict::Unavailable(
                "nodes answered with different completion records, none on a quorum, and a \
                 node did not answer",
            ),
            // A missing node could hold another "if free" value, or a valid-lease record,
            // which would outrank what was found: only every node's answer decides.
            (None, _) if !every => Verdict::Unavailable(
                "only records of lost leases were found, and a node did not answer: it could \
                 hold another record",
            ),
            (None, _) => match (free.next(), free.next()) {
                (Some(one), None) => Verdict::Record(one.record.clone()),
                _ => Verdict::Unknown,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(records: &[(&'static str, bool)]) -> Records {
        let mut r = Records::default();
        for &(bytes, if_free) in records {
            r.add(Bytes::from_static(bytes.as_bytes()), if_free, None);
        }
        r
    }

    fn record(bytes: &'static str) -> Option<Verdict> {
        Some(Verdict::Record(Bytes::from_static(bytes.as_bytes())))
    }

    /// The fast path: a valid record on a quorum answers before the others are heard, and
    /// over an "if free" record beside it.
    #[test]
    fn a_valid_record_on_a_quorum_is_the_answer() {
        let r = of(&[("r1", true), ("r2", false), ("r2", false)]);
        assert_eq!(r.settled(2).map(|b| &b[..]), Some(&b"r2"[..]));
        assert_eq!(r.verdict(2, 3, 2, true), record("r2"));
        assert!(of(&[("r2", false)]).settled(2).is_none());
        assert!(of(&[("r2", true), ("r2", true)]).settled(2).is_none());
    }

    /// The interleaving of `lost_lease_one_answer_*`: R1's "if free" record on C, R2's valid
    /// one on A and B. Whichever two nodes answer, the answer is R2's — or, with only C's
    /// and one of R2's (B down), R2's still (it outranks).
    #[test]
    fn a_valid_record_outranks_an_if_free_one() {
        assert_eq!(
            of(&[("r1", true), ("r2", false)]).verdict(2, 3, 2, false),
            record("r2")
        );
        assert_eq!(
            of(&[("r2", false), ("r1", true)]).verdict(2, 3, 3, false),
            record("r2")
        );
    }

    /// Rule 5's answer is copied where the try locked, for the longest time left that a
    /// node said; an answer a valid-lease record made, or a mix, is not.
    #[test]
    fn only_an_answer_from_if_free_records_alone_is_copied() {
        let day = Duration::from_secs(86_400);
        let mut r = Records::default();
        r.add(Bytes::from_static(b"r1"), true, Some(day / 2));
        r.add(Bytes::from_static(b"r1"), true, Some(day));
        r.add(Bytes::from_static(b"r1"), true, None);
        assert_eq!(r.verdict(2, 3, 3, false), record("r1"));
        assert_eq!(r.copy_for(&Bytes::from_static(b"r1")), Some(day));
        assert_eq!(r.copy_for(&Bytes::from_static(b"r2")), None);
        // Nobody said how long: no copy.
        assert_eq!(
            of(&[("r1", true)]).copy_for(&Bytes::from_static(b"r1")),
            None
        );
        let mut valid = Records::default();
        valid.add(Bytes::from_static(b"r2"), false, None);
        valid.add(Bytes::from_static(b"r1"), true, Some(day));
        assert_eq!(valid.copy_for(&Bytes::from_static(b"r2")), None);
    }

    #[test]
    fn too_few_answers_are_unavailable_never_a_guess() {
        assert!(matches!(
            of(&[("r1", false)]).verdict(2, 3, 1, false),
            Some(Verdict::Unavailable(_))
        ));
    }

    #[test]
    fn a_live_holder_beside_a_minority_record_is_contended() {
        assert_eq!(
            of(&[("r1", false)]).verdict(2, 3, 3, true),
            Some(Verdict::Contended)
        );
        assert_eq!(
            of(&[("r1", true)]).verdict(2, 3, 3, true),
            Some(Verdict::Contended)
        );
    }

    /// A record that survived on one node (the others lost it, or never got it) and no
    /// holder: the answer, as before.
    #[test]
    fn a_lone_record_without_a_holder_is_the_answer() {
        assert_eq!(of(&[("r1", false)]).verdict(2, 3, 3, false), record("r1"));
        assert_eq!(of(&[("r1", false)]).verdict(2, 3, 2, false), record("r1"));
        assert_eq!(of(&[("r1", true)]).verdict(2, 3, 3, false), record("r1"));
    }

    /// Differing "if free" records: unknown with every node's answer; unavailable while one
    /// is missing (it could hold a valid-lease record, which would outrank them both).
    #[test]
    fn if_free_records_that_differ_are_unknown() {
        let r = of(&[("r1", true), ("r3", true)]);
        assert!(matches!(
            r.verdict(2, 3, 2, false),
            Some(Verdict::Unavailable(_))
        ));
        let r = of(&[("r1", true), ("r3", true), ("r3", true)]);
        assert_eq!(r.verdict(2, 3, 3, false), Some(Verdict::Unknown));
        // Even when one of them is on a quorum.
        let r = of(&[("r1", true), ("r1", true), ("r3", true)]);
        assert_eq!(r.verdict(2, 3, 3, false), Some(Verdict::Unknown));
    }

    /// One "if free" value is the answer only when no node is missing: the missing one could
    /// hold another value.
    #[test]
    fn a_lone_if_free_value_needs_every_node() {
        let r = of(&[("r1", true), ("r1", true)]);
        assert!(matches!(
            r.verdict(2, 3, 2, false),
            Some(Verdict::Unavailable(_))
        ));
        assert_eq!(r.verdict(2, 3, 3, false), record("r1"));
    }

    /// Two valid values, neither on a quorum (two lost leases each stored some while
    /// valid): unknown once every node answered; unavailable while one is missing.
    #[test]
    fn valid_records_that_differ_without_a_quorum() {
        let r = of(&[("r1", false), ("r2", false)]);
        assert_eq!(r.verdict(2, 3, 3, false), Some(Verdict::Unknown));
        assert!(matches!(
            r.verdict(2, 3, 2, false),
            Some(Verdict::Unavailable(_))
        ));
        let r = of(&[("r1", false), ("r2", false), ("r2", true)]);
        assert_eq!(r.verdict(2, 3, 3, false), Some(Verdict::Unknown));
    }

    /// A valid-lease record on one node (its write missed the quorum) beside two differing "if
    /// free" ones. Whoever hears only the "if free" ones must not answer unknown while the third
    /// node is missing. That node would make the answer the valid record.
    #[test]
    fn a_missing_node_could_hold_the_record_that_outranks() {
        let two = of(&[("f1", true), ("f2", true)]);
        assert!(matches!(
            two.verdict(2, 3, 2, false),
            Some(Verdict::Unavailable(_))
        ));
        let all = of(&[("f1", true), ("f2", true), ("v", false)]);
        assert_eq!(all.verdict(2, 3, 3, false), record("v"));
    }

    #[test]
    fn no_record_is_no_verdict() {
        assert_eq!(Records::default().verdict(2, 3, 3, true), None);
        assert!(!Records::default().any());
        assert_eq!(of(&[("a", true), ("a", true), ("b", false)]).nodes(), 3);
    }
}
