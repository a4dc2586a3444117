//! Several hosts of one volume through etcd (`--coordinator`), partitions in network
//! namespaces.
//!
//! One test binary of several (docs/tests.md): one module per former test file.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/coherent.rs"]
mod coherent;

mod multihost;
mod multihost_fence;
mod partition;
mod etcd_auth;
mod etcd_script;
