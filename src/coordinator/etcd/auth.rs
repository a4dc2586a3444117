//! Credentials for etcd: `--coordinator-auth FILE` (or `?auth=FILE` in the URL).
//!
//! Whoever can write the volume's key space can lift every fence, so the file that lets a
//! mount in is treated like a private key: it must belong to the mounting user and grant
//! nobody else any access, or the mount refuses to start. The format is `KEY=VALUE` lines
//! (`#` starts a comment line):
//!
//! ```text
//! user=coherent-default       # etcd user (with password=)
//! password=...
//! ca=ca.pem                   # the cluster's CA (etcds:// only; required there)
//! cert=client.pem             # client certificate and its key (etcds://, both or none)
//! key=client-key.pem
//! ```
//!
//! Relative paths are taken from the file's own directory. Everything is read once, at
//! start; a reconnection uses what was read then.

use std::fmt;
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};

/// What `--coordinator-auth` holds, read and checked.
#[derive(Clone, Default)]
pub struct EtcdAuth {
    /// The file it came from (for messages).
    pub file: PathBuf,
    /// etcd user and password.
    pub user: Option<(String, String)>,
    /// The CA that signed the members' certificates (PEM).
    pub ca: Option<Vec<u8>>,
    /// Client certificate and key (PEM).
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

/// Never prints the password or the key.
impl fmt::Debug for EtcdAuth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdAuth")
            .field("file", &self.file)
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .field("ca", &self.ca.is_some())
            .field("identity", &self.identity.is_some())
            .finish()
    }
}

/// The keys a file may hold.
const KEYS: &str = "user, password, ca, cert, key";

impl EtcdAuth {
    /// Reads and checks `file`; every error is one line saying what to do.
    pub fn read(file: &Path) -> Result<EtcdAuth, String> {
        let shown = file.display();
        let text = read_private(file, "--coordinator-auth")?;
        let text = String::from_utf8(text)
            .map_err(|_| format!("--coordinator-auth {shown} is not text (UTF-8)"))?;
        let dir = file.parent().unwrap_or(Path::new("."));
        let mut seen = std::collections::HashMap::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why: &str| {
                format!(
                    "--coordinator-auth {shown} line {}: {why} (lines are KEY=VALUE, KEY one \
                     of {KEYS}; see docs/multi-host.md)",
                    n + 1
                )
            };
            let (k, v) = line.split_once('=').ok_or_else(|| bad("no '='"))?;
            let (k, v) = (k.trim(), v.trim());
            if !KEYS.split(", ").any(|x| x == k) {
                return Err(bad(&format!("unknown key {k:?}")));
            }
            if v.is_empty() {
                return Err(bad(&format!("{k} has no value")));
            }
            if seen.insert(k.to_string(), v.to_string()).is_some() {
                return Err(bad(&format!("{k} given twice")));
            }
        }
        let mut a = EtcdAuth {
            file: file.to_path_buf(),
            ..EtcdAuth::default()
        };
        let get = |k: &str| seen.get(k).cloned();
        match (get("user"), get("password")) {
            (Some(u), Some(p)) => a.user = Some((u, p)),
            (None, None) => {}
            _ => {
                return Err(format!(
                    "--coordinator-auth {shown}: user= and password= go together; give both"
                ))
            }
        }
        let path = |v: String| {
            let p = PathBuf::from(v);
            if p.is_absolute() {
                p
            } else {
                dir.join(p)
            }
        };
        if let Some(ca) = get("ca") {
            let ca = path(ca);
            a.ca =
                Some(std::fs::read(&ca).map_err(|e| {
                    format!("--coordinator-auth {shown}: ca={}: {e}", ca.display())
                })?);
        }
        match (get("cert"), get("key")) {
            (Some(c), Some(k)) => {
                let (c, k) = (path(c), path(k));
                let cert = std::fs::read(&c).map_err(|e| {
                    format!("--coordinator-auth {shown}: cert={}: {e}", c.display())
                })?;
                let key = read_private(&k, &format!("--coordinator-auth {shown}: key="))?;
                a.identity = Some((cert, key));
            }
            (None, None) => {}
            _ => {
                return Err(format!(
                    "--coordinator-auth {shown}: cert= and key= go together; give both"
                ))
            }
        }
        if a.user.is_none() && a.ca.is_none() && a.identity.is_none() {
            return Err(format!(
                "--coordinator-auth {shown} holds nothing: give user= and password=, and for \
                 etcds:// ca= (and cert=, key=)"
            ));
        }
        Ok(a)
    }

    /// Checks the file fits a URL of TLS (`etcds://`) or not.
    pub fn check_scheme(&self, tls: bool) -> Result<(), String> {
        let shown = self.file.display();
        if tls && self.ca.is_none() {
            return Err(format!(
                "etcds:// needs the CA of the cluster: add ca=FILE to --coordinator-auth {shown}"
            ));
        }
        if !tls && (self.ca.is_some() || self.identity.is_some()) {
            return Err(format!(
                "--coordinator-auth {shown} names certificates (ca=, cert=, key=), which only \
                 etcds:// uses: write the URL as etcds://..."
            ));
        }
        Ok(())
    }

    /// The client's options: the user, and the TLS configuration for `etcds://`.
    pub fn apply(&self, mut o: ConnectOptions, tls: bool) -> ConnectOptions {
        if let Some((u, p)) = &self.user {
            // An expired token (etcd drops idle ones) is fetched again, not a failed call.
            o = o.with_user(u, p).with_auto_token_refresh(true);
        }
        if tls {
            let mut t = TlsOptions::new();
            if let Some(ca) = &self.ca {
                t = t.ca_certificate(Certificate::from_pem(ca));
            }
            if let Some((cert, key)) = &self.identity {
                t = t.identity(Identity::from_pem(cert, key));
            }
            o = o.with_tls(t);
        }
        o
    }
}

/// Reads a secret file that must belong to this process's user and be closed to everyone
/// else (no group or other permission bits); `what` names it in the error.
fn read_private(file: &Path, what: &str) -> Result<Vec<u8>, String> {
    let shown = file.display();
    let mut f = std::fs::File::open(file).map_err(|e| {
        format!(
            "{what} {shown}: cannot read it ({e}); write it (KEY=VALUE lines, see \
             docs/multi-host.md) and run chmod 600 {shown}"
        )
    })?;
    // The opened file itself, so what is checked is what is read.
    let md = f.metadata().map_err(|e| format!("{what} {shown}: {e}"))?;
    if !md.is_file() {
        return Err(format!("{what} {shown} is not a regular file"));
    }
    let me = nix::unistd::geteuid().as_raw();
    if md.uid() != me {
        return Err(format!(
            "{what} {shown} belongs to uid {}, not to the mounting user (uid {me}), who alone \
             may read it: run chown {me} {shown} && chmod 600 {shown}",
            md.uid()
        ));
    }
    let mode = md.mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "{what} {shown} is open to other users (mode {mode:04o}); it grants write access \
             to every fence of the volume: run chmod 600 {shown}"
        ));
    }
    let mut buf = Vec::new();
    f.read_to_end(&mut buf)
        .map_err(|e| format!("{what} {shown}: {e}"))?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn write(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p
    }

    #[test]
    fn a_private_file_is_read_with_paths_from_its_directory() {
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "ca.pem", "CA", 0o644);
        write(d.path(), "c.pem", "CERT", 0o644);
        write(d.path(), "k.pem", "KEY", 0o600);
        let f = write(
            d.path(),
            "auth",
            "# comment\nuser=u\npassword= p=w \nca=ca.pem\ncert=c.pem\nkey=k.pem\n",
            0o600,
        );
        let a = EtcdAuth::read(&f).unwrap();
        assert_eq!(a.user, Some(("u".into(), "p=w".into())));
        assert_eq!(a.ca.as_deref(), Some(&b"CA"[..]));
        assert_eq!(a.identity, Some((b"CERT".to_vec(), b"KEY".to_vec())));
        assert!(!format!("{a:?}").contains("p=w"), "{a:?}");
        a.check_scheme(true).unwrap();
        assert!(a.check_scheme(false).unwrap_err().contains("etcds://"));
    }

    #[test]
    fn open_missing_or_malformed_files_are_refused_saying_what_to_do() {
        let d = tempfile::tempdir().unwrap();
        let f = write(d.path(), "auth", "user=u\npassword=p\n", 0o644);
        let e = EtcdAuth::read(&f).unwrap_err();
        assert!(e.contains("mode 0644") && e.contains("chmod 600"), "{e}");
        let f = write(d.path(), "auth", "user=u\npassword=p\n", 0o640);
        assert!(EtcdAuth::read(&f).unwrap_err().contains("chmod 600"));
        let e = EtcdAuth::read(&d.path().join("none")).unwrap_err();
        assert!(
            e.contains("cannot read it") && e.contains("chmod 600"),
            "{e}"
        );
        for (text, want) in [
            ("user=u\n", "go together"),
            ("user=u\npassword=p\nuser=v\n", "given twice"),
            ("usr=u\n", "unknown key \"usr\""),
            ("just words\n", "line 1: no '='"),
            ("password=\n", "has no value"),
            ("# nothing\n", "holds nothing"),
            ("cert=c\n", "go together"),
        ] {
            let f = write(d.path(), "auth", text, 0o600);
            let e = EtcdAuth::read(&f).unwrap_err();
            assert!(e.contains(want), "{text:?}: {e}");
        }
        // The key file is a secret too.
        write(d.path(), "k.pem", "KEY", 0o644);
        write(d.path(), "c.pem", "CERT", 0o644);
        let f = write(d.path(), "auth", "cert=c.pem\nkey=k.pem\n", 0o600);
        let e = EtcdAuth::read(&f).unwrap_err();
        assert!(e.contains("k.pem") && e.contains("chmod 600"), "{e}");
    }

    #[test]
    fn the_url_says_tls_and_may_name_the_auth_file() {
        use super::super::EtcdSpec;
        use std::time::Duration;
        let parse = |url: &str, auth: Option<&Path>| {
            EtcdSpec::parse(url, auth, "h".into(), Duration::from_secs(5))
        };
        let s = parse("etcd://a:1", None).unwrap();
        assert!(!s.tls && s.auth.is_none() && s.volume == "default");
        assert_eq!(s.endpoint_url("a:1"), "http://a:1");
        let d = tempfile::tempdir().unwrap();
        write(d.path(), "ca.pem", "CA", 0o600);
        let f = write(d.path(), "auth", "user=u\npassword=p\nca=ca.pem\n", 0o600);
        let url = format!("etcds://a:1,b:2/v?auth={}", f.display());
        let s = parse(&url, None).unwrap();
        assert!(s.tls && s.volume == "v" && s.endpoints == ["a:1", "b:2"]);
        assert_eq!(s.endpoint_url("b:2"), "https://b:2");
        assert_eq!(s.auth.as_ref().unwrap().user.as_ref().unwrap().0, "u");
        // The same file by flag and in the URL is fine; two different ones are not.
        assert!(parse(&url, Some(&f)).is_ok());
        let e = parse(&url, Some(Path::new("/other"))).unwrap_err();
        assert!(e.contains("differ"), "{e}");
        assert!(parse("etcds://a:1", Some(&f)).is_ok());
        let e = parse("etcds://a:1", None).unwrap_err();
        assert!(e.contains("needs the cluster's CA"), "{e}");
        let e = parse("etcd://a:1", Some(&f)).unwrap_err();
        assert!(e.contains("only etcds:// uses"), "{e}");
        let e = parse("etcd://a:1?user=x", None).unwrap_err();
        assert!(e.contains("only auth=FILE"), "{e}");
        let e = parse("https://a:1", None).unwrap_err();
        assert!(e.contains("etcds://"), "{e}");
    }
}
