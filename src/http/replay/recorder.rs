//! After the handler of a replayed endpoint answered: what to store, and storing it. Shared
//! by the tower and actix-web glue, which only read and rebuild their framework's bodies.

use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};

use super::record::{encode_completed, encode_response, response_len};
use super::{Fingerprint, Replay};
use crate::Lease;

/// Records the response of a request that runs under a replay policy.
#[derive(Clone)]
pub(crate) struct Recorder {
    replay: Arc<Replay>,
    fingerprint: Fingerprint,
}

/// What to do with a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Not stored (e.g. a 5xx): release the lock, a retry runs again.
    Release,
    /// Read the body (it is known to be this long) and store the response.
    Store {
        /// The body's length.
        body_len: usize,
    },
    /// Send the response as it is and store "completed" without it (a stream, or too large).
    MarkCompleted,
}

impl Recorder {
    pub(crate) fn new(replay: Arc<Replay>, fingerprint: Fingerprint) -> Self {
        Self {
            replay,
            fingerprint,
        }
    }

    /// The response headers that are stored, from all of them: not those the replay leaves
    /// out, nor those the `Connection` header names (hop-by-hop, RFC 9110 §7.6.1).
    pub(crate) fn stored_headers<'a, I>(&self, headers: I) -> Vec<(&'a str, &'a [u8])>
    where
        I: Iterator<Item = (&'a str, &'a [u8])>,
    {
        let all: Vec<_> = headers.collect();
        let hop_by_hop: Vec<&[u8]> = all
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("connection"))
            .flat_map(|(_, v)| v.split(|&b| b == b','))
            .map(<[u8]>::trim_ascii)
            .collect();
        all.into_iter()
            .filter(|(n, _)| self.replay.stores_header(n))
            .filter(|(n, _)| {
                !hop_by_hop
                    .iter()
                    .any(|h| h.eq_ignore_ascii_case(n.as_bytes()))
            })
            .collect()
    }

    /// The plan for a response with `status`, the headers to store and a body of `body_len`
    /// bytes (`None`: unknown, a stream).
    pub(crate) fn plan(
        &self,
        status: u16,
        stored: &[(&str, &[u8])],
        body_len: Option<u64>,
    ) -> Plan {
        if !self.replay.stores(status) {
            return Plan::Release;
        }
        let fits = |len: u64| {
            usize::try_from(len).ok().filter(|&len| {
                response_len(stored.iter().copied(), len) <= self.replay.response_limit
            })
        };
        match body_len.and_then(fits) {
            Some(body_len) => Plan::Store { body_len },
            None => Plan::MarkCompleted,
        }
    }

    /// The record of a response.
    pub(crate) fn response(&self, status: u16, stored: &[(&str, &[u8])], body: &[u8]) -> Bytes {
        encode_response(&self.fingerprint, status, stored.iter().copied(), body)
    }

    /// The record "completed, response not stored".
    pub(crate) fn completed(&self) -> Bytes {
        encode_completed(&self.fingerprint)
    }

    /// Stores `record` where `lease` still holds, ending the lock there. On failure the lock
    /// is left to its ttl (duplicates get `409` until then), logged at warn by the
    /// lock; the response is sent either way.
    pub(crate) async fn complete(&self, lease: Lease, record: Bytes) {
        let started = Instant::now();
        let key = tracing::enabled!(tracing::Level::DEBUG).then(|| lease.resource().to_owned());
        match lease.complete(record, self.replay.retention).await {
            Ok(()) => {
                if let Some(key) = key {
                    tracing::debug!(key = %key, elapsed = ?started.elapsed(), "response stored for replay");
                }
            }
            Err(e) => tracing::warn!(error = %e, "response not stored for replay"),
        }
    }
}

/// The lease of a request whose handler has started. Under a replay policy (`recorder`), a
/// request cancelled from here on — its future dropped while the handler runs or while its
/// response is read — marks the key completed in the background instead of releasing it:
/// the handler may have done its work, and must not run again for the key (a retry gets
/// `409` completed-not-stored). Without one, dropping it releases the lease as always.
#[cfg(any(feature = "tower", feature = "actix"))]
pub(crate) struct Running {
    lease: Option<Lease>,
    recorder: Option<Recorder>,
}

#[cfg(any(feature = "tower", feature = "actix"))]
impl Running {
    pub(crate) fn new(lease: Lease, recorder: Option<Recorder>) -> Self {
        Self {
            lease: Some(lease),
            recorder,
        }
    }

    /// The lease, for the keep-alive while the handler runs.
    pub(crate) fn lease_mut(&mut self) -> &mut Lease {
        self.lease
            .as_mut()
            .expect("taken only by a method that consumes the guard")
    }

    /// The recorder, under a replay policy.
    pub(crate) fn recorder(&self) -> Option<&Recorder> {
        self.recorder.as_ref()
    }

    /// The lease, out of the guard (a response not stored: released as without replay).
    pub(crate) fn into_lease(mut self) -> Lease {
        self.lease.take().expect("taken once")
    }

    /// Stores `record` (see [`Recorder::complete`]).
    pub(crate) async fn complete(mut self, record: Bytes) {
        let lease = self.lease.take().expect("taken once");
        let recorder = self.recorder.take().expect("only under a replay policy");
        recorder.complete(lease, record).await;
    }

    /// The handler ran (or may have) but its response cannot be stored: under a replay
    /// policy the key is marked completed, without one the lease is released.
    pub(crate) async fn finish_unstored(mut self) {
        let lease = self.lease.take().expect("taken once");
        match self.recorder.take() {
            Some(recorder) => recorder.complete(lease, recorder.completed()).await,
            None => crate::http::release(lease).await,
        }
    }
}

#[cfg(any(feature = "tower", feature = "actix"))]
impl Drop for Running {
    fn drop(&mut self) {
        let (Some(lease), Some(recorder)) = (self.lease.take(), self.recorder.take()) else {
            // Without a recorder the lease's own drop releases it in the background.
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                tracing::debug!(key = %lease.resource(), "request cancelled after its handler started: marked completed");
                rt.spawn(async move { recorder.complete(lease, recorder.completed()).await });
            }
            // The lease's drop logs that it could not release either; the lock expires.
            Err(_) => drop(lease),
        }
    }
}

/// Collects a body's chunks up to a limit.
pub(crate) struct Collector {
    buf: BytesMut,
    first: Option<Bytes>,
    limit: usize,
}

/// A body went over its collector's limit.
#[derive(Debug)]
pub(crate) struct OverLimit;

impl Collector {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            buf: BytesMut::new(),
            first: None,
            limit,
        }
    }

    /// Adds a chunk. One chunk is kept as it is (no copy); more are joined.
    pub(crate) fn push(&mut self, chunk: Bytes) -> Result<(), OverLimit> {
        let len = self.first.as_ref().map_or(0, Bytes::len) + self.buf.len() + chunk.len();
        if len > self.limit {
            return Err(OverLimit);
        }
        if chunk.is_empty() {
            return Ok(());
        }
        match self.first.take() {
            None if self.buf.is_empty() => self.first = Some(chunk),
            first => {
                if let Some(first) = first {
                    self.buf.reserve(len);
                    self.buf.extend_from_slice(&first);
                }
                self.buf.extend_from_slice(&chunk);
            }
        }
        Ok(())
    }

    /// The whole body.
    pub(crate) fn finish(self) -> Bytes {
        self.first.unwrap_or_else(|| self.buf.freeze())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorder(replay: Replay) -> Recorder {
        Recorder::new(Arc::new(replay), Fingerprint([1; 32]))
    }

    #[test]
    fn the_plan_follows_status_length_and_limit() {
        let r = recorder(Replay::new().response_limit(1000));
        let stored = r.stored_headers(
            [
                ("content-type", &b"application/json"[..]),
                ("set-cookie", b"s=1"),
            ]
            .into_iter(),
        );
        assert_eq!(stored, [("content-type", &b"application/json"[..])]);
        let listed = r.stored_headers(
            [
                ("connection", &b"X-Hop, keep-alive"[..]),
                ("x-hop", b"1"),
                ("x-kept", b"2"),
            ]
            .into_iter(),
        );
        assert_eq!(listed, [("x-kept", &b"2"[..])]);
        assert_eq!(r.plan(200, &stored, Some(10)), Plan::Store { body_len: 10 });
        assert_eq!(r.plan(404, &stored, Some(0)), Plan::Store { body_len: 0 });
        assert_eq!(r.plan(500, &stored, Some(10)), Plan::Release);
        assert_eq!(r.plan(200, &stored, None), Plan::MarkCompleted);
        assert_eq!(r.plan(200, &stored, Some(990)), Plan::MarkCompleted);
        assert_eq!(r.plan(200, &stored, Some(u64::MAX)), Plan::MarkCompleted);
    }

    #[test]
    fn the_collector_joins_chunks_up_to_its_limit() {
        let mut c = Collector::new(6);
        c.push(Bytes::from_static(b"ab")).unwrap();
        c.push(Bytes::new()).unwrap();
        c.push(Bytes::from_static(b"cd")).unwrap();
        c.push(Bytes::from_static(b"ef")).unwrap();
        assert!(c.push(Bytes::from_static(b"g")).is_err());
        assert_eq!(&c.finish()[..], b"abcdef");
        let mut one = Collector::new(6);
        one.push(Bytes::from_static(b"abc")).unwrap();
        assert_eq!(&one.finish()[..], b"abc");
    }
}
