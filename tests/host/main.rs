//! Tests that set the host's FUSE request-timeout sysctl: one at a time
//! (common::fuse_sysctl_turn), and nothing else in this binary mounts meanwhile.
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

mod content_storm;
mod doctor;
mod request_timeout;
