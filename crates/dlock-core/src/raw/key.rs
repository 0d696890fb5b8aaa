//! Key validation and the encodings backends share.
//!
//! Every key is validated once, before any network I/O ([`validate`]). Backends whose names
//! have a restricted alphabet or length escape keys with [`escape`] and shorten long ones
//! with [`shorten`]; both are injective together, so two different keys never share a name
//! on the server and no key can reach outside its namespace.

use std::fmt::Write as _;

use sha2::{Digest, Sha256};

use crate::{LockError, Result};

/// Check that `key` is usable: non-empty, at most `max_len` bytes, no NUL byte.
pub fn validate(key: &str, max_len: usize) -> Result<()> {
    if key.is_empty() {
        return Err(LockError::invalid_key(key, "a key must not be empty"));
    }
    if key.len() > max_len {
        return Err(LockError::invalid_key(
            key,
            "the key is longer than this backend accepts (Capabilities::max_key_len)",
        ));
    }
    if key.contains('\0') {
        return Err(LockError::invalid_key(
            key,
            "a key must not contain a NUL byte",
        ));
    }
    Ok(())
}

/// Percent-encode every byte of `key` that `keep` rejects, and every `%`.
///
/// The output only holds characters `keep` accepts, plus `%` followed by two upper-case hex
/// digits. It is injective: different keys give different outputs.
///
/// ```
/// let zk_safe = |c: char| c.is_ascii_alphanumeric() || "-_:@".contains(c);
/// assert_eq!(dlock_core::raw::key::escape("../etc/x y", zk_safe), "%2E%2E%2Fetc%2Fx%20y");
/// ```
pub fn escape(key: &str, keep: impl Fn(char) -> bool) -> String {
    let mut out = String::with_capacity(key.len());
    for c in key.chars() {
        if c != '%' && keep(c) {
            out.push(c);
        } else {
            let mut buf = [0u8; 4];
            for b in c.encode_utf8(&mut buf).bytes() {
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
    out
}

/// Fit an [`escape`]d name into `max_len` bytes: names that fit are returned unchanged;
/// longer ones keep a readable prefix followed by `%%` and the SHA-256 of the whole name in
/// hex (64 characters). `%%` never occurs in escaped output, so a shortened name can never
/// equal another key's escaped name.
///
/// # Panics
/// If `max_len` is less than 80 (a backend constant, not user input).
pub fn shorten(escaped: &str, max_len: usize) -> String {
    const DIGEST_HEX: usize = 64;
    assert!(
        max_len >= 80,
        "shorten needs room for a readable prefix and the digest"
    );
    if escaped.len() <= max_len {
        return escaped.to_owned();
    }
    let mut prefix_len = max_len - DIGEST_HEX - 2;
    // Do not cut through a %XX escape or a multi-byte character.
    while !escaped.is_char_boundary(prefix_len) || escaped[..prefix_len].ends_with('%') {
        prefix_len -= 1;
    }
    if escaped[..prefix_len].len() >= 2 && escaped.as_bytes()[prefix_len - 2] == b'%' {
        prefix_len -= 2;
    }
    let digest = Sha256::digest(escaped.as_bytes());
    let mut out = String::with_capacity(max_len);
    out.push_str(&escaped[..prefix_len]);
    out.push_str("%%");
    for b in digest {
        let _ = write!(out, "{b:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    fn safe(c: char) -> bool {
        c.is_ascii_alphanumeric() || c == '-' || c == '_'
    }

    #[test]
    fn bad_keys_are_rejected() {
        for (key, max) in [("", 10), ("a\0b", 10), ("abcdefghijk", 10)] {
            assert_eq!(
                validate(key, max).unwrap_err().kind(),
                ErrorKind::InvalidKey
            );
        }
        validate("orders/42", 10).unwrap();
    }

    #[test]
    fn escape_is_injective_on_tricky_keys() {
        let keys = [
            "a/b", "a%2Fb", "a%b", "..", ".", "a b", "a\u{e9}", "a%C3%A9", "%%", "%25%25",
        ];
        let names: std::collections::HashSet<_> = keys.iter().map(|k| escape(k, safe)).collect();
        assert_eq!(names.len(), keys.len());
        assert_eq!(escape("..", safe), "%2E%2E");
    }

    #[test]
    fn shortened_names_fit_and_stay_distinct() {
        let long_a = "a".repeat(300);
        let long_b = format!("{}b", "a".repeat(299));
        let (sa, sb) = (shorten(&long_a, 100), shorten(&long_b, 100));
        assert!(sa.len() <= 100 && sb.len() <= 100);
        assert_ne!(sa, sb);
        assert!(sa.starts_with("aaaa") && sa.contains("%%"));
        assert_eq!(shorten("short", 100), "short");
    }

    #[test]
    fn shorten_does_not_cut_an_escape() {
        let escaped = escape(&"/".repeat(200), safe);
        let short = shorten(&escaped, 100);
        let prefix = short.split("%%").next().unwrap();
        assert!(prefix.len().is_multiple_of(3), "{prefix}");
    }
}
