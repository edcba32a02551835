//! Durable replay in the request flow ([`crate::durable`]): the key's row looked up after the
//! lock and before the handler, what the handler's statements found read after it, and the
//! response stored in the row before the Redis record.

use std::time::Duration;

use bytes::Bytes;

use super::answer::FullResponse;
use crate::durable::{millis, Durable, FoundRow, KeyRow, NewRecord, RowKey, RowState};
use crate::metrics::durable_row;
use crate::policy::LockPolicy;
use crate::rejection::{Rejection, RejectionKind, Wire};
use crate::replay::{Recorder, Running, LOST_RECORD_PATIENCE};
use crate::Lease;

/// How much longer a row is kept than the Redis record written after it, beyond the time
/// a lost lease's record may still be written in the background.
const ROW_MARGIN: Duration = Duration::from_secs(60);

/// How long a row is kept: the replay's retention, the longest a lost lease's record is
/// tried for after it (see `Recorder::complete`), and [`ROW_MARGIN`].
fn row_retention(recorder: &Recorder, ttl: Duration) -> Duration {
    let background = LOST_RECORD_PATIENCE.max(ttl.saturating_mul(3));
    recorder
        .replay()
        .retention
        .saturating_add(background)
        .saturating_add(ROW_MARGIN)
}

/// How long a client is told to wait after a busy row (a lock timeout, a serialization
/// failure, a deadlock) or a row whose response may still be on its way.
const BUSY_RETRY: Duration = Duration::from_secs(1);

/// What the row says before the handler.
pub(crate) enum Before {
    /// No row: run the handler with this value in its request.
    Run(Lease, Recorder, KeyRow),
    /// The answer, the handler not run.
    Answered(FullResponse),
}

/// The durable settings of a replay recorder.
fn durable_of(recorder: &Recorder) -> &Durable {
    recorder
        .replay()
        .durable
        .as_ref()
        .expect("called only under durable replay")
}

/// Looks the key's row up. The lock is held, and no Redis voter had a record of the key.
/// Nothing has run: a request cancelled here drops the lease, which releases it.
pub(crate) async fn before(
    lease: Lease,
    recorder: Recorder,
    row_key: RowKey,
    policy: &LockPolicy,
    wire: Wire,
) -> Before {
    let durable = durable_of(&recorder);
    // Within the lease, and with a third of the ttl left for the handler: its keep-alive
    // (due a third of the ttl after the lock) then extends the lease as it starts.
    let bound = durable
        .timeout
        .min(lease.validity().saturating_sub(lease.ttl() / 3));
    let found = tokio::time::timeout(bound, durable.store.find(&row_key.0)).await;
    match found {
        Ok(Ok(None)) if lease.is_valid() => {
            durable_row("absent");
            let row = KeyRow::new(
                row_key,
                recorder.fingerprint().0,
                row_retention(&recorder, policy.ttl()),
                durable.lock_timeout,
                durable.row_sql.clone(),
            );
            Before::Run(lease, recorder, row)
        }
        Ok(Ok(Some(found))) => {
            let answer = answer(lease, recorder, &row_key, found, false, policy, wire).await;
            Before::Answered(answer)
        }
        Ok(Ok(None)) => {
            tracing::warn!("the lease ran out while the key's row was looked up: answered 503");
            Before::Answered(unavailable(lease, policy, wire).await)
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "the key's row could not be looked up: answered 503");
            Before::Answered(unavailable(lease, policy, wire).await)
        }
        Err(_) => {
            tracing::warn!(timeout = ?bound, "the key's row lookup did not answer: answered 503");
            Before::Answered(unavailable(lease, policy, wire).await)
        }
    }
}

/// The answer from a committed row.
///
/// A stored response is replayed (or `422` for another request), its record restored on
/// the Redis voters for as long as the row has left. Without one: `422` for another
/// request. Otherwise the row's execution may still be storing its response — a duplicate
/// that met the row (`in_flight`), or a row younger than the lock's ttl and the store's
/// timeout — so `409` + `Retry-After`; else the rebuild hook's response, or `409`
/// completed-not-stored. Without a response the lock is released and nothing written to
/// Redis, so a later lookup finds the response once it is stored.
async fn answer(
    lease: Lease,
    recorder: Recorder,
    row_key: &RowKey,
    found: FoundRow,
    in_flight: bool,
    policy: &LockPolicy,
    wire: Wire,
) -> FullResponse {
    let durable = durable_of(&recorder);
    let fingerprint = *recorder.fingerprint();
    let same = found.fingerprint[..] == fingerprint.0[..];
    let young = found.age < policy.ttl().saturating_add(durable.timeout);
    let mut record = found.record;
    if record.is_none() && same && !in_flight && !young {
        record = rebuild(&recorder, row_key, &found.run_id, policy.ttl()).await;
    }
    match record {
        Some(record) => {
            let transform = recorder.replay().transform.clone();
            let retention = found.left.max(Duration::from_millis(1));
            recorder
                .complete_for(lease, record.clone(), retention)
                .await;
            match crate::replay::answer(&record, &fingerprint, transform.as_deref()) {
                Ok(stored) => {
                    durable_row("replayed");
                    FullResponse::replay(stored)
                }
                Err(kind) => FullResponse::rejection(policy.reject(kind, wire)),
            }
        }
        None => {
            super::release(lease).await;
            if !same {
                crate::metrics::replay("mismatch");
                return FullResponse::rejection(policy.reject(RejectionKind::Mismatch, wire));
            }
            durable_row("not_stored");
            if in_flight || young {
                return busy(policy, wire);
            }
            crate::metrics::replay("not_stored");
            FullResponse::rejection(policy.reject(RejectionKind::CompletedNotStored, wire))
        }
    }
}

/// The record of the response [`Durable::rebuild`]'s hook made from the business data,
/// stored in the row of the execution `run_id`; `None` without a hook, or when it had none
/// (or did not answer in time).
async fn rebuild(
    recorder: &Recorder,
    row_key: &RowKey,
    run_id: &[u8],
    ttl: Duration,
) -> Option<Bytes> {
    let durable = durable_of(recorder);
    let hook = durable.rebuild.as_ref()?;
    let rebuilt = tokio::time::timeout(durable.timeout, hook(row_key.hex()));
    let Ok(Some(rebuilt)) = rebuilt.await else {
        return None;
    };
    let headers = rebuilt
        .headers
        .iter()
        .map(|(n, v)| (n.as_str(), v.as_bytes()));
    let record = recorder.response(rebuilt.status, headers, &rebuilt.body);
    durable_row("rebuilt");
    store_record(recorder, row_key, run_id, &record, ttl).await;
    Some(record)
}

/// `503` + `Retry-After`: the row could not be read (or the lease ran out meanwhile), so
/// whether the key completed is not known; nothing ran, the lock is released.
async fn unavailable(lease: Lease, policy: &LockPolicy, wire: Wire) -> FullResponse {
    durable_row("lookup_failed");
    super::release(lease).await;
    let rejection = Rejection::retry(RejectionKind::Unavailable, BUSY_RETRY).on(wire);
    FullResponse::rejection(policy.respond(&rejection))
}

/// `409` + `Retry-After`.
fn busy(policy: &LockPolicy, wire: Wire) -> FullResponse {
    let rejection = Rejection::retry(RejectionKind::Contended, BUSY_RETRY).on(wire);
    FullResponse::rejection(policy.respond(&rejection))
}

/// What the handler's statements found decides, before its response: `Ok` to go on with
/// the response (stored in the row by [`store`]), or the answer that replaces it.
pub(crate) async fn after(
    running: Running,
    row: &KeyRow,
    policy: &LockPolicy,
    wire: Wire,
) -> Result<Running, FullResponse> {
    match row.state() {
        RowState::Recorded | RowState::Committed => Ok(running),
        RowState::Unrecorded => {
            durable_row("unrecorded");
            tracing::warn!(
                "a handler under durable replay did not record the key's row in its transaction: its response is stored after it"
            );
            Ok(running)
        }
        RowState::Busy => {
            // Its transaction rolled back: nothing ran.
            durable_row("busy");
            super::release(running.into_lease()).await;
            Err(busy(policy, wire))
        }
        RowState::Completed => {
            // A duplicate (its lock was lost to it, or the Redis records were gone) met the
            // committed row; its own work rolled back.
            durable_row("duplicate");
            let (lease, recorder) = running.into_parts();
            let recorder = recorder.expect("under durable replay");
            let durable = durable_of(&recorder);
            let found =
                tokio::time::timeout(durable.timeout, durable.store.find(&row.key().0)).await;
            match found {
                Ok(Ok(Some(found))) => {
                    let answer = answer(lease, recorder, row.key(), found, true, policy, wire);
                    Err(answer.await)
                }
                _ => {
                    super::release(lease).await;
                    Err(busy(policy, wire))
                }
            }
        }
    }
}

/// Stores the response's `record` in the key's row, in a transaction of its own, before the
/// Redis record: into the handler's row when it committed, into a row of its own when it
/// rolled back or recorded none — never over another execution's row.
pub(crate) async fn store(running: &Running, row: &KeyRow, record: &Bytes, ttl: Duration) {
    if let Some(recorder) = running.recorder() {
        store_record(recorder, row.key(), row.run_id(), record, ttl).await;
    }
}

/// [`RowStore::store`](crate::durable::RowStore::store) for the execution `run_id`, bounded
/// by the durable timeout; a failure is logged and counted (the record still goes to the
/// Redis voters).
async fn store_record(
    recorder: &Recorder,
    key: &RowKey,
    run_id: &[u8],
    record: &Bytes,
    ttl: Duration,
) {
    let durable = durable_of(recorder);
    let lock_timeout = format!("{}ms", millis(durable.lock_timeout));
    let new = NewRecord {
        key_hash: &key.0,
        fingerprint: &recorder.fingerprint().0,
        record,
        retention_ms: millis(row_retention(recorder, ttl)),
        lock_timeout: &lock_timeout,
        run_id,
    };
    match tokio::time::timeout(durable.timeout, durable.store.store(new)).await {
        Ok(Ok(true)) => durable_row("stored"),
        Ok(Ok(false)) => {
            durable_row("store_failed");
            tracing::warn!(
                "the key's row already holds a response, or another execution's row is there: this response is kept on the Redis voters only"
            );
        }
        Ok(Err(e)) => {
            durable_row("store_failed");
            tracing::warn!(error = %e, "the response was not stored in the key's row");
        }
        Err(_) => {
            durable_row("store_failed");
            tracing::warn!(timeout = ?durable.timeout, "the response's store in the key's row did not answer");
        }
    }
}
