//! Key names and tokens.
#[test]
fn no_key_names_another_locks_fence_counter() {
    use super::Names;
    for prefix in ["", "{", "{app}:", "dlock:"] {
        for key in ["x", "a}b", "{x}", "{x}:released", ":fence", "{}:fence"] {
            let names = Names::new(prefix, key);
            if Names::check(prefix, key).is_ok() {
                for other in ["x", "a}b", "{x}", "", "{"] {
                    assert_ne!(
                        names.key,
                        Names::new(prefix, other).fence,
                        "{prefix:?} {key:?}"
                    );
                }
            }
        }
        // The collision the check exists for.
        let victim = Names::new(prefix, "x");
        let attacker = victim.fence.strip_prefix(prefix).map(str::to_owned);
        if let Some(attacker) = attacker {
            assert_eq!(Names::new(prefix, &attacker).key, victim.fence);
            assert!(
                Names::check(prefix, &attacker).is_err(),
                "{prefix:?} {attacker:?}"
            );
        }
    }
    assert!(Names::check("", "{x}:fence").is_err());
    assert!(Names::check("", "{x}:queue").is_err());
    assert!(Names::check("", "{x}:waiters").is_err());
    assert!(Names::check("", "{x}:hold").is_err());
    assert!(Names::check("dlock:", "{x}:fence").is_ok());
}

use super::*;

#[test]
fn names_are_distinct_and_share_the_hash_tag() {
    let n = Names::new("dlock:", "orders/42");
    assert_eq!(n.key, "dlock:orders/42");
    assert_eq!(n.fence, "{dlock:orders/42}:fence");
    assert_eq!(n.channel, "{dlock:orders/42}:released");
    assert_eq!(n.queue, "{dlock:orders/42}:queue");
    assert_eq!(n.waiters, "{dlock:orders/42}:waiters");
    assert_eq!(n.hold, "{dlock:orders/42}:hold");
    assert_eq!(Names::new("", "x").key, "x");
}

#[test]
fn tokens_are_128_bits_and_differ() {
    let (a, b) = (new_token(), new_token());
    let (random, who) = a.split_once(' ').expect("random bits, then the holder");
    assert_eq!(random.len(), 32);
    assert!(random.chars().all(|c| c.is_ascii_hexdigit()));
    assert_eq!(who, dlock_core::holder_description());
    assert_ne!(a, b);
}

#[test]
fn tokens_tell_their_mode_and_holder() {
    use dlock_core::Mode;
    let me = Some(dlock_core::holder_description());
    for (token, mode) in [
        (new_token(), Mode::Exclusive),
        (new_reader_token(), Mode::Shared),
        (new_permit_token(7), Mode::Permits(7)),
    ] {
        assert_eq!(token_mode(&token), Some(mode), "{token}");
        assert_eq!(token_holder(&token), me, "{token}");
    }
    // Tokens of older clients carry no holder; another library's value is not ours.
    assert_eq!(token_mode(&"a".repeat(32)), Some(Mode::Exclusive));
    assert_eq!(token_holder(&"a".repeat(32)), None);
    for foreign in [
        "",
        "x",
        "hello world",
        "p.0123",
        "rabc",
        "pX.0123456789abcdef0123456789abcdef",
    ] {
        assert_eq!(token_mode(foreign), None, "{foreign}");
        assert_eq!(token_holder(foreign), None, "{foreign}");
    }
}

#[test]
fn millis_is_never_zero() {
    assert_eq!(millis(Duration::ZERO), 1);
    assert_eq!(millis(Duration::from_millis(1500)), 1500);
}
