//! The key space of a volume is its fences (docs/multi-host.md#securing-etcd): a cluster
//! started by `scripts/etcd.sh` (TLS, client certificates, authentication, a role limited
//! to the volume's prefix) lets a mount in with its auth file and keeps an unprivileged
//! local user from reading or rewriting the keys; a mount with a wrong password or an auth
//! file others may read is refused at start, saying what to do.

use crate::coherent;
use crate::common;

use coherent::*;
use common::etcd::Etcd;
use common::users;
use common::{run_timeout, Mount, BIN, TIMEOUT};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The coordinator's state in the `status` reply.
fn coordinator(m: &Mount) -> serde_json::Value {
    let (_, v) = ctl(m, None, "status");
    v["status"]["coordinator"].clone()
}

/// The keys under the volume's prefix, read as etcd's root.
fn volume_keys(e: &Etcd) -> Vec<(String, String)> {
    e.get_prefix("/coherent/default/")
}

#[test]
fn an_unprivileged_user_cannot_read_or_rewrite_the_volume_keys_while_the_mount_works() {
    let e = Etcd::start(1);
    assert!(
        e.secure(),
        "etcd.sh start is secure by default: {}",
        e.url()
    );
    for (f, mode) in [
        (e.dir(), 0o700),
        (e.auth_file(), 0o600),
        (e.root_auth_file(), 0o600),
        (e.tls_file("client-key.pem"), 0o600),
    ] {
        let m = std::fs::metadata(&f).unwrap().permissions().mode() & 0o777;
        assert_eq!(m, mode, "{} mode {m:o}", f.display());
    }

    // The mount works with the URL etcd.sh printed (its ?auth= names the auth file) and
    // puts its state under the volume's prefix: a handed file, a session, this host.
    let state = tempfile::tempdir().unwrap();
    let m = Mount::builder()
        .args(["--coordinator", e.url(), "--host-id", "A", "--state-dir"])
        .arg(state.path().display().to_string())
        .start();
    std::fs::write(m.backing_path("plan.md"), "plan\n").unwrap();
    touch_session(&m, "bob");
    sh_ok(&m, Some("alice"), "cat plan.md >/dev/null");
    transfer(&m, "alice", "bob", &["plan.md"]);
    let c = coordinator(&m);
    assert_eq!(c["connected"], true, "{c}");
    let before = volume_keys(&e);
    let key = "/coherent/default/p/plan.md";
    let rec = before
        .iter()
        .find(|(k, _)| k == key)
        .unwrap_or_else(|| panic!("no {key} in {before:?}"));
    assert!(rec.1.contains("\"pending\""), "{rec:?}");
    assert!(before.iter().any(|(k, _)| k == "/coherent/default/h/A"));

    let u = users::u1();
    let dir = Path::new("/");
    let port = e.endpoints().to_string();
    let lifted = r#"{"status":"withdrawn"}"#;

    // 1. The user cannot read the cluster directory (auth file, keys, certificates).
    let o = u.sh(dir, &[], &format!("cat {}", e.auth_file().display()));
    assert!(
        !o.status.success(),
        "{} read the auth file: {}",
        u.name,
        text(&o)
    );
    assert!(stderr(&o).contains("Permission denied"), "{}", text(&o));

    // 2. Plain http: the members speak only TLS.
    let ctl = |extra: &str, what: &str| {
        u.sh(
            dir,
            &[("ETCDCTL_API", "3")],
            &format!("etcdctl --dial-timeout=2s --command-timeout=3s {extra} {what}"),
        )
    };
    for what in [
        "get --prefix /coherent/".to_string(),
        format!("put {key} '{lifted}'"),
    ] {
        let o = ctl(&format!("--endpoints={port}"), &what);
        assert!(
            !o.status.success(),
            "plain `{what}` as {}: {}",
            u.name,
            text(&o)
        );
        assert!(o.stdout.is_empty(), "nothing read: {}", text(&o));
    }
    // 3. TLS without a client certificate of the cluster's CA (the user cannot read the
    // CA either, so it skips verification): the handshake is refused, and the member
    // logs why.
    let log_before = e.log(1).len();
    for what in [
        "get --prefix /coherent/".to_string(),
        format!("put {key} '{lifted}'"),
    ] {
        let o = ctl(
            &format!(
                "--endpoints=https://{port} --insecure-transport=false \
                 --insecure-skip-tls-verify"
            ),
            &what,
        );
        assert!(
            !o.status.success(),
            "TLS `{what}` as {}: {}",
            u.name,
            text(&o)
        );
        assert!(o.stdout.is_empty(), "nothing read: {}", text(&o));
    }
    let log = e.log(1)[log_before..].to_string();
    assert!(
        log.contains("rejected connection") && log.contains("didn't provide a certificate"),
        "the member refused the handshakes for want of a client certificate: {log}"
    );

    // 4. Even with the client certificate (as if it had leaked) but no password, etcd's
    // authentication refuses both the read and the write.
    for what in [
        vec!["get", "--prefix", "/coherent/"],
        vec!["put", "--", key, lifted],
    ] {
        let o = run_timeout(e.ctl_command(false).args(&what), TIMEOUT);
        assert!(
            !o.status.success(),
            "certificate, no password, {what:?}: {}",
            text(&o)
        );
        assert!(
            stderr(&o).contains("permission denied") || stderr(&o).contains("user name is empty"),
            "refused by authentication: {}",
            text(&o)
        );
    }
    // 5. The volume's own user reaches its prefix only.
    let pw = Etcd::auth_value(&e.auth_file(), "password");
    let o = run_timeout(
        e.ctl_command(false)
            .env("ETCDCTL_USER", format!("coherent-default:{pw}"))
            .args(["get", "--prefix", "/coherent/"]),
        TIMEOUT,
    );
    assert!(
        !o.status.success(),
        "outside /coherent/default/: {}",
        text(&o)
    );
    assert!(stderr(&o).contains("permission denied"), "{}", text(&o));

    // Nothing changed, and the fence still holds on the mount.
    assert_eq!(volume_keys(&e), before, "the key space was not rewritten");
    let r = sh(&m, Some("alice"), "echo more >> plan.md");
    assert!(r.denied(), "the giver stays fenced: {}", r.show());
}

/// `coherent-mount` with this coordinator URL and auth arguments: must exit (not mount)
/// with status 1; its stderr.
fn refused_mount(args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let (b, mnt) = (dir.path().join("b"), dir.path().join("m"));
    std::fs::create_dir(&b).unwrap();
    std::fs::create_dir(&mnt).unwrap();
    let o = run_timeout(
        Command::new(BIN)
            .arg(&b)
            .arg(&mnt)
            .arg("--state-dir")
            .arg(dir.path().join("s"))
            .args(args),
        TIMEOUT,
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    // The log goes to stderr too; the error is its one line of its own.
    let all = stderr(&o);
    let err: Vec<&str> = all
        .lines()
        .filter(|l| l.starts_with("coherent-mount: "))
        .collect();
    assert_eq!(err.len(), 1, "one error line: {all}");
    assert!(!all.contains("panicked"), "{all}");
    assert!(common::mount_fstype(&mnt).is_none(), "nothing mounted");
    err[0].to_string()
}

#[test]
fn a_wrong_password_or_an_auth_file_others_can_read_is_refused_at_start() {
    let e = Etcd::start(1);
    let url = format!("etcds://{}/default", e.endpoints());
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read_to_string(e.auth_file()).unwrap();
    let put = |name: &str, body: &str, mode: u32| {
        let p = dir.path().join(name);
        std::fs::write(&p, body).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        p.display().to_string()
    };

    // A wrong password: etcd's refusal, named, at once (not after the start wait).
    let pw = Etcd::auth_value(&e.auth_file(), "password");
    let wrong = put("wrong", &good.replace(&pw, "not-the-password"), 0o600);
    let t = Instant::now();
    let err = refused_mount(&["--coordinator", &url, "--coordinator-auth", &wrong]);
    assert!(
        err.contains("authentication failed") && err.contains("check user= and password="),
        "{err}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(8),
        "refused at once: {:?}",
        t.elapsed()
    );

    // The auth file open to others, by flag and as a mount option: refused before any
    // connection, saying chmod 600.
    let open = put("open", &good, 0o644);
    for args in [
        vec!["--coordinator", &url, "--coordinator-auth", &open],
        vec![
            "--coordinator",
            &url,
            "-o",
            &format!("coordinator_auth={open}"),
        ],
    ] {
        let err = refused_mount(&args);
        assert!(
            err.contains("mode 0644") && err.contains(&format!("chmod 600 {open}")),
            "{err}"
        );
    }
    let group = put("group", &good, 0o640);
    let err = refused_mount(&["--coordinator", &format!("{url}?auth={group}")]);
    assert!(err.contains("chmod 600"), "{err}");
    // Missing, malformed, and TLS without a CA.
    let err = refused_mount(&[
        "--coordinator",
        &url,
        "--coordinator-auth",
        "/nonexistent/a",
    ]);
    assert!(
        err.contains("cannot read it") && err.contains("chmod 600"),
        "{err}"
    );
    let bad = put("bad", "user coherent-default\n", 0o600);
    let err = refused_mount(&["--coordinator", &url, "--coordinator-auth", &bad]);
    assert!(err.contains("line 1") && err.contains("KEY=VALUE"), "{err}");
    let err = refused_mount(&["--coordinator", &url]);
    assert!(err.contains("needs the cluster's CA"), "{err}");
    // The same file, private: the mount starts.
    let ok = put("ok", &good, 0o600);
    let state = dir.path().join("state");
    let m = Mount::builder()
        .args([
            "--coordinator",
            &url,
            "--coordinator-auth",
            &ok,
            "--state-dir",
        ])
        .arg(state.display().to_string())
        .start();
    assert_eq!(coordinator(&m)["connected"], true);
}
