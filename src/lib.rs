//! coherent: a FUSE-mounted coherent volume for agents that share one workspace
//! (docs/design.md).
//!
//! The modules in the order a request flows through them:
//!
//! 1. [`fuse`] decodes a kernel request and calls [`fs::Fs`], the filesystem with no FUSE
//!    in it, which routes `.coherent/` to its pseudo backend and everything else to the
//!    backing directory ([`store::Store`]), asking its policy before and after
//!    every write route;
//! 2. the policy is the [`volume`]: it finds who is calling ([`identity`]), whether the
//!    path is tracked ([`tracking`]), and asks the engine ([`coherence`]), which decides,
//!    counts versions and keeps records;
//! 3. every change of state becomes an event made durable by the [`journal`], and, across
//!    hosts, agreed through the [`coordinator`];
//! 4. the `.coherent/` files answer with the [`control`] wire format, showing a reader
//!    only what it may see ([`visibility`], [`access`], [`beneath`]).
//!
//! Underneath: [`error`] (reason codes and errnos), [`names`] (the session-name rule),
//! [`sys`] (`/proc` readers), [`mem`] (what a row per path costs), [`bypass`] (processes inside an in-place mount),
//! [`request_timeout`] (how long the kernel lets a request be held).

// 1. The kernel's side.
pub mod fs;
pub mod fuse;
pub mod store;

// 2. The policy and the decision.
pub mod coherence;
pub mod identity;
pub mod tracking;
pub mod volume;

// 3. Durability and agreement.
pub mod coordinator;
pub mod history;
pub mod journal;

// 4. The control surface (its wire format is the coherent-wire crate) and what a reader
// may see.
pub use coherent_wire::control;
pub mod access;
pub mod beneath;
pub mod visibility;

// Underneath everything.
pub use coherent_wire::{error, names};
pub mod bypass;
pub mod mem;
pub mod request_timeout;
pub mod sys;
