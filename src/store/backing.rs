//! The backing directory as the layers above the store see it: the store's own root
//! descriptor, shared (one descriptor, one owner: the [`Store`](super::Store)), with the
//! path questions the coherence layer asks of it. Paths are workspace-relative and are
//! looked up beneath the root without following a final symlink.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use super::print::has_content;
use super::{lstat_at, PathStat};

/// The store's root (`O_PATH`), lent out: it lives as long as the store or any lender.
#[derive(Clone)]
pub struct Backing(Arc<OwnedFd>);

impl Backing {
    pub(super) fn new(root: Arc<OwnedFd>) -> Self {
        Backing(root)
    }

    /// The root descriptor, for the checks that take one (permissions, visibility).
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }

    /// `fstatat` of `rel`, a final symlink not followed.
    pub fn lstat(&self, rel: &str) -> Option<PathStat> {
        lstat_at(self.fd(), rel)
    }

    /// Is there a regular file or a symlink at `rel`?
    pub fn has_content(&self, rel: &str) -> bool {
        has_content(self.fd(), rel)
    }
}

/// A backing directory opened by path, for a part used alone (a test of tracking): with
/// a store, take [`Store::backing`](super::Store::backing) instead.
impl From<OwnedFd> for Backing {
    fn from(root: OwnedFd) -> Self {
        Backing(Arc::new(root))
    }
}

impl std::fmt::Debug for Backing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Backing").field(&self.0).finish()
    }
}
