//! Issue 20, item 5: bounded when the state disk is full. The events the volume keeps in
//! memory while its state log cannot be written are bounded (COHERENT_JOURNAL_BUFFER);
//! past the bound it fails closed on what needs a durable record (verbs, writes to paths
//! with live records) and bystanders keep working; the log and `coherent status` say so;
//! once the disk takes writes again a snapshot covers what was not kept and everything
//! works again, without a restart.

use crate::coherent;
use crate::common;

use coherent::*;
use common::{wait_until, Mount};
use std::path::Path;
use std::time::Duration;

/// A small tmpfs for the state directory.
struct SmallDisk(tempfile::TempDir);

impl SmallDisk {
    fn new() -> SmallDisk {
        let d = tempfile::Builder::new()
            .prefix("coherent-smalldisk-")
            .tempdir()
            .unwrap();
        let st = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=512k,mode=0700", "tmpfs"])
            .arg(d.path())
            .status()
            .unwrap();
        assert!(st.success(), "mount tmpfs (the tests run as root)");
        SmallDisk(d)
    }

    fn path(&self) -> &Path {
        self.0.path()
    }

    fn fill(&self) {
        use std::io::Write;
        let mut f = std::fs::File::create(self.path().join("filler")).unwrap();
        let block = vec![0u8; 4096];
        while f.write(&block).is_ok() {}
    }

    fn free(&self) {
        std::fs::remove_file(self.path().join("filler")).unwrap();
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(self.0.path(), nix::mount::MntFlags::MNT_DETACH);
    }
}

fn status_json(m: &Mount) -> serde_json::Value {
    cli_json(m, None, &["status"]).1
}

#[test]
fn past_the_bound_handed_files_and_verbs_fail_closed_and_bystanders_go_on() {
    let disk = SmallDisk::new();
    let m = Mount::builder()
        .arg("--state-dir")
        .arg(disk.path().join("state").display().to_string())
        .env("COHERENT_JOURNAL_BUFFER", "4096")
        .start();
    touch_session(&m, "bob");
    touch_session(&m, "carol");
    sh_ok(&m, Some("alice"), "echo plan > plan.md");
    transfer(&m, "alice", "bob", &["plan.md"]);

    disk.fill();
    // carol's work goes on and produces events: past 4 KiB the volume stops keeping them.
    let mut shedding = false;
    for round in 0..20 {
        sh_ok(
            &m,
            Some("carol"),
            &format!("for i in $(seq 1 20); do echo x > w{round}-$i.md; done"),
        );
        let st = status_json(&m);
        if st["status"]["journal"]["shedding"] == true {
            shedding = true;
            let line = st["message"].as_str().unwrap_or("");
            assert!(line.contains("reached their bound"), "{st}");
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        shedding,
        "the journal never reached its bound: {}",
        status_json(&m)
    );
    assert!(
        m.log().contains("the bound"),
        "the daemon log says so: {}",
        m.log()
    );
    // Bystanders keep working.
    sh_ok(
        &m,
        Some("carol"),
        "echo more > more.md && cat plan.md >/dev/null",
    );
    // What needs a durable record fails closed: a write to the handed file, by anyone...
    let r = sh(&m, Some("bob"), "echo bob >> plan.md");
    assert!(r.denied(), "{}", r.show());
    assert!(
        why(&m, Some("bob")).contains("cannot record"),
        "{}",
        why(&m, Some("bob"))
    );
    // ... and verbs (io_error, EIO).
    let (errno, v) = ctl(&m, Some("bob"), "accept plan.md\n");
    assert_eq!(
        (errno, v["reason"].as_str()),
        (libc::EIO, Some("io_error")),
        "{v}"
    );
    assert_eq!(
        std::fs::read_to_string(m.path("plan.md")).unwrap(),
        "plan\n"
    );

    // The disk takes writes again: a snapshot covers what was not kept, no restart.
    disk.free();
    let ok = wait_until(Duration::from_secs(30), || {
        status_json(&m)["status"].get("journal").is_none()
    });
    assert!(ok, "still failing: {}", status_json(&m));
    sh_ok(&m, Some("bob"), "echo bob >> plan.md");
    let r = record(&m, "plan.md").unwrap();
    assert_eq!(
        (&r["status"], &r["live"]),
        (&"completed".into(), &false.into())
    );
    assert!(version(&m, "w0-1.md").is_some());
}
