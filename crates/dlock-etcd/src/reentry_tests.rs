//! Tests of `reentry`.

use super::*;

#[test]
fn owner_values_read_back() {
    let value = owner_value("job-7", 3, "me@host:12");
    assert_eq!(parse(value.as_bytes()), Some((3, "job-7", "me@host:12")));
    assert_eq!(
        describe(value.as_bytes(), true).as_deref(),
        Some("job-7 (held 3 times) me@host:12")
    );
    assert_eq!(
        describe(owner_value("o", 1, "").as_bytes(), true).as_deref(),
        Some("o (held 1 time)")
    );
    assert_eq!(
        describe(value.as_bytes(), false).as_deref(),
        Some("job-7 me@host:12")
    );
    for other in [
        &b""[..],
        b"me@host:12",
        b"dlock-owner 3 job-7 x",
        b"\x01dlock-owner x y",
    ] {
        assert_eq!(parse(other), None);
    }
}
