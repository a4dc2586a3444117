//! The filesystem's [`Policy`] and [`PseudoFs`] interfaces, through a real in-process mount
//! and through [`Fs`] alone: which policy methods run for which operation, in which order,
//! with which workspace-relative paths; refusals; handle tokens and change stamps at
//! flush/release; the `.coherent` tree and hiding a backing one.

use std::ffi::{OsStr, OsString};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use coherent::fs::{
    Fs, FsOptions, HandleInfo, HandleState, OpenInfo, Permit, Policy, PseudoFs, ReadDone,
    WriteRoute,
};
use coherent::fuse::CoherentFs;
use coherent::request_timeout::Started;
use coherent::store::{
    Attr, Caller, DirEntry, FsError, FsResult, Kind, SetAttr, Store, Time, ROOT_INO,
    VIRTUAL_INO_BIT,
};
use parking_lot::Mutex;

#[derive(Default)]
struct Recorder {
    events: Mutex<Vec<String>>,
}

const VDIR: u64 = VIRTUAL_INO_BIT | 1;
const VFILE: u64 = VIRTUAL_INO_BIT | 2;

fn p(x: Option<&Path>) -> String {
    x.map(|p| p.display().to_string())
        .unwrap_or_else(|| "?".into())
}

fn vattr(ino: u64, kind: Kind) -> Attr {
    Attr {
        ino,
        kind,
        perm: if kind == Kind::Dir { 0o555 } else { 0o444 },
        nlink: 1,
        uid: 0,
        gid: 0,
        size: 0,
        blocks: 0,
        atime: Time::default(),
        mtime: Time::default(),
        ctime: Time::default(),
        rdev: 0,
        blksize: 4096,
    }
}

impl Recorder {
    fn push(&self, s: String) {
        self.events.lock().push(s);
    }
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.events.lock())
    }
    /// Wait (up to 5 s) until `want` was recorded (release arrives after close returns),
    /// then take everything.
    fn take_after(&self, want: &str) -> Vec<String> {
        let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !self.events.lock().iter().any(|e| e == want) && std::time::Instant::now() < end {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        self.take()
    }
}

fn route(r: &WriteRoute<'_>) -> String {
    match r {
        WriteRoute::Open { path, flags, .. } => {
            format!("open {} trunc={}", p(*path), flags & libc::O_TRUNC != 0)
        }
        WriteRoute::Create { path, .. } => format!("create {}", p(*path)),
        WriteRoute::Setattr { path, set, .. } => {
            format!("setattr {} size={:?}", p(*path), set.size)
        }
        WriteRoute::Rename { from, to, flags } => format!("rename {} {} {flags}", p(*from), p(*to)),
        WriteRoute::Unlink { path } => format!("unlink {}", p(*path)),
        WriteRoute::Rmdir { path } => format!("rmdir {}", p(*path)),
        WriteRoute::Link { from, to } => format!("link {} {}", p(*from), p(*to)),
        WriteRoute::Symlink { path, .. } => format!("symlink {}", p(*path)),
        WriteRoute::Mknod { path, .. } => format!("mknod {}", p(*path)),
        WriteRoute::Mkdir { path, .. } => format!("mkdir {}", p(*path)),
        WriteRoute::Setxattr { path, name } => {
            format!("setxattr {} {}", p(*path), name.to_string_lossy())
        }
        WriteRoute::Removexattr { path, name } => {
            format!("removexattr {} {}", p(*path), name.to_string_lossy())
        }
    }
}

struct TestPolicy(Arc<Recorder>);

/// The number a handle keeps as its state (0: none).
fn token(h: &HandleInfo<'_>) -> u64 {
    h.state.map_or(0, |s| s.0)
}

impl Policy for TestPolicy {
    fn before_write(&self, _c: &Caller, r: &WriteRoute<'_>) -> Result<Option<Permit>, FsError> {
        let s = route(r);
        if s.contains("forbidden") {
            self.0.push(format!("refuse {s}"));
            return Err(FsError(libc::EACCES));
        }
        self.0.push(format!("before {s}"));
        Ok(None)
    }
    fn after_write(
        &self,
        _c: &Caller,
        r: &WriteRoute<'_>,
        _permit: Option<Permit>,
        outcome: Result<(), FsError>,
    ) {
        self.0.push(format!(
            "after {} {:?}",
            route(r),
            outcome.err().map(|e| e.errno())
        ));
    }
    fn on_open(
        &self,
        c: &Caller,
        o: &OpenInfo<'_>,
        _permit: Option<Permit>,
    ) -> Result<Option<HandleState>, FsError> {
        // FUSE reports the calling thread's id: one of our threads.
        assert!(
            Path::new(&format!("/proc/self/task/{}", c.pid)).exists(),
            "caller {c:?}"
        );
        self.0.push(format!(
            "open {} created={} size={}",
            p(o.path),
            o.created,
            o.stamp.size
        ));
        // A handle the policy refuses after the backing file was opened.
        if p(o.path).contains("noopen") {
            return Err(FsError(libc::EPERM));
        }
        // A handle the policy keeps no state for (like the volume's untracked paths).
        if p(o.path).contains("stateless") {
            return Ok(None);
        }
        Ok(Some(HandleState(1000 + o.stamp.size)))
    }
    fn on_flush(&self, _c: &Caller, h: &HandleInfo<'_>) {
        self.0.push(format!(
            "flush {} token={} changed={}",
            p(h.path),
            token(h),
            h.changed()
        ));
    }
    fn on_release(&self, _c: &Caller, h: &HandleInfo<'_>) {
        self.0.push(format!(
            "release {} token={} changed={}",
            p(h.path),
            token(h),
            h.changed()
        ));
    }
    fn getxattr(
        &self,
        _c: &Caller,
        _ino: u64,
        path: Option<&Path>,
        name: &OsStr,
    ) -> Option<FsResult<Vec<u8>>> {
        (name == "user.coherent.path").then(|| Ok(p(path).into_bytes()))
    }
    fn listxattr(&self, _c: &Caller, _ino: u64, _path: Option<&Path>) -> Vec<OsString> {
        vec!["user.coherent.path".into()]
    }
}

/// A `.coherent` tree of one file, `hello`, that says who opened it.
struct TestTree(Arc<Recorder>);

impl PseudoFs for TestTree {
    fn root_name(&self) -> OsString {
        ".coherent".into()
    }
    fn lookup(&self, _c: &Caller, parent: u64, name: &OsStr) -> FsResult<Attr> {
        match (parent, name.to_str()) {
            (ROOT_INO, Some(".coherent")) => Ok(vattr(VDIR, Kind::Dir)),
            (VDIR, Some("hello")) => Ok(vattr(VFILE, Kind::File)),
            _ => Err(FsError(libc::ENOENT)),
        }
    }
    fn forget(&self, _ino: u64, _n: u64) {}
    fn getattr(&self, _c: &Caller, ino: u64) -> FsResult<Attr> {
        match ino {
            VDIR => Ok(vattr(VDIR, Kind::Dir)),
            VFILE => Ok(vattr(VFILE, Kind::File)),
            _ => Err(FsError(libc::ENOENT)),
        }
    }
    fn readdir(&self, _c: &Caller, ino: u64) -> FsResult<Vec<(u64, DirEntry)>> {
        assert_eq!(ino, VDIR);
        Ok(vec![(
            VFILE,
            DirEntry {
                name: "hello".into(),
                kind: Kind::File,
                d_ino: VFILE,
            },
        )])
    }
    fn open(&self, c: &Caller, ino: u64, _flags: i32) -> FsResult<u64> {
        assert_eq!(ino, VFILE);
        Ok(c.pid as u64) // the token: the reader's thread id
    }
    fn read(&self, _c: &Caller, token: u64, offset: u64, _size: u32, done: ReadDone) {
        let s = format!("hello pid {token}\n").into_bytes();
        done(Ok(s.get(offset as usize..).unwrap_or_default().to_vec()))
    }
    fn write(&self, _c: &Caller, _t: u64, data: &[u8]) -> FsResult<u32> {
        self.0
            .push(format!("vwrite {}", String::from_utf8_lossy(data).trim()));
        Ok(data.len() as u32)
    }
    fn release(&self, token: u64) {
        self.0.push(format!("vrelease {token}"));
    }
}

/// A backing directory with a `.coherent` entry of its own, which must stay hidden.
fn backing_dir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("b");
    fs::create_dir(&backing).unwrap();
    fs::create_dir(backing.join(".coherent")).unwrap();
    fs::write(backing.join(".coherent/secret"), b"s").unwrap();
    (dir, backing)
}

fn test_fs(rec: &Arc<Recorder>, backing: &Path, passthrough: bool) -> Fs {
    Fs::new(
        Store::open_root(backing).unwrap(),
        Arc::new(TestPolicy(rec.clone())),
        Some(Arc::new(TestTree(rec.clone()))),
        FsOptions {
            passthrough,
            ..FsOptions::default()
        },
    )
    .unwrap()
}

struct InProcess {
    _dir: tempfile::TempDir,
    backing: PathBuf,
    mnt: PathBuf,
    session: Option<fuser::BackgroundSession>,
}

impl Drop for InProcess {
    fn drop(&mut self) {
        drop(self.session.take()); // unmounts
        let _ = nix::mount::umount2(&self.mnt, nix::mount::MntFlags::MNT_DETACH);
    }
}

fn mount(rec: Arc<Recorder>, passthrough: bool) -> InProcess {
    let (dir, backing) = backing_dir();
    let mnt = dir.path().join("m");
    fs::create_dir(&mnt).unwrap();
    let fs_ = CoherentFs::new(test_fs(&rec, &backing, passthrough));
    let mut config = fuser::Config::default();
    config.n_threads = Some(2);
    config.clone_fd = true;
    let session = fuser::Session::new(fs_, &mnt, &config)
        .unwrap()
        .spawn()
        .unwrap();
    InProcess {
        _dir: dir,
        backing,
        mnt,
        session: Some(session),
    }
}

fn has(events: &[String], want: &str) -> bool {
    events.iter().any(|e| e == want)
}

fn hooks_see_every_route(passthrough: bool) {
    let rec = Arc::new(Recorder::default());
    let m = mount(rec.clone(), passthrough);
    let at = |x: &str| m.mnt.join(x);

    fs::create_dir(at("dir")).unwrap();
    let mut f = fs::File::create(at("dir/a")).unwrap();
    f.write_all(b"hello").unwrap();
    drop(f);
    let ev = rec.take_after("release dir/a token=1000 changed=false");
    assert!(has(&ev, "before mkdir dir"), "{ev:#?}");
    assert!(has(&ev, "after mkdir dir None"), "{ev:#?}");
    assert!(has(&ev, "before create dir/a"), "{ev:#?}");
    assert!(has(&ev, "open dir/a created=true size=0"), "{ev:#?}");
    assert!(has(&ev, "flush dir/a token=1000 changed=true"), "{ev:#?}");
    // Release follows the flush; nothing changed in between.
    assert!(
        ev.iter()
            .any(|e| e == "release dir/a token=1000 changed=false"),
        "{ev:#?}"
    );

    // Paths follow renames (of the file and of its directory).
    fs::rename(at("dir/a"), at("dir/b")).unwrap();
    fs::rename(at("dir"), at("dir2")).unwrap();
    let f = fs::OpenOptions::new()
        .write(true)
        .truncate(true)
        .open(at("dir2/b"))
        .unwrap();
    drop(f);
    let ev = rec.take_after("release dir2/b token=1000 changed=false");
    assert!(has(&ev, "before rename dir/a dir/b 0"), "{ev:#?}");
    assert!(has(&ev, "before rename dir dir2 0"), "{ev:#?}");
    assert!(has(&ev, "before open dir2/b trunc=true"), "{ev:#?}");
    assert!(has(&ev, "open dir2/b created=false size=0"), "{ev:#?}");

    // Reads are never write routes, but still get an open hook and a token.
    fs::read(at("dir2/b")).unwrap();
    let ev = rec.take_after("release dir2/b token=1000 changed=false");
    assert!(ev.iter().all(|e| !e.starts_with("before")), "{ev:#?}");
    assert!(has(&ev, "open dir2/b created=false size=0"), "{ev:#?}");
    assert!(
        has(&ev, "release dir2/b token=1000 changed=false"),
        "{ev:#?}"
    );

    // Every other write route.
    fs::write(at("x"), b"1").unwrap();
    fs::write(at("h"), b"1").unwrap();
    rec.take_after("release h token=1000 changed=false");
    // (a hard-linked inode reports the name it was last used under: `y` from here on)
    fs::hard_link(at("h"), at("y")).unwrap();
    std::os::unix::fs::symlink("x", at("s")).unwrap();
    fs::set_permissions(at("x"), std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    fs::OpenOptions::new()
        .write(true)
        .open(at("x"))
        .unwrap()
        .set_len(0)
        .unwrap();
    let c = std::ffi::CString::new(at("x").to_str().unwrap()).unwrap();
    let n = std::ffi::CString::new("user.k").unwrap();
    assert_eq!(
        unsafe { libc::setxattr(c.as_ptr(), n.as_ptr(), b"v".as_ptr().cast(), 1, 0) },
        0
    );
    assert_eq!(unsafe { libc::removexattr(c.as_ptr(), n.as_ptr()) }, 0);
    fs::remove_file(at("y")).unwrap();
    fs::remove_dir(at("dir2")).unwrap_err();
    let ev = rec.take();
    for want in [
        "before link h y",
        "before symlink s",
        "before setattr x size=None",
        "before setattr x size=Some(0)",
        "before setxattr x user.k",
        "before removexattr x user.k",
        "before unlink y",
        "before rmdir dir2",
        "after rmdir dir2 Some(39)",
    ] {
        assert!(has(&ev, want), "{want}: {ev:#?}");
    }

    // Refusals: errno to the caller, nothing done, no after hook.
    let e = fs::write(at("forbidden"), b"no").unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EACCES));
    assert!(!m.backing.join("forbidden").exists());
    let e = fs::rename(at("x"), at("forbidden2")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EACCES));
    assert!(m.backing.join("x").exists());
    let ev = rec.take();
    assert!(has(&ev, "refuse create forbidden"), "{ev:#?}");
    assert!(ev.iter().all(|e| !e.starts_with("after")), "{ev:#?}");

    // Computed xattrs.
    let v = xattr_get(&at("dir2/b"), "user.coherent.path");
    assert_eq!(v, b"dir2/b");

    // The virtual directory: not listed at the root (docs/design.md#control-surface, as ZFS
    // hides `.zfs`) but reachable by name, served by the hooks, the backing one hidden and not
    // writable.
    let names: Vec<String> = fs::read_dir(&m.mnt)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.iter().filter(|n| *n == ".coherent").count(), 0);
    let inside: Vec<String> = fs::read_dir(at(".coherent"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(inside, vec!["hello".to_string()]);
    let tid = unsafe { libc::gettid() };
    assert_eq!(
        fs::read_to_string(at(".coherent/hello")).unwrap(),
        format!("hello pid {tid}\n")
    );
    assert!(fs::metadata(at(".coherent/secret")).is_err());
    fs::OpenOptions::new()
        .write(true)
        .open(at(".coherent/hello"))
        .unwrap()
        .write_all(b"ping\n")
        .unwrap();
    assert!(rec.take().iter().any(|e| e == "vwrite ping"));
    assert!(fs::remove_dir(at(".coherent")).is_err());
    assert!(fs::create_dir(at(".coherent")).is_err());
    assert_eq!(
        fs::rename(at(".coherent"), at("elsewhere"))
            .unwrap_err()
            .raw_os_error(),
        Some(libc::EACCES)
    );
    assert!(m.backing.join(".coherent/secret").exists());

    // Editor-style save over a file someone still has open: the old handle's flush is
    // no longer attributed to the path (the new file has it now).
    fs::write(at("plan"), b"v1").unwrap();
    let mut old = fs::OpenOptions::new()
        .append(true)
        .open(at("plan"))
        .unwrap();
    fs::write(at("plan.tmp"), b"v2").unwrap();
    fs::rename(at("plan.tmp"), at("plan")).unwrap();
    old.write_all(b"late").unwrap();
    drop(old);
    let ev = rec.take_after("release ? token=1002 changed=false");
    assert!(has(&ev, "flush ? token=1002 changed=true"), "{ev:#?}");
    assert!(has(&ev, "before rename plan.tmp plan 0"), "{ev:#?}");
    assert_eq!(fs::read(at("plan")).unwrap(), b"v2");
}

fn xattr_get(p: &Path, name: &str) -> Vec<u8> {
    let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
    let n = std::ffi::CString::new(name).unwrap();
    let mut b = vec![0u8; 256];
    let r = unsafe { libc::getxattr(c.as_ptr(), n.as_ptr(), b.as_mut_ptr().cast(), b.len()) };
    assert!(r >= 0, "{}", std::io::Error::last_os_error());
    b.truncate(r as usize);
    b
}

#[test]
fn hooks_passthrough() {
    hooks_see_every_route(true);
}

#[test]
fn hooks_daemon() {
    hooks_see_every_route(false);
}

#[test]
fn a_write_handle_without_state_gets_no_flush() {
    for passthrough in [true, false] {
        let rec = Arc::new(Recorder::default());
        let m = mount(rec.clone(), passthrough);
        let mut f = fs::File::create(m.mnt.join("stateless")).unwrap();
        f.write_all(b"hello").unwrap();
        drop(f);
        let ev = rec.take_after("release stateless token=0 changed=true");
        assert!(has(&ev, "open stateless created=true size=0"), "{ev:#?}");
        assert!(
            has(&ev, "release stateless token=0 changed=true"),
            "{ev:#?}"
        );
        // Token 0: opened with FOPEN_NOFLUSH, so the close cost no FLUSH round trip.
        assert!(!ev.iter().any(|e| e.starts_with("flush")), "{ev:#?}");
    }
}

/// Descriptors of this process open on `p` for I/O (the store's handles of it, not the
/// `O_PATH` descriptors it keeps of known inodes).
fn open_fds(p: &Path) -> usize {
    let o_path = |fd: &std::ffi::OsStr| {
        let info = fs::read_to_string(Path::new("/proc/self/fdinfo").join(fd)).unwrap_or_default();
        let flags = info.lines().find_map(|l| l.strip_prefix("flags:"));
        flags
            .and_then(|f| i64::from_str_radix(f.trim(), 8).ok())
            .unwrap_or(0)
            & libc::O_PATH as i64
            != 0
    };
    fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| fs::read_link(e.path()).is_ok_and(|t| t == p) && !o_path(&e.file_name()))
        .count()
}

/// The filesystem without a mount: the policy's calls for each request, in order.
#[test]
fn the_filesystem_sequences_decide_operate_open_and_release_without_a_mount() {
    let rec = Arc::new(Recorder::default());
    let (_dir, backing) = backing_dir();
    let fs_ = test_fs(&rec, &backing, false);
    let c = Caller {
        pid: unsafe { libc::gettid() } as u32,
        uid: 0,
        gid: 0,
        started: Started::now(),
    };
    let name = OsStr::new;
    let wr = libc::O_WRONLY | libc::O_CREAT;

    // A create: decided, made, then the open hook (no after hook: the handle has the
    // permit); FLUSH wanted since the policy keeps state.
    let made = fs_.create(&c, ROOT_INO, name("a"), 0o644, 0, wr).unwrap();
    let (ino, fh) = (made.entry.attr.unwrap().ino, made.opened.fh);
    assert!(!made.opened.fopen.noflush);
    assert_eq!(
        rec.take(),
        ["before create a", "open a created=true size=0"]
    );
    assert_eq!(fs_.write(&c, ino, fh, 0, b"hello").unwrap(), 5);
    fs_.flush(&c, ino, fh).unwrap();
    assert!(fs_.release(&c, ino, fh).is_some());
    assert_eq!(
        rec.take(),
        [
            "flush a token=1000 changed=true",
            "release a token=1000 changed=false"
        ]
    );

    // A read-only open: no decision, an open hook, no FLUSH.
    let o = fs_.open(&c, ino, libc::O_RDONLY).unwrap();
    assert!(o.fopen.noflush);
    assert_eq!(rec.take(), ["open a created=false size=5"]);
    fs_.release(&c, ino, o.fh);
    rec.take();

    // Refused by the decision: nothing made, no after hook.
    let e = fs_
        .create(&c, ROOT_INO, name("forbidden"), 0o644, 0, wr)
        .err();
    assert_eq!(e.map(|e| e.errno()), Some(libc::EACCES));
    assert!(!backing.join("forbidden").exists());
    assert_eq!(rec.take(), ["refuse create forbidden"]);

    // Allowed, but the operation fails: the permit goes back through the after hook.
    let dir = fs_.mkdir(&c, ROOT_INO, name("d"), 0o755, 0).unwrap();
    let dir = dir.attr.unwrap().ino;
    rec.take();
    let e = fs_.open(&c, dir, libc::O_WRONLY).err();
    assert_eq!(e.map(|e| e.errno()), Some(libc::EISDIR));
    assert_eq!(
        rec.take(),
        [
            "before open d trunc=false",
            "after open d trunc=false Some(21)"
        ]
    );

    // Refused by the open hook: the backing file was opened, and is closed again; a
    // created file stays created and its lookup is given back.
    let inodes = fs_.store().inode_count();
    let e = fs_.create(&c, ROOT_INO, name("noopen"), 0o644, 0, wr).err();
    assert_eq!(e.map(|e| e.errno()), Some(libc::EPERM));
    assert_eq!(
        rec.take(),
        ["before create noopen", "open noopen created=true size=0"]
    );
    assert!(backing.join("noopen").exists());
    assert_eq!(open_fds(&backing.join("noopen")), 0);
    assert_eq!(fs_.store().inode_count(), inodes);
    let noopen = fs_.lookup(&c, ROOT_INO, name("noopen")).unwrap();
    let e = fs_.open(&c, noopen.attr.unwrap().ino, libc::O_RDWR).err();
    assert_eq!(e.map(|e| e.errno()), Some(libc::EPERM));
    assert_eq!(open_fds(&backing.join("noopen")), 0);

    // A handle without state: no FLUSH.
    let made = fs_
        .create(&c, ROOT_INO, name("stateless"), 0o644, 0, wr)
        .unwrap();
    assert!(made.opened.fopen.noflush);
    fs_.release(&c, made.entry.attr.unwrap().ino, made.opened.fh);
    rec.take();

    // A miss is a negative entry, cached for the TTL.
    let miss = fs_.lookup(&c, ROOT_INO, name("nothing")).unwrap();
    assert!(miss.attr.is_none() && miss.ttl == FsOptions::default().ttl);
}

/// The `.coherent` tree through the filesystem without a mount: routed by inode and by
/// its name at the root, never cached, the backing entry of that name hidden, and no
/// write route can make, move or remove it.
#[test]
fn the_pseudo_tree_is_routed_by_inode_without_a_mount() {
    let rec = Arc::new(Recorder::default());
    let (_dir, backing) = backing_dir();
    let fs_ = test_fs(&rec, &backing, false);
    let c = Caller {
        pid: 4242,
        uid: 0,
        gid: 0,
        started: Started::now(),
    };
    let name = OsStr::new;
    let dir = fs_.lookup(&c, ROOT_INO, name(".coherent")).unwrap();
    assert_eq!(dir.attr.map(|a| a.ino), Some(VDIR));
    assert_eq!(dir.ttl, std::time::Duration::ZERO);
    // Never listed at the root (neither the virtual one nor the backing one: tools that
    // walk the tree must not see it), but reachable by name, with its own listing.
    let root = fs_.opendir(&c, ROOT_INO).unwrap();
    let names: Vec<OsString> = fs_
        .readdir(&c, ROOT_INO, root.fh, 0)
        .unwrap()
        .into_iter()
        .map(|(_, e)| e.name)
        .collect();
    assert_eq!(names.iter().filter(|n| *n == ".coherent").count(), 0);
    fs_.releasedir(ROOT_INO, root.fh);
    let listed: Vec<(u64, OsString)> = fs_
        .readdir(&c, VDIR, 0, 0)
        .unwrap()
        .into_iter()
        .map(|(i, e)| (i, e.name))
        .collect();
    assert_eq!(
        listed,
        [
            (VDIR, ".".into()),
            (ROOT_INO, "..".into()),
            (VFILE, "hello".into())
        ]
    );
    // A miss inside is no negative entry (names there come and go).
    let e = fs_.lookup(&c, VDIR, name("secret")).err();
    assert_eq!(e.map(|e| e.errno()), Some(libc::ENOENT));
    // Open, read, write, release: the tree's, with direct I/O.
    let o = fs_.open(&c, VFILE, libc::O_RDWR).unwrap();
    assert!(o.fopen.direct_io && o.handle.is_none());
    let (tx, rx) = std::sync::mpsc::channel();
    fs_.read(
        &c,
        VFILE,
        o.fh,
        0,
        100,
        Box::new(move |r| tx.send(r).unwrap()),
    );
    assert_eq!(rx.recv().unwrap().unwrap(), b"hello pid 4242\n");
    assert_eq!(fs_.write(&c, VFILE, o.fh, 0, b"ping").unwrap(), 4);
    assert!(fs_.release(&c, VFILE, o.fh).is_none());
    assert_eq!(rec.take(), ["vwrite ping", "vrelease 4242"]);
    // No write route reaches the tree or its name, and the policy never hears of one.
    let err = |r: Result<(), FsError>| r.unwrap_err().errno();
    assert_eq!(
        err(fs_
            .mkdir(&c, ROOT_INO, name(".coherent"), 0o755, 0)
            .map(drop)),
        libc::EEXIST
    );
    assert_eq!(err(fs_.unlink(&c, VDIR, name("hello"))), libc::EACCES);
    assert_eq!(
        err(fs_.rmdir(&c, ROOT_INO, name(".coherent"))),
        libc::EACCES
    );
    let mv = fs_.rename(&c, ROOT_INO, name(".coherent"), ROOT_INO, name("x"), 0);
    assert_eq!(err(mv), libc::EACCES);
    let wr = libc::O_WRONLY | libc::O_CREAT;
    let made = fs_.create(&c, VDIR, name("new"), 0o644, 0, wr).map(drop);
    assert_eq!(err(made), libc::EACCES);
    assert_eq!(
        err(fs_.setxattr(&c, VFILE, name("user.k"), b"v", 0)),
        libc::EPERM
    );
    assert_eq!(
        err(fs_.getxattr(&c, VFILE, name("user.k"), 0).map(drop)),
        libc::ENODATA
    );
    let chmod = SetAttr {
        mode: Some(0o600),
        ..SetAttr::default()
    };
    assert_eq!(
        err(fs_.setattr(&c, VFILE, &chmod, None).map(drop)),
        libc::EPERM
    );
    assert!(rec.take().is_empty());
    assert!(backing.join(".coherent/secret").exists());
    // Asked of the tree, statfs answers for the backing filesystem; readlink finds nothing.
    assert!(fs_.statfs(VFILE).unwrap().blocks > 0);
    assert_eq!(err(fs_.readlink(VFILE).map(drop)), libc::ENOENT);
}
