//! Whether a node still has its name in the backing directory. A file replaced there by a
//! rename (what a sync tool does) leaves the kernel's cached name pointing at the old
//! inode until the entry's cache time runs out; an open of that name in the window would
//! reach the orphan, and what is written there is lost (docs/cache.md).

use super::{FsError, FsResult, Kind, Store, ROOT_INO};

impl Store {
    /// `Ok` when regular file `ino` is still named by the name the store knows it by (or
    /// one of its earlier names: hard links), or has no name to check (removed through
    /// the mount, reached through `/proc/PID/fd`). ESTALE when that name now denotes
    /// another file or none: the kernel then looks the name up again and opens what it
    /// denotes now.
    pub fn still_named(&self, ino: u64) -> FsResult<()> {
        if ino == ROOT_INO {
            return Ok(());
        }
        let node = self.inode(ino)?;
        if node.kind != Kind::File {
            return Ok(());
        }
        let (link, others) = {
            let st = node.state.lock();
            (st.link.clone(), st.others.clone())
        };
        let Some((parent, name)) = link else {
            return Ok(());
        };
        if self.names(parent, &name, node.key)
            || others.iter().any(|(p, n)| self.names(*p, n, node.key))
        {
            return Ok(());
        }
        Err(FsError(libc::ESTALE))
    }
}
