//! `coherent fsmonitor 2 TOKEN`: git's `core.fsmonitor` hook, protocol version 2
//! (docs/git.md). Git runs it once per command that reads the index, in the worktree's top
//! directory; it prints a token, a NUL, then the NUL-separated paths (relative to the
//! worktree) that may have changed since TOKEN, or `/` for "everything may have changed".
//!
//! The changes come from the volume's `.coherent/changes`, read with one `pread` at the
//! token's sequence (the file answers for the offset of the first read), so a call costs
//! one open, a read or two and a write: no shell, no mount table, no log. The token is
//! `c1:INSTANCE:SEQ`; whatever it cannot vouch for answers `/` with a fresh token: a token
//! of another mount instance (a restart) or not of ours (git's first call passes its own
//! timestamp), changes the volume cannot name or no longer has (see the volume's
//! `changes.rs`), a separate backing directory, a worktree outside any coherent volume.
//!
//! Git also accepts `coherent 2 TOKEN` (the binary alone as `core.fsmonitor`, which git
//! runs without a shell); `main` sends it here.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// The token prefix: the format of the rest (`INSTANCE:SEQ`).
const TOKEN_PREFIX: &str = "c1:";
/// The token answered when no volume is found: never one of a volume's.
const NO_VOLUME_TOKEN: &str = "c1:none";
const FUSE_SUPER_MAGIC: i64 = 0x6573_5546;
/// Where a token not of ours reads: past any sequence, so the answer is the header alone.
const FOREIGN: u64 = 1 << 60;

/// The header of a `.coherent/changes` answer.
struct Header {
    instance: String,
    seq: u64,
    complete: bool,
    open: usize,
}

fn parse_header(line: &[u8]) -> Option<Header> {
    let line = std::str::from_utf8(line).ok()?;
    let rest = line.strip_prefix("coherent-changes 1 ")?;
    let (mut instance, mut seq, mut complete, mut open) = (None, None, None, None);
    for w in rest.split(' ') {
        let (k, v) = w.split_once('=')?;
        match k {
            "instance" => instance = Some(v.to_string()),
            "seq" => seq = v.parse().ok(),
            "complete" => complete = Some(v == "1"),
            "open" => open = v.parse().ok(),
            _ => {}
        }
    }
    Some(Header {
        instance: instance?,
        seq: seq?,
        complete: complete?,
        open: open?,
    })
}

/// (instance, seq) of one of our tokens.
fn parse_token(t: &OsStr) -> Option<(&str, u64)> {
    let t = t.to_str()?.strip_prefix(TOKEN_PREFIX)?;
    let (inst, seq) = t.split_once(':')?;
    if inst.len() != 16 || !inst.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    Some((inst, seq.parse().ok()?))
}

/// The volume's `changes` file for `cwd`: the nearest ancestor with `.coherent/changes`
/// on a FUSE filesystem, and that ancestor.
fn open_changes(cwd: &Path) -> Option<(File, PathBuf)> {
    for anc in cwd.ancestors() {
        let Ok(f) = File::open(anc.join(".coherent/changes")) else {
            continue;
        };
        if !nix::sys::statfs::fstatfs(&f).is_ok_and(|st| st.filesystem_type().0 == FUSE_SUPER_MAGIC)
        {
            return None;
        }
        return Some((f, anc.to_path_buf()));
    }
    None
}

/// Everything the file answers when first read at `since`. The answer is made whole at
/// the first read, so a short read is its end (one round trip to the daemon less).
fn read_from(f: &File, since: u64) -> Option<Vec<u8>> {
    const CHUNK: usize = 64 * 1024;
    let mut out = Vec::new();
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = f
            .read_at(&mut buf, since.checked_add(out.len() as u64)?)
            .ok()?;
        out.extend_from_slice(&buf[..n]);
        if n < CHUNK {
            return Some(out);
        }
    }
}

/// The reply to git: `token\0` then `/\0` or the paths, each followed by NUL.
fn answer(cwd: Option<&Path>, token: Option<&OsStr>) -> Vec<u8> {
    let everything = |tok: &str| {
        let mut o = tok.as_bytes().to_vec();
        o.extend_from_slice(b"\0/\0");
        o
    };
    let Some(cwd) = cwd else {
        return everything(NO_VOLUME_TOKEN);
    };
    let Some((file, root)) = open_changes(cwd) else {
        return everything(NO_VOLUME_TOKEN);
    };
    let asked = token.and_then(parse_token);
    // A token not of ours still needs the current one: read past any sequence (the
    // answer is then incomplete, with the header alone).
    // (Offsets stay far below i64::MAX: pread fails where offset + length overflows.)
    let since = asked.map_or(FOREIGN, |(_, s)| s.min(FOREIGN));
    let Some(body) = read_from(&file, since) else {
        return everything(NO_VOLUME_TOKEN);
    };
    let Some(nl) = body.iter().position(|&b| b == b'\n') else {
        return everything(NO_VOLUME_TOKEN);
    };
    let Some(h) = parse_header(&body[..nl]) else {
        return everything(NO_VOLUME_TOKEN);
    };
    let fresh = format!("{TOKEN_PREFIX}{}:{}", h.instance, h.seq);
    let Some((inst, since)) = asked.filter(|(i, _)| *i == h.instance) else {
        return everything(&fresh);
    };
    if !h.complete {
        return everything(&fresh);
    }
    // Paths are relative to the mount root; git wants them relative to the worktree.
    let prefix = match cwd.strip_prefix(&root) {
        Ok(p) if p.as_os_str().is_empty() => Vec::new(),
        Ok(p) => {
            let mut b = p.as_os_str().as_bytes().to_vec();
            b.push(b'/');
            b
        }
        Err(_) => return everything(&fresh),
    };
    let paths: Vec<&[u8]> = body[nl + 1..]
        .split(|&b| b == 0)
        .filter(|p| !p.is_empty())
        .collect();
    let n_changed = paths.len().saturating_sub(h.open);
    let mut out = Vec::new();
    let mut changed = false;
    for (i, p) in paths.iter().enumerate() {
        let Some(rel) = p.strip_prefix(prefix.as_slice()) else {
            continue;
        };
        // The repository's own `.git` is git's business (the index it writes would
        // otherwise make every answer a new token and every status an index write).
        if rel.is_empty() || rel == b".git/" || rel == b".git" || rel.starts_with(b".git/") {
            continue;
        }
        changed |= i < n_changed;
        out.extend_from_slice(rel);
        out.push(0);
    }
    // Nothing in this worktree changed since the token: keep it (the next answer covers
    // everything since it), so git has no new token to write into the index.
    let token = if changed {
        fresh
    } else {
        format!("{TOKEN_PREFIX}{inst}:{since}")
    };
    let mut reply = token.into_bytes();
    reply.push(0);
    reply.extend_from_slice(&out);
    reply
}

/// The hook: `VERSION TOKEN` as git passes them.
pub fn run(version: &OsStr, token: Option<&OsStr>) -> ExitCode {
    if version != "2" {
        eprintln!(
            "coherent fsmonitor: protocol version {} is not supported (only 2): set \
             `git config core.fsmonitorHookVersion 2`",
            version.to_string_lossy()
        );
        return ExitCode::from(1);
    }
    let cwd = std::env::current_dir().ok();
    let reply = answer(cwd.as_deref(), token);
    let mut out = std::io::stdout().lock();
    if out.write_all(&reply).and_then(|()| out.flush()).is_err() {
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

/// `coherent 2 TOKEN` or `coherent fsmonitor 2 TOKEN` (git's argv), served before the
/// command line is parsed; None for every other command.
pub fn direct(args: &[OsString]) -> Option<ExitCode> {
    let first = args.get(1)?;
    if first == "fsmonitor" {
        // Anything but `fsmonitor VERSION [TOKEN]` is for clap (help, usage errors).
        if args.len() < 3 || args.len() > 4 || args[2].as_bytes().starts_with(b"-") {
            return None;
        }
        return Some(run(&args[2], args.get(3).map(OsString::as_os_str)));
    }
    if !first.is_empty() && first.as_bytes().iter().all(u8::is_ascii_digit) && args.len() <= 3 {
        return Some(run(first, args.get(2).map(OsString::as_os_str)));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_of_ours_only() {
        assert_eq!(
            parse_token(OsStr::new("c1:00112233aabbccdd:42")),
            Some(("00112233aabbccdd", 42))
        );
        for bad in [
            "",
            "1733000000000000000",
            "c1:none",
            "c1:0011:1",
            "c1:00112233aabbccdd:x",
        ] {
            assert_eq!(parse_token(OsStr::new(bad)), None, "{bad}");
        }
    }

    #[test]
    fn outside_a_volume_everything_may_have_changed() {
        let r = answer(
            Some(Path::new("/")),
            Some(OsStr::new("c1:00112233aabbccdd:1")),
        );
        assert_eq!(r, b"c1:none\0/\0");
        assert_eq!(answer(None, None), b"c1:none\0/\0");
    }
}
