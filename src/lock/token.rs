//! A lock's token: the unguessable value only its owner knows, set on every node that
//! grants the lock and compared by every release, extension and completion.

/// A lock token: 128 random bits from the OS CSPRNG (a UUID v4), as 32 lowercase hex digits.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Token([u8; 32]);

impl Token {
    pub(crate) fn new() -> Self {
        let mut buf = [0u8; 32];
        uuid::Uuid::new_v4().simple().encode_lower(&mut buf);
        Self(buf)
    }

    pub(crate) fn as_str(&self) -> &str {
        // Always 32 ASCII hex digits.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::Token;

    #[test]
    fn tokens_are_ascii_hex_and_unique() {
        let a = Token::new();
        let b = Token::new();
        assert_ne!(a.as_str(), b.as_str());
        assert_eq!(a.as_str().len(), 32);
        assert!(a.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
    }
}
