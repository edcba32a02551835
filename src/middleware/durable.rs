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
use crate::replay::{Recorder, Running};

/// How long a client is told to wait after a busy row (a lock timeout, a serialization
/// failure, a deadlock) or a duplicate that met a row whose response is not stored yet.
const BUSY_RETRY: Duration = Duration::from_secs(1);

/// What the row says before the handler.
pub(crate) enum Before {
    /// No row: run the handler with this value in its request.
    Run(Running, KeyRow),
    /// The answer, the handler not run.
    Answered(FullResponse),
}

/// The durable settings of a request's replay, if it has them.
fn durable_of(running: &Running) -> Option<(&Recorder, &Durable)> {
    let recorder = running.recorder()?;
    Some((recorder, recorder.replay().durable.as_ref()?))
}

/// Looks the key's row up. The lock is held, and no Redis voter had a record of the key.
pub(crate) async fn before(
    running: Running,
    row_key: RowKey,
    policy: &LockPolicy,
    wire: Wire,
) -> Before {
    let Some((recorder, durable)) = durable_of(&running) else {
        unreachable!("called only under durable replay")
    };
    let found = tokio::time::timeout(durable.timeout, durable.store.find(&row_key.0)).await;
    match found {
        Ok(Ok(None)) => {
            let row = KeyRow::new(
                row_key,
                recorder.fingerprint().0,
                recorder.replay().retention,
                durable.lock_timeout,
                durable.insert_sql.clone(),
            );
            Before::Run(running, row)
        }
        Ok(Ok(Some(found))) => {
            Before::Answered(answer(running, &row_key, found, false, policy, wire).await)
        }
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "the key's row could not be looked up: answered 503");
            Before::Answered(unavailable(running, policy, wire).await)
        }
        Err(_) => {
            tracing::warn!(timeout = ?durable.timeout, "the key's row lookup did not answer: answered 503");
            Before::Answered(unavailable(running, policy, wire).await)
        }
    }
}

/// The answer from a committed row. A stored response is replayed (or `422` for another
/// request), its record restored on the Redis voters. Without one: `422` for another
/// request, else — for a duplicate that met the row while its first may still store the
/// response (`in_flight`) — `409` + `Retry-After`, otherwise `409` completed-not-stored;
/// the lock is released and nothing written to Redis, so a later lookup finds the
/// response once it is stored.
async fn answer(
    running: Running,
    row_key: &RowKey,
    found: FoundRow,
    in_flight: bool,
    policy: &LockPolicy,
    wire: Wire,
) -> FullResponse {
    let (recorder, _) = durable_of(&running).expect("under durable replay");
    let fingerprint = *recorder.fingerprint();
    let mut record = found.record;
    let same = found.fingerprint[..] == fingerprint.0[..];
    if record.is_none() && same && !in_flight {
        record = rebuild(&running, row_key).await;
    }
    match record {
        Some(record) => {
            let transform = recorder.replay().transform.clone();
            running.complete(record.clone()).await;
            match crate::replay::answer(&record, &fingerprint, transform.as_deref()) {
                Ok(stored) => {
                    durable_row("replayed");
                    FullResponse::replay(stored)
                }
                Err(kind) => FullResponse::rejection(policy.reject(kind, wire)),
            }
        }
        None => {
            super::release(running.into_lease()).await;
            if !same {
                return FullResponse::rejection(policy.reject(RejectionKind::Mismatch, wire));
            }
            durable_row("not_stored");
            if in_flight {
                return busy(policy, wire);
            }
            FullResponse::rejection(policy.reject(RejectionKind::CompletedNotStored, wire))
        }
    }
}

/// The record of the response [`Durable::rebuild`]'s hook made from the business data, stored
/// in the row; `None` without a hook, or when it had none (or did not answer in time).
async fn rebuild(running: &Running, row_key: &RowKey) -> Option<Bytes> {
    let (recorder, durable) = durable_of(running)?;
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
    store_record(durable, recorder, row_key, &record).await;
    Some(record)
}

/// `503` + `Retry-After`: the row could not be read, so whether the key completed is not
/// known; nothing ran, the lock is released.
async fn unavailable(running: Running, policy: &LockPolicy, wire: Wire) -> FullResponse {
    durable_row("lookup_failed");
    super::release(running.into_lease()).await;
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
        RowState::Recorded => Ok(running),
        RowState::Unrecorded => {
            durable_row("unrecorded");
            tracing::warn!(
                "a handler under durable replay did not record the key's row: its response is kept on the Redis voters only"
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
            let (_, durable) = durable_of(&running).expect("under durable replay");
            let found =
                tokio::time::timeout(durable.timeout, durable.store.find(&row.key().0)).await;
            match found {
                Ok(Ok(Some(found))) => {
                    Err(answer(running, row.key(), found, true, policy, wire).await)
                }
                _ => {
                    super::release(running.into_lease()).await;
                    Err(busy(policy, wire))
                }
            }
        }
    }
}

/// Stores the response's `record` in the key's row, in a transaction of its own, before the
/// Redis record: into the handler's row when it committed, into a row of its own when it
/// rolled back (a response below 500). A failure is logged and counted; the record still
/// goes to the Redis voters.
pub(crate) async fn store(running: &Running, row: &KeyRow, record: &Bytes) {
    let Some((recorder, durable)) = durable_of(running) else {
        return;
    };
    if row.state() == RowState::Recorded {
        store_record(durable, recorder, row.key(), record).await;
    }
}

/// [`RowStore::store`](crate::durable::RowStore::store), bounded by the durable timeout;
/// logged and counted.
async fn store_record(durable: &Durable, recorder: &Recorder, key: &RowKey, record: &Bytes) {
    let lock_timeout = format!("{}ms", millis(durable.lock_timeout));
    let new = NewRecord {
        key_hash: &key.0,
        fingerprint: &recorder.fingerprint().0,
        record,
        retention_ms: millis(recorder.replay().retention),
        lock_timeout: &lock_timeout,
    };
    match tokio::time::timeout(durable.timeout, durable.store.store(new)).await {
        Ok(Ok(true)) => durable_row("stored"),
        Ok(Ok(false)) => {
            durable_row("store_failed");
            tracing::warn!(
                "the key's row holds another response: this one is kept on the Redis voters only"
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
