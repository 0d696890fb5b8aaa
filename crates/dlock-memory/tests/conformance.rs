//! The whole conformance suite against the in-process server.

mod common;

use common::InProcess;
use dlock_memory::MemoryBackend;

dlock_conformance::conformance!(memory, InProcess::<MemoryBackend>::new());
