//! What a [`Node`] is asked: one value per verb, whose optional parts (a completion record, a
//! fencing counter) say which form of the verb it is, and what a node says it can do.
//!
//! The values are `#[non_exhaustive]`: a node reads their public fields; a test (or a node
//! wrapping another) makes one with `new` and the `with`-style methods.

use std::time::Duration;

#[cfg(doc)]
use super::{Acquire, Node};

/// What a node does beyond locks, and the longest ttl it takes. A node declares it in
/// [`Node::capabilities`]. The client never sends a request with a record or a fence, a completion
/// or an operator call to a custom node that does not declare it. Such a request fails at once with
/// an error (that node's vote is lost), as it does on a node that answered it with an error.
///
/// ```
/// use std::time::Duration;
/// use tower_redlock::node::Capabilities;
///
/// let caps = Capabilities::LOCKS.with_records();
/// assert!(caps.records && !caps.fencing && !caps.operations);
/// assert_eq!(Capabilities::ALL, caps.with_fencing().with_operations());
/// let limited = Capabilities::LOCKS.with_max_ttl(Duration::from_secs(60));
/// assert_eq!(limited.max_ttl, Some(Duration::from_secs(60)));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// Completion records: [`AcquireRequest::record_key`] and [`Node::complete`].
    pub records: bool,
    /// Fencing counters: the `fence` of every request.
    pub fencing: bool,
    /// Operator calls: [`Node::operate`].
    pub operations: bool,
    /// The longest ttl the node accepts, if it limits it (delayed-restart protection): the
    /// client refuses longer locks up front.
    pub max_ttl: Option<Duration>,
}

impl Capabilities {
    /// Locks only: acquire, extend and release without records or fences, any ttl (the
    /// default).
    pub const LOCKS: Self = Self {
        records: false,
        fencing: false,
        operations: false,
        max_ttl: None,
    };

    /// Everything: completion records, fencing counters and operator calls, any ttl (the
    /// built-in nodes).
    pub const ALL: Self = Self {
        records: true,
        fencing: true,
        operations: true,
        max_ttl: None,
    };

    /// These, and completion records.
    #[must_use]
    pub const fn with_records(mut self) -> Self {
        self.records = true;
        self
    }

    /// These, and fencing counters.
    #[must_use]
    pub const fn with_fencing(mut self) -> Self {
        self.fencing = true;
        self
    }

    /// These, and operator calls.
    #[must_use]
    pub const fn with_operations(mut self) -> Self {
        self.operations = true;
        self
    }

    /// These, for locks of at most `ttl`.
    #[must_use]
    pub const fn with_max_ttl(mut self, ttl: Duration) -> Self {
        self.max_ttl = Some(ttl);
        self
    }
}

/// [`Node::acquire`]: set `key` to `token` with a time to live of `ttl`, only if `key` is
/// absent — and, with a [`record_key`](Self::record_key), only if no completion record is
/// there; with a [`fence`](Self::fence), bumping the resource's fencing counter in the same
/// atomic step.
///
/// ```
/// use std::time::Duration;
/// use tower_redlock::node::AcquireRequest;
///
/// let ttl = Duration::from_secs(10);
/// let plain = AcquireRequest::new("job", "token", ttl);
/// assert!(plain.record_key.is_none() && plain.fence.is_none());
/// let both = plain
///     .unless_completed("job:record")
///     .fenced("job:fence", Duration::from_secs(20));
/// assert_eq!(both.record_key, Some("job:record"));
/// assert_eq!(both.fence.map(|f| f.key), Some("job:fence"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct AcquireRequest<'a> {
    /// The lock's key.
    pub key: &'a str,
    /// The owner's token: the value the key is set to.
    pub token: &'a str,
    /// The lock's time to live.
    pub ttl: Duration,
    /// For idempotent work ([`Capabilities::records`]): answer [`Acquire::Completed`] with the
    /// record stored at this key if there is one, locking nothing; otherwise acquire. Both in
    /// one atomic step, so that no completion can slip between the look and the lock.
    pub record_key: Option<&'a str>,
    /// For fencing tokens ([`Capabilities::fencing`]): when the key is set, bump this counter
    /// and answer [`Acquire::Fenced`] (see [`FenceBump`]).
    pub fence: Option<FenceBump<'a>>,
}

impl<'a> AcquireRequest<'a> {
    /// The plain acquire.
    pub fn new(key: &'a str, token: &'a str, ttl: Duration) -> Self {
        Self {
            key,
            token,
            ttl,
            record_key: None,
            fence: None,
        }
    }

    /// This acquire, unless a completion record is stored at `record_key`.
    #[must_use]
    pub fn unless_completed(mut self, record_key: &'a str) -> Self {
        self.record_key = Some(record_key);
        self
    }

    /// This acquire, bumping the fencing counter at `key` (kept for `retention`).
    #[must_use]
    pub fn fenced(mut self, key: &'a str, retention: Duration) -> Self {
        self.fence = Some(FenceBump { key, retention });
        self
    }
}

/// A fenced acquire's counter. When the lock is set, in the same atomic step, the counter at `key`
/// goes to its value plus one. When it has none (it expired or was lost), it goes to the node's
/// clock in microseconds since 1970 instead, so that it starts again above the tokens it gave.
/// Either way it is kept for `retention`, and the node answers [`Acquire::Fenced`] with the new
/// value. (Bumping an existing counter to the clock when that is larger is allowed too. The
/// built-in nodes do not, so that counters kept level by the fenced extension and releases stay
/// level.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct FenceBump<'a> {
    /// The counter's key.
    pub key: &'a str,
    /// How long the counter is kept after the bump.
    pub retention: Duration,
}

/// A fencing counter to raise to a lease's token: before the lease's lock is deleted (a fenced
/// [`ReleaseRequest`] or [`CompleteRequest`]), or right after its grant (a fenced
/// [`ExtendRequest`]). The counter at `key` goes to `floor` if it is below; one that is gone
/// (expired, or lost) starts again from the larger of `floor` and the node's clock in
/// microseconds, never from an old token alone; it is kept for `retention`. A release or a
/// completion raises it also when the lock no longer holds the token (the raise is safe on
/// its own: a counter only grows); an extension raises it only where the lock holds the
/// token, and answers `true` only if it did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct FenceFloor<'a> {
    /// The counter's key.
    pub key: &'a str,
    /// The lease's token: the counter's least value after the raise.
    pub floor: u64,
    /// How long the counter is kept after the raise.
    pub retention: Duration,
}

impl<'a> FenceFloor<'a> {
    /// Raise the counter at `key` to `floor`, keeping it for `retention`.
    pub fn new(key: &'a str, floor: u64, retention: Duration) -> Self {
        Self {
            key,
            floor,
            retention,
        }
    }
}

/// [`Node::extend`]: set the time to live of `key` to `ttl`, only if it holds `token`; an
/// absent (expired) key is never re-created. With a [`fence`](Self::fence), raise that
/// counter too, in the same atomic step, only if the key holds `token`.
///
/// The client sends the fenced form right after a fenced grant, before it hands the lease out. It
/// sends it to nodes that granted it with a counter below the lease's token (the largest counter of
/// the grant). So enough of them to meet every later quorum carry the token. The next holder's
/// token is then larger whatever the nodes' clocks say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExtendRequest<'a> {
    /// The lock's key.
    pub key: &'a str,
    /// The owner's token.
    pub token: &'a str,
    /// The new time to live.
    pub ttl: Duration,
    /// The counter to raise as well ([`Capabilities::fencing`]).
    pub fence: Option<FenceFloor<'a>>,
}

impl<'a> ExtendRequest<'a> {
    /// The plain extension.
    pub fn new(key: &'a str, token: &'a str, ttl: Duration) -> Self {
        Self {
            key,
            token,
            ttl,
            fence: None,
        }
    }

    /// This extension, raising `fence` too.
    #[must_use]
    pub fn fenced(mut self, fence: FenceFloor<'a>) -> Self {
        self.fence = Some(fence);
        self
    }
}

/// [`Node::release`]: delete `key` only if it holds `token`. With a [`fence`](Self::fence),
/// raise that counter first (or in the same atomic step): the next holder's bump follows the
/// delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReleaseRequest<'a> {
    /// The lock's key.
    pub key: &'a str,
    /// The owner's token.
    pub token: &'a str,
    /// The counter to raise first ([`Capabilities::fencing`]).
    pub fence: Option<FenceFloor<'a>>,
}

impl<'a> ReleaseRequest<'a> {
    /// The plain release.
    pub fn new(key: &'a str, token: &'a str) -> Self {
        Self {
            key,
            token,
            fence: None,
        }
    }

    /// This release, raising `fence` first.
    #[must_use]
    pub fn fenced(mut self, fence: FenceFloor<'a>) -> Self {
        self.fence = Some(fence);
        self
    }
}

/// [`Node::complete`], for idempotent work, fenced by the lock: only if `key` holds `token`,
/// store `record` at `record_key` with a time to live of `retention` and delete `key`,
/// atomically. With a [`fence`](Self::fence), raise that counter first (or in the same
/// atomic step), as a fenced release does. With [`if_free`](Self::if_free), store it also
/// where `key` is absent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct CompleteRequest<'a> {
    /// The lock's key.
    pub key: &'a str,
    /// Where the record is stored.
    pub record_key: &'a str,
    /// The owner's token.
    pub token: &'a str,
    /// The completion record.
    pub record: &'a [u8],
    /// How long the record is kept.
    pub retention: Duration,
    /// The counter to raise first ([`Capabilities::fencing`]).
    pub fence: Option<FenceFloor<'a>>,
    /// Store the record also where `key` is **absent** (the lock expired there), not only
    /// where it holds `token` — for a lease that may have been lost while its work ran,
    /// whose outcome must still be recorded. Never where `key` holds anything else (another
    /// client's token: that holder keeps its lock, and nothing is stored); the other rules
    /// stand: a different record already at `record_key`, or a value there that is not a
    /// record (a lock of another resource), answers `false` and is left alone; the same
    /// record again answers `true`; where `key` held `token` it is deleted. `false` (the
    /// default): only where `key` holds `token`. A node that declares
    /// [`Capabilities::records`] gets the request as it is and must honour this field
    /// (`completion_if_free_*` in the conformance suite checks it).
    pub if_free: bool,
}

impl<'a> CompleteRequest<'a> {
    /// The plain completion.
    pub fn new(
        key: &'a str,
        record_key: &'a str,
        token: &'a str,
        record: &'a [u8],
        retention: Duration,
    ) -> Self {
        Self {
            key,
            record_key,
            token,
            record,
            retention,
            fence: None,
            if_free: false,
        }
    }

    /// This completion, raising `fence` first.
    #[must_use]
    pub fn fenced(mut self, fence: FenceFloor<'a>) -> Self {
        self.fence = Some(fence);
        self
    }

    /// This completion, storing the record also where the key is absent (see
    /// [`if_free`](Self::if_free)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use tower_redlock::node::CompleteRequest;
    ///
    /// let day = Duration::from_secs(86_400);
    /// let plain = CompleteRequest::new("job", "job:record", "token", b"unknown", day);
    /// assert!(!plain.if_free);
    /// assert!(plain.or_if_free().if_free);
    /// ```
    #[must_use]
    pub fn or_if_free(mut self) -> Self {
        self.if_free = true;
        self
    }
}
