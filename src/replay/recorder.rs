//! After the handler of a replayed endpoint answered: what to store, and storing it. Shared
//! by the tower and actix-web glue, which only read and rebuild their framework's bodies.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};

use super::record::{encode_aborted, encode_completed, encode_response, response_len};
use super::{Fingerprint, Replay};
use crate::lock::hashed;
use crate::Lease;

/// The headers of a gRPC response that are stored whatever [`Replay::drop_header`] says:
/// its type and, for a trailers-only one, its status.
const GRPC_KEPT: [&str; 3] = ["content-type", "grpc-status", "grpc-message"];

/// The first value of the header `name` among `headers`.
fn header<'a>(headers: &[(&str, &'a [u8])], name: &str) -> Option<&'a [u8]> {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map(|(_, v)| *v)
}

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

    /// The replay settings.
    pub(crate) fn replay(&self) -> &Replay {
        &self.replay
    }

    /// The request's fingerprint (keyed, under the policy's `hmac_key`).
    pub(crate) fn fingerprint(&self) -> &Fingerprint {
        &self.fingerprint
    }

    /// The response headers that are stored, from all of them: not those the replay leaves
    /// out, nor those the `Connection` header names (hop-by-hop, RFC 9110 §7.6.1). A gRPC
    /// response (a gRPC `content-type`) always keeps [`GRPC_KEPT`]: without them its replay
    /// would not be a gRPC answer, or not the same one.
    fn stored_headers<'a>(&self, all: &[(&'a str, &'a [u8])]) -> Vec<(&'a str, &'a [u8])> {
        let hop_by_hop: Vec<&[u8]> = all
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case("connection"))
            .flat_map(|(_, v)| v.split(|&b| b == b','))
            .map(<[u8]>::trim_ascii)
            .collect();
        let grpc = header(all, "content-type").is_some_and(crate::grpc::is_grpc);
        let kept = |n: &str| grpc && GRPC_KEPT.iter().any(|k| k.eq_ignore_ascii_case(n));
        all.iter()
            .copied()
            .filter(|(n, _)| {
                kept(n)
                    || (self.replay.stores_header(n)
                        && !hop_by_hop
                            .iter()
                            .any(|h| h.eq_ignore_ascii_case(n.as_bytes())))
            })
            .collect()
    }

    /// The plan for a response with `status`, all its `headers` (unfiltered: a gRPC response
    /// is judged by its `content-type` and `grpc-status`, whatever is stored) and a body of
    /// `body_len` bytes (`None`: unknown, a stream). A gRPC response is judged by its gRPC
    /// status (see `grpc::replay_view`); one whose status comes in trailers is never stored.
    pub(crate) fn plan_response<'a>(
        &self,
        status: u16,
        headers: impl Iterator<Item = (&'a str, &'a [u8])>,
        body_len: Option<u64>,
    ) -> Plan {
        let all: Vec<_> = headers.collect();
        let (judged, body_len) = crate::grpc::replay_view(
            status,
            header(&all, "content-type"),
            header(&all, "grpc-status"),
            body_len,
        );
        self.plan(judged, &self.stored_headers(&all), body_len)
    }

    /// The plan for a response judged as `status`, with the headers to store and a body of
    /// `body_len` bytes.
    fn plan(&self, status: u16, stored: &[(&str, &[u8])], body_len: Option<u64>) -> Plan {
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

    /// The record of a response with `status`, all its `headers` (those stored are picked as
    /// for [`plan_response`](Self::plan_response)) and `body`.
    pub(crate) fn response<'a>(
        &self,
        status: u16,
        headers: impl Iterator<Item = (&'a str, &'a [u8])>,
        body: &[u8],
    ) -> Bytes {
        let all: Vec<_> = headers.collect();
        let stored = self.stored_headers(&all);
        let record = encode_response(&self.fingerprint, status, stored.into_iter(), body);
        let Some(transform) = &self.replay.transform else {
            return record;
        };
        match super::record::seal(record, &**transform) {
            Some(sealed) if sealed.len() <= crate::Lease::MAX_RECORD_LEN => sealed,
            // Not stored (warned) or too large sealed: the key is marked completed, so
            // that a duplicate is answered `409` rather than run again.
            _ => self.completed(),
        }
    }

    /// The record "completed, response not stored".
    pub(crate) fn completed(&self) -> Bytes {
        encode_completed(&self.fingerprint)
    }

    /// The record "stopped on a lost lease, outcome unknown".
    pub(crate) fn aborted(&self) -> Bytes {
        encode_aborted(&self.fingerprint)
    }

    /// Stores `record` where `lease` still holds, ending the lock there. On failure the lock
    /// is left to its ttl (duplicates get `409` until then), logged at warn by the
    /// lock; the response is sent either way.
    ///
    /// A lease found lost (before, or by the write) stores it where its key is still ours or free —
    /// never over another holder's lock. It tries in the background for [`LOST_RECORD_PATIENCE`]
    /// (three ttls if longer) until a quorum has it. So a duplicate gets the record rather than a
    /// second run. The response waits for that at most [`LOST_RECORD_WAIT`].
    pub(crate) async fn complete(&self, lease: Lease, record: Bytes) {
        let stored = self
            .complete_for(lease, record, self.replay.retention)
            .await;
        crate::metrics::replay(if stored { "stored" } else { "store_failed" });
    }

    /// [`complete`](Self::complete), the record kept for `retention` (a record restored from
    /// a durable row: for as long as the row has left). Whether the record reached its quorum
    /// (not counted by `redlock_replay_total`: a durable row's copy is the row's business).
    pub(crate) async fn complete_for(
        &self,
        lease: Lease,
        record: Bytes,
        retention: Duration,
    ) -> bool {
        let started = Instant::now();
        let key = tracing::enabled!(tracing::Level::DEBUG).then(|| hashed(lease.key()).to_string());
        let patience = LOST_RECORD_PATIENCE.max(lease.ttl().saturating_mul(3));
        let stored = lease
            .complete_or_free(record, retention, patience, LOST_RECORD_WAIT)
            .await;
        match &stored {
            Ok(()) => {
                if let Some(key) = key {
                    tracing::debug!(key, elapsed = ?started.elapsed(), "response stored for replay");
                }
            }
            Err(e) => tracing::warn!(error = %e, "response not stored for replay"),
        }
        stored.is_ok()
    }
}

/// How long the record of a request whose lease was lost is tried for at least, while too
/// few masters answer (see [`Recorder::complete`]).
pub(crate) const LOST_RECORD_PATIENCE: Duration = Duration::from_secs(30);

/// How long the response of a request whose lease was lost waits for its record to be
/// stored (it goes on in the background).
pub(crate) const LOST_RECORD_WAIT: Duration = Duration::from_secs(1);

/// The lease of a request whose handler has started. Under a replay policy (`recorder`), a request
/// may be cancelled from here on: its future dropped while the handler runs or while its response
/// is read. Such a request marks the key completed in the background instead of releasing it. The
/// handler may have done its work, and must not run again for the key (a retry gets `409`
/// completed-not-stored). Without a replay policy, dropping it releases the lease as always.
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

    /// The lease and the recorder, out of the guard: what happens to the key is the
    /// caller's.
    pub(crate) fn into_parts(mut self) -> (Lease, Option<Recorder>) {
        (self.lease.take().expect("taken once"), self.recorder.take())
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

    /// The handler was stopped because the lease was lost: under a replay policy the key is
    /// marked "outcome unknown" (unless the handler is `repeatable`), in the background;
    /// otherwise the lease is dropped, which releases it (where it still is ours) in the
    /// background.
    pub(crate) fn abort(mut self, repeatable: bool) {
        let lease = self.lease.take().expect("taken once");
        let Some(recorder) = self.recorder.take().filter(|_| !repeatable) else {
            return;
        };
        let record = recorder.aborted();
        tokio::spawn(async move { recorder.complete(lease, record).await });
    }

    /// The handler ran (or may have) but its response cannot be stored: under a replay
    /// policy the key is marked completed, without one the lease is released.
    pub(crate) async fn finish_unstored(mut self) {
        let lease = self.lease.take().expect("taken once");
        match self.recorder.take() {
            Some(recorder) => recorder.complete(lease, recorder.completed()).await,
            None => crate::middleware::release(lease).await,
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
                tracing::debug!(key = %hashed(lease.key()), "request cancelled after its handler started: marked completed");
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
        let stored = r.stored_headers(&[
            ("content-type", &b"application/json"[..]),
            ("set-cookie", b"s=1"),
        ]);
        assert_eq!(stored, [("content-type", &b"application/json"[..])]);
        let listed = r.stored_headers(&[
            ("connection", &b"X-Hop, keep-alive"[..]),
            ("x-hop", b"1"),
            ("x-kept", b"2"),
        ]);
        assert_eq!(listed, [("x-kept", &b"2"[..])]);
        assert_eq!(r.plan(200, &stored, Some(10)), Plan::Store { body_len: 10 });
        assert_eq!(r.plan(404, &stored, Some(0)), Plan::Store { body_len: 0 });
        assert_eq!(r.plan(500, &stored, Some(10)), Plan::Release);
        assert_eq!(r.plan(200, &stored, None), Plan::MarkCompleted);
        assert_eq!(r.plan(200, &stored, Some(990)), Plan::MarkCompleted);
        assert_eq!(r.plan(200, &stored, Some(u64::MAX)), Plan::MarkCompleted);
    }

    /// A trailers-only gRPC answer with `grpc-status: code`.
    fn trailers_only(code: &str) -> [(&str, &[u8]); 4] {
        [
            ("content-type", b"application/grpc"),
            ("grpc-status", code.as_bytes()),
            ("grpc-message", b"not%20found"),
            ("x-trace", b"t-1"),
        ]
    }

    #[test]
    fn grpc_responses_are_judged_by_their_unfiltered_headers() {
        // Dropping the gRPC headers changes neither the judgment nor what is stored.
        let r = recorder(
            Replay::new()
                .drop_header("grpc-status")
                .drop_header("Content-Type")
                .drop_header("grpc-message")
                .drop_header("x-trace"),
        );
        let headers = trailers_only("5");
        assert_eq!(
            r.plan_response(200, headers.into_iter(), Some(0)),
            Plan::Store { body_len: 0 }
        );
        assert_eq!(r.stored_headers(&headers), headers[..3]);
        // A code that invites a retry is not stored, whatever is dropped.
        for code in ["1", "4", "8", "10", "14"] {
            let headers = trailers_only(code);
            assert_eq!(
                r.plan_response(200, headers.into_iter(), Some(0)),
                Plan::Release,
                "{code}"
            );
        }
        // The status in trailers: never stored.
        let streamed = [("content-type", &b"application/grpc+proto"[..])];
        assert_eq!(
            r.plan_response(200, streamed.into_iter(), Some(5)),
            Plan::MarkCompleted
        );
        // The record keeps them too.
        let record = r.response(200, headers.into_iter(), b"");
        let crate::replay::record::Record::Response(_, stored) =
            crate::replay::record::decode(&record)
        else {
            panic!("a response record");
        };
        let names: Vec<_> = stored.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["content-type", "grpc-status", "grpc-message"]);

        // Not gRPC: dropped as asked.
        let json = [
            ("content-type", &b"application/json"[..]),
            ("grpc-status", b"5"),
        ];
        assert!(r.stored_headers(&json).is_empty());
        assert_eq!(
            r.plan_response(200, json.into_iter(), Some(2)),
            Plan::Store { body_len: 2 }
        );
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
