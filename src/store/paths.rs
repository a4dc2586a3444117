//! The workspace path of each inode: the name it was last seen under, the names it had
//! before (hard links), and what becomes of them when a name goes.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;

use super::sys::{cstr, fstat_fd, fstatat};
use super::{Kind, NamePreference, Store, ROOT_INO};

impl Store {
    /// Set once which names [`Store::path_of`] prefers.
    pub fn set_name_preference(&self, f: NamePreference) {
        let _ = self.prefer.set(f);
    }

    /// The workspace-relative path of `ino` ("" for the root): the name it was last seen
    /// under, unless that name is not preferred (see [`Store::set_name_preference`]) and
    /// another name it was seen under, still its name, is.
    pub fn path_of(&self, ino: u64) -> Option<PathBuf> {
        let p = self.last_path_of(ino)?;
        let Some(prefer) = self.prefer.get() else {
            return Some(p);
        };
        let (key, others) = {
            let t = self.tables.read();
            let node = t.inodes.get(&ino)?;
            let st = node.state.lock();
            if st.others.is_empty() {
                return Some(p);
            }
            (node.key, st.others.clone())
        };
        if prefer(&p) {
            return Some(p);
        }
        for (parent, name) in others.iter().rev() {
            if !self.names(*parent, name, key) {
                continue;
            }
            if let Some(q) = self.last_path_of(*parent).map(|d| d.join(name)) {
                if prefer(&q) {
                    return Some(q);
                }
            }
        }
        Some(p)
    }

    /// Does (parent, name) name the file at `key` in the backing directory now?
    pub(super) fn names(&self, parent: u64, name: &OsStr, key: (u64, u64)) -> bool {
        let Ok((_, dir)) = self.node_fd(parent) else {
            return false;
        };
        let Ok(c) = cstr(name) else { return false };
        fstatat(dir.as_raw_fd(), &c, libc::AT_SYMLINK_NOFOLLOW)
            .is_ok_and(|st| (st.st_dev, st.st_ino) == key)
    }

    /// The workspace-relative path `ino` was last seen under ("" for the root).
    fn last_path_of(&self, ino: u64) -> Option<PathBuf> {
        let t = self.tables.read();
        let mut names: Vec<OsString> = Vec::new();
        let mut cur = ino;
        for _ in 0..4096 {
            if cur == ROOT_INO {
                let mut p = PathBuf::new();
                for n in names.iter().rev() {
                    p.push(n);
                }
                return Some(p);
            }
            let node = t.inodes.get(&cur)?;
            let st = node.state.lock();
            let (parent, name) = st.link.as_ref()?;
            names.push(name.clone());
            cur = *parent;
        }
        None
    }

    /// The workspace-relative path of `name` under `parent`.
    pub fn child_path(&self, parent: u64, name: &OsStr) -> Option<PathBuf> {
        self.path_of(parent).map(|p| p.join(name))
    }

    /// The node at `key` lost the name (parent, name) but may have others: if that was
    /// its current name, an earlier name that still names it (checked in the backing
    /// directory) takes over. Without one it keeps the old name.
    pub(super) fn unname(&self, key: (u64, u64), parent: u64, name: &OsStr) {
        let Some(ino) = self.tables.read().by_key.get(&key).copied() else {
            return;
        };
        let Ok(node) = self.inode(ino) else { return };
        let others = {
            let mut st = node.state.lock();
            st.others.retain(|(p, n)| !(*p == parent && n == name));
            match &st.link {
                Some((p, n)) if *p == parent && n == name => st.others.clone(),
                _ => return,
            }
        };
        for (p, n) in others.iter().rev() {
            if self.names(*p, n, key) {
                let mut st = node.state.lock();
                if st
                    .link
                    .as_ref()
                    .is_some_and(|(lp, ln)| *lp == parent && ln == name)
                {
                    st.others.retain(|(q, m)| !(q == p && m == n));
                    st.link = Some((*p, n.clone()));
                }
                return;
            }
        }
    }

    /// A node lost a name: once it has no name left (a removed file still open, a file
    /// replaced by a rename), it has no path any more ([`Store::path_of`] is `None`), so
    /// nothing done through an old handle is attributed to whatever now has that name.
    ///
    /// `held` is the node's descriptor taken before the name went: a node with no name
    /// left keeps it pinned, as it can no longer be re-resolved by name.
    pub(super) fn orphan(&self, key: (u64, u64), held: Option<Arc<OwnedFd>>) {
        let Some(ino) = self.tables.read().by_key.get(&key).copied() else {
            return;
        };
        if ino == ROOT_INO {
            return;
        }
        let Ok(node) = self.inode(ino) else { return };
        let fd = match held.clone() {
            Some(fd) => Ok(fd),
            None => self.node_fd(ino).map(|(_, fd)| fd),
        };
        let gone = match fd.and_then(|fd| fstat_fd(fd.as_raw_fd())) {
            Ok(st) => st.st_nlink == 0 || node.kind == Kind::Dir,
            Err(_) => true,
        };
        if gone {
            node.state.lock().link = None;
            if let Some(fd) = held {
                *node.pinned.lock() = Some(fd);
                self.fds.remove(ino);
            }
        }
    }

    /// The descriptor of the node we know at `key`, if any, to pin if it loses its last
    /// name: without handles it could not be re-resolved, and with them its inode number
    /// could be given to a new file while the kernel still knows the old one (a current
    /// directory, say), which would then show the new file's attributes under its number.
    /// With handles only a descriptor at hand is taken (pinned or cached: a node the
    /// kernel used lately, as a current directory is), so a removal costs no
    /// `open_by_handle_at`.
    pub(super) fn known_fd(&self, key: (u64, u64)) -> Option<Arc<OwnedFd>> {
        let ino = *self.tables.read().by_key.get(&key)?;
        if self.mount.is_some() {
            let node = self.inode(ino).ok()?;
            let pinned = node.pinned.lock().clone();
            return pinned.or_else(|| self.fds.get(ino));
        }
        self.node_fd(ino).ok().map(|(_, fd)| fd)
    }

    /// Point the inode now found at (parent, name) to that name.
    pub(super) fn relink(&self, parent: u64, name: &OsStr) {
        let Ok((_, dir_fd)) = self.node_fd(parent) else {
            return;
        };
        let Ok(c) = cstr(name) else { return };
        let Ok(st) = fstatat(dir_fd.as_raw_fd(), &c, libc::AT_SYMLINK_NOFOLLOW) else {
            return;
        };
        let t = self.tables.read();
        if let Some(ino) = t.by_key.get(&(st.st_dev, st.st_ino)) {
            if *ino != ROOT_INO {
                t.inodes[ino].state.lock().set_link(parent, name);
            }
        }
    }
}
