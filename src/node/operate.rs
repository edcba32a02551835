//! What an operator asks a node, outside the lock's own verbs ([`Node::operate`]). It may ask what
//! the node holds at a key ([`Operation::Inspect`]: reads only), or the locks under a prefix
//! ([`Operation::Scan`]). It may also ask for the deletion of a stuck lock, of a named holder or
//! whatever its token ([`Operation::ForceRelease`]). The client never sends one on its own;
//! [`Redlock::inspect`], [`Redlock::scan`] and [`Redlock::force_release`] do, when called.
//!
//! [`Redlock::inspect`]: crate::Redlock::inspect
//! [`Redlock::force_release`]: crate::Redlock::force_release
//! [`Redlock::scan`]: crate::Redlock::scan

use std::time::Duration;

#[cfg(doc)]
use super::Node;

/// [`Node::operate`]: an operator's question or act.
///
/// ```
/// use tower_redlock::node::{InspectRequest, Operation};
///
/// let ask = Operation::Inspect(InspectRequest::new("job", "job:fence", "job:record"));
/// assert!(matches!(ask, Operation::Inspect(r) if r.key == "job"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Operation<'a> {
    /// Read what the node holds at the request's keys, writing nothing: answered by
    /// [`Operated::Inspected`].
    Inspect(InspectRequest<'a>),
    /// The locks held at keys that start with `prefix`, at most `limit`, ordered by key:
    /// answered by [`Operated::Scanned`].
    Scan {
        /// The keys' prefix.
        prefix: &'a str,
        /// The most locks to list.
        limit: usize,
    },
    /// Delete a stuck lock (see [`ForceReleaseRequest`]): answered by [`Operated::Forced`].
    ForceRelease(ForceReleaseRequest<'a>),
}

/// A node's answer to an [`Operation`], of the same kind (another kind is an error).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Operated {
    /// What the node holds: the answer to [`Operation::Inspect`].
    Inspected(KeyState),
    /// The locks held under the prefix: the answer to [`Operation::Scan`].
    Scanned(Vec<HeldKey>),
    /// What was deleted: the answer to [`Operation::ForceRelease`].
    Forced(Forced),
}

/// [`Operation::Inspect`]: read what the node holds at `key` (the lock), `fence_key` (the
/// resource's fencing counter) and `record_key` (the completion record). Writes nothing.
///
/// ```
/// use tower_redlock::node::InspectRequest;
///
/// let ask = InspectRequest::new("job", "job:fence", "job:record");
/// assert_eq!((ask.key, ask.fence_key, ask.record_key), ("job", "job:fence", "job:record"));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct InspectRequest<'a> {
    /// The lock's key.
    pub key: &'a str,
    /// The key of the resource's fencing counter.
    pub fence_key: &'a str,
    /// The key of the completion record.
    pub record_key: &'a str,
}

impl<'a> InspectRequest<'a> {
    /// Read the lock at `key`, the counter at `fence_key`, the record at `record_key`.
    pub fn new(key: &'a str, fence_key: &'a str, record_key: &'a str) -> Self {
        Self {
            key,
            fence_key,
            record_key,
        }
    }
}

/// What a node holds at a key ([`Operation::Inspect`]'s answer): each part read as it was when
/// read (a Redis master reads them one command after the other: not one atomic snapshot).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyState {
    /// The lock: the holder's token and its remaining ttl (`None`: no expiry), when held.
    pub lock: Option<(String, Option<Duration>)>,
    /// The resource's fencing counter, when the node keeps one for it.
    pub fence: Option<u64>,
    /// The completion record, when there is one.
    pub record: Option<RecordState>,
}

impl KeyState {
    /// Nothing at the key: no lock, no counter, no record.
    pub fn new() -> Self {
        Self::default()
    }

    /// With the lock held by `token`, `ttl` left (`None`: no expiry).
    #[must_use]
    pub fn locked(mut self, token: impl Into<String>, ttl: Option<Duration>) -> Self {
        self.lock = Some((token.into(), ttl));
        self
    }

    /// With the fencing counter at `fence`.
    #[must_use]
    pub fn fenced(mut self, fence: u64) -> Self {
        self.fence = Some(fence);
        self
    }

    /// With a completion record.
    #[must_use]
    pub fn recorded(mut self, record: RecordState) -> Self {
        self.record = Some(record);
        self
    }
}

/// A completion record as [`Operation::Inspect`] sees it: its size, and how long it is kept still.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecordState {
    /// The record's size in bytes.
    pub size: usize,
    /// How long the node keeps it still (`None`: no expiry).
    pub ttl: Option<Duration>,
}

impl RecordState {
    /// A record of `size` bytes, kept `ttl` longer.
    pub fn new(size: usize, ttl: Option<Duration>) -> Self {
        Self { size, ttl }
    }

    /// How long ago it was stored, given the retention it was stored with (the replay
    /// policy's [`Replay::retention`](crate::replay::Replay::retention)): `None` without an
    /// expiry, or when the retention given is shorter than what is left.
    pub fn age(&self, retention: Duration) -> Option<Duration> {
        retention.checked_sub(self.ttl?)
    }
}

/// [`Operation::ForceRelease`]: delete the lock at `key` — of the holder whose token starts with
/// [`holder`](Self::holder), or whatever token it holds when none is named. With
/// [`with_record`](Self::with_record), delete the completion record too. With a holder named, the
/// record goes only in the same call that deleted that holder's lock (a record carries no token, so
/// a re-run that finds another holder leaves its record). The fencing counter is kept (tokens must
/// keep growing).
///
/// ```
/// use tower_redlock::node::ForceReleaseRequest;
///
/// let ask = ForceReleaseRequest::new("job");
/// assert_eq!((ask.record_key, ask.holder), (None, None));
/// let ask = ask.with_record("job:record").holder("f0f0f0f0");
/// assert_eq!((ask.record_key, ask.holder), (Some("job:record"), Some("f0f0f0f0")));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ForceReleaseRequest<'a> {
    /// The lock's key.
    pub key: &'a str,
    /// The completion record's key, to delete too.
    pub record_key: Option<&'a str>,
    /// The prefix of the token to delete (`None`: whatever token is there).
    pub holder: Option<&'a str>,
}

impl<'a> ForceReleaseRequest<'a> {
    /// Delete the lock at `key`, whatever its token (see [`holder`](Self::holder)).
    pub fn new(key: &'a str) -> Self {
        Self {
            key,
            record_key: None,
            holder: None,
        }
    }

    /// Delete the completion record at `record_key` too (with a holder named, only when
    /// that holder's lock was deleted by this request).
    #[must_use]
    pub fn with_record(mut self, record_key: &'a str) -> Self {
        self.record_key = Some(record_key);
        self
    }

    /// Delete the lock only if its token starts with `prefix` (the client checks it: 8 to
    /// 32 lowercase hex digits). An empty prefix names no holder: whatever token is there.
    #[must_use]
    pub fn holder(mut self, prefix: &'a str) -> Self {
        self.holder = Some(prefix).filter(|p| !p.is_empty());
        self
    }

    /// Whether this request deletes `token`: one named holder's, or any when none is named.
    pub fn clears(&self, token: &str) -> bool {
        self.holder.is_none_or(|p| token.starts_with(p))
    }
}

/// What [`Operation::ForceRelease`] deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Forced {
    /// A lock was there, and is gone.
    pub lock: bool,
    /// A completion record was there, and is gone (only when asked).
    pub record: bool,
}

impl Forced {
    /// What was deleted: a lock, a record.
    pub fn new(lock: bool, record: bool) -> Self {
        Self { lock, record }
    }
}

/// A lock a node holds, as [`Operation::Scan`] lists it: its key, the holder's token, its ttl.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HeldKey {
    /// The lock's key.
    pub key: String,
    /// The holder's token.
    pub token: String,
    /// Its remaining ttl (`None`: no expiry).
    pub ttl: Option<Duration>,
}

impl HeldKey {
    /// `key`, held by `token` for `ttl` longer.
    pub fn new(key: impl Into<String>, token: impl Into<String>, ttl: Option<Duration>) -> Self {
        Self {
            key: key.into(),
            token: token.into(),
            ttl,
        }
    }
}
