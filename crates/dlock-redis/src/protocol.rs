//! Building blocks shared with `dlock-redlock`, which runs the same protocol on several
//! independent servers. Not part of this crate's stable API: use [`RedisLock`](crate::RedisLock).
//!
//! - [`Node`]: one server (command connection, the lock scripts, the subscriber);
//! - [`Names`] and [`new_token`]: key naming and holder tokens;
//! - [`Error`]: a failed request, with [`Error::into_lock_error`];
//! - [`Waiter`]: waiting on one or several nodes for a quorum of releases;
//! - [`InFlight`]: releases what a cancelled acquire may have taken.

pub use crate::error::Error;
pub use crate::lock::InFlight;
pub use crate::node::{Attempt, Node};
pub use crate::scripts::{Names, new_token};
pub use crate::subscriber::{Event, Notice, Subscription};
pub use crate::wait::{NO_EXPIRY_RECHECK, View, Waiter, Wake};
