//! The filesystem on a real FUSE mount: operations, permissions, cache, lifecycle, the
//! differential reftest, the mount helper and the systemd unit.
//!
//! One test binary of several (docs/tests.md): one module per former test file.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/coherent.rs"]
mod coherent;

mod fs_cache;
mod fs_hooks;
mod fs_lifecycle;
mod fs_ops;
mod fs_perms;
mod acl;
mod killpriv;
mod volume_smoke;
mod reftest;
mod long_run;
mod state_paths;
mod mount_helper;
mod systemd_unit;
