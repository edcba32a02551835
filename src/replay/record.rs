//! The stored HTTP record: the fingerprint of the request that completed, and its response
//! (or the mark that it completed without one). Framework-neutral bytes, so that either
//! framework replays what the other stored.
//!
//! ```text
//! "TRH1"                     magic and format version
//! fingerprint [32]
//! kind u8                    0: response stored, 1: completed, response not stored,
//!                            2: response stored sealed (Replay::transform),
//!                            3: stopped on a lost lease, outcome unknown (OnLost::Abort)
//! -- kind 0 only, and kind 2 once opened --
//! status u16, header count u16
//! per header: name len u16, name, value len u32, value
//! body                       the rest
//! -- kind 2 --
//! sealed                     the rest: what RecordTransform::seal made of the above
//! ```
//! Integers are big-endian. A record that does not parse (another version, damage) is
//! answered as "completed, not stored": never a second run.

use bytes::{BufMut, Bytes, BytesMut};

use super::{Fingerprint, RecordTransform};

const MAGIC: &[u8; 4] = b"TRH1";
const KIND_RESPONSE: u8 = 0;
const KIND_COMPLETED: u8 = 1;
const KIND_SEALED: u8 = 2;
const KIND_ABORTED: u8 = 3;
/// The bytes before a response: magic, fingerprint, kind.
const HEAD: usize = 4 + 32 + 1;

/// A response to replay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredResponse {
    pub(crate) status: u16,
    /// Lower-case names, raw values, in the order the handler set them.
    pub(crate) headers: Vec<(String, Bytes)>,
    pub(crate) body: Bytes,
}

/// What a record says.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Record {
    /// Completed with this response.
    Response(Fingerprint, StoredResponse),
    /// Completed; the response was not stored.
    Completed(Fingerprint),
    /// Stopped when its lease was lost: the outcome is unknown.
    Aborted(Fingerprint),
    /// Not a record this version reads.
    Unreadable,
}

/// The size of a response record with these parts.
pub(crate) fn response_len<'a>(
    headers: impl Iterator<Item = (&'a str, &'a [u8])>,
    body: usize,
) -> usize {
    let head = MAGIC.len() + 32 + 1 + 2 + 2;
    let headers: usize = headers.map(|(n, v)| 2 + n.len() + 4 + v.len()).sum();
    // Saturating: a body length near usize::MAX is "too large", never an overflow.
    (head + headers).saturating_add(body)
}

/// A response record. The caller has checked the size with [`response_len`]; header names
/// are at most 64 KiB and values 4 GiB by construction of HTTP servers (longer ones are
/// left out, with a warning).
pub(crate) fn encode_response<'a>(
    fingerprint: &Fingerprint,
    status: u16,
    headers: impl Iterator<Item = (&'a str, &'a [u8])> + Clone,
    body: &[u8],
) -> Bytes {
    let mut out = BytesMut::with_capacity(response_len(headers.clone(), body.len()));
    out.put_slice(MAGIC);
    out.put_slice(&fingerprint.0);
    out.put_u8(KIND_RESPONSE);
    out.put_u16(status);
    let fits =
        |(n, v): &(&str, &[u8])| n.len() <= u16::MAX as usize && v.len() <= u32::MAX as usize;
    let count = headers.clone().filter(fits).count().min(u16::MAX as usize);
    out.put_u16(count as u16);
    for (name, value) in headers.filter(fits).take(count) {
        out.put_u16(name.len() as u16);
        out.put_slice(name.to_ascii_lowercase().as_bytes());
        out.put_u32(value.len() as u32);
        out.put_slice(value);
    }
    out.put_slice(body);
    out.freeze()
}

/// A "completed, response not stored" record.
pub(crate) fn encode_completed(fingerprint: &Fingerprint) -> Bytes {
    encode_mark(fingerprint, KIND_COMPLETED)
}

/// A "stopped on a lost lease, outcome unknown" record.
pub(crate) fn encode_aborted(fingerprint: &Fingerprint) -> Bytes {
    encode_mark(fingerprint, KIND_ABORTED)
}

/// A record without a response: its fingerprint and `kind`.
fn encode_mark(fingerprint: &Fingerprint, kind: u8) -> Bytes {
    let mut out = BytesMut::with_capacity(HEAD);
    out.put_slice(MAGIC);
    out.put_slice(&fingerprint.0);
    out.put_u8(kind);
    out.freeze()
}

/// A response record sealed with `transform` (kind 2); a "completed" record as it is (it
/// holds a hash). `None` when the transform failed (logged at warn).
pub(crate) fn seal(record: Bytes, transform: &dyn RecordTransform) -> Option<Bytes> {
    if record.get(HEAD - 1) != Some(&KIND_RESPONSE) {
        return Some(record);
    }
    match transform.seal(&record[HEAD..]) {
        Ok(sealed) => {
            let mut out = BytesMut::with_capacity(HEAD + sealed.len());
            out.put_slice(&record[..HEAD - 1]);
            out.put_u8(KIND_SEALED);
            out.put_slice(&sealed);
            Some(out.freeze())
        }
        Err(e) => {
            tracing::warn!(error = %e, "the replay transform failed to seal a response: it is not stored");
            None
        }
    }
}

/// The answer to a request with `fingerprint` whose key has `record`: the response to
/// replay, or why not (`422` another request, `409` completed without a stored response).
pub(crate) fn answer(
    record: &Bytes,
    fingerprint: &Fingerprint,
    transform: Option<&dyn RecordTransform>,
) -> Result<StoredResponse, crate::rejection::RejectionKind> {
    use crate::rejection::RejectionKind;
    // Another request is told so without opening anything (a sealed record's fingerprint
    // is in the clear).
    if let Some(stored) = record.get(MAGIC.len()..HEAD - 1) {
        if record.starts_with(MAGIC) && stored != fingerprint.0 {
            return Err(RejectionKind::Mismatch);
        }
    }
    match decode_with(record, transform) {
        Record::Response(fp, _) | Record::Completed(fp) | Record::Aborted(fp)
            if fp != *fingerprint =>
        {
            Err(RejectionKind::Mismatch)
        }
        Record::Response(_, response) => Ok(response),
        Record::Completed(_) => Err(RejectionKind::CompletedNotStored),
        Record::Aborted(_) => Err(RejectionKind::OutcomeUnknown),
        Record::Unreadable => {
            tracing::warn!("a completion record this version cannot read: answered as completed");
            Err(RejectionKind::CompletedNotStored)
        }
    }
}

/// Reads a record; never panics, whatever the bytes.
#[cfg(test)]
pub(crate) fn decode(record: &Bytes) -> Record {
    decode_with(record, None)
}

/// Reads a record, opening a sealed one with `transform`: without it, or when it fails
/// (logged at warn), the record is unreadable.
pub(crate) fn decode_with(record: &Bytes, transform: Option<&dyn RecordTransform>) -> Record {
    if record.len() >= HEAD && record[..4] == MAGIC[..] && record[HEAD - 1] == KIND_SEALED {
        let opened = match transform.map(|t| t.open(&record[HEAD..])) {
            Some(Ok(opened)) => opened,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "the replay transform failed to open a stored response");
                return Record::Unreadable;
            }
            None => return Record::Unreadable,
        };
        let mut plain = BytesMut::with_capacity(HEAD + opened.len());
        plain.put_slice(&record[..HEAD - 1]);
        plain.put_u8(KIND_RESPONSE);
        plain.put_slice(&opened);
        return decode_inner(&plain.freeze()).unwrap_or(Record::Unreadable);
    }
    decode_inner(record).unwrap_or(Record::Unreadable)
}

fn decode_inner(record: &Bytes) -> Option<Record> {
    let mut at = 0usize;
    let mut take = |n: usize| -> Option<std::ops::Range<usize>> {
        let range = at..at.checked_add(n)?;
        (range.end <= record.len()).then(|| {
            at = range.end;
            range
        })
    };
    if record.get(take(4)?)? != MAGIC {
        return None;
    }
    let fingerprint = Fingerprint(record.get(take(32)?)?.try_into().ok()?);
    let kind = record[take(1)?.start];
    if kind == KIND_COMPLETED {
        return Some(Record::Completed(fingerprint));
    }
    if kind == KIND_ABORTED {
        return Some(Record::Aborted(fingerprint));
    }
    if kind != KIND_RESPONSE {
        return None;
    }
    let u16_at =
        |r: std::ops::Range<usize>| u16::from_be_bytes([record[r.start], record[r.start + 1]]);
    let status = u16_at(take(2)?);
    if !(100..=999).contains(&status) {
        return None;
    }
    let count = u16_at(take(2)?);
    let mut headers = Vec::with_capacity(usize::from(count).min(64));
    for _ in 0..count {
        let name_len = usize::from(u16_at(take(2)?));
        let name = std::str::from_utf8(&record[take(name_len)?])
            .ok()?
            .to_owned();
        let r = take(4)?;
        let value_len = u32::from_be_bytes(record[r].try_into().ok()?) as usize;
        let value = record.slice(take(value_len)?);
        headers.push((name, value));
    }
    let body = record.slice(at..);
    Some(Record::Response(
        fingerprint,
        StoredResponse {
            status,
            headers,
            body,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_garbage_is_unreadable() {
        let fp = Fingerprint([7; 32]);
        let headers = [("content-type", &b"application/json"[..]), ("x-id", b"1")];
        let body = b"{\"payment_id\":\"p1\"}";
        let bytes = encode_response(&fp, 201, headers.iter().copied(), body);
        assert_eq!(
            bytes.len(),
            response_len(headers.iter().copied(), body.len())
        );
        let Record::Response(got, res) = decode(&bytes) else {
            panic!("not a response")
        };
        assert_eq!(got, fp);
        assert_eq!(res.status, 201);
        assert_eq!(
            res.headers[0],
            (
                "content-type".to_owned(),
                Bytes::from_static(b"application/json")
            )
        );
        assert_eq!(&res.body[..], body);

        assert_eq!(decode(&encode_completed(&fp)), Record::Completed(fp));
        assert_eq!(decode(&encode_aborted(&fp)), Record::Aborted(fp));
        assert_eq!(
            answer(&encode_aborted(&fp), &fp, None),
            Err(crate::rejection::RejectionKind::OutcomeUnknown)
        );
        assert_eq!(
            answer(&encode_aborted(&fp), &Fingerprint([8; 32]), None),
            Err(crate::rejection::RejectionKind::Mismatch)
        );

        // Every truncation and a foreign record are unreadable, never a panic.
        for n in 0..bytes.len() - body.len() {
            assert_eq!(decode(&bytes.slice(..n)), Record::Unreadable, "{n}");
        }
        assert_eq!(
            decode(&Bytes::from_static(b"charged: pay_1")),
            Record::Unreadable
        );
        let mut bad_status = bytes.to_vec();
        bad_status[37..39].copy_from_slice(&42u16.to_be_bytes());
        assert_eq!(decode(&Bytes::from(bad_status)), Record::Unreadable);
    }
}
