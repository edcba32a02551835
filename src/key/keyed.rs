//! Keyed lock keys: HMAC-SHA-256 (RFC 2104) with a secret the application holds, so that a
//! low-entropy key (an order id) cannot be recovered from Redis by hashing guesses.

use super::*;

/// The least secret accepted, in bytes (128 bits).
pub(crate) const MIN_SECRET_LEN: usize = 16;

/// An HMAC-SHA-256 key, its padded inner and outer states computed once.
#[derive(Clone)]
pub(crate) struct HmacKey {
    inner: Sha256,
    outer: Sha256,
}

impl fmt::Debug for HmacKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HmacKey(..)")
    }
}

impl HmacKey {
    /// The key for `secret`; a secret shorter than [`MIN_SECRET_LEN`] is refused.
    pub(crate) fn new(secret: &[u8]) -> crate::Result<Self> {
        if secret.len() < MIN_SECRET_LEN {
            return Err(crate::Error::invalid(format!(
                "an HMAC key of {} bytes is too short: use at least {MIN_SECRET_LEN} random \
                 bytes (32 recommended)",
                secret.len()
            )));
        }
        // A key longer than the block is hashed first (RFC 2104).
        let mut block = [0u8; 64];
        if secret.len() > block.len() {
            block[..32].copy_from_slice(&Sha256::digest(secret));
        } else {
            block[..secret.len()].copy_from_slice(secret);
        }
        let pad = |byte: u8| {
            let mut h = Sha256::new();
            h.update(block.map(|b| b ^ byte));
            h
        };
        Ok(Self {
            inner: pad(0x36),
            outer: pad(0x5c),
        })
    }

    /// HMAC-SHA-256 of `message`.
    pub(crate) fn mac(&self, message: &[u8]) -> [u8; 32] {
        let mut inner = self.inner.clone();
        inner.update(message);
        let mut outer = self.outer.clone();
        outer.update(inner.finalize());
        outer.finalize().into()
    }
}

impl LockKey {
    /// This key under `secret`: the same prefix, then the hex of the first 16 bytes of
    /// HMAC-SHA-256(secret, this whole key).
    pub(crate) fn keyed(&self, secret: &HmacKey) -> LockKey {
        let full = self.as_str();
        let prefix = &full[..full.len().saturating_sub(DIGEST_HEX_LEN)];
        let mac = secret.mac(full.as_bytes());
        let mut key = String::with_capacity(prefix.len() + DIGEST_HEX_LEN);
        key.push_str(prefix);
        for byte in mac.iter().take(DIGEST_BYTES) {
            key.push(char::from(HEX[usize::from(byte >> 4)]));
            key.push(char::from(HEX[usize::from(byte & 0x0f)]));
        }
        LockKey { key }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 4231, test cases 6 (a key longer than the block) and 1; its case 2's key
    /// ("Jefe") is shorter than the minimum and refused.
    #[test]
    fn hmac_matches_rfc_4231() {
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        let key = HmacKey::new(&[0xaa; 131]).unwrap();
        assert_eq!(
            hex(&key.mac(b"Test Using Larger Than Block-Size Key - Hash Key First")),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
        let key = HmacKey::new(&[0x0b; 20]).unwrap();
        assert_eq!(
            hex(&key.mac(b"Hi There")),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"
        );
        assert!(HmacKey::new(b"Jefe").is_err(), "too short");
    }
}
