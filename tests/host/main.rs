//! Tests that set the host's FUSE request-timeout sysctl: one at a time
//! (common::fuse_sysctl_turn), and nothing else in this binary mounts meanwhile.
//!
//! One test binary of several (docs/tests.md): one module per former test file.

#[path = "../common/mod.rs"]
#[macro_use]
mod common;
#[path = "../common/coherent.rs"]
mod coherent;

mod content_storm;
mod doctor;
mod request_timeout;
