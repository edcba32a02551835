//! Stored responses sealed before the write and opened on replay ([`RecordTransform`]).

/// The error a [`RecordTransform`] answers.
pub type TransformError = Box<dyn std::error::Error + Send + Sync>;

/// What a stored response goes through on its way to Redis and back: encrypt (or redact)
/// in [`seal`](Self::seal) before the write, reverse it in [`open`](Self::open) on replay.
/// Replayed responses sit in Redis for up to the retention; with a transform, Redis keeps
/// only what `seal` gave.
///
/// What is sealed is the response: its status, the stored headers and the body, encoded.
/// The request's fingerprint (a SHA-256, which decides `422`) and the record's tag stay
/// outside, so that a reused key is judged without opening anything. A response whose
/// `seal` fails is not stored: the key is marked completed without a response (duplicates
/// get `409` completed-not-stored; the handler never runs twice). A record whose `open`
/// fails (a key rotated away, damage) is answered the same way, logged at warn; another
/// request under the same key is answered `422` without opening anything. Every instance
/// must open what any other sealed: rotate keys by opening with the old and the new one for
/// at least the retention.
///
/// What it gives is confidentiality, not integrity: the record's tag and fingerprint are not bound
/// to the sealed bytes. Use a cipher that authenticates. Know too that anyone who can write to your
/// Redis can move a sealed response under another key. Records stored unsealed (before the
/// transform was turned on) are still replayed. The replay's `response_limit` applies to the
/// response before it is sealed. A sealed record over
/// [`Lease::MAX_RECORD_LEN`](crate::Lease::MAX_RECORD_LEN) is not stored (the key is marked
/// completed).
///
/// ```
/// use tower_redlock::replay::{RecordTransform, Replay, TransformError};
///
/// /// A stand-in for a real cipher (AES-GCM, ChaCha20-Poly1305 with a key you hold).
/// struct Xor(u8);
///
/// impl RecordTransform for Xor {
///     fn seal(&self, response: &[u8]) -> Result<Vec<u8>, TransformError> {
///         Ok(response.iter().map(|b| b ^ self.0).collect())
///     }
///     fn open(&self, sealed: &[u8]) -> Result<Vec<u8>, TransformError> {
///         Ok(sealed.iter().map(|b| b ^ self.0).collect())
///     }
/// }
///
/// let replay = Replay::new().transform(Xor(0x5a));
/// # let _ = replay;
/// ```
pub trait RecordTransform: Send + Sync + 'static {
    /// Before the write: the encoded response to what Redis keeps.
    ///
    /// # Errors
    ///
    /// A [`TransformError`] when the response cannot be sealed: the response is then not
    /// stored (the key is marked completed, never run twice).
    fn seal(&self, response: &[u8]) -> Result<Vec<u8>, TransformError>;

    /// On replay: what Redis kept back to the encoded response `seal` was given.
    ///
    /// # Errors
    ///
    /// A [`TransformError`] when what Redis kept cannot be opened (another key, damaged
    /// bytes): the request is answered `409` completed-not-stored, never run again.
    fn open(&self, sealed: &[u8]) -> Result<Vec<u8>, TransformError>;
}
