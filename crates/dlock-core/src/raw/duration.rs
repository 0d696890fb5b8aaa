//! One spelling for option values across every backend's URL.

use std::ops::RangeInclusive;
use std::time::Duration;

use crate::{LockError, Result};

/// Parse the value of duration option `option` of `backend`: a number (decimals allowed)
/// followed by `ms`, `s` or `m` — `250ms`, `5s`, `1.5s`, `2m` — within `range`.
///
/// A bare number is refused: `5` could mean seconds or milliseconds.
///
/// ```
/// use std::time::Duration;
/// use dlock_core::raw::parse_duration;
///
/// let range = Duration::from_millis(1)..=Duration::from_secs(3600);
/// assert_eq!(parse_duration("redis", "connect_timeout", "1.5s", range.clone()).unwrap(), Duration::from_millis(1500));
/// assert!(parse_duration("redis", "connect_timeout", "1500", range).is_err());
/// ```
///
/// # Errors
/// [`LockError::InvalidConfig`] naming the option and the value when it is not a duration or
/// is out of range.
pub fn parse_duration(
    backend: &'static str,
    option: &str,
    value: &str,
    range: RangeInclusive<Duration>,
) -> Result<Duration> {
    let not_a_duration = || {
        LockError::invalid_config(
            backend,
            format!("option {option}={value:?} is not a duration (write 250ms, 5s, 1.5s or 2m)"),
        )
    };
    let split = value
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(not_a_duration)?;
    let (number, unit) = value.split_at(split);
    let number: f64 = number.parse().map_err(|_| not_a_duration())?;
    let seconds = match unit {
        "ms" => number / 1000.0,
        "s" => number,
        "m" => number * 60.0,
        _ => return Err(not_a_duration()),
    };
    let duration = Duration::try_from_secs_f64(seconds).map_err(|_| not_a_duration())?;
    if !range.contains(&duration) {
        return Err(LockError::invalid_config(
            backend,
            format!(
                "option {option}={value:?} is out of range ({:?} to {:?})",
                range.start(),
                range.end()
            ),
        ));
    }
    Ok(duration)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(value: &str) -> Result<Duration> {
        parse_duration(
            "test",
            "timeout",
            value,
            Duration::from_millis(1)..=Duration::from_secs(3600),
        )
    }

    #[test]
    fn units_and_decimals() {
        for (value, ms) in [
            ("250ms", 250),
            ("5s", 5000),
            ("1.5s", 1500),
            ("2m", 120_000),
            ("0.5ms", 0),
        ] {
            match parse(value) {
                Ok(d) => assert_eq!(d.as_millis(), ms, "{value}"),
                Err(e) => assert!(
                    ms == 0 && e.to_string().contains("out of range"),
                    "{value}: {e}"
                ),
            }
        }
    }

    #[test]
    fn bad_values_name_the_option() {
        for value in [
            "", "5", "1500", "s", "5 s", "5h", "-1s", "1.2.3s", "NaNs", "1e3s",
        ] {
            let err = parse(value).unwrap_err();
            assert!(err.to_string().contains("timeout="), "{value}: {err}");
            assert!(err.to_string().contains("not a duration"), "{value}: {err}");
        }
        let err = parse("2h").unwrap_err();
        assert!(err.to_string().contains("not a duration"), "{err}");
        let err = parse("61m").unwrap_err();
        assert!(err.to_string().contains("out of range"), "{err}");
    }
}
