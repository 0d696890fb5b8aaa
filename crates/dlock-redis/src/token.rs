//! Holder tokens: what a hold stores on the server to prove it is its own, and what it
//! tells of its mode and its holder.

/// A fresh holder token: 128 random bits from a cryptographically secure generator, as 32
/// hex digits, then a space and this process's
/// [`holder_description`](dlock_core::holder_description) (`NAME@HOST:PID`), which
/// [`inspect`](dlock_core::DistributedLock::inspect) shows as the holder's `who`. The
/// description rides in the token the scripts store anyway, so it costs no request, and
/// every owner check still compares the random bits (a writer's owner check compares
/// those alone, as an election's proclaim changes what follows them: see `scripts`).
pub fn new_token() -> String {
    format!(
        "{:032x} {}",
        rand::random::<u128>(),
        dlock_core::holder_description()
    )
}

/// A fresh token for an election candidate publishing `value`: [`new_token`] with the
/// value in place of the holder description, so [`token_holder`] (and `inspect`'s `who`)
/// reads it back. No escaping is needed: the core admits only values without control
/// characters, [`token_holder`] takes everything after the *first* space (so spaces,
/// colons and any Unicode come back as they went), and the scripts compare and store
/// tokens as bytes.
pub(crate) fn new_campaign_token(value: &str) -> String {
    format!("{:032x} {value}", rand::random::<u128>())
}

/// `token` (a writer's, [`new_token`] or [`new_campaign_token`]) with `value` in place of
/// what follows its random bits: the same owner identity carrying a new value, which a
/// proclaim stores in place of the old token.
pub(crate) fn with_value(token: &str, value: &str) -> String {
    let random = token.split_once(' ').map_or(token, |(random, _)| random);
    format!("{random} {value}")
}

/// A fresh reader token: `r`, 128 random bits as 32 hex digits, and the description, as
/// [`new_token`]. The scripts tell a reader from a writer by that first letter (a
/// writer's token starts with a hex digit).
pub fn new_reader_token() -> String {
    format!("r{}", new_token())
}

/// A fresh permit token for a limit of `limit` permits: `p`, the limit in decimal, `.`,
/// 128 random bits as 32 hex digits, and the description, as [`new_token`]. The scripts
/// tell a permit from the other holds by that first letter and read each holder's and
/// waiter's limit from the token, so no script needs the limit as an argument, and the
/// queue knows every waiter's limit.
pub fn new_permit_token(limit: u32) -> String {
    format!("p{limit}.{}", new_token())
}

/// A fresh token for a hold in `mode`: [`new_token`], [`new_reader_token`] or
/// [`new_permit_token`].
pub fn token_for(mode: dlock_core::Mode) -> String {
    match mode {
        dlock_core::Mode::Shared => new_reader_token(),
        dlock_core::Mode::Permits(limit) => new_permit_token(limit),
        dlock_core::Mode::Exclusive => new_token(),
    }
}

/// The mode a token was made for, where it is one of ours ([`token_for`]): `None` for
/// another library's value.
pub fn token_mode(token: &str) -> Option<dlock_core::Mode> {
    let random = token.split_once(' ').map_or(token, |(random, _)| random);
    let (mode, hex) = if let Some(rest) = random.strip_prefix('r') {
        (dlock_core::Mode::Shared, rest)
    } else if let Some(rest) = random.strip_prefix('p') {
        let (limit, hex) = rest.split_once('.')?;
        (dlock_core::Mode::Permits(limit.parse().ok()?), hex)
    } else {
        (dlock_core::Mode::Exclusive, random)
    };
    let ours = hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit());
    ours.then_some(mode)
}

/// Who made a token of ours: the [`holder_description`](dlock_core::holder_description)
/// after its first space (`None` for another library's value, or a token without one).
pub fn token_holder(token: &str) -> Option<&str> {
    token_mode(token)?;
    token
        .split_once(' ')
        .map(|(_, who)| who)
        .filter(|who| !who.is_empty())
}

/// Whether `token` is a permit's (made by [`new_permit_token`]).
pub fn is_permit_token(token: &str) -> bool {
    token.starts_with('p')
}

/// Whether `token` is a reader's (made by [`new_reader_token`]).
pub fn is_reader_token(token: &str) -> bool {
    token.starts_with('r')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn campaign_values_round_trip_through_the_token() {
        for value in [
            "v",
            "10.0.0.7:8080",
            "alpha: draining",
            " leading space and  two",
            "ünïcødé ✓ 東京",
            "r not a reader",
            "p3.not a permit",
            &"x".repeat(256),
        ] {
            let token = new_campaign_token(value);
            assert_eq!(
                token_mode(&token),
                Some(dlock_core::Mode::Exclusive),
                "{value:?}"
            );
            assert_eq!(token_holder(&token), Some(value), "{value:?}");
            let moved = with_value(&token, "next: value");
            assert_eq!(moved[..32], token[..32], "the owner identity stays");
            assert_eq!(token_holder(&moved), Some("next: value"));
            assert_eq!(token_holder(&with_value(&moved, value)), Some(value));
        }
    }
}
