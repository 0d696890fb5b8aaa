//! Building blocks shared with `dlock-redlock`, which runs the same protocol on several
//! independent servers. Not part of this crate's stable API: use [`RedisLock`](crate::RedisLock).
//!
//! - [`Node`]: one server (command connection, the lock scripts, the subscriber);
//! - [`Names`] and [`new_token`]: key naming and holder tokens;
//! - [`Error`]: a failed request, with [`Error::into_lock_error`];
//! - [`split_url`]: the URL grammar, several `host:port` allowed.

pub use crate::config::{UrlParts, split_url};
pub use crate::error::Error;
pub use crate::lock::{NO_EXPIRY_RECHECK, recheck_after};
pub use crate::node::{Attempt, Node};
pub use crate::scripts::{Names, new_token};
pub use crate::subscriber::Subscription;
