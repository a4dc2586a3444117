//! Tests with no mount: the core (engine, journal, identity, tracking, access), the CLI's
//! installs, and the filesystem type with the real volume policy in process
//! (tests/common/inproc.rs).
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
#[path = "../common/core.rs"]
mod core_common;

mod access;
mod bench_gate;
mod core_content;
mod core_contract;
mod core_handoff_table;
mod core_journal;
mod core_journal_faults;
mod core_model;
mod core_offers;
mod core_scenarios;
mod core_step;
mod core_stress;
mod core_wait;
mod identity_directory;
mod identity_resolve;
mod inproc_decisions;
mod inproc_tell;
mod inproc_unresolved;
mod inproc_versions;
mod inproc_ways_out;
mod install;
mod tracking;
mod volume_policy;
