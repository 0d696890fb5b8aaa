//! What dlock prints: its own lines on stderr and stdout, each kept on one line, and keys
//! shown so that they cannot be taken for other output.

use std::borrow::Cow;

/// Print a line to stderr, escaped by [`one_line`]. A terminal that hung up (SIGHUP) makes
/// writes fail; that must not stop the release.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let line = format!($($arg)*);
        let _ = writeln!(std::io::stderr(), "{}", $crate::output::one_line(&line));
    }};
}

/// Print a line to stdout, escaped by [`one_line`], and flush it, ignoring a closed
/// terminal or pipe.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let line = format!($($arg)*);
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{}", $crate::output::one_line(&line));
        let _ = out.flush();
    }};
}

pub(crate) use {out, say};

/// A key as dlock prints it in `key=…`: as it is when plain (not empty; no blank, quote,
/// backslash or character that does not print), so that `acquired key=K token=N` reads as
/// it always did; otherwise quoted and escaped as a Rust string (`"a\nb"`), which no plain
/// key can be taken for. A key cannot add a line or a field to the output, or drive the
/// terminal.
pub(crate) fn shown_key(key: &str) -> Cow<'_, str> {
    let quoted = format!("{key:?}");
    // Debug escapes quotes, backslashes, control characters and characters that do not
    // print; blanks it leaves as they are.
    let plain = !key.is_empty()
        && quoted.len() == key.len() + 2
        && !key.chars().any(|c| c.is_whitespace() || is_unsafe(c));
    match plain {
        true => Cow::Borrowed(key),
        false => Cow::Owned(quoted),
    }
}

/// Characters that must not reach the output as they are: control characters (a newline,
/// a terminal escape), line and paragraph separators, and the bidirectional overrides
/// that make text read other than it is.
fn is_unsafe(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{2028}' | '\u{2029}' | '\u{200e}' | '\u{200f}' | '\u{61c}'
        )
        || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `line` with the characters of [`is_unsafe`] escaped (`\n`, `\u{1b}`…): text from a key,
/// a server's error or a file name stays on dlock's one line.
pub(crate) fn one_line(line: &str) -> Cow<'_, str> {
    if !line.chars().any(is_unsafe) {
        return Cow::Borrowed(line);
    }
    let mut escaped = String::with_capacity(line.len() + 8);
    for c in line.chars() {
        match is_unsafe(c) {
            true => escaped.extend(c.escape_debug()),
            false => escaped.push(c),
        }
    }
    Cow::Owned(escaped)
}

/// A JSON document as dlock prints it, on one line: serde_json escapes what JSON requires
/// (quotes, backslashes, C0 controls); the other characters of [`is_unsafe`] (DEL, C1
/// controls, line separators, bidirectional overrides) are escaped here as `\uXXXX`. They
/// can only occur inside strings, where that escape reads back as the same character.
pub(crate) fn json_line(value: &impl serde::Serialize) -> String {
    // Serializing plain structs, strings and numbers to a string cannot fail.
    let text = serde_json::to_string(value).unwrap_or_else(|_| "null".to_owned());
    let mut escaped = String::with_capacity(text.len());
    for c in text.chars() {
        match is_unsafe(c) {
            // Every character of is_unsafe is in the Basic Multilingual Plane: one \uXXXX.
            true => escaped.push_str(&format!("\\u{:04x}", u32::from(c))),
            false => escaped.push(c),
        }
    }
    escaped
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines_escape_what_would_break_them_and_read_back() {
        let key = "a\nb\u{1b}[2K\u{7f}\u{85}\u{2028}rtl\u{202e}\"q\\";
        let line = json_line(&serde_json::json!({ "key": key }));
        assert!(!line.chars().any(is_unsafe), "{line}");
        assert_eq!(one_line(&line), line);
        let back: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(back["key"], key);
    }

    #[test]
    fn plain_keys_print_as_they_are() {
        for key in ["k", "jobs/nightly-backup:eu=1", "café/ключ", "a'b", "日本"] {
            assert_eq!(shown_key(key), key);
        }
    }

    #[test]
    fn other_keys_print_quoted_and_escaped() {
        let cases = [
            ("a\nb", r#""a\nb""#),
            ("a b", r#""a b""#),
            ("a\u{a0}b", r#""a\u{a0}b""#),
            ("x\r\x1b[2K\t\x07\x7f", r#""x\r\u{1b}[2K\t\u{7}\u{7f}""#),
            ("q\"b\\", r#""q\"b\\""#),
            ("rtl\u{202e}txt", r#""rtl\u{202e}txt""#),
            ("sep\u{2028}x", r#""sep\u{2028}x""#),
            ("zero\u{200b}width", r#""zero\u{200b}width""#),
            ("", r#""""#),
        ];
        for (key, shown) in cases {
            let out = shown_key(key);
            assert_eq!(out, shown, "{key:?}");
            assert!(!out.chars().any(is_unsafe), "{key:?}");
            assert_eq!(one_line(&out), out, "{key:?}");
        }
    }

    #[test]
    fn lines_escape_what_would_break_them() {
        assert_eq!(one_line("lost: plain reason"), "lost: plain reason");
        assert_eq!(
            one_line("lost: a\nforged: line\x1b[31m \u{202e}x"),
            r#"lost: a\nforged: line\u{1b}[31m \u{202e}x"#
        );
    }
}
