//! The regression gate of scripts/bench.sh (`--check`): its compare step
//! (scripts/bench-gate.py) on fixed inputs, no mount and no benchmark run. A row 15 % worse
//! than the baseline fails the gate, 5 % passes, a move inside the runs' spread passes, a
//! row the run lost fails; and the rows step computes the ratio of medians and the spread
//! from raw timings as documented.

use std::path::Path;
use std::process::{Command, Output};

const GATE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/bench-gate.py");
const HEADER: &str = "backing\tworkload\tmode\tratio\tspread\truns\n";

/// A rows file: a '#' header as --record writes it, then `rows` (workload, mode, ratio, spread).
fn rows_file(dir: &Path, name: &str, rows: &[(&str, &str, &str, &str)]) -> String {
    let mut text = format!("# date: fixed\n# args: --runs 5\n{HEADER}");
    for (w, m, ratio, spread) in rows {
        text.push_str(&format!("ext4\t{w}\t{m}\t{ratio}\t{spread}\t5\n"));
    }
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

fn gate(args: &[&str]) -> (i32, String) {
    let out: Output = Command::new("python3")
        .arg(GATE)
        .args(args)
        .output()
        .expect("python3 runs (bash scripts/deps.sh installs it)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().expect("exited"), text)
}

/// The table line of one row (`| workload | mode | ...`).
fn row<'a>(report: &'a str, workload: &str, mode: &str) -> &'a str {
    let start = format!("| {workload} | {mode} |");
    report
        .lines()
        .find(|l| l.starts_with(&start))
        .unwrap_or_else(|| panic!("no row {workload}/{mode} in the report:\n{report}"))
}

const BASELINE: &[(&str, &str, &str, &str)] = &[
    ("create_small", "coherent", "2.0000", "0.0200"),
    ("rm_rf", "coherent", "1.5000", "0.0100"),
    ("grep", "coherent", "1.2000", "0.0100"),
    ("rg", "bindfs", "3.0000", "0.2500"),
];

#[test]
fn a_row_15_percent_worse_fails_the_gate() {
    let d = tempfile::tempdir().unwrap();
    let base = rows_file(d.path(), "base", BASELINE);
    let cur = rows_file(
        d.path(),
        "cur",
        &[
            ("create_small", "coherent", "2.3000", "0.0200"), // +15 %
            ("rm_rf", "coherent", "1.5000", "0.0100"),
            ("grep", "coherent", "1.2000", "0.0100"),
            ("rg", "bindfs", "3.0000", "0.2500"),
        ],
    );
    let (rc, report) = gate(&["compare", &base, &cur]);
    assert_eq!(rc, 1, "a row 15 % worse must fail the gate:\n{report}");
    let line = row(&report, "create_small", "coherent");
    assert!(
        line.contains("+15.0%") && line.ends_with("| WORSE |"),
        "{line}"
    );
    assert!(report.contains("1 worse"), "{report}");
    assert!(row(&report, "rm_rf", "coherent").ends_with("| ok |"));
}

#[test]
fn a_row_5_percent_worse_passes() {
    let d = tempfile::tempdir().unwrap();
    let base = rows_file(d.path(), "base", BASELINE);
    let cur = rows_file(
        d.path(),
        "cur",
        &[
            ("create_small", "coherent", "2.1000", "0.0200"), // +5 %
            ("rm_rf", "coherent", "1.4000", "0.0100"),        // better
            ("grep", "coherent", "1.2000", "0.0100"),
            ("rg", "bindfs", "3.0000", "0.2500"),
        ],
    );
    let (rc, report) = gate(&["compare", &base, &cur]);
    assert_eq!(rc, 0, "a row 5 % worse must pass:\n{report}");
    assert!(row(&report, "create_small", "coherent").ends_with("| ok |"));
    assert!(report.contains(": pass"), "{report}");
}

#[test]
fn a_move_inside_the_spread_passes() {
    // +15 % on a row whose rounds stray by 0.25 each side: 0.45 < 0.25 + 0.25, noise.
    let d = tempfile::tempdir().unwrap();
    let base = rows_file(d.path(), "base", BASELINE);
    let mut now: Vec<_> = BASELINE[..3].to_vec();
    now.push(("rg", "bindfs", "3.4500", "0.2500"));
    let cur = rows_file(d.path(), "cur", &now);
    let (rc, report) = gate(&["compare", &base, &cur]);
    assert_eq!(
        rc, 0,
        "a move inside the spread is not a regression:\n{report}"
    );
    assert!(row(&report, "rg", "bindfs").ends_with("| within spread |"));
    // the same move with a steady run is past the spread: it fails
    let cur = rows_file(
        d.path(),
        "cur2",
        &[
            BASELINE[0],
            BASELINE[1],
            BASELINE[2],
            ("rg", "bindfs", "3.4500", "0.0100"),
        ],
    );
    let base = rows_file(
        d.path(),
        "base2",
        &[
            BASELINE[0],
            BASELINE[1],
            BASELINE[2],
            ("rg", "bindfs", "3.0000", "0.0100"),
        ],
    );
    let (rc, report) = gate(&["compare", &base, &cur]);
    assert_eq!(rc, 1, "+15 % past a small spread fails:\n{report}");
    assert!(row(&report, "rg", "bindfs").ends_with("| WORSE |"));
}

#[test]
fn a_missing_row_is_reported_and_fails() {
    let d = tempfile::tempdir().unwrap();
    let base = rows_file(d.path(), "base", BASELINE);
    // grep is gone; rm_rf ran but failed (no ratio); a new row is shown, not gated
    let cur = rows_file(
        d.path(),
        "cur",
        &[
            BASELINE[0],
            ("rm_rf", "coherent", "", ""),
            BASELINE[3],
            ("git_status", "coherent", "1.1000", "0.0100"),
        ],
    );
    let (rc, report) = gate(&["compare", &base, &cur]);
    assert_eq!(rc, 1, "a missing row must fail the gate:\n{report}");
    assert!(row(&report, "grep", "coherent").ends_with("| MISSING |"));
    assert!(row(&report, "rm_rf", "coherent").ends_with("| MISSING |"));
    assert!(row(&report, "git_status", "coherent").ends_with("| new (not gated) |"));
    assert!(report.contains("2 missing: FAIL"), "{report}");
}

#[test]
fn rows_are_the_ratio_of_medians_with_the_rounds_spread() {
    let d = tempfile::tempdir().unwrap();
    let raw = d.path().join("raw.tsv");
    // native 1.0, 1.1, 0.9; coherent 2.0, 2.4, 1.9 (a failed fourth round is left out);
    // per-round ratios 2.0, 2.1818, 2.1111: median 2.1111, deviations 0.1111, 0.0707, 0
    let mut text = String::from("backing\tmode\tworkload\trun\tseconds\n");
    for (run, n, c) in [(1, "1.0", "2.0"), (2, "1.1", "2.4"), (3, "0.9", "1.9")] {
        text.push_str(&format!("ext4\tnative\tcreate_small\t{run}\t{n}\n"));
        text.push_str(&format!("ext4\tcoherent\tcreate_small\t{run}\t{c}\n"));
        text.push_str(&format!("tmpfs\tcoherent\tcreate_small\t{run}\t9\n"));
    }
    text.push_str("ext4\tcoherent\tcreate_small\t4\tFAILED\n");
    std::fs::write(&raw, text).unwrap();
    let (rc, out) = gate(&["rows", raw.to_str().unwrap(), "ext4"]);
    assert_eq!(rc, 0, "{out}");
    assert_eq!(
        out,
        format!("{HEADER}ext4\tcreate_small\tcoherent\t2.0000\t0.0707\t3\n"),
        "ratio = median 2.0 / median 1.0, spread = MAD of the per-round ratios"
    );
}

#[test]
fn a_file_that_is_not_a_rows_file_is_a_clear_error() {
    let d = tempfile::tempdir().unwrap();
    let base = rows_file(d.path(), "base", BASELINE);
    let junk = d.path().join("junk");
    std::fs::write(&junk, "workload ratio\ncopy 2\n").unwrap();
    let (rc, out) = gate(&["compare", &base, junk.to_str().unwrap()]);
    assert_eq!(rc, 2, "{out}");
    assert!(out.contains("expected a header line"), "{out}");
    assert!(
        out.contains("bench.sh --record"),
        "says what writes one: {out}"
    );
}
