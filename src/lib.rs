//! coherent: a FUSE-mounted coherent volume for agents that share one workspace.
//!
//! The core (`identity`, `coherence`, `journal`) has no FUSE in it; `passthrough` owns the
//! backing directory; `fuse` is a thin adapter from `fuser` callbacks to the rest.

pub mod access;
pub mod beneath;
pub mod bypass;
pub mod coherence;
pub mod control;
pub mod coordinator;
pub mod error;
pub mod fs;
pub mod fuse;
pub mod identity;
pub mod journal;
pub mod names;
pub mod passthrough;
pub mod sys;
pub mod tracking;
pub mod visibility;
pub mod volume;
