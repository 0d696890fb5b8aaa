//! `dlock list`: the held keys under a prefix, one per line or as one JSON array, where the
//! backend can enumerate them.

use dlock::{ErrorKind, LockError};

use crate::args::ListArgs;
use crate::exit;
use crate::output::{json_line, out, say, shown_key};

pub(crate) async fn list(args: ListArgs) -> Result<u8, LockError> {
    let url = args.source.url()?;
    let lock = dlock::connect(&url).await?;
    let keys = match lock.list(&args.prefix).await {
        Ok(keys) => keys,
        Err(e) if e.kind() == ErrorKind::Unsupported => {
            say!("dlock: {}", cannot_list(lock.backend_name()));
            return Ok(exit::USAGE);
        }
        Err(e) => return Err(e),
    };
    match args.json {
        true => {
            use std::io::Write as _;
            let mut stdout = std::io::stdout().lock();
            let _ = writeln!(stdout, "{}", json_line(&keys));
            let _ = stdout.flush();
        }
        false => {
            for key in &keys {
                out!("{}", shown_key(key));
            }
        }
    }
    Ok(0)
}

/// What `dlock list` says on a backend that cannot enumerate its keys.
fn cannot_list(backend: &str) -> String {
    format!(
        "{backend} cannot enumerate its keys: `dlock list` is not available on this backend \
         (`dlock status --key KEY` shows one key)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_without_listing_is_named() {
        assert_eq!(
            cannot_list("redis"),
            "redis cannot enumerate its keys: `dlock list` is not available on this backend \
             (`dlock status --key KEY` shows one key)"
        );
    }
}
