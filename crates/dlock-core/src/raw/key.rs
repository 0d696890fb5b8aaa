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

    /// The characters the fuzz target `key` asks [`escape`] to keep: each backend's, and
    /// edge cases (everything, nothing, hex digits, only multi-byte characters, half of
    /// ASCII).
    const KEEPS: [fn(char) -> bool; 8] = [
        |c| c != '/',
        |c| c.is_ascii_alphanumeric() || "._:@-".contains(c),
        |c| c.is_ascii_alphanumeric() || "-_./:@+=,~".contains(c),
        |_| true,
        |_| false,
        |c| c.is_ascii_hexdigit(),
        |c| !c.is_ascii(),
        |c| c.is_ascii() && (c as u32).is_multiple_of(2),
    ];

    /// Inputs the fuzzer found (`scripts/fuzz`, target `key`): `(max_len, keep, a, b)`,
    /// a short one for each way `shorten` cuts and for pairs of keys, `\u{fffd}` standing for
    /// bytes that were not UTF-8. Each keeps the target's properties (see
    /// [`check_names`]), and two different keys get different names.
    #[test]
    fn the_fuzz_corpus_keeps_its_properties() {
        let cases: &[(usize, usize, &str, Option<&str>)] = &[
            (
                132,
                1,
                "\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\0\0\u{fffd}\u{fffd}\u{fffd}",
                None,
            ),
            (
                100,
                1,
                "\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\0\u{fffd}\u{fffd}",
                None,
            ),
            (
                80,
                2,
                "o\0\u{fffd}\u{6}éééé\u{fffd}é\u{1d}\u{fffd}é\0ёé\u{fffd}",
                None,
            ),
            (
                80,
                2,
                "\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}&\u{fffd}\u{fffd}ᯆ",
                None,
            ),
            (
                207,
                5,
                "\u{fffd}\u{fffd}%\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}%\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}\u{fffd}%\u{fffd}\u{fffd}\u{fffd}\0\0\0\u{fffd}u",
                None,
            ),
            (
                100,
                5,
                "/\u{fffd}\u{fffd}\u{fffd}%密🔒\u{fffd}\u{fffd}%\u{fffd}%%\u{fffd}\u{fffd}%%密🔒\u{fffd}\u{fffd}%埔\u{fffd}%/密\u{1}\0",
                None,
            ),
            (
                85,
                7,
                "\u{fffd}/,/\u{fffd}\u{fffd}/-//\u{fffd}🔒/////-/",
                None,
            ),
            (
                100,
                7,
                "__%\0____2E______\\_%\0____2E______\\______\\_//_\\_////",
                None,
            ),
            (
                100,
                4,
                ".;\r\r\r\r\r\r\r\r\r\r\r\r\r\r\r\r\r\r-\r\u{fffd}\u{fffd}w\r\r\r\r\u{fffd}\r\r\r\r\r\r\r\r\r\u{fffd}",
                None,
            ),
            (80, 0, "%", None),
            (84, 6, "\0", None),
            (204, 3, "%%", None),
            (335, 3, "密🔒%🔒", None),
            (100, 4, "...d", None),
            (100, 7, "", None),
            (126, 1, "", Some("0")),
            (100, 1, "Ò", Some(".")),
            (100, 1, "..", Some("0")),
            (81, 4, "a", Some("a b")),
            (100, 6, "....", Some(".")),
            (197, 3, "\0\u{fffd}", Some("\0")),
            (90, 0, "\u{fffd}\u{fffd}", Some("\u{fffd}\u{fffd}\n")),
            (80, 2, "\0\0%'", Some("\0")),
            (179, 0, "cccccc", Some("cc")),
            (80, 0, "\0*a-B", Some("3ba")),
            (335, 7, "..........", Some("")),
            (
                81,
                0,
                "\0\u{fffd}🔒%寶/🔒%\u{fffd}%\u{fffd}",
                Some("\u{fffd}\u{fffd}"),
            ),
            (
                80,
                1,
                "\0b\u{3}\u{fffd}\u{fffd}",
                Some("\u{fffd}b\0:\u{fffd}\u{fffd}b"),
            ),
            (
                80,
                6,
                "\u{fffd}\u{1}\0B\u{fffd}\u{fffd}\u{fffd}\u{fffd}`\u{fffd}",
                Some("\u{fffd}\u{fffd}\""),
            ),
        ];
        let mut shortened = 0;
        for &(max_len, keep, a, b) in cases {
            let names_a = check_names(a, max_len, KEEPS[keep]);
            shortened += usize::from(names_a.0 != names_a.1);
            if let Some(b) = b {
                let names_b = check_names(b, max_len, KEEPS[keep]);
                assert_ne!(names_a.0, names_b.0, "{a:?} and {b:?}: escape");
                assert_ne!(names_a.1, names_b.1, "{a:?} and {b:?}: shorten");
            }
        }
        assert_eq!(shortened, 9, "the first nine keys are shortened");
    }

    /// The properties the fuzz target `key` asserts of one key: `validate` refuses exactly
    /// the bad keys; `escape` holds kept characters and `%XX` only and decodes back to the
    /// key; `shorten` keeps names that fit and cuts the others between two characters, at
    /// most one character short of the room, then `%%` and the digest. Returns the escaped
    /// and the shortened name.
    fn check_names(key: &str, max_len: usize, keep: fn(char) -> bool) -> (String, String) {
        let valid = !key.is_empty() && key.len() <= max_len && !key.contains('\0');
        match validate(key, max_len) {
            Ok(()) => assert!(valid, "{key:?}"),
            Err(e) => {
                assert!(!valid, "{key:?}: {e}");
                assert_eq!(e.kind(), ErrorKind::InvalidKey, "{key:?}");
                assert!(!e.to_string().contains(char::is_control), "{key:?}: {e}");
            }
        }

        let escaped = escape(key, keep);
        let mut chars = escaped.chars();
        while let Some(c) = chars.next() {
            if c == '%' {
                let hex = [chars.next(), chars.next()];
                assert!(
                    hex.iter()
                        .all(|d| d.is_some_and(|d| d.is_ascii_digit() || ('A'..='F').contains(&d))),
                    "{key:?} escapes to {escaped:?}"
                );
            } else {
                assert!(keep(c), "{key:?} escapes to {escaped:?}, keeping {c:?}");
            }
        }
        assert!(!escaped.contains("%%"), "{escaped:?}");
        let decoded: Vec<u8> = percent_encoding::percent_decode_str(&escaped).collect();
        assert_eq!(decoded, key.as_bytes(), "{key:?} escapes to {escaped:?}");

        let short = shorten(&escaped, max_len);
        if escaped.len() <= max_len {
            assert_eq!(short, escaped);
        } else {
            assert!(short.len() <= max_len, "{short:?}");
            let (prefix, digest) = short.rsplit_once("%%").expect("a digest");
            assert!(digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()));
            assert!(
                escaped.starts_with(prefix),
                "{escaped:?} shortened to {short:?}"
            );
            let tail = prefix.as_bytes().iter().rev().take(2);
            assert!(
                !tail.into_iter().any(|&b| b == b'%'),
                "{short:?} cuts an escape"
            );
            assert!(prefix.len() + 66 + 3 >= max_len, "{short:?}: short prefix");
        }
        (escaped, short)
    }
}
