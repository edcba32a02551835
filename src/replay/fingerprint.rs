//! The request fingerprint: what tells a retry of a request from another request that reuses
//! its key. Part of the stored record, so its encoding is part of the crate's contract (the
//! same request gives the same fingerprint in every process and in both frameworks).

use sha2::{Digest, Sha256};

use super::Replay;
use crate::key::RequestView;

/// The SHA-256 of a request: method, path, query, configured headers and the body's digest.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fingerprint(pub(crate) [u8; 32]);

impl std::fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A digest, not request data; the first bytes are enough to tell two apart.
        write!(
            f,
            "Fingerprint({:02x}{:02x}{:02x}{:02x}…)",
            self.0[0], self.0[1], self.0[2], self.0[3]
        )
    }
}

/// A fingerprint of everything but the body, made synchronously from the request's view;
/// [`finish`](Self::finish) adds the body once it is buffered.
#[derive(Clone)]
pub(crate) struct FingerprintBuilder {
    hasher: Sha256,
}

/// Each part as its length (big-endian `u64`) and its bytes: no two part lists collide.
fn part(hasher: &mut Sha256, bytes: &[u8]) {
    hasher.update((bytes.len() as u64).to_be_bytes());
    hasher.update(bytes);
}

impl FingerprintBuilder {
    pub(crate) fn new(replay: &Replay, req: &dyn RequestView) -> Self {
        let mut hasher = Sha256::new();
        part(&mut hasher, b"tower-redlock request fingerprint v1");
        part(&mut hasher, req.method().as_bytes());
        part(&mut hasher, req.path().as_bytes());
        // An empty query is no query: the frameworks do not agree on `/p?`.
        match req.query().filter(|q| !q.is_empty()) {
            Some(q) => {
                part(&mut hasher, b"?");
                part(&mut hasher, q.as_bytes());
            }
            None => part(&mut hasher, b""),
        }
        for name in &replay.fingerprint_headers {
            part(&mut hasher, name.as_bytes());
            let count = req.header_count(name) as u64;
            hasher.update(count.to_be_bytes());
            if let Some(value) = req.header(name) {
                part(&mut hasher, value);
            }
        }
        Self { hasher }
    }

    /// The fingerprint, with the body's digest (`None`: the body is not fingerprinted).
    pub(crate) fn finish(mut self, body: Option<&[u8]>) -> Fingerprint {
        match body {
            Some(body) => {
                part(&mut self.hasher, b"body");
                part(&mut self.hasher, &Sha256::digest(body));
            }
            None => part(&mut self.hasher, b"no body"),
        }
        Fingerprint(self.hasher.finalize().into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::SimpleRequest;

    fn fp(replay: &Replay, req: &SimpleRequest, body: Option<&[u8]>) -> Fingerprint {
        FingerprintBuilder::new(replay, req).finish(body)
    }

    #[test]
    fn every_part_counts() {
        let r = Replay::new().fingerprint_header("content-type");
        let base = SimpleRequest::new("POST", "/pay").header("content-type", "application/json");
        let a = fp(&r, &base, Some(b"{\"amount\":1}"));
        assert_eq!(a, fp(&r, &base, Some(b"{\"amount\":1}")));
        assert_ne!(a, fp(&r, &base, Some(b"{\"amount\":2}")));
        assert_ne!(a, fp(&r, &base, None));
        let put = SimpleRequest::new("PUT", "/pay").header("content-type", "application/json");
        assert_ne!(a, fp(&r, &put, Some(b"{\"amount\":1}")));
        let other_path =
            SimpleRequest::new("POST", "/pay2").header("content-type", "application/json");
        assert_ne!(a, fp(&r, &other_path, Some(b"{\"amount\":1}")));
        let text = SimpleRequest::new("POST", "/pay").header("content-type", "text/plain");
        assert_ne!(a, fp(&r, &text, Some(b"{\"amount\":1}")));
        // A header not configured does not count.
        let traced = base.clone().header("x-trace", "1");
        assert_eq!(a, fp(&r, &traced, Some(b"{\"amount\":1}")));
        // The query counts; an empty one is none.
        let q = SimpleRequest::new("POST", "/pay?a=1");
        let empty_q = SimpleRequest::new("POST", "/pay?");
        let no_q = SimpleRequest::new("POST", "/pay");
        assert_ne!(fp(&r, &q, None), fp(&r, &no_q, None));
        assert_eq!(fp(&r, &empty_q, None), fp(&r, &no_q, None));
    }
}
