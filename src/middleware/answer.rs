//! The middleware's own answers, made whole: a rejection or a replayed response.

use bytes::Bytes;

use crate::rejection::RejectionResponse;
use crate::replay::{StoredResponse, REPLAYED_HEADER};

/// An answer made whole by the middleware: a rejection or a replayed response.
#[derive(Debug)]
pub(crate) struct FullResponse {
    pub(crate) status: u16,
    /// Lower-case names; the values were checked when they were made or stored.
    pub(crate) headers: Vec<(String, Bytes)>,
    pub(crate) body: Bytes,
}

impl FullResponse {
    /// The rejection as a response: its `Content-Type`, `Retry-After` and own headers.
    pub(crate) fn rejection(r: RejectionResponse) -> Self {
        let mut headers = vec![(
            "content-type".to_owned(),
            Bytes::copy_from_slice(r.content_type().as_bytes()),
        )];
        if let Some(secs) = r.retry_after() {
            headers.push(("retry-after".to_owned(), Bytes::from(secs.to_string())));
        }
        headers.extend(
            r.headers()
                .map(|(n, v)| (n.to_owned(), Bytes::copy_from_slice(v.as_bytes()))),
        );
        Self {
            status: r.status(),
            headers,
            body: r.into_body(),
        }
    }

    /// The stored response, replayed: its status, headers and body, and
    /// `Idempotency-Replayed: true`.
    pub(crate) fn replay(stored: StoredResponse) -> Self {
        let mut headers = stored.headers;
        headers.push((REPLAYED_HEADER.to_owned(), Bytes::from_static(b"true")));
        Self {
            status: stored.status,
            headers,
            body: stored.body,
        }
    }
}
