//! The negotiation at init: the capabilities asked of the kernel, the I/O sizes, and
//! whether file data goes by FUSE passthrough or through the daemon (the data mode).

use fuser::{InitFlags, KernelConfig};

use super::convert::has_cap_sys_admin;
use super::{CoherentFs, MAX_IO};

impl CoherentFs {
    /// What `init` answers the kernel (see the module docs).
    pub(super) fn negotiate(&mut self, config: &mut KernelConfig) -> std::io::Result<()> {
        for flag in [
            InitFlags::FUSE_ATOMIC_O_TRUNC,
            InitFlags::FUSE_DO_READDIRPLUS,
            InitFlags::FUSE_PARALLEL_DIROPS,
            InitFlags::FUSE_CACHE_SYMLINKS,
            InitFlags::FUSE_ASYNC_DIO,
            InitFlags::FUSE_HANDLE_KILLPRIV_V2,
        ] {
            let _ = config.add_capabilities(flag);
        }
        // No export handles (`name_to_handle_at`, NFS): a node id is not a handle the
        // volume can open again once the kernel forgot it, so declining them makes callers
        // get EOPNOTSUPP up front instead of ESTALE later (Linux 6.7+; as libfuse's
        // passthrough_hp).
        if config
            .add_capabilities(InitFlags::FUSE_NO_EXPORT_SUPPORT)
            .is_err()
        {
            tracing::debug!("the kernel does not offer FUSE_NO_EXPORT_SUPPORT");
        }
        // Record locks on the backing file (fs/locks.rs). Without it the kernel would keep
        // them to this host's processes, silently: say so.
        if config
            .add_capabilities(InitFlags::FUSE_POSIX_LOCKS)
            .is_err()
        {
            tracing::warn!(
                "the kernel does not offer FUSE_POSIX_LOCKS: fcntl locks hold between the \
                 processes of this mount only, not against the backing directory"
            );
        }
        // POSIX ACLs (docs/permissions.md): the kernel's permission check (on always with
        // them, as `default_permissions`) then reads `system.posix_acl_access` through
        // GETXATTR, and leaves the umask to us: the mode comes unmasked with the caller's
        // umask beside it (FUSE_DONT_MASK), for the backing filesystem to apply or to
        // replace by the parent's default ACL. Both or neither: ACL checks with the kernel
        // still masking would lose the default ACL's inheritance.
        let acl = InitFlags::FUSE_POSIX_ACL | InitFlags::FUSE_DONT_MASK;
        if let Err(missing) = config.add_capabilities(acl) {
            tracing::warn!(
                "the kernel does not offer {missing:?}: permission checks count the mode \
                 only, not POSIX ACLs (needs Linux 4.9+)"
            );
        }
        let _ = config.set_max_write(MAX_IO);
        if let Err(max) = config.set_max_readahead(MAX_IO) {
            let _ = config.set_max_readahead(max);
        }
        let _ = config.set_max_background(64);
        let mode = if !self.fs.wants_passthrough() {
            "through the daemon (--no-passthrough)"
        } else if self.fs.sees_every_write() {
            // Reads too: the kernel keeps an inode in passthrough or cached mode, not both.
            "through the daemon (a multi-host volume checks every write)"
        } else if !has_cap_sys_admin() {
            "through the daemon (FUSE passthrough needs CAP_SYS_ADMIN)"
        } else {
            match config.add_capabilities(InitFlags::FUSE_PASSTHROUGH) {
                Ok(()) => {
                    // Allow a backing directory on a stacked filesystem (e.g. overlayfs).
                    if config.set_max_stack_depth(2).is_err() {
                        let _ = config.set_max_stack_depth(1);
                    }
                    self.backings.activate();
                    "passthrough (reads and writes of regular files go straight to the backing files)"
                }
                Err(_) => {
                    "through the daemon (the kernel does not offer FUSE passthrough, needs 6.9+)"
                }
            }
        };
        tracing::info!("data mode: {mode}");
        self.fs.set_data_mode(mode);
        Ok(())
    }
}
