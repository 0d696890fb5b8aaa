//! The owner of a reentrant hold: an id the caller chooses.

use std::fmt;

use crate::{LockError, Result};

/// Who a reentrant hold belongs to: an id the caller chooses (a job id, a request id), set
/// with [`LockOptions::owner`](crate::LockOptions::owner).
///
/// An acquire of a key already held under the same owner succeeds at once, with the same
/// fencing token, and raises the hold's count on the server; each release lowers it, and the
/// key frees when the count reaches zero or the hold's lease ends. The count lives on the
/// server, so clients and processes that share an owner id share the hold: a second process
/// of the same job can take the key its first process holds, and release it.
///
/// An id is 1 to [`Owner::MAX_LEN`] printable ASCII characters without spaces
/// (`!` to `~`). Anything else is kept as given and refused with
/// [`InvalidConfig`](crate::LockError::InvalidConfig) by the acquire, before any I/O, so
/// that [`LockOptions`](crate::LockOptions) stays `Copy` and its builder infallible.
///
/// ```
/// use dlock_core::{LockOptions, Owner};
///
/// let opts = LockOptions::new().owner("job-7");
/// assert_eq!(opts.owner.map(|o| o.to_string()), Some("job-7".to_owned()));
/// assert!(Owner::new("job 7").check("dlock").is_err());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Owner {
    len: u8,
    bytes: [u8; Owner::MAX_LEN],
    /// The id given was too long, empty, or not printable ASCII.
    invalid: bool,
}

impl Owner {
    /// The longest owner id, in bytes.
    pub const MAX_LEN: usize = 64;

    /// The owner `id`; checked when an acquire uses it (see [`check`](Self::check)).
    pub fn new(id: &str) -> Self {
        let valid =
            (1..=Self::MAX_LEN).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_graphic());
        let mut bytes = [0u8; Self::MAX_LEN];
        if valid {
            bytes[..id.len()].copy_from_slice(id.as_bytes());
        } else {
            // Keep a printable prefix for the error message.
            let shown: Vec<u8> = id
                .bytes()
                .map(|b| if b.is_ascii_graphic() { b } else { b'?' })
                .take(Self::MAX_LEN)
                .collect();
            bytes[..shown.len()].copy_from_slice(&shown);
            return Self {
                len: shown.len() as u8,
                bytes,
                invalid: true,
            };
        }
        Self {
            len: id.len() as u8,
            bytes,
            invalid: false,
        }
    }

    /// The id, as given (for an invalid one, a printable prefix of it).
    pub fn as_str(&self) -> &str {
        // Only ASCII bytes are ever stored.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or_default()
    }

    /// Refuse an id that is empty, longer than [`MAX_LEN`](Self::MAX_LEN), or holds a
    /// character outside `!`..=`~`.
    ///
    /// # Errors
    /// [`LockError::InvalidConfig`] saying why.
    pub fn check(&self, backend: &'static str) -> Result<()> {
        if self.invalid {
            return Err(LockError::invalid_config(
                backend,
                format!(
                    "owner id {:?} is not 1 to {} printable ASCII characters without spaces",
                    self.as_str(),
                    Self::MAX_LEN
                ),
            ));
        }
        Ok(())
    }
}

impl fmt::Debug for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Owner({:?})", self.as_str())
    }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked() {
        assert!(Owner::new("job-7").check("t").is_ok());
        assert!(Owner::new(&"x".repeat(64)).check("t").is_ok());
        for bad in ["", "a b", "tab\t", "é", &"x".repeat(65)] {
            assert!(Owner::new(bad).check("t").is_err(), "{bad:?}");
        }
        assert_eq!(Owner::new("a b").as_str(), "a?b");
    }
}
