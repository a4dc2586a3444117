//! `impl Fs` for extended attributes: set and remove are write routes; get and list
//! merge the policy's computed names with the backing file's.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use super::router::Node;
use super::{Fs, WriteRoute};
use crate::store::{Caller, FsError, FsResult, XattrReply};

impl Fs {
    pub fn setxattr(
        &self,
        caller: &Caller,
        ino: u64,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> FsResult<()> {
        self.refuse_pseudo(&[ino], &[], libc::EPERM)?;
        let path = self.store.path_of(ino);
        let route = WriteRoute::Setxattr {
            path: path.as_deref(),
            name,
        };
        self.guarded(caller, &route, || {
            self.store.setxattr(caller, ino, name, value, flags)
        })
    }

    pub fn removexattr(&self, caller: &Caller, ino: u64, name: &OsStr) -> FsResult<()> {
        self.refuse_pseudo(&[ino], &[], libc::EPERM)?;
        let path = self.store.path_of(ino);
        let route = WriteRoute::Removexattr {
            path: path.as_deref(),
            name,
        };
        self.guarded(caller, &route, || self.store.removexattr(caller, ino, name))
    }

    /// An xattr's value (`size` 0: only its length): computed by the policy, or the
    /// backing file's.
    pub fn getxattr(
        &self,
        caller: &Caller,
        ino: u64,
        name: &OsStr,
        size: u32,
    ) -> FsResult<XattrReply> {
        self.refuse_pseudo(&[ino], &[], libc::ENODATA)?;
        let path = self.store.path_of(ino);
        match self.policy.getxattr(caller, ino, path.as_deref(), name) {
            Some(Ok(v)) => sized(v, size),
            Some(Err(e)) => Err(e),
            None => self.store.getxattr(ino, name, size),
        }
    }

    /// The xattr names of a node: the backing file's, then the policy's computed ones.
    pub fn listxattr(&self, caller: &Caller, ino: u64, size: u32) -> FsResult<XattrReply> {
        if let Node::Pseudo(_) = self.router.node(ino) {
            return Ok(XattrReply::Size(0));
        }
        let path = self.store.path_of(ino);
        let extra = self.policy.listxattr(caller, ino, path.as_deref());
        if extra.is_empty() {
            return self.store.listxattr(ino, size);
        }
        // Merge: read the backing list in full, append the computed names.
        let mut list = match self.store.listxattr(ino, 0)? {
            XattrReply::Size(n) if n > 0 => match self.store.listxattr(ino, n)? {
                XattrReply::Data(d) => d,
                XattrReply::Size(_) => Vec::new(),
            },
            _ => Vec::new(),
        };
        for n in extra {
            list.extend_from_slice(n.as_bytes());
            list.push(0);
        }
        sized(list, size)
    }
}

/// An xattr answer of `v` for a buffer of `size` bytes (0: only the length).
fn sized(v: Vec<u8>, size: u32) -> FsResult<XattrReply> {
    if size == 0 {
        Ok(XattrReply::Size(v.len() as u32))
    } else if v.len() > size as usize {
        Err(FsError(libc::ERANGE))
    } else {
        Ok(XattrReply::Data(v))
    }
}
