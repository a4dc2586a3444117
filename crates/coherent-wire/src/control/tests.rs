use super::*;
use crate::error::{Reason, Refusal};
use crate::session::{SessionInfo, Via};
use serde_json::{json, Map, Value};

mod replies;

fn ok(s: &str) -> Request {
    match parse_request(s.as_bytes()) {
        Ok(r) => r,
        Err(e) => panic!("{s:?} should parse, got {e}"),
    }
}

fn err(s: &[u8]) -> RequestError {
    match parse_request(s) {
        Ok(r) => panic!(
            "{:?} should be refused, parsed as {r:?}",
            String::from_utf8_lossy(s)
        ),
        Err(e) => e,
    }
}

fn bad(s: &str) -> RequestError {
    let e = err(s.as_bytes());
    assert_eq!(e.refusal.reason, Reason::BadRequest, "{s:?}: {e}");
    e
}

fn v(paths: &[&str]) -> Vec<String> {
    paths.iter().map(|p| p.to_string()).collect()
}

// ---- paths ----------------------------------------------------------------------------

#[test]
fn normalises_paths_lexically() {
    let cases = [
        ("plan.md", "plan.md"),
        ("./plan.md", "plan.md"),
        ("././plan.md", "plan.md"),
        ("src//lib.rs", "src/lib.rs"),
        ("src/./lib.rs", "src/lib.rs"),
        ("src/../plan.md", "plan.md"),
        ("a/b/c/../../d", "a/d"),
        ("dir/", "dir"),
        ("dir//", "dir"),
        ("a b/c d.txt", "a b/c d.txt"),
        ("..hidden", "..hidden"),
        ("...", "..."),
        ("x/.coherent", "x/.coherent"),
        (".coherentish/file", ".coherentish/file"),
        ("ünïcødé/文件", "ünïcødé/文件"),
        ("line\nbreak", "line\nbreak"),
    ];
    for (raw, want) in cases {
        assert_eq!(normalize_path(raw).as_deref(), Ok(want), "{raw:?}");
    }
}

#[test]
fn refuses_paths_that_leave_or_miss_the_root() {
    for raw in [
        "",
        ".",
        "./",
        "a/..",
        "..",
        "../x",
        "a/../../x",
        "a/../b/../../x",
        "/etc/passwd",
        "/",
        "//x",
        "nul\0byte",
        ".coherent",
        ".coherent/ctl",
        "./.coherent/why",
        "x/../.coherent/events",
        "x/..//.coherent",
    ] {
        let r = normalize_path(raw).expect_err(raw);
        assert_eq!(r.reason, Reason::BadRequest, "{raw:?}");
        assert!(
            r.message.contains("relative to the mount root"),
            "{}",
            r.message
        );
    }
}

#[test]
fn refuses_overlong_paths() {
    let long = "a/".repeat(MAX_PATH);
    let r = normalize_path(&long).unwrap_err();
    assert_eq!(r.reason, Reason::BadRequest);
    // the message quotes a bounded prefix, never the whole argument
    assert!(r.message.len() < 600, "{}", r.message.len());
    let just_fits = "a".repeat(MAX_PATH);
    assert_eq!(normalize_path(&just_fits).unwrap().len(), MAX_PATH);
}

// ---- plain lines ------------------------------------------------------------------------

#[test]
fn plain_transfer_in_every_order() {
    let want = Request::Transfer {
        paths: v(&["plan.md"]),
        to: "bob".into(),
        note: None,
    };
    for line in [
        "transfer --to bob plan.md",
        "transfer plan.md --to bob",
        "transfer --to=bob plan.md",
        "transfer plan.md --to=bob\n",
        "  transfer   --to   bob   ./plan.md  \r\n",
        "TRANSFER --to bob plan.md",
        "transfer\t--to\tbob\tplan.md",
    ] {
        assert_eq!(ok(line), want, "{line:?}");
    }
}

#[test]
fn plain_transfer_with_notes_and_quoting() {
    assert_eq!(
        ok(r#"transfer --to bob --note "review the API section, then merge" plan.md src/x.rs"#),
        Request::Transfer {
            paths: v(&["plan.md", "src/x.rs"]),
            to: "bob".into(),
            note: Some("review the API section, then merge".into()),
        }
    );
    assert_eq!(
        ok(r#"transfer plan.md --note "say \"hi\"\nback\\slash\ttab" --to 6e271ee6"#),
        Request::Transfer {
            paths: v(&["plan.md"]),
            to: "6e271ee6".into(),
            note: Some("say \"hi\"\nback\\slash\ttab".into()),
        }
    );
    assert_eq!(
        ok(r#"transfer --to bob --note 'it''s "literal" \n' plan.md"#),
        Request::Transfer {
            paths: v(&["plan.md"]),
            to: "bob".into(),
            note: Some(r#"its "literal" \n"#.into()),
        }
    );
    assert_eq!(
        ok(r#"transfer --to bob "--note=with space" "my file.md" my\ other.md"#),
        Request::Transfer {
            paths: v(&["my file.md", "my other.md"]),
            to: "bob".into(),
            note: Some("with space".into()),
        }
    );
    // a quoted newline is part of the note, not a second request
    assert_eq!(
        ok("transfer --to bob --note \"two\nlines\" plan.md"),
        Request::Transfer {
            paths: v(&["plan.md"]),
            to: "bob".into(),
            note: Some("two\nlines".into()),
        }
    );
    // an empty note is no note
    assert_eq!(
        ok(r#"transfer --to bob --note "" plan.md"#),
        Request::Transfer {
            paths: v(&["plan.md"]),
            to: "bob".into(),
            note: None,
        }
    );
}

#[test]
fn double_dash_ends_options_and_duplicates_collapse() {
    assert_eq!(
        ok("transfer --to bob -- --weird-name.md -x plan.md ./plan.md"),
        Request::Transfer {
            paths: v(&["--weird-name.md", "-x", "plan.md"]),
            to: "bob".into(),
            note: None,
        }
    );
    assert_eq!(
        ok("accept - a/../plan.md plan.md"),
        Request::Accept {
            paths: v(&["-", "plan.md"])
        }
    );
}

#[test]
fn plain_single_verbs() {
    assert_eq!(
        ok("accept plan.md notes/x.md"),
        Request::Accept {
            paths: v(&["plan.md", "notes/x.md"])
        }
    );
    assert_eq!(
        ok("decline ./plan.md"),
        Request::Decline {
            paths: v(&["plan.md"])
        }
    );
    assert_eq!(
        ok("withdraw plan.md\n"),
        Request::Withdraw {
            paths: v(&["plan.md"])
        }
    );
    assert_eq!(ok("status"), Request::Status { path: None });
    assert_eq!(
        ok("status src//lib.rs"),
        Request::Status {
            path: Some("src/lib.rs".into())
        }
    );
    assert_eq!(ok("whoami\n"), Request::Whoami);
    assert_eq!(ok("register"), Request::Register { name: None });
    assert_eq!(
        ok("register bob"),
        Request::Register {
            name: Some("bob".into())
        }
    );
}

#[test]
fn plain_refusals_say_what_is_valid() {
    let e = bad("transfer plan.md");
    assert!(e.refusal.message.contains("missing --to"), "{e}");
    assert!(e.refusal.message.contains("transfer --to SESSION"), "{e}");
    assert_eq!(e.verb, Some(Verb::Transfer));

    for (line, says) in [
        ("transfer --to bob", "no path given"),
        ("transfer --to", "--to needs a value"),
        ("transfer plan.md --to", "--to needs a value"),
        ("transfer --to bob --to carol plan.md", "--to given twice"),
        ("transfer --to= plan.md", "--to is empty"),
        ("transfer --to bob --force plan.md", "unknown option"),
        ("accept --to bob plan.md", "unknown option"),
        ("accept", "no path given"),
        ("decline", "no path given"),
        ("withdraw", "no path given"),
        ("status a b", "at most one path"),
        ("whoami extra", "takes no arguments"),
        ("register a b", "at most one name"),
        ("register a/b", "may hold only"),
        ("register ..", "cannot be . or .."),
        ("register \"\"", "cannot be empty"),
        ("frobnicate plan.md", "unknown verb"),
        ("transfer --to bob \"plan.md", "unterminated double quote"),
        ("transfer --to bob 'plan.md", "unterminated single quote"),
        ("transfer --to bob \"plan.md\\", "unterminated double quote"),
        ("transfer --to bob plan.md \\", "lone backslash"),
        ("accept plan.md\naccept other.md", "second line"),
        ("accept /etc/passwd", "is absolute"),
        ("accept ../outside", "leaves the mount root"),
        ("accept .coherent/ctl", "control directory"),
        ("accept .", "names the mount root"),
        ("\"\"", "unknown verb"),
    ] {
        let e = bad(line);
        assert!(e.refusal.message.contains(says), "{line:?}: {e}");
        assert!(
            e.refusal.message.contains("expected `")
                || e.refusal.message.contains("valid requests:")
                || e.refusal.message.contains("relative to the mount root")
                || e.refusal.message.starts_with("invalid session name"),
            "{line:?} does not say what is valid: {e}"
        );
    }
    // an unknown verb lists every verb
    let e = bad("frobnicate");
    for verb in Verb::ALL {
        assert!(e.refusal.message.contains(verb.as_str()), "{e}");
    }
    assert_eq!(e.verb, None);
    // a bad path names it in the reply
    let e = bad("transfer --to bob ok.md ../up.md");
    assert_eq!(e.path.as_deref(), Some("../up.md"));
}

#[test]
fn malformed_successor_is_its_own_reason() {
    for line in [
        "transfer --to \"bo\\tb\" plan.md".to_string(),
        format!("transfer --to {} plan.md", "x".repeat(MAX_NAME + 1)),
    ] {
        let e = err(line.as_bytes());
        assert_eq!(e.refusal.reason, Reason::HandoffSuccessorMalformed, "{e}");
        assert_eq!(e.refusal.errno(), libc::EINVAL);
    }
}

// ---- JSON -------------------------------------------------------------------------------

#[test]
fn json_requests() {
    assert_eq!(
        ok(r#"{"verb":"transfer","paths":["plan.md","./a//b"],"to":"bob","note":"n"}"#),
        Request::Transfer {
            paths: v(&["plan.md", "a/b"]),
            to: "bob".into(),
            note: Some("n".into()),
        }
    );
    assert_eq!(
        ok(r#"  {"verb":"transfer","path":"plan.md","to":"bob","note":null}  "#),
        Request::Transfer {
            paths: v(&["plan.md"]),
            to: "bob".into(),
            note: None,
        }
    );
    assert_eq!(
        ok(r#"{"verb":"accept","path":"plan.md"}"#),
        Request::Accept {
            paths: v(&["plan.md"])
        }
    );
    assert_eq!(
        ok(r#"{"verb":"withdraw","paths":["a","b"]}"#),
        Request::Withdraw {
            paths: v(&["a", "b"])
        }
    );
    assert_eq!(ok(r#"{"verb":"status"}"#), Request::Status { path: None });
    assert_eq!(
        ok(r#"{"verb":"status","path":"x"}"#),
        Request::Status {
            path: Some("x".into())
        }
    );
    assert_eq!(ok(r#"{"verb":"whoami"}"#), Request::Whoami);
    assert_eq!(ok("{\"verb\":\"WhoAmI\"}\n"), Request::Whoami);
    assert_eq!(
        ok(r#"{"verb":"register","name":"carol"}"#),
        Request::Register {
            name: Some("carol".into())
        }
    );
    // a note with every awkward character JSON can carry (but NUL)
    let note = "quotes \" back\\slash\nnew line, tab\t, emoji 🎉, and spaces";
    let req = json!({"verb":"transfer","paths":["p"],"to":"bob","note":note}).to_string();
    assert_eq!(
        ok(&req),
        Request::Transfer {
            paths: v(&["p"]),
            to: "bob".into(),
            note: Some(note.into()),
        }
    );
}

#[test]
fn json_refusals() {
    for (text, says) in [
        ("{", "invalid JSON"),
        ("{}", "no \"verb\""),
        (r#"{"verb":7}"#, "must be a string"),
        (r#"{"verb":"nope"}"#, "unknown verb"),
        (r#"{"verb":"transfer","paths":["p"]}"#, "missing --to"),
        (r#"{"verb":"transfer","to":"bob"}"#, "no path given"),
        (
            r#"{"verb":"transfer","paths":[],"to":"bob"}"#,
            "no path given",
        ),
        (
            r#"{"verb":"transfer","paths":"p","to":"bob"}"#,
            "array of strings",
        ),
        (
            r#"{"verb":"transfer","paths":[1],"to":"bob"}"#,
            "array of strings",
        ),
        (
            r#"{"verb":"transfer","paths":["p"],"to":5}"#,
            "\"to\" must be a string",
        ),
        (
            r#"{"verb":"transfer","paths":["p"],"to":"bob","tO":"x"}"#,
            "unknown field",
        ),
        (
            r#"{"verb":"transfer","path":"p","paths":["q"],"to":"b"}"#,
            "not both",
        ),
        (r#"{"verb":"accept","path":"/abs"}"#, "is absolute"),
        (
            r#"{"verb":"accept","path":"p","to":"bob"}"#,
            "unknown field",
        ),
        (r#"{"verb":"whoami","path":"p"}"#, "unknown field"),
        (r#"{"verb":"status","paths":["a","b"]}"#, "at most one path"),
        (
            r#"{"verb":"transfer","paths":["p"],"to":"bob","note":"a\u0000b"}"#,
            "NUL",
        ),
        (r#"{"verb":"accept","path":"a\u0000b"}"#, "NUL"),
        (r#"{"verb":"register","name":"a/b"}"#, "may hold only"),
    ] {
        let e = bad(text);
        assert!(e.refusal.message.contains(says), "{text}: {e}");
    }
    for text in [r#"["transfer"]"#, "{\"verb\":\"whoami\"} trailing"] {
        bad(text);
    }
}

#[test]
fn to_json_round_trips() {
    for req in [
        Request::Transfer {
            paths: v(&["a b", "c/d"]),
            to: "bob".into(),
            note: Some("x \"y\"\n".into()),
        },
        Request::Transfer {
            paths: v(&["p"]),
            to: "6e271ee6".into(),
            note: None,
        },
        Request::Accept { paths: v(&["p"]) },
        Request::Decline { paths: v(&["p"]) },
        Request::Withdraw {
            paths: v(&["p", "q"]),
        },
        Request::Status { path: None },
        Request::Status {
            path: Some("s".into()),
        },
        Request::Whoami,
        Request::Register { name: None },
        Request::Register {
            name: Some("n".into()),
        },
        Request::Wait {
            path: "p".into(),
            until: crate::control::Until::Accepted,
            timeout_ms: Some(1500),
        },
        Request::Wait {
            path: "p".into(),
            until: crate::control::Until::Ended,
            timeout_ms: None,
        },
        Request::WaitStanding {
            path: "p".into(),
            until: crate::control::Until::Completed,
        },
        Request::WaitReport,
    ] {
        let bytes = serde_json::to_vec(&req.to_json()).unwrap();
        assert_eq!(parse_request(&bytes).unwrap(), req);
    }
}

// ---- wait ----------------------------------------------------------------------------

#[test]
fn standing_wait_requests() {
    use crate::control::Until;
    let s = |path: &str, until| Request::WaitStanding {
        path: path.into(),
        until,
    };
    assert_eq!(ok("wait plan.md --standing"), s("plan.md", Until::Ended));
    assert_eq!(
        ok("wait --standing ./plan.md accepted"),
        s("plan.md", Until::Accepted)
    );
    assert_eq!(
        ok(r#"{"verb":"wait","path":"plan.md","until":"completed","standing":true}"#),
        s("plan.md", Until::Completed)
    );
    // `"standing": false` is an ordinary wait
    assert!(matches!(
        ok(r#"{"verb":"wait","path":"plan.md","standing":false}"#),
        Request::Wait { .. }
    ));
    assert_eq!(ok("wait --report"), Request::WaitReport);
    assert_eq!(ok(r#"{"verb":"wait","report":true}"#), Request::WaitReport);
    for b in [
        "wait --standing",
        "wait plan.md --standing --standing",
        "wait plan.md --standing --timeout 1",
        "wait plan.md soon --standing",
        "wait plan.md --report",
        "wait --report --standing",
        "wait --report --timeout 1",
        "wait --standing=yes plan.md",
        "status --standing",
    ] {
        bad(b);
    }
    bad(r#"{"verb":"wait","path":"a","standing":"yes"}"#);
    bad(r#"{"verb":"wait","path":"a","report":true}"#);
    bad(r#"{"verb":"status","standing":true}"#);
}

#[test]
fn wait_requests() {
    use crate::control::Until;
    let w = |path: &str, until, timeout_ms| Request::Wait {
        path: path.into(),
        until,
        timeout_ms,
    };
    assert_eq!(ok("wait plan.md"), w("plan.md", Until::Ended, None));
    assert_eq!(
        ok("wait ./a/../plan.md completed\n"),
        w("plan.md", Until::Completed, None)
    );
    assert_eq!(
        ok("WAIT plan.md --timeout 2.5 accepted"),
        w("plan.md", Until::Accepted, Some(2500))
    );
    // the server's cap
    assert_eq!(
        ok("wait plan.md --timeout=1e9"),
        w("plan.md", Until::Ended, Some(30_000))
    );
    assert_eq!(
        ok(r#"{"verb":"wait","path":"plan.md","until":"completed","timeout":0}"#),
        w("plan.md", Until::Completed, Some(0))
    );
    for b in [
        "wait",
        "wait plan.md soon",
        "wait plan.md ended more",
        "wait plan.md --timeout -1",
        "wait plan.md --timeout nan",
        "wait plan.md --to bob",
        "wait /abs",
    ] {
        bad(b);
    }
    bad(r#"{"verb":"wait","paths":["a"]}"#);
    bad(r#"{"verb":"wait","path":"a","timeout":[1]}"#);
    assert_eq!(Verb::parse("wait"), Some(Verb::Wait));
}

// ---- hostile input ----------------------------------------------------------------------

#[test]
fn hostile_input_is_refused_not_panicked_on() {
    // too large
    let huge = vec![b'a'; MAX_REQUEST + 1];
    let e = bad(std::str::from_utf8(&huge).unwrap());
    assert!(e.refusal.message.contains("larger than the limit"), "{e}");
    assert!(e.refusal.message.len() < 1000);
    // binary
    let e = err(&[0xff, 0xfe, 0x00, 0x01]);
    assert_eq!(e.refusal.reason, Reason::BadRequest);
    assert!(e.refusal.message.contains("not UTF-8"), "{e}");
    let e = err(b"accept pl\0an.md");
    assert!(e.refusal.message.contains("NUL"), "{e}");
    // empty and blank
    for s in [&b""[..], b"\n", b"   \t\r\n"] {
        let e = err(s);
        assert!(e.refusal.message.contains("empty request"), "{e}");
    }
    // note too long, in both syntaxes
    let note = "n".repeat(MAX_NOTE + 1);
    let e = bad(&format!("transfer --to bob --note {note} p"));
    assert!(e.refusal.message.contains("limit is 65536"), "{e}");
    let e = bad(&json!({"verb":"transfer","path":"p","to":"bob","note":note}).to_string());
    assert!(e.refusal.message.contains("limit is 65536"), "{e}");
    // a note of exactly the limit is fine
    let note = "n".repeat(MAX_NOTE);
    assert!(matches!(
        ok(&format!("transfer --to bob --note {note} p")),
        Request::Transfer { note: Some(n), .. } if n.len() == MAX_NOTE
    ));
    // deeply nested JSON is refused by the parser's recursion limit, not a stack overflow
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    bad(&format!("{{\"verb\":\"whoami\",\"x\":{deep}}}"));
    // many paths up to the size limit are fine (and deduplicated in linear time)
    let many: Vec<String> = (0..150_000).map(|i| format!("f{}", i % 100_000)).collect();
    let line = format!("accept {}", many.join(" "));
    assert!(line.len() < MAX_REQUEST);
    match ok(&line) {
        Request::Accept { paths } => assert_eq!(paths.len(), 100_000),
        other => panic!("{other:?}"),
    }
}

proptest::proptest! {
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
        match parse_request(&bytes) {
            Ok(req) => {
                for p in req.paths() {
                    proptest::prop_assert!(normalize_path(p).as_deref() == Ok(p.as_str()));
                }
            }
            Err(e) => {
                let body = e.reply().body().clone();
                proptest::prop_assert_eq!(&body["ok"], &Value::Bool(false));
            }
        }
    }

    #[test]
    fn arbitrary_lines_never_panic(line in "[a-z\"'\\\\ \\-=./\n]{0,80}") {
        let _ = parse_request(line.as_bytes());
    }

    #[test]
    fn normalised_paths_stay_inside(raw in "[a./]{0,24}") {
        if let Ok(p) = normalize_path(&raw) {
            proptest::prop_assert!(!p.is_empty());
            proptest::prop_assert!(!p.starts_with('/'));
            proptest::prop_assert!(p.split('/').all(|c| !c.is_empty() && c != "." && c != ".."));
            proptest::prop_assert_eq!(normalize_path(&p), Ok(p.clone()));
        }
    }

    #[test]
    fn quoted_args_round_trip(arg in "\\PC{0,40}") {
        // any printable text survives double-quoting with escapes
        let quoted = format!("\"{}\"", arg.replace('\\', "\\\\").replace('"', "\\\""));
        let toks = tokenize(&format!("x {quoted} y")).unwrap();
        proptest::prop_assert_eq!(toks, vec!["x".to_string(), arg, "y".to_string()]);
    }
}
