//! Reading key text from headers: the structured-field string of the `Idempotency-Key` draft, a bare token, or raw printable ASCII.

use super::*;

/// Removes optional whitespace (SP / HTAB) around a header value.
pub(super) fn trim_ows(mut value: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = value {
        value = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = value {
        value = rest;
    }
    value
}

/// Lowercases a configured header name, allocating only when needed.
pub(super) fn header_name(name: Cow<'static, str>) -> Cow<'static, str> {
    if name.bytes().any(|b| b.is_ascii_uppercase()) {
        Cow::Owned(name.to_ascii_lowercase())
    } else {
        name
    }
}

/// The single value of header `name`: `Ok(None)` when absent, `Duplicate`
/// when sent more than once.
pub(super) fn single_header<'r>(
    req: &'r dyn RequestView,
    name: &str,
) -> Result<Option<&'r [u8]>, KeyRejectionKind> {
    let Some(value) = req.header(name) else {
        return Ok(None);
    };
    if req.header_count(name) > 1 {
        return Err(KeyRejectionKind::Duplicate);
    }
    Ok(Some(value))
}

/// A bare key character: RFC 9110 `tchar`, plus `:` and `/` (as in an RFC
/// 8941 token) and `=` (base64 padding).
pub(super) fn is_bare_key_char(b: u8) -> bool {
    matches!(b,
        b'0'..=b'9' | b'a'..=b'z' | b'A'..=b'Z'
        | b'!' | b'#' | b'$' | b'%' | b'&' | b'\'' | b'*' | b'+' | b'-' | b'.'
        | b'^' | b'_' | b'`' | b'|' | b'~' | b':' | b'/' | b'=')
}

/// A validated `Idempotency-Key` value. (No `Debug`: it holds the raw key.)
#[derive(Clone, Copy)]
pub(super) enum KeyText<'a> {
    /// A bare token, used as is.
    Bare(&'a [u8]),
    /// The inside of a structured-field string (escapes still in place) and
    /// its unescaped length.
    Quoted { inner: &'a [u8], len: usize },
}

impl KeyText<'_> {
    /// Pushes the (unescaped) key as one part, without allocating.
    pub(super) fn push_into(self, material: &mut KeyMaterial) {
        match self {
            KeyText::Bare(bytes) => {
                material.push(bytes);
            }
            KeyText::Quoted { inner, len } => {
                material.begin_part(len);
                let mut rest = inner;
                while let Some(i) = rest.iter().position(|&b| b == b'\\') {
                    material.write(rest.get(..i).unwrap_or_default());
                    // Validation guarantees a `"` or `\` after each backslash;
                    // it is content.
                    match rest.get(i + 1..).unwrap_or_default().split_first() {
                        Some((escaped, tail)) => {
                            material.write(std::slice::from_ref(escaped));
                            rest = tail;
                        }
                        None => {
                            rest = &[];
                        }
                    }
                }
                material.write(rest);
            }
        }
    }
}

/// Parses an `Idempotency-Key` value: an RFC 8941 string (`"..."`, printable
/// ASCII, only `\"` and `\\` escapes) or a bare token.
pub(super) fn parse_key_text(raw: &[u8], max: usize) -> Result<KeyText<'_>, KeyRejectionKind> {
    let value = trim_ows(raw);
    let Some((&first, body)) = value.split_first() else {
        return Err(KeyRejectionKind::Empty);
    };
    if first != b'"' {
        if value.len() > max {
            return Err(KeyRejectionKind::TooLong { max });
        }
        if !value.iter().all(|&b| is_bare_key_char(b)) {
            return Err(KeyRejectionKind::Malformed {
                reason: "a key that is not a quoted string may only contain letters, digits \
                         and !#$%&'*+-.^_`|~:/= (quote it to use other printable characters)",
            });
        }
        return Ok(KeyText::Bare(value));
    }

    let mut len = 0usize;
    let mut escaped = false;
    for (i, &b) in body.iter().enumerate() {
        if escaped {
            if b != b'"' && b != b'\\' {
                return Err(KeyRejectionKind::Malformed {
                    reason: r#"only \" and \\ escapes are allowed in a quoted key"#,
                });
            }
            escaped = false;
        } else {
            match b {
                b'\\' => {
                    escaped = true;
                    continue;
                }
                b'"' => {
                    if body.get(i + 1..).is_some_and(|tail| !tail.is_empty()) {
                        return Err(KeyRejectionKind::Malformed {
                            reason: "unexpected characters after the closing quote",
                        });
                    }
                    if len == 0 {
                        return Err(KeyRejectionKind::Empty);
                    }
                    let inner = body.get(..i).unwrap_or_default();
                    return Ok(KeyText::Quoted { inner, len });
                }
                0x20..=0x7e => {}
                _ => {
                    return Err(KeyRejectionKind::Malformed {
                        reason: "a quoted key may only contain printable ASCII characters",
                    });
                }
            }
        }
        len += 1;
        if len > max {
            return Err(KeyRejectionKind::TooLong { max });
        }
    }
    Err(KeyRejectionKind::Malformed {
        reason: "the quoted key has no closing quote",
    })
}

/// Validates a raw header value used as key (printable ASCII, bounded).
pub(super) fn parse_raw_text(raw: &[u8], max: usize) -> Result<&[u8], KeyRejectionKind> {
    let value = trim_ows(raw);
    if value.is_empty() {
        return Err(KeyRejectionKind::Empty);
    }
    if value.len() > max {
        return Err(KeyRejectionKind::TooLong { max });
    }
    if !value.iter().all(|&b| matches!(b, 0x20..=0x7e)) {
        return Err(KeyRejectionKind::Malformed {
            reason: "the value may only contain printable ASCII characters",
        });
    }
    Ok(value)
}
