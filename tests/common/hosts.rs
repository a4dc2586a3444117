//! One host's daemon in the multi-host tests: started, signalled, killed and cleaned up
//! the same way by every test file that plays several hosts.

use super::{lazy_umount, mount_fstype, spawn_mounted, wait_child, wait_until, TIMEOUT};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};

/// A `coherent-mount` daemon and its mount point.
pub struct Daemon {
    pub mnt: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl Daemon {
    /// Runs `cmd` (a `coherent-mount` command line) and waits until `mnt` answers.
    pub fn spawn(cmd: Command, mnt: &Path, log: &Path) -> Daemon {
        Daemon {
            child: Some(spawn_mounted(cmd, mnt, log)),
            mnt: mnt.to_path_buf(),
            log: log.to_path_buf(),
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.as_ref().expect("daemon").id() as i32
    }

    pub fn signal(&self, sig: i32) {
        assert_eq!(unsafe { libc::kill(self.pid(), sig) }, 0, "kill {sig}");
    }

    /// What the daemon logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `kill -9` the daemon; its mount is left dead (unmounted lazily, so descriptors
    /// opened through it stay open in their processes).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            unsafe { libc::kill(c.id() as i32, libc::SIGKILL) };
            let _ = wait_child(&mut c, TIMEOUT);
        }
        lazy_umount(&self.mnt);
        assert!(wait_until(TIMEOUT, || mount_fstype(&self.mnt).is_none()));
    }
}

impl Drop for Daemon {
    /// Stops a daemon still running (a killed one left nothing: its mount point may
    /// already hold the next daemon's mount).
    fn drop(&mut self) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        // A stopped daemon does not act on SIGTERM until it runs again.
        unsafe {
            libc::kill(c.id() as i32, libc::SIGCONT);
            libc::kill(c.id() as i32, libc::SIGTERM);
        }
        if wait_child(&mut c, TIMEOUT).is_none() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if mount_fstype(&self.mnt).is_some_and(|t| t.starts_with("fuse")) {
            lazy_umount(&self.mnt);
        }
    }
}
