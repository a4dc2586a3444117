//! Tests of the replies: the JSON envelopes, the human record lines and the per-handle
//! reply buffer of `ctl`.

use super::*;

// ---- replies ----------------------------------------------------------------------------

fn record(status: &str, live: bool) -> Value {
    json!({
        "path": "plan.md",
        "giver": "alice",
        "giver_agent": "27a468b0-7fa2-5c0d-a2ba-2dac753b2070",
        "successor": "bob",
        "successor_agent": "6e271ee6-0000-5000-8000-000000000000",
        "version_at_transfer": 2,
        "hold": "M",
        "status": status,
        "counterparty": null,
        "note": "please review",
        "created": "2026-11-30T12:00:00Z",
        "updated": "2026-11-30T12:00:00Z",
        "live": live,
    })
}

#[test]
fn success_envelopes() {
    let r = Reply::records(Verb::Transfer, vec![record("pending", true)]);
    let b = r.body();
    assert_eq!(b["ok"], true);
    assert_eq!(b["verb"], "transfer");
    assert_eq!(b["records"][0]["successor"], "bob");
    assert_eq!(
        b["message"],
        "handed plan.md (v2) to bob (6e271ee6); you can no longer write it until bob writes \
         or declines it, or you run: coherent withdraw plan.md"
    );
    assert!(r.is_ok());
    assert_eq!(r.errno(), None);
    let bytes = r.to_bytes();
    assert_eq!(bytes.last(), Some(&b'\n'));
    assert_eq!(bytes.iter().filter(|&&c| c == b'\n').count(), 1, "one line");
    let back: Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(&back, b);
    assert_eq!(Reply::from_json(back).unwrap(), r);

    // reserved keys cannot be overridden by fields
    let mut m = Map::new();
    m.insert("ok".into(), false.into());
    m.insert("extra".into(), 1.into());
    let r = Reply::ok(Verb::Status, m, "fine");
    assert_eq!(r.body()["ok"], true);
    assert_eq!(r.body()["extra"], 1);
    assert_eq!(r.message(), "fine");

    let r = Reply::status(json!({"sessions": [], "records": []}), "0 sessions");
    assert_eq!(r.body()["verb"], "status");
    assert_eq!(r.body()["status"]["sessions"], json!([]));

    let alice = SessionInfo::from_tag(
        Some("COHERENT_SESSION"),
        "alice",
        Via::Env {
            var: "COHERENT_SESSION".into(),
        },
    );
    let r = Reply::session(Verb::Whoami, &alice);
    assert_eq!(r.body()["session"], "alice");
    assert_eq!(r.body()["agent"], "27a468b0-7fa2-5c0d-a2ba-2dac753b2070");
    assert_eq!(r.body()["via"]["kind"], "env");
    assert!(
        r.message().contains("alice (27a468b0)")
            && r.message()
                .contains("environment variable COHERENT_SESSION"),
        "{}",
        r.message()
    );
    let r = Reply::session(Verb::Register, &alice);
    assert_eq!(r.body()["verb"], "register");
    assert_eq!(r.message(), "registered session alice (27a468b0)");
}

#[test]
fn refusal_envelopes_carry_reason_errno_and_path() {
    for reason in Reason::ALL {
        let refusal = Refusal::new(reason, format!("because {reason}"));
        let r = Reply::refused(Some(Verb::Transfer), &refusal, Some("plan.md"));
        let b = r.body();
        assert_eq!(b["ok"], false);
        assert_eq!(b["verb"], "transfer");
        assert_eq!(b["reason"], reason.as_str());
        assert_eq!(b["errno"], reason.errno());
        assert_eq!(b["path"], "plan.md");
        assert_eq!(b["message"], format!("because {reason}"));
        assert_eq!(r.errno(), Some(reason.errno()));
        assert_eq!(r.reason(), Some(reason));
        let keys: Vec<&String> = b.as_object().unwrap().keys().collect();
        assert_eq!(keys.len(), 6, "{keys:?}");
    }
    let e = bad("nonsense");
    let b = e.reply().body().clone();
    assert_eq!(b["verb"], Value::Null);
    assert_eq!(b["path"], Value::Null);
    assert_eq!(b["reason"], "bad_request");
    assert_eq!(b["errno"], libc::EINVAL);
    let e = bad("accept ok.md /abs.md");
    assert_eq!(e.reply().body()["path"], "/abs.md");
    assert_eq!(e.reply().body()["verb"], "accept");
}

#[test]
fn record_lines_name_file_session_version_and_next_step() {
    let line = describe_record(Verb::Accept, &record("completed", true));
    assert!(
        line.starts_with("accepted plan.md (v2) from alice (27a468b0);"),
        "{line}"
    );
    let line = describe_record(Verb::Decline, &record("declined", false));
    assert_eq!(
        line,
        "declined plan.md (v2) from alice (27a468b0); alice can write it again"
    );
    let line = describe_record(Verb::Withdraw, &record("withdrawn", false));
    assert_eq!(
        line,
        "withdrew plan.md (v2) from bob (6e271ee6); you can write it again"
    );
    let mut over = record("overtaken", true);
    over["counterparty"] = "carol".into();
    let line = describe_record(Verb::Status, &over);
    assert_eq!(
        line,
        "plan.md (v2): alice (27a468b0) -> bob (6e271ee6), overtaken by carol; live: the giver \
         is fenced"
    );
    let two = describe_records(
        Verb::Withdraw,
        &[record("withdrawn", false), record("x", false)],
    );
    assert_eq!(two.matches(" | ").count(), 1);
    // hints quote awkward paths for the shell
    let mut odd = record("pending", true);
    odd["path"] = "my plan's.md".into();
    let line = describe_record(Verb::Transfer, &odd);
    assert!(
        line.ends_with(r"coherent withdraw 'my plan'\''s.md'"),
        "{line}"
    );
    // a record with missing fields still gives a line
    let line = describe_record(Verb::Transfer, &json!({}));
    assert!(line.contains("?"), "{line}");
}

#[test]
fn hints_are_relative_to_the_readers_directory() {
    assert_eq!(relative_from("plan.md", ""), "plan.md");
    assert_eq!(relative_from("sub/x.md", "sub"), "x.md");
    assert_eq!(relative_from("plan.md", "sub/deeper"), "../../plan.md");
    assert_eq!(relative_from("a/b/c", "a/x"), "../b/c");
    assert_eq!(relative_from("a", "a"), ".");
    let mut rec = record("pending", true);
    rec["path"] = "docs/plan.md".into();
    let line = describe_record_from(Verb::Transfer, &rec, |p| relative_from(p, "src"));
    assert!(line.starts_with("handed docs/plan.md (v2)"), "{line}");
    assert!(
        line.ends_with("coherent withdraw ../docs/plan.md"),
        "{line}"
    );
}

#[test]
fn shell_words() {
    assert_eq!(shell_word("src/lib.rs"), "src/lib.rs");
    assert_eq!(shell_word("-x"), "./-x");
    assert_eq!(shell_word("a b"), "'a b'");
    assert_eq!(shell_word("it's"), r"'it'\''s'");
    assert_eq!(shell_word(""), "''");
}

// ---- the ctl handle ---------------------------------------------------------------------

#[test]
fn ctl_handle_serves_stores_and_replaces_replies() {
    let mut h = CtlHandle::new();
    assert!(h.is_empty());
    assert_eq!(h.read(0, 4096), b"");

    let mut seen = None;
    let n = h
        .write(b"transfer --to bob plan.md\n", |req| {
            seen = Some(req.clone());
            Reply::records(Verb::Transfer, vec![record("pending", true)])
        })
        .unwrap();
    assert_eq!(n, 26);
    assert_eq!(
        seen,
        Some(Request::Transfer {
            paths: v(&["plan.md"]),
            to: "bob".into(),
            note: None
        })
    );
    let first = h.reply().to_vec();
    let body: Value = serde_json::from_slice(&first).unwrap();
    assert_eq!(body["ok"], true);
    // reads from any offset, in pieces, past the end
    let mut pieced = Vec::new();
    let mut off = 0u64;
    loop {
        let chunk = h.read(off, 7);
        if chunk.is_empty() {
            break;
        }
        pieced.extend_from_slice(chunk);
        off += chunk.len() as u64;
    }
    assert_eq!(pieced, first);
    assert_eq!(h.read(u64::MAX, u32::MAX), b"");
    assert_eq!(h.read(first.len() as u64 - 1, u32::MAX), b"\n");

    // a refused request fails the write with its errno, and the reply says why
    let errno = h
        .write(b"accept plan.md", |_| {
            Reply::refused(
                Some(Verb::Accept),
                &Refusal::new(Reason::HandoffNotSuccessor, "you are not bob"),
                Some("plan.md"),
            )
        })
        .unwrap_err();
    assert_eq!(errno, libc::EACCES);
    let body: Value = serde_json::from_slice(h.reply()).unwrap();
    assert_eq!(body["reason"], "handoff_not_successor");
    assert!(h.len() < first.len() || h.reply() != first.as_slice());

    // malformed: the service is never called, EINVAL, bad_request reply
    let errno = h
        .write(b"transfer plan.md", |_| panic!("must not be served"))
        .unwrap_err();
    assert_eq!(errno, libc::EINVAL);
    let body: Value = serde_json::from_slice(h.reply()).unwrap();
    assert_eq!(body["reason"], "bad_request");
    assert_eq!(body["verb"], "transfer");

    // each errno of docs/design.md#control-surface comes through
    for (reason, want) in [
        (Reason::NoSuchPath, libc::ENOENT),
        (Reason::HandoffSuccessorUnknown, libc::ESRCH),
        (Reason::HandoffInFlight, libc::EBUSY),
        (Reason::HandoffSuccessorMalformed, libc::EINVAL),
        (Reason::HandoffEnded, libc::EACCES),
    ] {
        let got = h
            .write(b"whoami", |_| {
                Reply::refused(Some(Verb::Whoami), &Refusal::new(reason, "x"), None)
            })
            .unwrap_err();
        assert_eq!(got, want, "{reason}");
    }

    // a later success replaces the refusal
    h.write(b"{\"verb\":\"status\"}", |_| {
        Reply::status(json!({}), "nothing")
    })
    .unwrap();
    let body: Value = serde_json::from_slice(h.reply()).unwrap();
    assert_eq!(body["verb"], "status");
    assert_eq!(body["ok"], true);
}

/// After a request, the first read marks the reply's first byte whatever offset the write
/// left (`echo whoami >&3; cat <&3`); the next request starts a new reply.
#[test]
fn ctl_handle_reads_the_reply_from_its_start_after_a_write() {
    let mut h = CtlHandle::new();
    let req = b"whoami\n";
    h.write(req, |_| Reply::ok(Verb::Whoami, Map::new(), "you"))
        .unwrap();
    let first = h.reply().to_vec();
    let at = req.len() as u64; // the offset the write left
    assert_eq!(h.read(at, 4096), &first[..]);
    assert_eq!(h.read(at + first.len() as u64, 4096), b"");
    assert_eq!(
        h.read(0, 3),
        &first[..3],
        "a pread below the mark is absolute"
    );

    let req2 = b"status\n";
    let at2 = at + first.len() as u64 + req2.len() as u64;
    h.write(req2, |_| Reply::ok(Verb::Status, Map::new(), "all"))
        .unwrap();
    let second = h.reply().to_vec();
    assert_ne!(first, second);
    assert_eq!(h.read(at2, 10), &second[..10]);
    assert_eq!(h.read(at2 + 10, 4096), &second[10..]);
}

/// The errno of a refused write is the typed refusal's, whatever the JSON says.
#[test]
fn a_refused_write_fails_with_the_refusals_errno() {
    let mut h = CtlHandle::new();
    for (reason, errno) in [
        (Reason::HandoffInFlight, libc::EBUSY),
        (Reason::NoSuchPath, libc::ENOENT),
        (Reason::HandoffSuccessorUnknown, libc::ESRCH),
        (Reason::HandoffNotHeld, libc::EACCES),
    ] {
        let got = h
            .write(b"withdraw plan.md", |_| {
                Reply::refused(Some(Verb::Withdraw), &Refusal::new(reason, "no"), None)
            })
            .unwrap_err();
        assert_eq!(got, errno, "{reason:?}");
        let body: Value = serde_json::from_slice(h.reply()).unwrap();
        assert_eq!(
            (&body["reason"], &body["errno"]),
            (&Value::from(reason.as_str()), &Value::from(errno))
        );
    }
    let io = h
        .write(b"status", |_| {
            Reply::failed(Some(Verb::Status), "io_error", libc::EIO, None, "disk")
        })
        .unwrap_err();
    assert_eq!(io, libc::EIO);
}
