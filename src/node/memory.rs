//! An in-process node.

use std::collections::HashMap;
use std::future::ready;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{
    Acquire, AcquireRequest, Capabilities, CompleteRequest, ExtendRequest, ForceReleaseRequest,
    Forced, HeldKey, InspectRequest, KeyState, Node, NodeFuture, Operated, Operation, RecordState,
    ReleaseRequest,
};

/// An in-process lock node: a map of keys to (token, expiry), with the same semantics as a
/// Redis master (expiry, owner-only release and extend).
///
/// Clones share the same map, so several [`Redlock`](crate::Redlock) clients built from
/// clones of one `MemoryNode` contend with each other, as replicas sharing a Redis master
/// would. It is the embedded default for single-process apps and a fast stand-in for tests
/// of *your* app; it gives no protection across processes.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::time::Duration;
/// use tower_redlock::{node::MemoryNode, Redlock};
///
/// let node = MemoryNode::new();
/// let a = Redlock::builder().node(node.clone()).build().unwrap();
/// let b = Redlock::builder().node(node).build().unwrap();
/// let lease = a.try_lock("job:1", Duration::from_secs(1)).await.unwrap();
/// assert!(b.try_lock("job:1", Duration::from_secs(1)).await.unwrap_err().is_contended());
/// lease.release().await.unwrap();
/// assert!(b.try_lock("job:1", Duration::from_secs(1)).await.is_ok());
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryNode {
    map: Arc<Mutex<Map>>,
}

#[derive(Debug, Default)]
struct Map {
    entries: HashMap<String, Entry>,
    /// Completion records (see [`Node::complete`]): the record, its expiry, and whether it
    /// was stored "if free" ([`CompleteRequest::if_free`]: answered as
    /// [`Acquire::CompletedIfFree`]).
    records: HashMap<String, (Bytes, Instant, bool)>,
    /// Fencing counters (see [`AcquireRequest::fence`]): the value and its expiry.
    fences: HashMap<String, (u64, Instant)>,
    writes_since_sweep: usize,
}

#[derive(Debug)]
struct Entry {
    token: String,
    expires: Instant,
}

impl MemoryNode {
    /// A new, empty node.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many unexpired keys the node holds.
    pub fn len(&self) -> usize {
        let now = Instant::now();
        self.lock()
            .entries
            .values()
            .filter(|e| e.expires > now)
            .count()
    }

    /// Whether the node holds no unexpired key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The token `key` holds, if it is held and unexpired.
    pub fn get(&self, key: &str) -> Option<String> {
        let now = Instant::now();
        self.lock()
            .entries
            .get(key)
            .filter(|e| e.expires > now)
            .map(|e| e.token.clone())
    }

    /// The remaining ttl of `key`, if it is held and unexpired.
    pub(crate) fn remaining_now(&self, key: &str) -> Option<Duration> {
        let now = Instant::now();
        self.lock()
            .entries
            .get(key)
            .filter(|e| e.expires > now)
            .map(|e| e.expires - now)
    }

    fn lock(&self) -> MutexGuard<'_, Map> {
        // A panic while holding the lock cannot leave the map inconsistent (every update is a
        // single insert or remove), so a poisoned lock is safe to keep using.
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The answer to `request` (see [`AcquireRequest`]), in one step under the map's lock.
    pub(crate) fn acquire_now(&self, request: &AcquireRequest<'_>) -> Acquire {
        let AcquireRequest {
            key, token, ttl, ..
        } = *request;
        let now = Instant::now();
        let mut map = self.lock();
        if let Some(done) = request
            .record_key
            .and_then(|r| Self::completed_in(&map, now, r))
        {
            return done;
        }
        match request.fence {
            None => Self::acquire_in(&mut map, now, key, token, ttl),
            Some(f) => Self::acquire_fenced_in(&mut map, now, key, f.key, token, ttl, f.retention),
        }
    }

    /// The answer to `request` (see [`CompleteRequest`]): the counter raised first, then the
    /// record stored and the lock deleted — with `if_free`, stored where the lock is absent
    /// too — in one step under the map's lock.
    pub(crate) fn complete_now(&self, request: &CompleteRequest<'_>) -> bool {
        let CompleteRequest {
            key,
            record_key,
            token,
            record,
            retention,
            fence,
            if_free,
            ..
        } = *request;
        let now = Instant::now();
        let mut map = self.lock();
        if let Some(f) = fence {
            Self::raise_in(&mut map, now, f.key, f.floor, f.retention);
        }
        // A first record is never overwritten, nor a lock someone holds at that name (as
        // on Redis, where both live in one keyspace). The same record again is the same
        // completion asked again: stored.
        let ours = |e: &Entry| e.token == token && e.expires > now;
        match map.records.get(record_key) {
            Some((r, e, _)) if *e > now && r[..] == *record => {
                if map.entries.get(key).is_some_and(ours) {
                    map.entries.remove(key);
                }
                return true;
            }
            Some((_, e, _)) if *e > now => return false,
            _ => {}
        }
        let taken = map.entries.get(record_key).is_some_and(|e| e.expires > now);
        let live = map.entries.get(key).filter(|e| e.expires > now);
        let store = match live {
            Some(e) => e.token == token,
            None => if_free,
        };
        // Marked "if free" whenever the "if free" form stored it (as on Redis).
        if taken || !store {
            return false;
        }
        map.entries.remove(key);
        // The client bounds the retention (`Lease::MAX_RECORD_RETENTION`).
        map.records.insert(
            record_key.to_owned(),
            (
                Bytes::copy_from_slice(record),
                expiry(now, retention),
                if_free,
            ),
        );
        true
    }

    fn acquire_in(map: &mut Map, now: Instant, key: &str, token: &str, ttl: Duration) -> Acquire {
        map.writes_since_sweep += 1;
        if map.writes_since_sweep >= 1024 {
            map.writes_since_sweep = 0;
            map.entries.retain(|_, e| e.expires > now);
            map.records.retain(|_, (_, expires, _)| *expires > now);
            map.fences.retain(|_, (_, expires)| *expires > now);
        }
        match map.entries.get_mut(key) {
            Some(e) if e.expires > now => Acquire::Held {
                remaining: Some(e.expires - now),
            },
            Some(e) => {
                e.token.clear();
                e.token.push_str(token);
                e.expires = now + ttl;
                Acquire::Acquired
            }
            None => {
                map.entries.insert(
                    key.to_owned(),
                    Entry {
                        token: token.to_owned(),
                        expires: now + ttl,
                    },
                );
                Acquire::Acquired
            }
        }
    }

    /// The live completion record at `record_key`, as the replay acquire answers it.
    fn completed_in(map: &Map, now: Instant, record_key: &str) -> Option<Acquire> {
        match map.records.get(record_key) {
            Some((record, expires, false)) if *expires > now => Some(Acquire::Completed {
                record: record.clone(),
            }),
            Some((record, expires, true)) if *expires > now => Some(Acquire::CompletedIfFree {
                record: record.clone(),
                remaining: Some(*expires - now),
            }),
            _ => None,
        }
    }

    /// The plain acquire and, when it set the key, the counter's bump: to its value plus
    /// one, or this process's clock in microseconds when it has none (expired, or never
    /// set).
    fn acquire_fenced_in(
        map: &mut Map,
        now: Instant,
        key: &str,
        fence_key: &str,
        token: &str,
        ttl: Duration,
        retention: Duration,
    ) -> Acquire {
        match Self::acquire_in(map, now, key, token, ttl) {
            Acquire::Acquired => {
                let fence = map
                    .fences
                    .get(fence_key)
                    .filter(|(_, expires)| *expires > now)
                    .map_or_else(clock_micros, |(v, _)| v.saturating_add(1));
                map.fences
                    .insert(fence_key.to_owned(), (fence, expiry(now, retention)));
                Acquire::Fenced { fence }
            }
            other => other,
        }
    }

    /// Raises the counter at `fence_key` to `floor` if it is below; one that is gone (expired,
    /// or never set) starts again from the larger of `floor` and this process's clock in
    /// microseconds, never from an old token.
    fn raise_in(map: &mut Map, now: Instant, fence_key: &str, floor: u64, retention: Duration) {
        let live = map
            .fences
            .get(fence_key)
            .filter(|(_, expires)| *expires > now)
            .map(|(v, _)| *v);
        let to = match live {
            Some(v) if v >= floor => return,
            Some(_) => floor,
            None => floor.max(clock_micros()),
        };
        map.fences
            .insert(fence_key.to_owned(), (to, expiry(now, retention)));
    }

    /// The answer to `request` (see [`ReleaseRequest`]): the counter raised first, then the
    /// compare-and-delete, in one step under the map's lock.
    pub(crate) fn release_now(&self, request: &ReleaseRequest<'_>) -> bool {
        let now = Instant::now();
        let mut map = self.lock();
        if let Some(f) = request.fence {
            Self::raise_in(&mut map, now, f.key, f.floor, f.retention);
        }
        match map.entries.get(request.key) {
            Some(e) if e.token == request.token => {
                let live = e.expires > now;
                map.entries.remove(request.key);
                live
            }
            _ => false,
        }
    }

    /// The answer to `request` (see [`ExtendRequest`]): the counter raised only if the key
    /// holds the token, in one step under the map's lock.
    pub(crate) fn extend_now(&self, request: &ExtendRequest<'_>) -> bool {
        let now = Instant::now();
        let mut map = self.lock();
        match map.entries.get_mut(request.key) {
            Some(e) if e.token == request.token && e.expires > now => {
                e.expires = now + request.ttl;
            }
            _ => return false,
        }
        if let Some(f) = request.fence {
            Self::raise_in(&mut map, now, f.key, f.floor, f.retention);
        }
        true
    }
}

impl Node for MemoryNode {
    fn name(&self) -> &str {
        "memory"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::ALL
    }

    fn acquire<'a>(&'a self, request: AcquireRequest<'a>) -> NodeFuture<'a, Acquire> {
        Box::pin(ready(Ok(self.acquire_now(&request))))
    }

    fn extend<'a>(&'a self, request: ExtendRequest<'a>) -> NodeFuture<'a, bool> {
        Box::pin(ready(Ok(self.extend_now(&request))))
    }

    fn release<'a>(&'a self, request: ReleaseRequest<'a>) -> NodeFuture<'a, bool> {
        Box::pin(ready(Ok(self.release_now(&request))))
    }

    fn complete<'a>(&'a self, request: CompleteRequest<'a>) -> NodeFuture<'a, bool> {
        Box::pin(ready(Ok(self.complete_now(&request))))
    }

    fn operate<'a>(&'a self, operation: Operation<'a>) -> NodeFuture<'a, Operated> {
        let answer = match operation {
            Operation::Inspect(r) => Operated::Inspected(self.inspect_now(&r)),
            Operation::Scan { prefix, limit } => Operated::Scanned(self.scan_now(prefix, limit)),
            Operation::ForceRelease(r) => Operated::Forced(self.force_release_now(&r)),
        };
        Box::pin(ready(Ok(answer)))
    }
}

/// The operator's calls ([`Operation`]), answered at once.
impl MemoryNode {
    fn inspect_now(&self, request: &InspectRequest<'_>) -> KeyState {
        let now = Instant::now();
        let map = self.lock();
        let left = |expires: Instant| Some(expires.saturating_duration_since(now));
        let state = KeyState {
            lock: map
                .entries
                .get(request.key)
                .filter(|e| e.expires > now)
                .map(|e| (e.token.clone(), left(e.expires))),
            fence: map
                .fences
                .get(request.fence_key)
                .filter(|(_, expires)| *expires > now)
                .map(|(fence, _)| *fence),
            record: map
                .records
                .get(request.record_key)
                .filter(|(_, expires, _)| *expires > now)
                .map(|(record, expires, _)| RecordState::new(record.len(), left(*expires))),
        };
        state
    }

    fn scan_now(&self, prefix: &str, limit: usize) -> Vec<HeldKey> {
        let now = Instant::now();
        let map = self.lock();
        let mut held: Vec<HeldKey> = map
            .entries
            .iter()
            .filter(|(key, e)| key.starts_with(prefix) && e.expires > now)
            .map(|(key, e)| HeldKey::new(key, &e.token, Some(e.expires - now)))
            .collect();
        held.sort_by(|a, b| a.key.cmp(&b.key));
        held.truncate(limit);
        held
    }

    fn force_release_now(&self, request: &ForceReleaseRequest<'_>) -> Forced {
        let now = Instant::now();
        let mut map = self.lock();
        let named = map
            .entries
            .get(request.key)
            .is_some_and(|e| request.clears(&e.token));
        let lock = named
            && map
                .entries
                .remove(request.key)
                .is_some_and(|e| e.expires > now);
        // A record carries no token: with a holder named, it goes only with that lock.
        let record = (lock || request.holder.is_none())
            && request.record_key.is_some_and(|key| {
                map.records
                    .remove(key)
                    .is_some_and(|(_, expires, _)| expires > now)
            });
        Forced::new(lock, record)
    }
}
/// This process's clock in microseconds since 1970 (0 before it): where a fencing counter
/// that expired starts again.
fn clock_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// `now + retention`, or a year when that overflows.
fn expiry(now: Instant, retention: Duration) -> Instant {
    now.checked_add(retention)
        .unwrap_or(now + Duration::from_secs(86_400 * 365))
}
