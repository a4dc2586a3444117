//! `-o` options and the mount-helper calling convention.
//!
//! `-o` takes three kinds of options, comma-separated (`\,` keeps a comma in a value):
//! the FUSE/kernel options ([`FUSE_OPTIONS`]), the options fstab and mount(8) add for
//! their own use (ignored: [`ignored`]), and every long flag of the command line spelled
//! as an option (`state_dir=/x`, `no_passthrough`: the `mount.fuse3` convention), so an
//! fstab line can say everything the command line can. Anything else is refused, naming
//! what is accepted, before anything is mounted.
//!
//! Run as `mount.fuse.coherent-mount` (the helper mount(8) looks for when asked for type
//! `fuse.coherent-mount`), the program takes mount(8)'s arguments (`SOURCE DIR [-sfnv] [-o
//! OPTS] [-t TYPE] [-N NS]`) and detaches once the mount is usable, as mount(8) expects.
//!
//! Without that link, mount(8) runs `mount.fuse3`, which runs `/bin/sh -c "'coherent-mount'
//! 'SOURCE' 'DIR' '-o' 'OPTS,dev,suid'"` (the type after `fuse.` is the command, found on
//! the shell's default PATH, since mount(8) passes none) and waits for it: a daemon in the
//! foreground would hang mount(8) for good. [`started_by_mount`] recognises that start
//! from the process's ancestors, and the program then acts as the helper all the same.

use std::ffi::OsString;

use clap::CommandFactory;
use fuser::{MountOption, SessionACL};

/// The FUSE/kernel options by name, for the refusal's list; each is read by
/// [`fuse_option`] (a name ending in `=` takes a value).
pub const FUSE_OPTIONS: &[&str] = &[
    "allow_other",
    "allow_root",
    "default_permissions",
    "auto_unmount",
    "ro",
    "rw",
    "dev",
    "nodev",
    "suid",
    "nosuid",
    "exec",
    "noexec",
    "atime",
    "noatime",
    "sync",
    "async",
    "dirsync",
    "fsname=",
    "subtype=",
];

/// What a FUSE option does: who may enter the mount, or a mount option for fuser.
pub enum Fuse {
    Acl(SessionACL),
    Opt(MountOption),
}

/// The one reading of a FUSE option; `None`: not one.
pub fn fuse_option(o: &str) -> Option<Fuse> {
    use MountOption as M;
    Some(Fuse::Opt(match o {
        "allow_other" => return Some(Fuse::Acl(SessionACL::All)),
        "allow_root" => return Some(Fuse::Acl(SessionACL::RootAndOwner)),
        "default_permissions" => M::DefaultPermissions,
        "auto_unmount" => M::AutoUnmount,
        "ro" => M::RO,
        "rw" => M::RW,
        "dev" => M::Dev,
        "nodev" => M::NoDev,
        "suid" => M::Suid,
        "nosuid" => M::NoSuid,
        "exec" => M::Exec,
        "noexec" => M::NoExec,
        "atime" => M::Atime,
        "noatime" => M::NoAtime,
        "sync" => M::Sync,
        "async" => M::Async,
        "dirsync" => M::DirSync,
        x => match x.split_once('=') {
            Some(("fsname", v)) => M::FSName(v.into()),
            // Given to the kernel, so the mount table names the type (`fuse.SUBTYPE`) that
            // a later `mount -o remount DIR` runs the helper of.
            Some(("subtype", v)) => M::CUSTOM(format!("subtype={v}")),
            _ => return None,
        },
    }))
}

/// Options that belong to fstab, mount(8) or systemd, not to the filesystem.
fn ignored(opt: &str) -> bool {
    matches!(
        opt,
        "defaults"
            | "auto"
            | "noauto"
            | "user"
            | "nouser"
            | "users"
            | "owner"
            | "group"
            | "nofail"
            | "_netdev"
    ) || opt.starts_with("x-")
        || opt.starts_with("comment=")
}

/// True when the program was started as a mount helper (`mount.fuse.coherent-mount`,
/// or any `mount.*` name that links to it).
pub fn is_helper(argv0: &OsString) -> bool {
    std::path::Path::new(argv0)
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("mount."))
}

/// One ancestor process: its command line and, where readable, its executable.
#[derive(Debug, Default, Clone)]
pub struct Ancestor {
    pub argv: Vec<OsString>,
    pub exe: Option<std::path::PathBuf>,
}

/// This process's parent, grandparent, ... (up to `n`), from /proc.
pub fn ancestors(n: usize) -> Vec<Ancestor> {
    let ppid = |pid: &str| -> Option<String> {
        let st = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The command name is in parentheses and may hold anything: split after the last.
        let rest = &st[st.rfind(')')? + 1..];
        rest.split_whitespace().nth(1).map(String::from)
    };
    let mut out = Vec::new();
    let mut pid = "self".to_string();
    while out.len() < n {
        let Some(p) = ppid(&pid).filter(|p| p != "0") else {
            break;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{p}/cmdline")) else {
            break;
        };
        let argv = cmd
            .split(|b| *b == 0)
            .filter(|a| !a.is_empty())
            .map(|a| {
                <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(a).to_os_string()
            })
            .collect();
        // Unreadable for another user's process (mount(8) run setuid): argv still tells.
        let exe = std::fs::read_link(format!("/proc/{p}/exe")).ok();
        out.push(Ancestor { argv, exe });
        pid = p;
    }
    out
}

/// `arg` as mount.fuse3 quotes each word of the command it gives `/bin/sh -c`.
fn sh_quoted(arg: &OsString) -> String {
    format!("'{}'", arg.to_string_lossy().replace('\'', r"'\''"))
}

/// Was this process started by mount(8), directly or through `mount.fuse3`, so that
/// mount(8) waits for it to return? Either an ancestor (up to the shell, `su` and mount(8)
/// itself) is mount(8), or the parent is the `/bin/sh -c` that `mount.fuse3` runs with
/// exactly this command line, word by word quoted (`mount.fuse3` called by hand).
pub fn started_by_mount(argv: &[OsString], ancestors: &[Ancestor]) -> bool {
    let is_mount = |a: &Ancestor| {
        let name = |p: &std::path::Path| p.file_name().is_some_and(|n| n == "mount");
        a.exe.as_deref().is_some_and(name)
            || a.argv
                .first()
                .is_some_and(|a0| name(std::path::Path::new(a0)))
    };
    if ancestors.iter().take(3).any(is_mount) {
        return true;
    }
    let Some(parent) = ancestors.first() else {
        return false;
    };
    let cmd = argv.iter().map(sh_quoted).collect::<Vec<_>>().join(" ");
    parent.argv.len() == 3 && parent.argv[1] == "-c" && parent.argv[2] == *cmd
}

/// How the command line must be read, after [`rewrite`].
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Invocation {
    /// The arguments for clap: `-o` holds only FUSE options, flags given as options are
    /// long flags again.
    pub args: Vec<OsString>,
    /// Started by mount(8): detach once usable.
    pub helper: bool,
    /// mount(8)'s `-f`: check everything, mount nothing.
    pub fake: bool,
    /// Started through `mount.fuse3` (no helper link): the helper all the same.
    pub via_mount_fuse: bool,
}

/// The long flags of `coherent-mount` as option names (`state-dir` → `state_dir`), and
/// whether each takes a value. Read from the flag definitions, so every flag has its
/// option.
fn flag_options<C: CommandFactory>() -> Vec<(String, String, bool)> {
    C::command()
        .get_arguments()
        .filter_map(|a| {
            let long = a.get_long()?;
            if matches!(long, "help" | "version") {
                return None;
            }
            Some((
                long.replace('-', "_"),
                long.to_string(),
                a.get_action().takes_values(),
            ))
        })
        .collect()
}

/// The command that makes mount(8) run coherent-mount as its helper directly.
pub const LN_HELPER: &str =
    "ln -s \"$(command -v coherent-mount)\" /usr/sbin/mount.fuse.coherent-mount";

/// The option list mount.fuse3 built, without the `dev` and `suid` it appends (it adds
/// `dev` unless `nodev` was given, then `suid` unless `nosuid` was).
fn without_mount_fuse_additions(list: &str) -> String {
    let mut opts = split_options(list);
    for (added, unless) in [("suid", "nosuid"), ("dev", "nodev")] {
        if !opts.iter().any(|o| o == unless) && opts.last().is_some_and(|o| o == added) {
            opts.pop();
        }
    }
    // Put back the escapes split_options took out.
    opts.iter()
        .map(|o| o.replace('\\', "\\\\").replace(',', "\\,"))
        .collect::<Vec<_>>()
        .join(",")
}

/// Splits an option list at commas not preceded by a backslash.
pub fn split_options(s: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(n) => cur.push(n),
                None => cur.push('\\'),
            },
            ',' => out.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    out.push(cur);
    out.into_iter().filter(|o| !o.is_empty()).collect()
}

/// Reads `argv` (program name first): expands every `-o` list into long flags and FUSE
/// options, drops what fstab and mount(8) add, and in helper mode takes mount(8)'s own
/// arguments. An unknown option is an error that names the accepted ones.
///
/// A process `by_mount` started (see [`started_by_mount`]) is the helper whatever its
/// name. Under another name than `mount.*` it came through `mount.fuse3`, which appends
/// `dev` and `suid` unless `nodev`/`nosuid` were given: those two are dropped again, so
/// the volume is `nodev,nosuid` as when mount(8) runs the helper link.
pub fn rewrite<C: CommandFactory>(
    argv: Vec<OsString>,
    by_mount: bool,
) -> Result<Invocation, String> {
    let through_mount_fuse = by_mount && !argv.first().is_some_and(is_helper);
    let mut it = argv.into_iter();
    let argv0 = it.next().unwrap_or_else(|| "coherent-mount".into());
    let helper = is_helper(&argv0) || by_mount;
    let flags = flag_options::<C>();
    let mut inv = Invocation {
        args: vec![argv0],
        helper,
        fake: false,
        via_mount_fuse: through_mount_fuse,
    };
    let mut fuse = Vec::new();
    let mut sloppy = false;
    let mut lists = Vec::new();
    let mut rest = it.collect::<Vec<_>>().into_iter();
    while let Some(a) = rest.next() {
        let s = a.to_string_lossy().into_owned();
        if s == "-o" {
            let v = rest
                .next()
                .ok_or("-o needs a value (e.g. -o allow_other,state_dir=/var/lib/x)")?;
            lists.push(v.to_string_lossy().into_owned());
        } else if let Some(v) = s.strip_prefix("-o").filter(|v| !v.is_empty()) {
            lists.push(v.to_string());
        } else if helper && s.starts_with('-') && !s.starts_with("--") && s.len() > 1 {
            // mount(8)'s helper flags, possibly bundled (-nv).
            for f in s[1..].chars() {
                match f {
                    'n' | 'v' => {}
                    's' => sloppy = true,
                    'f' => inv.fake = true,
                    't' => {
                        let t = rest.next().ok_or("-t needs a type")?;
                        let t = t.to_string_lossy();
                        if !t.starts_with("fuse") {
                            return Err(format!(
                                "type {t} is not a FUSE type (use -t fuse.coherent-mount)"
                            ));
                        }
                    }
                    'N' => {
                        return Err("mounting in another namespace (-N) is not supported: \
                                    run mount inside that namespace (nsenter)"
                            .into())
                    }
                    other => {
                        return Err(format!("unknown mount helper flag -{other}"));
                    }
                }
            }
        } else {
            inv.args.push(a);
        }
    }
    if through_mount_fuse {
        if inv
            .args
            .iter()
            .skip(1)
            .any(|a| a.to_string_lossy().starts_with("/dev/fd/"))
        {
            return Err(format!(
                "started by mount.fuse3 with drop_privileges, which coherent-mount does not \
                 support: mount without it, through the helper link ({LN_HELPER})"
            ));
        }
        if let Some(last) = lists.last_mut() {
            *last = without_mount_fuse_additions(last);
        }
    }
    // A remount changes the kernel's flags only; mount(8) passes the options the mount
    // table shows too (the kernel's `user_id=0,group_id=0`, ...): not ours to refuse.
    let remount = lists
        .iter()
        .any(|l| split_options(l).iter().any(|o| o == "remount"));
    for list in lists {
        for opt in split_options(&list) {
            let (name, value) = match opt.split_once('=') {
                Some((n, v)) => (n.to_string(), Some(v.to_string())),
                None => (opt.clone(), None),
            };
            let norm = name.replace('-', "_");
            if let Some((_, long, takes)) = flags.iter().find(|(o, _, _)| *o == norm) {
                match (takes, value) {
                    (true, Some(v)) => inv.args.push(format!("--{long}={v}").into()),
                    (true, None) => {
                        return Err(format!("option {name} needs a value ({name}=...)"))
                    }
                    (false, None) => inv.args.push(format!("--{long}").into()),
                    (false, Some(_)) => {
                        return Err(format!("option {name} takes no value (write just {name})"))
                    }
                }
            } else if fuse_option(&opt).is_some()
                || crate::kernel_flags::is_extra(&opt)
                || opt == "remount"
            {
                fuse.push(opt);
            } else if ignored(&opt) || remount {
                continue;
            } else if sloppy {
                eprintln!("coherent-mount: ignoring unknown mount option {opt} (mount -s)");
            } else {
                let ours: Vec<&str> = flags.iter().map(|(o, _, _)| o.as_str()).collect();
                return Err(format!(
                    "unknown mount option {opt:?}: accepted are the FUSE options {}, the \
                     kernel's {},remount and coherent-mount's own {} (see coherent-mount \
                     --help)",
                    FUSE_OPTIONS.join(","),
                    crate::kernel_flags::EXTRA.join(","),
                    ours.join(",")
                ));
            }
        }
    }
    if !fuse.is_empty() {
        inv.args.push("-o".into());
        inv.args.push(fuse.join(",").into());
    }
    Ok(inv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(clap::Parser)]
    struct Demo {
        backing: String,
        #[arg(long)]
        state_dir: Option<String>,
        #[arg(long)]
        no_passthrough: bool,
        #[arg(long = "session-env")]
        session_env: Vec<String>,
        #[arg(short = 'o')]
        options: Vec<String>,
    }

    fn run(args: &[&str]) -> Result<Invocation, String> {
        rewrite::<Demo>(args.iter().map(OsString::from).collect(), false)
    }

    fn strs(inv: &Invocation) -> Vec<String> {
        inv.args
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn flags_spelled_as_options_become_flags_and_the_rest_stays_fuse() {
        let inv = run(&[
            "coherent-mount",
            "/b",
            "-o",
            "allow_other,state-dir=/s,no_passthrough,session_env=A",
            "-oro,session_env=B",
        ])
        .unwrap();
        assert_eq!(
            strs(&inv),
            [
                "coherent-mount",
                "/b",
                "--state-dir=/s",
                "--no-passthrough",
                "--session-env=A",
                "--session-env=B",
                "-o",
                "allow_other,ro"
            ]
        );
        assert!(!inv.helper && !inv.fake);
    }

    #[test]
    fn fstab_and_systemd_options_are_dropped() {
        let inv = run(&[
            "coherent-mount",
            "/b",
            "-o",
            "defaults,_netdev,nofail,x-systemd.automount,noauto,comment=x",
        ])
        .unwrap();
        assert_eq!(strs(&inv), ["coherent-mount", "/b"]);
    }

    #[test]
    fn unknown_options_and_misused_values_are_refused_by_name() {
        let e = run(&["coherent-mount", "/b", "-o", "rw,bogus=1"]).unwrap_err();
        assert!(e.contains("unknown mount option \"bogus=1\""), "{e}");
        assert!(e.contains("state_dir"), "{e}");
        let e = run(&["coherent-mount", "/b", "-o", "state_dir"]).unwrap_err();
        assert!(e.contains("needs a value"), "{e}");
        let e = run(&["coherent-mount", "/b", "-o", "no_passthrough=1"]).unwrap_err();
        assert!(e.contains("takes no value"), "{e}");
        assert!(run(&["coherent-mount", "/b", "-o"]).is_err());
    }

    #[test]
    fn every_listed_fuse_option_is_read_and_nothing_else() {
        for name in FUSE_OPTIONS {
            let o = if name.ends_with('=') {
                format!("{name}x")
            } else {
                name.to_string()
            };
            assert!(fuse_option(&o).is_some(), "{o}");
        }
        for o in ["nonsense", "fsname", "ro=1", "allow_others"] {
            assert!(fuse_option(o).is_none(), "{o}");
        }
    }

    #[test]
    fn escaped_commas_stay_in_a_value() {
        assert_eq!(
            split_options(r"a,state_dir=x\,y,,b"),
            ["a", "state_dir=x,y", "b"]
        );
    }

    #[test]
    fn helper_mode_takes_mount_8_arguments() {
        let inv = run(&[
            "/sbin/mount.fuse.coherent-mount",
            "/b",
            "/m",
            "-nv",
            "-o",
            "rw,state_dir=/s",
            "-t",
            "fuse.coherent-mount",
        ])
        .unwrap();
        assert!(inv.helper && !inv.fake);
        assert_eq!(
            strs(&inv),
            [
                "/sbin/mount.fuse.coherent-mount",
                "/b",
                "/m",
                "--state-dir=/s",
                "-o",
                "rw"
            ]
        );
        assert!(
            run(&["mount.fuse.coherent-mount", "/b", "/m", "-f"])
                .unwrap()
                .fake
        );
        // As mount(8) calls it: no -t, the type in the helper's name.
        let sloppy = run(&["mount.fuse.cm2", "/b", "/m", "-s", "-o", "rw,zzz"]).unwrap();
        assert_eq!(strs(&sloppy), ["mount.fuse.cm2", "/b", "/m", "-o", "rw"]);
        assert!(run(&["mount.fuse.coherent-mount", "/b", "/m", "-t", "ext4"]).is_err());
        assert!(run(&["mount.fuse.coherent-mount", "/b", "/m", "-N", "1"]).is_err());
        // Outside helper mode short flags are clap's to judge.
        assert_eq!(
            strs(&run(&["coherent-mount", "-f"]).unwrap()),
            ["coherent-mount", "-f"]
        );
    }

    fn os(v: &[&str]) -> Vec<OsString> {
        v.iter().map(OsString::from).collect()
    }

    #[test]
    fn started_by_mount_through_mount_fuse3_or_directly_and_not_otherwise() {
        let argv = os(&["coherent-mount", "/b", "/it's", "-o", "rw,dev,suid"]);
        // dash runs the command as a child: the parent is mount.fuse3's shell, word by
        // word quoted (a quote inside as '\''), its parent mount(8).
        let sh = Ancestor {
            argv: os(&[
                "/bin/sh",
                "-c",
                r"'coherent-mount' '/b' '/it'\''s' '-o' 'rw,dev,suid'",
            ]),
            exe: Some("/usr/bin/dash".into()),
        };
        let mount = Ancestor {
            argv: os(&["mount", "-t", "fuse.coherent-mount", "/b", "/it's"]),
            exe: Some("/usr/bin/mount".into()),
        };
        let shell = Ancestor {
            argv: os(&["-bash"]),
            exe: Some("/usr/bin/bash".into()),
        };
        assert!(started_by_mount(&argv, &[sh.clone(), mount.clone()]));
        // mount.fuse3 run by hand: its shell alone tells.
        assert!(started_by_mount(&argv, &[sh.clone(), shell.clone()]));
        // bash as /bin/sh execs the command: mount(8) is the parent (exe unreadable for a
        // setuid mount: argv[0] tells).
        let hidden = Ancestor {
            exe: None,
            ..mount.clone()
        };
        assert!(started_by_mount(&argv, &[hidden, shell.clone()]));
        // From a terminal, or a script's `sh -c` with other words: the foreground daemon.
        assert!(!started_by_mount(&argv, std::slice::from_ref(&shell)));
        let script = Ancestor {
            argv: os(&["sh", "-c", "coherent-mount /b /it's -o rw,dev,suid"]),
            exe: Some("/usr/bin/dash".into()),
        };
        assert!(!started_by_mount(&argv, &[script, shell]));
        assert!(!started_by_mount(&argv, &[]));
    }

    #[test]
    fn through_mount_fuse3_it_is_the_helper_and_drops_the_dev_suid_it_added() {
        let by = |args: &[&str]| rewrite::<Demo>(os(args), true);
        let inv = by(&[
            "coherent-mount",
            "/b",
            "/m",
            "-o",
            "rw,state_dir=/s,dev,suid",
        ])
        .unwrap();
        assert!(inv.helper && inv.via_mount_fuse);
        assert_eq!(
            strs(&inv),
            ["coherent-mount", "/b", "/m", "--state-dir=/s", "-o", "rw"]
        );
        // Asked for by the user: kept (mount.fuse3 then adds nothing for it).
        let inv = by(&["coherent-mount", "/b", "/m", "-o", "nodev,suid"]).unwrap();
        assert_eq!(strs(&inv), ["coherent-mount", "/b", "/m", "-o", "nodev"]);
        let inv = by(&["coherent-mount", "/b", "/m", "-o", "suid,dev,suid"]).unwrap();
        assert_eq!(strs(&inv), ["coherent-mount", "/b", "/m", "-o", "suid"]);
        // Under the helper name, mount(8) called it: nothing was added.
        let inv = rewrite::<Demo>(os(&["mount.fuse.x", "/b", "/m", "-o", "dev"]), true).unwrap();
        assert!(!inv.via_mount_fuse);
        assert_eq!(strs(&inv), ["mount.fuse.x", "/b", "/m", "-o", "dev"]);
        // drop_privileges hands over /dev/fd/N: refused with the helper link to use.
        let e = by(&["coherent-mount", "/b", "/dev/fd/5", "-o", "dev,suid"]).unwrap_err();
        assert!(e.contains("drop_privileges") && e.contains("ln -s"), "{e}");
    }
}
