//! Retention: the store's bounds applied (see the module docs of the store), and the index
//! written anew without the lines they dropped.

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsRawFd;

use super::fd::{cstr, fd_b, openat};
use super::{hex, Inner, Store, INDEX};
use crate::coherence::Timestamp;

impl Store {
    /// Applies the bounds (module docs); `by_age` also drops old index lines.
    pub fn prune(&self, now: Timestamp, by_age: bool) {
        let mut inner = self.inner.lock();
        let cutoff = now.0 - self.limits.keep.as_millis() as i64;
        // A path's latest version goes last: by size only, and only after every older
        // version (its content is the file's own, until something outside overwrites it).
        let latest: HashSet<[u8; 32]> = inner
            .by_path
            .values()
            .filter_map(|v| v.last().and_then(|e| e.digest))
            .collect();
        let mut victims: Vec<(bool, i64, [u8; 32])> = inner
            .blobs
            .iter()
            .map(|(d, b)| (latest.contains(d), b.last, *d))
            .collect();
        victims.sort();
        let mut dropped: HashSet<[u8; 32]> = HashSet::new();
        let target = self.limits.max_bytes / 10 * 9;
        let over_bound = inner.total > self.limits.max_bytes;
        let mut total = inner.total;
        for (is_latest, last, d) in victims {
            let old = by_age && last < cutoff && !is_latest;
            let over = over_bound && total > target;
            if !old && !over {
                continue;
            }
            if let Some(b) = inner.blobs.remove(&d) {
                total -= super::on_disk(b.size);
                match b.at {
                    Some(at) => inner.packs.drop_blob(fd_b(&self.objects), at, b.size),
                    None => self.unlink_obj(&hex(&d)),
                }
                dropped.insert(d);
            }
        }
        inner.total = total;
        #[cfg(test)]
        {
            inner.passes += 1;
        }
        if !dropped.is_empty() {
            for e in inner.by_path.values_mut().flat_map(|v| v.iter_mut()) {
                if e.digest.is_some_and(|d| dropped.contains(&d)) {
                    e.kept = false;
                }
            }
        }
        if by_age {
            inner.last_age_prune = now.0;
            let mut gone = 0usize;
            for v in inner.by_path.values_mut() {
                let n = v.len();
                let keep_from = v.iter().position(|e| e.ts >= cutoff).unwrap_or(n - 1);
                v.drain(..keep_from.min(n - 1));
                gone += n - v.len();
            }
            if gone > 0 {
                if let Err(err) = self.rewrite(&mut inner) {
                    tracing::warn!("history: cannot rewrite the index: {err}");
                }
            }
        }
    }

    /// Writes the index anew (the entries in memory) and renames it into place.
    fn rewrite(&self, inner: &mut Inner) -> io::Result<()> {
        let tmp = ".index.tmp";
        let fd = openat(
            fd_b(&self.dir),
            tmp,
            libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC,
            0o600,
        )?;
        let mut f = io::BufWriter::new(File::from(fd));
        let mut all: Vec<(&String, &super::Rec)> = inner
            .by_path
            .iter()
            .flat_map(|(p, v)| v.iter().map(move |r| (p, r)))
            .collect();
        all.sort_by_key(|(_, r)| r.ts);
        for (p, r) in all {
            serde_json::to_writer(&mut f, &r.entry(p))?;
            f.write_all(b"\n")?;
        }
        let f = f.into_inner().map_err(|e| e.into_error())?;
        f.sync_data()?;
        let (a, b) = (cstr(tmp)?, cstr(INDEX)?);
        // SAFETY: valid directory descriptors and NUL-terminated names.
        if unsafe {
            libc::renameat(
                self.dir.as_raw_fd(),
                a.as_ptr(),
                self.dir.as_raw_fd(),
                b.as_ptr(),
            )
        } != 0
        {
            return Err(io::Error::last_os_error());
        }
        inner.index = File::from(openat(
            fd_b(&self.dir),
            INDEX,
            libc::O_RDWR | libc::O_APPEND,
            0,
        )?);
        Ok(())
    }
}
