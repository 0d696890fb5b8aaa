//! The key functions: `key::validate`, `key::escape`, `key::shorten`, and the key encodings
//! backends make public (`EtcdConfig::lock_name`, `ZookeeperConfig::key_dir`).
//!
//! Input: byte 0 picks `max_len` (80 to 335), byte 1 picks the characters `escape` keeps;
//! the rest, split at its first `0xFF` byte (never part of UTF-8), is two keys `a` and `b`
//! (`b` missing when there is no `0xFF`).
//!
//! Properties:
//!
//! - `validate` accepts exactly the non-empty keys of at most `max_len` bytes without NUL;
//!   refusals are `InvalidKey` with a short message;
//! - `escape` holds only kept characters (never `%`) and `%XX` with upper-case hex digits,
//!   never `%%`, and percent-decodes back to the key: so it is injective;
//! - `shorten` returns names that fit unchanged, and otherwise a readable prefix of the
//!   name, cut between two characters of the escaped name (never inside `%XX`), then `%%`
//!   and 64 hex digits, in at most `max_len` bytes;
//! - for `a != b`: `escape`, `shorten ∘ escape`, `lock_name` and `key_dir` differ;
//! - `lock_name` is the prefix then a name without `/`; `key_dir` is `/dlock/` then one
//!   segment of at most 240 printable ASCII characters, never `.` or `..`.

#![no_main]

use dlock_core::ErrorKind;
use dlock_core::raw::key;
use dlock_etcd::EtcdConfig;
use dlock_zookeeper::ZookeeperConfig;
use libfuzzer_sys::fuzz_target;
use percent_encoding::percent_decode_str;

/// The sets of characters `escape` is asked to keep: each backend's, and edge cases.
const KEEPS: &[fn(char) -> bool] = &[
    // etcd
    |c| c != '/',
    // ZooKeeper
    |c| c.is_ascii_alphanumeric() || "._:@-".contains(c),
    // MySQL
    |c| c.is_ascii_alphanumeric() || "-_./:@+=,~".contains(c),
    // everything (but `%` is still escaped)
    |_| true,
    // nothing
    |_| false,
    // the hex digits, so kept characters can look like the tail of an escape
    |c| c.is_ascii_hexdigit(),
    // only multi-byte characters, so shorten must cut between characters
    |c| !c.is_ascii(),
    // every other ASCII character, and no multi-byte one
    |c| c.is_ascii() && (c as u32).is_multiple_of(2),
];

fuzz_target!(|data: &[u8]| {
    let [max, pick, rest @ ..] = data else {
        return;
    };
    let max_len = 80 + usize::from(*max);
    let keep = KEEPS[usize::from(*pick) % KEEPS.len()];
    let (a, b) = match rest.iter().position(|&byte| byte == 0xFF) {
        Some(at) => (&rest[..at], Some(&rest[at + 1..])),
        None => (rest, None),
    };
    let a = String::from_utf8_lossy(a);
    let b = b.map(String::from_utf8_lossy);

    let etcd = EtcdConfig::new(&["h"]).expect("a config");
    let zk = ZookeeperConfig::new(["h"]).expect("a config");
    let names = |key: &str| {
        validate(key, max_len);
        let escaped = key::escape(key, keep);
        check_escaped(key, &escaped, keep);
        let short = key::shorten(&escaped, max_len);
        check_shortened(&escaped, &short, max_len);
        let lock_name = etcd.lock_name(key);
        let name = lock_name
            .strip_prefix(EtcdConfig::DEFAULT_PREFIX)
            .expect("lock_name starts with the prefix");
        assert!(!name.contains('/'), "{key:?}: lock_name {lock_name:?}");
        let key_dir = zk.key_dir(key);
        if !key.is_empty() {
            check_key_dir(key, &key_dir);
        }
        [escaped, short, lock_name, key_dir]
    };
    let names_a = names(&a);
    if let Some(b) = b
        && *a != *b
    {
        let names_b = names(&b);
        for (x, y) in names_a.iter().zip(&names_b) {
            assert_ne!(x, y, "{a:?} and {b:?}");
        }
    }
});

fn validate(key: &str, max_len: usize) {
    let valid = !key.is_empty() && key.len() <= max_len && !key.contains('\0');
    match key::validate(key, max_len) {
        Ok(()) => assert!(valid, "{key:?} is not a valid key of at most {max_len}"),
        Err(e) => {
            assert!(!valid, "{key:?} is a valid key of at most {max_len}: {e}");
            assert_eq!(e.kind(), ErrorKind::InvalidKey, "{key:?}: {e}");
            let text = e.to_string();
            assert!(text.len() < 1024, "{key:?}: a long message: {text}");
            assert!(!text.contains(char::is_control), "{key:?}: {text:?}");
        }
    }
}

fn check_escaped(key: &str, escaped: &str, keep: fn(char) -> bool) {
    let mut chars = escaped.chars();
    while let Some(c) = chars.next() {
        if c == '%' {
            for _ in 0..2 {
                let digit = chars.next();
                assert!(
                    digit.is_some_and(|d| d.is_ascii_digit() || ('A'..='F').contains(&d)),
                    "{key:?} escapes to {escaped:?}: '%' then {digit:?}"
                );
            }
        } else {
            assert!(keep(c), "{key:?} escapes to {escaped:?}, keeping {c:?}");
        }
    }
    assert!(!escaped.contains("%%"), "{key:?} escapes to {escaped:?}");
    let decoded = percent_decode_str(escaped).collect::<Vec<u8>>();
    assert_eq!(
        decoded,
        key.as_bytes(),
        "{key:?} escapes to {escaped:?}, which decodes to another key"
    );
}

fn check_shortened(escaped: &str, short: &str, max_len: usize) {
    if escaped.len() <= max_len {
        assert_eq!(short, escaped, "a name that fits is kept");
        return;
    }
    assert!(
        short.len() <= max_len,
        "{escaped:?} shortened to {} bytes: {short:?}",
        short.len()
    );
    let (prefix, digest) = short
        .rsplit_once("%%")
        .unwrap_or_else(|| panic!("{escaped:?} shortened to {short:?}: no %%"));
    assert!(
        digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_hexdigit()),
        "{escaped:?} shortened to {short:?}: digest"
    );
    assert!(
        escaped.starts_with(prefix),
        "{escaped:?} shortened to {short:?}: prefix"
    );
    // Cut between two characters of the escaped name, never inside a %XX.
    let bytes = prefix.as_bytes();
    let inside = bytes.iter().rev().take(2).any(|&b| b == b'%');
    assert!(
        prefix.len() < escaped.len() && !inside,
        "{escaped:?} shortened to {short:?}: cut inside an escape"
    );
    // Readable: at most one character (4 bytes) shorter than the room allows.
    assert!(
        prefix.len() + 66 + 3 >= max_len,
        "{escaped:?} shortened to {short:?}: prefix of {} bytes for {max_len}",
        prefix.len()
    );
}

fn check_key_dir(key: &str, key_dir: &str) {
    let segment = key_dir
        .strip_prefix("/dlock/")
        .unwrap_or_else(|| panic!("{key:?}: key_dir {key_dir:?}"));
    assert!(
        !segment.is_empty()
            && segment.len() <= 240
            && !matches!(segment, "." | "..")
            && segment.bytes().all(|b| b.is_ascii_graphic() && b != b'/'),
        "{key:?}: key_dir {key_dir:?}"
    );
}
