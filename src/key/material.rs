//! Key material (length-prefixed parts) and the hashed [`LockKey`].

use super::*;

/// The parts of a lock key, hashed as they are pushed; [`finish`] turns them
/// into a [`LockKey`].
///
/// Each part is fed to SHA-256 as its length (big-endian `u64`) followed by
/// its bytes, so `["ab", "c"]` and `["a", "bc"]` give different keys. Pushing
/// costs no allocation; [`finish`] allocates the key's one `String`.
///
/// Extractors receive a `&mut KeyMaterial` in
/// [`KeyExtractor::extract_into`]. Start what you push with a constant tag of
/// your own (e.g. `b"my-extractor"`) so that your parts cannot be mistaken for
/// another extractor's.
///
/// ```
/// use tower_redlock::key::{KeyMaterial, LockKey};
///
/// let mut material = KeyMaterial::new();
/// material.push("order").push("42");
/// let key = material.finish();
/// assert_eq!(key, LockKey::from_parts(["order", "42"]));
/// assert!(key.as_str().starts_with("tower-redlock:"));
/// ```
///
/// [`finish`]: KeyMaterial::finish
#[derive(Clone, Default)]
pub struct KeyMaterial {
    hasher: Sha256,
    prefix: Option<Arc<str>>,
}

impl KeyMaterial {
    /// Empty material with the default prefix ([`LockKey::DEFAULT_PREFIX`](crate::key::LockKey::DEFAULT_PREFIX)).
    pub fn new() -> Self {
        Self::default()
    }

    /// Pushes one part.
    pub fn push(&mut self, part: impl AsRef<[u8]>) -> &mut Self {
        let part = part.as_ref();
        self.begin_part(part.len());
        self.hasher.update(part);
        self
    }

    /// Sets the Redis prefix of the key, replacing any set before.
    pub fn set_prefix(&mut self, prefix: impl Into<Arc<str>>) -> &mut Self {
        self.prefix = Some(prefix.into());
        self
    }

    /// The prefix the key will get.
    pub fn prefix(&self) -> &str {
        self.prefix.as_deref().unwrap_or(DEFAULT_KEY_PREFIX)
    }

    /// Hashes the parts into a [`LockKey`] (the one allocation).
    pub fn finish(self) -> LockKey {
        let prefix = self.prefix.as_deref().unwrap_or(DEFAULT_KEY_PREFIX);
        let digest = self.hasher.finalize();
        let mut key = String::with_capacity(prefix.len() + DIGEST_HEX_LEN);
        key.push_str(prefix);
        for byte in digest.iter().take(DIGEST_BYTES) {
            key.push(char::from(HEX[usize::from(byte >> 4)]));
            key.push(char::from(HEX[usize::from(byte & 0x0f)]));
        }
        LockKey { key }
    }

    /// Starts a part of `len` bytes; [`write`](Self::write) must then feed
    /// exactly `len` bytes.
    pub(super) fn begin_part(&mut self, len: usize) {
        let len = u64::try_from(len).unwrap_or(u64::MAX);
        self.hasher.update(len.to_be_bytes());
    }

    /// Feeds bytes of the part started by [`begin_part`](Self::begin_part).
    pub(super) fn write(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
    }
}

impl fmt::Debug for KeyMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyMaterial")
            .field("prefix", &self.prefix())
            .finish_non_exhaustive()
    }
}

// ===== LockKey =====

/// A lock key ready for Redis: `prefix + 32 lowercase hex digits` (128 bits of
/// SHA-256 over the key's parts).
///
/// The raw key material is gone once the key is built: `Display`, `Debug`
/// and [`as_str`](LockKey::as_str) all show the hashed form only.
///
/// ```
/// use tower_redlock::key::LockKey;
///
/// let key = LockKey::from_parts(["payments", "order-123"]);
/// assert_eq!(key.prefix(), "tower-redlock:");
/// assert_eq!(key.digest_hex().len(), 32);
/// assert!(!format!("{key} {key:?}").contains("order-123"));
///
/// let custom = LockKey::from_parts_with_prefix("myapp:", ["payments", "order-123"]);
/// assert_eq!(custom.digest_hex(), key.digest_hex());
/// assert_eq!(custom.as_str(), format!("myapp:{}", key.digest_hex()));
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockKey {
    pub(super) key: String,
}

impl LockKey {
    /// The Redis prefix of a key when none is set with
    /// [`KeyExtractorExt::prefix`](crate::key::KeyExtractorExt::prefix).
    pub const DEFAULT_PREFIX: &'static str = DEFAULT_KEY_PREFIX;

    /// Hashes `parts` (in order) into a key with the default prefix.
    pub fn from_parts<I>(parts: I) -> Self
    where
        I: IntoIterator,
        I::Item: AsRef<[u8]>,
    {
        let mut material = KeyMaterial::new();
        for part in parts {
            material.push(part);
        }
        material.finish()
    }

    /// Hashes `parts` (in order) into a key with `prefix`.
    pub fn from_parts_with_prefix<I>(prefix: &str, parts: I) -> Self
    where
        I: IntoIterator,
        I::Item: AsRef<[u8]>,
    {
        let mut material = KeyMaterial::new();
        material.set_prefix(prefix);
        for part in parts {
            material.push(part);
        }
        material.finish()
    }

    /// The Redis resource name: prefix and hex digest.
    pub fn as_str(&self) -> &str {
        &self.key
    }

    /// The prefix part of the key.
    pub fn prefix(&self) -> &str {
        let end = self.key.len().saturating_sub(DIGEST_HEX_LEN);
        self.key.get(..end).unwrap_or_default()
    }

    /// The 32 lowercase hex digits after the prefix.
    pub fn digest_hex(&self) -> &str {
        let start = self.key.len().saturating_sub(DIGEST_HEX_LEN);
        self.key.get(start..).unwrap_or_default()
    }

    /// The Redis resource name as an owned `String`.
    pub fn into_string(self) -> String {
        self.key
    }
}

impl fmt::Display for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key)
    }
}

impl fmt::Debug for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("LockKey").field(&self.key).finish()
    }
}

impl AsRef<str> for LockKey {
    fn as_ref(&self) -> &str {
        &self.key
    }
}

impl From<LockKey> for String {
    fn from(key: LockKey) -> Self {
        key.key
    }
}
