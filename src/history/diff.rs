//! A line diff (Myers' O(ND) greedy algorithm) printed as a unified diff with three lines
//! of context, as `diff -u` prints it (`\ No newline at end of file` included).

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Same,
    Del,
    Add,
}

/// Beyond this many lines together, two versions are said to differ, not diffed (the
/// trace of the search grows with lines × differences).
const MAX_LINES: usize = 40_000;

fn lines(b: &[u8]) -> Vec<&[u8]> {
    b.split_inclusive(|&c| c == b'\n').collect()
}

/// The edit script from `a` to `b`: one op per line of a (`Same`/`Del`) or b (`Add`).
fn script(a: &[&[u8]], b: &[&[u8]]) -> Vec<Op> {
    let (n, m) = (a.len() as isize, b.len() as isize);
    let max = (n + m) as usize;
    let off = max as isize + 1;
    let mut v = vec![0isize; 2 * max + 3];
    let mut trace: Vec<Vec<isize>> = Vec::new();
    'outer: for d in 0..=max as isize {
        trace.push(v.clone());
        let mut k = -d;
        while k <= d {
            let i = (k + off) as usize;
            let mut x = if k == -d || (k != d && v[i - 1] < v[i + 1]) {
                v[i + 1]
            } else {
                v[i - 1] + 1
            };
            let mut y = x - k;
            while x < n && y < m && a[x as usize] == b[y as usize] {
                x += 1;
                y += 1;
            }
            v[i] = x;
            if x >= n && y >= m {
                break 'outer;
            }
            k += 2;
        }
    }
    // Walk back through the trace.
    let (mut x, mut y) = (n, m);
    let mut ops = Vec::new();
    for d in (0..trace.len() as isize).rev() {
        let v = &trace[d as usize];
        let k = x - y;
        let i = (k + off) as usize;
        let prev_k = if k == -d || (k != d && v[i - 1] < v[i + 1]) {
            k + 1
        } else {
            k - 1
        };
        let prev_x = v[(prev_k + off) as usize];
        let prev_y = prev_x - prev_k;
        while x > prev_x && y > prev_y {
            ops.push(Op::Same);
            x -= 1;
            y -= 1;
        }
        if d > 0 {
            if x == prev_x {
                ops.push(Op::Add);
                y -= 1;
            } else {
                ops.push(Op::Del);
                x -= 1;
            }
        }
    }
    ops.reverse();
    ops
}

fn push_line(out: &mut Vec<u8>, sign: u8, line: &[u8]) {
    out.push(sign);
    out.extend_from_slice(line);
    if !line.ends_with(b"\n") {
        out.extend_from_slice(b"\n\\ No newline at end of file\n");
    }
}

/// The unified diff of `a` (named `from`) and `b` (named `to`); empty when they are equal.
pub fn unified(from: &str, to: &str, a: &[u8], b: &[u8]) -> Vec<u8> {
    if a == b {
        return Vec::new();
    }
    let (la, lb) = (lines(a), lines(b));
    // As diff(1): bytes with a NUL are not text; and the trace is bounded.
    if a.contains(&0) || b.contains(&0) || la.len() + lb.len() > MAX_LINES {
        return format!("Binary files {from} and {to} differ\n").into_bytes();
    }
    let ops = script(&la, &lb);
    // Positions in a and b before each op.
    let mut pos = Vec::with_capacity(ops.len() + 1);
    let (mut i, mut j) = (0usize, 0usize);
    for op in &ops {
        pos.push((i, j));
        match op {
            Op::Same => {
                i += 1;
                j += 1;
            }
            Op::Del => i += 1,
            Op::Add => j += 1,
        }
    }
    pos.push((i, j));
    const CTX: usize = 3;
    let mut out = format!("--- {from}\n+++ {to}\n").into_bytes();
    let mut at = 0;
    while at < ops.len() {
        let Some(first) = (at..ops.len()).find(|&t| ops[t] != Op::Same) else {
            break;
        };
        let start = first.saturating_sub(CTX);
        // Extend the hunk while the next change is within 2*CTX same lines.
        let mut end = first;
        let mut t = first;
        while t < ops.len() {
            if ops[t] != Op::Same {
                end = t + 1;
                t += 1;
                continue;
            }
            let run = (t..ops.len()).take_while(|&u| ops[u] == Op::Same).count();
            if t + run < ops.len() && run <= 2 * CTX {
                t += run;
                continue;
            }
            break;
        }
        let stop = (end + CTX).min(ops.len());
        let (a0, b0) = pos[start];
        let (a1, b1) = pos[stop];
        let range = |s: usize, n: usize| match n {
            0 => format!("{s},0"),
            1 => format!("{}", s + 1),
            _ => format!("{},{n}", s + 1),
        };
        out.extend_from_slice(
            format!("@@ -{} +{} @@\n", range(a0, a1 - a0), range(b0, b1 - b0)).as_bytes(),
        );
        for (t, op) in ops.iter().enumerate().take(stop).skip(start) {
            let (i, j) = pos[t];
            match op {
                Op::Same => push_line(&mut out, b' ', la[i]),
                Op::Del => push_line(&mut out, b'-', la[i]),
                Op::Add => push_line(&mut out, b'+', lb[j]),
            }
        }
        at = stop;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(a: &[u8], b: &[u8]) -> Vec<u8> {
        // Replays the script: what it keeps and adds must be b.
        let (la, lb) = (lines(a), lines(b));
        let mut out = Vec::new();
        let (mut i, mut j) = (0, 0);
        for op in script(&la, &lb) {
            match op {
                Op::Same => {
                    assert_eq!(la[i], lb[j]);
                    out.extend_from_slice(lb[j]);
                    i += 1;
                    j += 1;
                }
                Op::Del => i += 1,
                Op::Add => {
                    out.extend_from_slice(lb[j]);
                    j += 1;
                }
            }
        }
        assert_eq!((i, j), (la.len(), lb.len()));
        out
    }

    #[test]
    fn the_script_turns_a_into_b() {
        let cases: [(&[u8], &[u8]); 6] = [
            (b"", b"x\n"),
            (b"x\n", b""),
            (b"a\nb\nc\n", b"a\nc\n"),
            (b"a\nb\nc\n", b"z\na\nb\nc\nd\n"),
            (b"1\n2\n3\n4\n5\n", b"5\n4\n3\n2\n1\n"),
            (b"a\nb", b"a\nb\n"),
        ];
        for (a, b) in cases {
            assert_eq!(apply(a, b), b);
        }
    }

    #[test]
    fn prints_what_diff_u_prints() {
        let a = b"one\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nnine\nten\n";
        let b = b"one\ntwo\nTHREE\nfour\nfive\nsix\nseven\neight\nnine\nten\neleven\n";
        let d = String::from_utf8(unified("a/f", "b/f", a, b)).unwrap();
        assert_eq!(
            d,
            "--- a/f\n+++ b/f\n@@ -1,6 +1,6 @@\n one\n two\n-three\n+THREE\n four\n five\n six\n\
             @@ -8,3 +8,4 @@\n eight\n nine\n ten\n+eleven\n"
        );
        assert!(unified("a", "b", a, a).is_empty());
        let d = String::from_utf8(unified("a", "b", b"", b"new")).unwrap();
        assert_eq!(
            d,
            "--- a\n+++ b\n@@ -0,0 +1 @@\n+new\n\\ No newline at end of file\n"
        );
    }
}
