//! The filesystem on a real FUSE mount: operations, permissions, cache, lifecycle, the
//! differential reftest, the mount helper and the systemd unit.
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

mod acl;
mod data_path;
mod fs_cache;
mod fs_hooks;
mod fs_identity;
mod fs_lifecycle;
mod fs_ops;
mod fs_perms;
mod fuzz;
mod killpriv;
mod locks;
mod long_run;
mod mount_helper;
mod reftest;
mod replace_by_rename;
mod state_paths;
mod systemd_unit;
mod volume_smoke;
