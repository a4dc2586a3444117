//! Extended attributes of a node: where the xattr calls reach it (a symlink by its name,
//! not followed), and POSIX ACLs set or removed as the caller.

use std::ffi::{CString, OsStr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use super::sys::{cstr, cvt, fstatat, proc_path, xattr_reply};
use super::{creds, Caller, FsError, FsResult, Inode, Kind, Store, XattrReply};

/// Where the xattr calls reach a node: its descriptor's magic link (followed), or a
/// symlink's name under its parent (for the `l*` calls, which do not follow it).
enum Xattr {
    Fd(CString),
    Link(CString),
}

type GetXattr = unsafe extern "C" fn(
    *const libc::c_char,
    *const libc::c_char,
    *mut libc::c_void,
    usize,
) -> isize;
type ListXattr = unsafe extern "C" fn(*const libc::c_char, *mut libc::c_char, usize) -> isize;
type SetXattr = unsafe extern "C" fn(
    *const libc::c_char,
    *const libc::c_char,
    *const libc::c_void,
    usize,
    libc::c_int,
) -> libc::c_int;
type RemoveXattr = unsafe extern "C" fn(*const libc::c_char, *const libc::c_char) -> libc::c_int;

impl Store {
    /// A path that reaches the node itself for the xattr calls (which do not accept
    /// `O_PATH` descriptors). Symlinks have no user xattrs on Linux.
    /// The descriptor returned keeps the path valid.
    /// The path the xattr calls take for `ino`, and what keeps it valid. A symlink's
    /// xattrs (`trusted.*`, `security.*`) are reached by its name under its parent's
    /// descriptor with the `l*` calls, which do not follow it (the magic link of its own
    /// `O_PATH` descriptor would be followed, to the target); the name is checked to be
    /// the node's first. Calls on `Xattr::Link` paths must be the `l*` ones.
    fn xattr_target(&self, ino: u64) -> FsResult<(Arc<Inode>, Xattr, Arc<OwnedFd>)> {
        let (node, node_fd) = self.node_fd(ino)?;
        if node.kind != Kind::Symlink {
            let p = proc_path(node_fd.as_raw_fd());
            return Ok((node, Xattr::Fd(p), node_fd));
        }
        let (parent, name) = node
            .state
            .lock()
            .link
            .clone()
            .ok_or(FsError(libc::ESTALE))?;
        let (_, dir) = self.node_fd(parent)?;
        let mut p = proc_path(dir.as_raw_fd()).into_bytes();
        p.push(b'/');
        p.extend_from_slice(name.as_bytes());
        let p = CString::new(p).map_err(|_| FsError(libc::EINVAL))?;
        let st = fstatat(dir.as_raw_fd(), &cstr(&name)?, libc::AT_SYMLINK_NOFOLLOW)?;
        if (st.st_dev, st.st_ino) != node.key {
            return Err(FsError(libc::ESTALE));
        }
        Ok((node, Xattr::Link(p), dir))
    }

    /// Get an xattr; `size` 0 asks for the length only (returned as an empty vec + len).
    ///
    /// The kernel asks for `system.posix_acl_access` to check permissions (POSIX ACLs are
    /// negotiated): a backing filesystem without ACL support has no ACLs, and its answer
    /// `EOPNOTSUPP` would fail every check, so it is `ENODATA` (no ACL: the mode decides).
    pub fn getxattr(&self, ino: u64, name: &OsStr, size: u32) -> FsResult<XattrReply> {
        let (_, p, _fd) = self.xattr_target(ino)?;
        let n = cstr(name)?;
        let mut buf = vec![0u8; size as usize];
        let (call, p) = match &p {
            Xattr::Fd(p) => (libc::getxattr as GetXattr, p),
            Xattr::Link(p) => (libc::lgetxattr as GetXattr, p),
        };
        // SAFETY: getxattr writes at most buf.len() bytes into `buf`; both names are
        // NUL-terminated.
        let r = cvt(unsafe { call(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) });
        match r {
            Err(FsError(libc::EOPNOTSUPP)) if is_posix_acl(name) => Err(FsError(libc::ENODATA)),
            r => Ok(xattr_reply(buf, r? as usize, size)),
        }
    }

    pub fn listxattr(&self, ino: u64, size: u32) -> FsResult<XattrReply> {
        let (_, p, _fd) = self.xattr_target(ino)?;
        let mut buf = vec![0u8; size as usize];
        let (call, p) = match &p {
            Xattr::Fd(p) => (libc::listxattr as ListXattr, p),
            Xattr::Link(p) => (libc::llistxattr as ListXattr, p),
        };
        // SAFETY: listxattr writes at most buf.len() bytes into `buf`; the path is
        // NUL-terminated.
        let r = cvt(unsafe { call(p.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })?;
        Ok(xattr_reply(buf, r as usize, size))
    }

    /// Set an xattr. A POSIX ACL is set as the caller (see `acl_as_caller`).
    pub fn setxattr(
        &self,
        caller: &Caller,
        ino: u64,
        name: &OsStr,
        value: &[u8],
        flags: i32,
    ) -> FsResult<()> {
        let (_, p, _fd) = self.xattr_target(ino)?;
        let n = cstr(name)?;
        let _as = acl_as_caller(caller, name);
        let (call, p) = match &p {
            Xattr::Fd(p) => (libc::setxattr as SetXattr, p),
            Xattr::Link(p) => (libc::lsetxattr as SetXattr, p),
        };
        // SAFETY: setxattr reads value.len() bytes of `value`; both names are NUL-terminated.
        cvt(unsafe {
            call(
                p.as_ptr(),
                n.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                flags,
            )
        })
        .map(drop)
    }

    /// Remove an xattr. A POSIX ACL is removed as the caller (see `acl_as_caller`).
    pub fn removexattr(&self, caller: &Caller, ino: u64, name: &OsStr) -> FsResult<()> {
        let (_, p, _fd) = self.xattr_target(ino)?;
        let n = cstr(name)?;
        let _as = acl_as_caller(caller, name);
        let (call, p) = match &p {
            Xattr::Fd(p) => (libc::removexattr as RemoveXattr, p),
            Xattr::Link(p) => (libc::lremovexattr as RemoveXattr, p),
        };
        // SAFETY: removexattr with a NUL-terminated path and name.
        cvt(unsafe { call(p.as_ptr(), n.as_ptr()) }).map(drop)
    }
}

/// The two xattrs that hold POSIX ACLs.
pub fn is_posix_acl(name: &OsStr) -> bool {
    matches!(
        name.as_bytes(),
        b"system.posix_acl_access" | b"system.posix_acl_default"
    )
}

/// A POSIX ACL is set or removed with the caller's fs uid, gid and groups: the backing
/// filesystem then decides as for the caller's own `setfacl` (only the owner may, and
/// setting an access ACL clears set-group-ID when the caller is not in the file's group,
/// which it never does for root). Other xattrs are set as the daemon: the kernel has
/// checked them for the caller already.
fn acl_as_caller(caller: &Caller, name: &OsStr) -> Option<creds::AsCaller> {
    is_posix_acl(name).then(|| creds::AsCaller::enter(caller))
}
