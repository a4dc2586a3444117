//! The tools agents use on a real mount: the CLI, the hooks, the MCP server, the relay, the
//! board, `coherent run` and git's fsmonitor.
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
#[path = "../common/pty.rs"]
mod pty;

mod cli;
mod cli_mount;
mod fsmonitor;
mod hook;
mod hook_codex;
mod hostile;
mod mcp;
mod names_in_text;
mod relay;
mod run_landlock;
mod standing_wait;
mod top;
