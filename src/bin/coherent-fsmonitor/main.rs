//! `coherent-fsmonitor VERSION TOKEN`: git's `core.fsmonitor` hook (docs/git.md), the same
//! answer as `coherent fsmonitor`, from a binary of its own. Git runs it at every `git
//! status`: a process that only needs std and libc starts in about half the time of the
//! full `coherent` (no clap, serde, tokio to map and relocate), which is most of what the
//! hook costs.

#[path = "../coherent/fsmonitor.rs"]
#[allow(dead_code)]
mod fsmonitor;

use std::ffi::OsString;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    match args.get(1) {
        Some(version) if args.len() <= 3 => {
            fsmonitor::run(version, args.get(2).map(OsString::as_os_str))
        }
        _ => {
            eprintln!("usage: coherent-fsmonitor VERSION [TOKEN] (git's core.fsmonitor hook)");
            ExitCode::from(1)
        }
    }
}
