//! Where and who: the `--coordinator` URL, its credentials, the host id and the lease, as
//! parsed at start, and what the client is given of them.

use super::*;

/// Where and who: parsed from `--coordinator`, `--coordinator-auth`, `--host-id`,
/// `--coordinator-ttl`.
#[derive(Debug, Clone)]
pub struct EtcdSpec {
    /// `HOST:PORT` each.
    pub endpoints: Vec<String>,
    /// `etcds://`: every member is reached over TLS.
    pub tls: bool,
    /// User, password and certificates, read from the auth file.
    pub auth: Option<EtcdAuth>,
    /// The key space (`/coherent/VOLUME/`): hosts sharing one workspace use one.
    pub volume: String,
    pub host: String,
    pub ttl: Duration,
}

impl EtcdSpec {
    /// Parses `etcd[s]://HOST:PORT[,HOST:PORT...][/VOLUME][?auth=FILE]` and reads the
    /// auth file (`auth`: `--coordinator-auth`; the URL's `?auth=` says the same, so the
    /// one line `scripts/etcd.sh start` prints is all a mount needs).
    pub fn parse(
        url: &str,
        auth: Option<&std::path::Path>,
        host: String,
        ttl: Duration,
    ) -> Result<EtcdSpec, String> {
        let bad = |why: &str| {
            format!(
                "--coordinator {url:?}: {why}; expected \
                 etcd[s]://HOST:PORT[,HOST:PORT...][/VOLUME][?auth=FILE], for example \
                 etcd://127.0.0.1:2379"
            )
        };
        let (tls, rest) = if let Some(r) = url.strip_prefix("etcds://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("etcd://") {
            (false, r)
        } else {
            return Err(bad("only etcd:// and etcds:// (TLS) are supported"));
        };
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let url_auth = match query {
            None => None,
            Some(q) => Some(
                q.strip_prefix("auth=")
                    .filter(|f| !f.is_empty())
                    .ok_or_else(|| bad(&format!("unknown query {q:?} (only auth=FILE)")))?,
            ),
        };
        let auth_file = match (auth, url_auth) {
            (Some(a), Some(u)) if a != std::path::Path::new(u) => {
                return Err(format!(
                    "--coordinator-auth {} and the URL's ?auth={u} differ: give one",
                    a.display()
                ))
            }
            (Some(a), _) => Some(a.to_path_buf()),
            (None, u) => u.map(std::path::PathBuf::from),
        };
        let (hosts, volume) = match rest.split_once('/') {
            Some((h, v)) if !v.is_empty() => (h, v),
            Some((h, _)) => (h, "default"),
            None => (rest, "default"),
        };
        if !volume
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            return Err(bad(
                "the volume name may hold only letters, digits, '.', '_' and '-'",
            ));
        }
        let mut endpoints = Vec::new();
        for ep in hosts.split(',') {
            let (h, port) = ep
                .rsplit_once(':')
                .ok_or_else(|| bad(&format!("{ep:?} has no :PORT")))?;
            if h.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
                return Err(bad(&format!("{ep:?} is not HOST:PORT")));
            }
            endpoints.push(ep.to_string());
        }
        if !valid_host_id(&host) {
            return Err(format!(
                "--host-id {host:?}: use 1 to 200 printable characters, no spaces"
            ));
        }
        if ttl < Duration::from_secs(2) {
            return Err("--coordinator-ttl must be at least 2 seconds".into());
        }
        let auth = match auth_file {
            Some(f) => {
                let a = EtcdAuth::read(&f)?;
                a.check_scheme(tls)?;
                Some(a)
            }
            None if tls => {
                return Err(format!(
                    "--coordinator {url:?}: etcds:// needs the cluster's CA: give \
                     --coordinator-auth FILE with ca=FILE (see docs/multi-host.md)"
                ))
            }
            None => None,
        };
        Ok(EtcdSpec {
            endpoints,
            tls,
            auth,
            volume: volume.to_string(),
            host,
            ttl,
        })
    }

    /// The client's options for this spec (user, TLS) on top of `o`.
    pub(super) fn connect_options(&self, o: ConnectOptions) -> ConnectOptions {
        match &self.auth {
            Some(a) => a.apply(o, self.tls),
            None => o,
        }
    }

    /// The URL of one endpoint for the client.
    pub(super) fn endpoint_url(&self, ep: &str) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{ep}")
    }
}

pub fn valid_host_id(h: &str) -> bool {
    !h.is_empty() && h.len() <= 200 && h.chars().all(|c| c.is_ascii_graphic())
}

/// The default `--host-id`: this machine's name and the mount point.
pub fn default_host_id(mountpoint: &std::path::Path) -> String {
    let name = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "host".into());
    let id: String = format!("{name}:{}", mountpoint.display())
        .chars()
        .map(|c| if c.is_ascii_graphic() { c } else { '_' })
        .collect();
    id.chars().take(200).collect()
}
