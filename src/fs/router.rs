//! Which backend answers a request: the one place that tells the inodes of the
//! `.coherent/` tree ([`PseudoFs`](super::PseudoFs)) from those of the backing directory
//! ([`Store`](crate::store::Store)). Inode numbers with
//! [`VIRTUAL_INO_BIT`](crate::store::VIRTUAL_INO_BIT) set belong to the tree, and so
//! does its name at the root.

use std::ffi::{OsStr, OsString};

use crate::store::{ROOT_INO, VIRTUAL_INO_BIT};

/// Is `ino` a node of the pseudo tree? (The one place this is asked.)
fn is_virtual(ino: u64) -> bool {
    ino & VIRTUAL_INO_BIT != 0
}

/// The backend of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Node {
    Backing(u64),
    Pseudo(u64),
}

/// Routes inodes and names to their backend.
#[derive(Debug, Clone, Default)]
pub(super) struct Router {
    /// The root name of the pseudo tree (None: there is none).
    pseudo_name: Option<OsString>,
}

impl Router {
    pub(super) fn new(pseudo_name: Option<OsString>) -> Self {
        Router { pseudo_name }
    }

    /// The backend of inode `ino`.
    pub(super) fn node(&self, ino: u64) -> Node {
        if is_virtual(ino) {
            Node::Pseudo(ino)
        } else {
            Node::Backing(ino)
        }
    }

    /// The backend that looks `name` up under `parent` (the node is the parent's).
    pub(super) fn child(&self, parent: u64, name: &OsStr) -> Node {
        if is_virtual(parent) || self.is_root_name(parent, name) {
            Node::Pseudo(parent)
        } else {
            Node::Backing(parent)
        }
    }

    /// Is any of these nodes or names in the pseudo tree? A write route that makes,
    /// moves or removes such a name is refused before it reaches a backend.
    pub(super) fn any_pseudo(&self, inos: &[u64], names: &[(u64, &OsStr)]) -> bool {
        inos.iter().any(|&i| is_virtual(i))
            || names
                .iter()
                .any(|&(p, n)| matches!(self.child(p, n), Node::Pseudo(_)))
    }

    fn is_root_name(&self, parent: u64, name: &OsStr) -> bool {
        parent == ROOT_INO && self.pseudo_name.as_deref() == Some(name)
    }
}
