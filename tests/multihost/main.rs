//! Several hosts of one volume through etcd (`--coordinator`), partitions in network
//! namespaces.
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

mod etcd_auth;
mod etcd_script;
mod multihost;
mod multihost_fence;
mod partition;
