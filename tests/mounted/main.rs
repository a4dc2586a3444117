//! The enforcement on a real FUSE mount: what only the kernel shows (real tools, routes
//! like mmap and rename over, hard links, caches, sessions of real processes).
//!
//! One test binary of several (docs/tests.md): one module per former test file.

// The workspace's SAFETY-comment rule is for the code that ships; a test's unsafe is a libc
// call on its own children and files.
#![allow(clippy::undocumented_unsafe_blocks)]

#[path = "../common/mod.rs"]
#[macro_use]
mod common;
#[path = "../common/coherent.rs"]
mod coherent;

mod enforce_copies;
mod enforce_full_disk;
mod enforce_handoff;
mod enforce_hardlink;
mod enforce_metadata;
mod enforce_mutants;
mod enforce_other_names;
mod enforce_persist;
mod enforce_routes;
mod enforce_sessions;
mod enforce_stale;
mod enforce_surface;
mod enforce_tracking;
mod enforce_unresolved;
mod enforce_users;
mod enforce_versions;
mod enforce_wait;
mod history;
