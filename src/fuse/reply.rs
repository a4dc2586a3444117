//! Encoding the answers of [`Fs`](crate::fs::Fs) as `fuser` replies, with the one error
//! path ([`answer`]).

use fuser::{
    BackingId, FopenFlags, Generation, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl, ReplyLock, ReplyLseek, ReplyOpen,
    ReplyStatfs, ReplyWrite, ReplyXattr,
};

use super::convert::{fail, file_attr, negative_attr};
use crate::fs::{AttrOut, Entry, Fopen, Op};
use crate::store::{FsResult, XattrReply};

/// A reply that can carry an errno (every `fuser` reply).
pub(super) trait ErrorReply {
    fn error(self, e: fuser::Errno);
}

macro_rules! error_reply {
    ($($t:ty),*) => {$(
        impl ErrorReply for $t {
            fn error(self, e: fuser::Errno) {
                <$t>::error(self, e)
            }
        }
    )*};
}
error_reply!(
    ReplyAttr,
    ReplyCreate,
    ReplyData,
    ReplyDirectory,
    ReplyDirectoryPlus,
    ReplyEmpty,
    ReplyEntry,
    ReplyIoctl,
    ReplyLock,
    ReplyLseek,
    ReplyOpen,
    ReplyStatfs,
    ReplyWrite,
    ReplyXattr
);

/// The one place an answer of [`Fs`] becomes a reply: `ok` encodes a success, a failure
/// is logged and answered with its errno.
pub(super) fn answer<R: ErrorReply, T>(op: Op, r: FsResult<T>, reply: R, ok: impl FnOnce(R, T)) {
    match r {
        Ok(v) => ok(reply, v),
        Err(e) => reply.error(fail(&op.name(), e)),
    }
}

pub(super) fn entry(reply: ReplyEntry, e: Entry) {
    match e.attr {
        Some(a) => reply.entry(&e.ttl, &file_attr(&a), Generation(0)),
        None => reply.entry(&e.ttl, &negative_attr(), Generation(0)),
    }
}

pub(super) fn attr(reply: ReplyAttr, a: AttrOut) {
    reply.attr(&a.ttl, &file_attr(&a.attr))
}

pub(super) fn empty(reply: ReplyEmpty, (): ()) {
    reply.ok()
}

pub(super) fn xattr(reply: ReplyXattr, x: XattrReply) {
    match x {
        XattrReply::Size(n) => reply.size(n),
        XattrReply::Data(d) => reply.data(&d),
    }
}

pub(super) fn fopen_flags(f: Fopen) -> FopenFlags {
    let mut out = FopenFlags::empty();
    for (on, flag) in [
        (f.direct_io, FopenFlags::FOPEN_DIRECT_IO),
        (f.noflush, FopenFlags::FOPEN_NOFLUSH),
        (
            f.cache_dir,
            FopenFlags::FOPEN_CACHE_DIR | FopenFlags::FOPEN_KEEP_CACHE,
        ),
    ] {
        if on {
            out |= flag;
        }
    }
    out
}

/// The replies that can register a passthrough backing file.
pub(super) trait OpenBacking {
    fn open_backing(&self, f: &std::fs::File) -> std::io::Result<BackingId>;
}

impl OpenBacking for ReplyOpen {
    fn open_backing(&self, f: &std::fs::File) -> std::io::Result<BackingId> {
        ReplyOpen::open_backing(self, f)
    }
}

impl OpenBacking for ReplyCreate {
    fn open_backing(&self, f: &std::fs::File) -> std::io::Result<BackingId> {
        ReplyCreate::open_backing(self, f)
    }
}

pub(super) fn empty_dir(reply: ReplyDirectoryPlus, (): ()) {
    reply.ok()
}
