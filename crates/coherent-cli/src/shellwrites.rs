//! Which files a shell command would write, read from its syntax (brush-parser's bash
//! parser, not patterns over the text): redirections (`>`, `>>`, `>|`, `<>`, `&>`), `tee`,
//! `sed -i`, `perl -i`, `cp`/`mv`/`install`/`rsync` targets (and `mv`'s sources), `ln`,
//! `truncate`, `touch`, `rm`, `chmod`/`chown`, `dd of=`, `git checkout`/`restore` of paths,
//! `git stash`/`reset --hard`/`checkout -f` (every modified file), here-documents into
//! files, through `sudo`/`env`/`command`/`nice`/`timeout`/`xargs`, `sh -c`/`bash -c`, `cd`,
//! pipelines, lists, subshells, braces, `if`/`for`/`while`/`case` and functions.
//!
//! A word the shell would expand at run time (`$VAR`, `$(...)`) is not guessed at: it is
//! left out. A glob in the last component is matched against the directory.

use brush_parser::ast;
use std::path::{Path, PathBuf};

/// One file (or tree) the command would write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// Absolute, lexically normalised.
    pub path: PathBuf,
    /// The path and everything under it (`rm -r DIR`, `git checkout .`).
    pub tree: bool,
    /// Only if the file differs from git's HEAD (`git stash`, `git reset --hard`).
    pub if_modified: bool,
    /// What writes it: `> redirection`, `sed -i`, ...
    pub how: String,
    /// `git checkout`/`restore` of pathspecs: git writes only the files that differ from
    /// the source, so ask git which (the paths above are what the words name, for when
    /// git cannot answer).
    pub git: Option<GitCheck>,
}

/// Which paths a `git checkout`/`git restore` of pathspecs would change: those `git diff
/// --name-only [SOURCE] -- PATHSPEC...`, run in `dir`, lists (the work tree against the
/// index, or against SOURCE).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GitCheck {
    pub dir: PathBuf,
    /// The tree-ish the files come from; None: the index.
    pub source: Option<String>,
    pub pathspec: Vec<String>,
}

/// The targets of `command` run in `cwd`; None if it does not parse.
pub fn targets(command: &str, cwd: &Path) -> Option<Vec<Target>> {
    let mut w = Walker {
        cwd: cwd.to_path_buf(),
        out: Vec::new(),
        depth: 0,
    };
    w.source(command)?;
    Some(w.out)
}

struct Walker {
    cwd: PathBuf,
    out: Vec<Target>,
    depth: usize,
}

/// A word after quote removal: its text, or None when the shell would expand it at run time.
enum Lit {
    Text(String),
    Glob(String),
}

/// Quote removal for a word with no expansions; `~/` expanded from HOME.
fn literal(word: &str) -> Option<Lit> {
    let mut out = String::new();
    let mut glob = false;
    let mut chars = word.chars().peekable();
    if word == "~" || word.starts_with("~/") {
        out.push_str(&std::env::var("HOME").ok()?);
        chars.next();
    }
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                for d in chars.by_ref() {
                    if d == '\'' {
                        break;
                    }
                    out.push(d);
                }
            }
            '"' => loop {
                match chars.next()? {
                    '"' => break,
                    '\\' => match chars.next()? {
                        d @ ('$' | '`' | '"' | '\\') => out.push(d),
                        '\n' => {}
                        d => {
                            out.push('\\');
                            out.push(d);
                        }
                    },
                    '$' | '`' => return None,
                    d => out.push(d),
                }
            },
            '\\' => out.push(chars.next()?),
            '$' | '`' => return None,
            '*' | '?' | '[' => {
                glob = true;
                out.push(c);
            }
            c => out.push(c),
        }
    }
    Some(if glob { Lit::Glob(out) } else { Lit::Text(out) })
}

/// The words of a simple command as plain strings (None for one that expands).
fn plain(word: &str) -> Option<String> {
    match literal(word)? {
        Lit::Text(t) | Lit::Glob(t) => Some(t),
    }
}

/// `*` and `?` against one name.
fn matches(pat: &[char], name: &[char]) -> bool {
    match (pat.first(), name.first()) {
        (None, None) => true,
        (Some('*'), _) => {
            matches(&pat[1..], name) || (!name.is_empty() && matches(pat, &name[1..]))
        }
        (Some('?'), Some(_)) => matches(&pat[1..], &name[1..]),
        (Some(p), Some(n)) if p == n => matches(&pat[1..], &name[1..]),
        _ => false,
    }
}

fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::Normal(n) => out.push(n),
            _ => {}
        }
    }
    out
}

/// How each command names what it writes, by program name (the last component of its
/// first word). For a command not listed only its redirections count.
const COMMANDS: &[(&str, Rule)] = &[
    // wrappers: the rest is a command line of its own
    ("sudo", WRAP),
    ("doas", WRAP),
    ("command", WRAP),
    ("builtin", WRAP),
    ("exec", WRAP),
    ("nohup", WRAP),
    ("time", WRAP),
    ("xargs", WRAP),
    ("stdbuf", WRAP),
    ("ionice", WRAP),
    ("chronic", WRAP),
    ("env", ENV),
    ("nice", NICE),
    ("timeout", TIMEOUT),
    // shell text of its own, and where relative paths start
    ("sh", Rule::Walk(Walker::shell)),
    ("bash", Rule::Walk(Walker::shell)),
    ("dash", Rule::Walk(Walker::shell)),
    ("zsh", Rule::Walk(Walker::shell)),
    ("eval", Rule::Walk(Walker::eval)),
    ("cd", Rule::Walk(Walker::cd)),
    ("pushd", Rule::Walk(Walker::cd)),
    // writers of their operands
    ("tee", FILES),
    ("sed", SED),
    ("gsed", SED),
    ("truncate", TRUNCATE),
    ("touch", TOUCH),
    ("rm", RM),
    ("unlink", RM),
    ("shred", RM),
    ("chmod", CHMOD),
    ("chown", CHMOD),
    ("chgrp", CHMOD),
    ("setfacl", CHMOD),
    ("chattr", CHMOD),
    // writers whose words need reading of their own
    ("perl", Rule::Walk(Walker::perl)),
    ("cp", Rule::Walk(Walker::copy)),
    ("mv", Rule::Walk(Walker::copy)),
    ("install", Rule::Walk(Walker::copy)),
    ("rsync", Rule::Walk(Walker::copy)),
    ("ln", Rule::Walk(Walker::link)),
    ("dd", Rule::Walk(Walker::dd)),
    ("git", Rule::Walk(Walker::git)),
];

/// How one command's words name what it writes: a row of [`COMMANDS`].
enum Rule {
    /// Runs the rest of its words as a command line of its own.
    Wrapper(Wrap),
    /// Writes each of its operands.
    Operands(Operands),
    /// Its words need reading of their own (a target, a script, a subcommand).
    Walk(fn(&mut Walker, &str, &[String])),
}

/// A wrapper's own words before the command it runs.
struct Wrap {
    /// Options that take the next word as their value (`nice -n 5`).
    takes: &'static [&'static str],
    /// `NAME=VALUE` words are its own too (`env`).
    assignments: bool,
    /// Words after its options that are its own (`timeout DURATION`).
    positional: usize,
}

const WRAP: Rule = Rule::Wrapper(Wrap {
    takes: &[],
    assignments: false,
    positional: 0,
});
const ENV: Rule = Rule::Wrapper(Wrap {
    takes: &[],
    assignments: true,
    positional: 0,
});
const NICE: Rule = Rule::Wrapper(Wrap {
    takes: &["-n", "-s", "-k"],
    assignments: false,
    positional: 0,
});
const TIMEOUT: Rule = Rule::Wrapper(Wrap {
    takes: &["-n", "-s", "-k"],
    assignments: false,
    positional: 1,
});

impl Wrap {
    /// The command line it runs.
    fn command<'a>(&self, rest: &'a [String]) -> &'a [String] {
        let mut i = 0;
        while let Some(w) = rest.get(i) {
            if !(w.starts_with('-') || (self.assignments && w.contains('='))) {
                break;
            }
            i += if self.takes.contains(&w.as_str()) {
                2
            } else {
                1
            };
        }
        rest.get(i + self.positional..).unwrap_or(&[])
    }
}

/// A command that writes each operand (a word that is not an option).
struct Operands {
    /// What the target says writes it; None: the program's name.
    how: Option<&'static str>,
    /// Options that take the next word as their value.
    takes: &'static [&'static str],
    /// Flags that make each operand a whole tree (`rm -r`).
    tree: &'static [&'static str],
    /// It writes only when one of its words says so (`sed -i`).
    only_if: Option<fn(&str) -> bool>,
    /// The first operand is a script or a mode, not a file, unless a word like this gave
    /// it elsewhere (`sed -e`, `chmod --reference`).
    first_unless: Option<fn(&str) -> bool>,
}

const PLAIN: Operands = Operands {
    how: None,
    takes: &[],
    tree: &[],
    only_if: None,
    first_unless: None,
};
const FILES: Rule = Rule::Operands(PLAIN);
const SED: Rule = Rule::Operands(Operands {
    how: Some("sed -i"),
    takes: &["-e", "-f", "-l", "--expression", "--file"],
    only_if: Some(|w| {
        w == "--in-place"
            || w.starts_with("--in-place=")
            || (w.starts_with('-') && !w.starts_with("--") && w.contains('i'))
    }),
    first_unless: Some(|w| {
        w == "-e" || w == "-f" || w.starts_with("--expression") || w.starts_with("--file")
    }),
    ..PLAIN
});
const TRUNCATE: Rule = Rule::Operands(Operands {
    takes: &["-s", "--size", "-r", "--reference"],
    ..PLAIN
});
const TOUCH: Rule = Rule::Operands(Operands {
    takes: &["-r", "--reference", "-d", "--date", "-t"],
    ..PLAIN
});
const RM: Rule = Rule::Operands(Operands {
    tree: &["-r", "-R", "--recursive"],
    ..PLAIN
});
const CHMOD: Rule = Rule::Operands(Operands {
    takes: &["--reference"],
    tree: &["-R", "--recursive"],
    first_unless: Some(|w| w.starts_with("--reference")),
    ..PLAIN
});

/// The operands among `rest`: the words that are not options (after `--`, all are).
fn operands(rest: &[String], takes_value: &[&str]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    let mut dashdash = false;
    while i < rest.len() {
        let w = &rest[i];
        if !dashdash && w == "--" {
            dashdash = true;
        } else if !dashdash && w.starts_with('-') && w.len() > 1 {
            if takes_value.contains(&w.as_str()) {
                i += 1;
            }
        } else {
            out.push(w.clone());
        }
        i += 1;
    }
    out
}

/// Does one of `flags` appear in `rest`, alone or (a short one) among bundled flags?
fn has(rest: &[String], flags: &[&str]) -> bool {
    rest.iter().any(|w| {
        flags.iter().any(|f| {
            w == f
                || (f.len() == 2
                    && !w.starts_with("--")
                    && w.starts_with('-')
                    && w[1..].contains(&f[1..]))
        })
    })
}

impl Walker {
    fn source(&mut self, text: &str) -> Option<()> {
        if self.depth > 8 {
            return Some(());
        }
        self.depth += 1;
        let opts = brush_parser::ParserOptions::default();
        let info = brush_parser::SourceInfo {
            source: "hook".into(),
        };
        let mut parser = brush_parser::Parser::new(std::io::Cursor::new(text), &opts, &info);
        let program = parser.parse_program().ok()?;
        for c in &program.complete_commands {
            self.list(c);
        }
        self.depth -= 1;
        Some(())
    }

    fn abs(&self, p: &str) -> PathBuf {
        normalize(&self.cwd.join(p))
    }

    /// Add the file(s) a word names.
    fn add_word(&mut self, word: &str, how: &str, tree: bool) {
        match literal(word) {
            Some(Lit::Text(t)) if !t.is_empty() && t != "/dev/null" && !t.starts_with("/dev/") => {
                self.add(self.abs(&t), how, tree)
            }
            Some(Lit::Glob(pattern)) => {
                let abs = self.abs(&pattern);
                let (Some(dir), Some(name)) = (abs.parent(), abs.file_name()) else {
                    return;
                };
                let pat: Vec<char> = name.to_string_lossy().chars().collect();
                let Ok(entries) = std::fs::read_dir(dir) else {
                    return;
                };
                for e in entries.flatten() {
                    let n: Vec<char> = e.file_name().to_string_lossy().chars().collect();
                    if (n.first() != Some(&'.') || pat.first() == Some(&'.')) && matches(&pat, &n) {
                        self.add(dir.join(e.file_name()), how, tree);
                    }
                }
            }
            _ => {}
        }
    }

    fn add(&mut self, path: PathBuf, how: &str, tree: bool) {
        self.out.push(Target {
            path,
            tree,
            if_modified: false,
            how: how.to_string(),
            git: None,
        });
    }

    fn list(&mut self, list: &ast::CompoundList) {
        for item in &list.0 {
            self.and_or(&item.0);
        }
    }

    fn and_or(&mut self, l: &ast::AndOrList) {
        self.pipeline(&l.first);
        for a in &l.additional {
            match a {
                ast::AndOr::And(p) | ast::AndOr::Or(p) => self.pipeline(p),
            }
        }
    }

    fn pipeline(&mut self, p: &ast::Pipeline) {
        // each part of a pipeline runs in its own subshell: a `cd` there stays there
        let multi = p.seq.len() > 1;
        for c in &p.seq {
            let saved = self.cwd.clone();
            self.command(c);
            if multi {
                self.cwd = saved;
            }
        }
    }

    fn redirects(&mut self, r: &ast::IoRedirect) {
        use ast::{IoFileRedirectKind as K, IoFileRedirectTarget as T, IoRedirect as R};
        match r {
            R::File(_, kind, T::Filename(w)) => {
                let how = match kind {
                    K::Write | K::Clobber => "`>` redirection",
                    K::Append => "`>>` redirection",
                    K::ReadAndWrite => "`<>` redirection",
                    _ => return,
                };
                self.add_word(&w.value, how, false);
            }
            R::OutputAndError(w, append) => {
                let how = if *append {
                    "`&>>` redirection"
                } else {
                    "`&>` redirection"
                };
                self.add_word(&w.value, how, false);
            }
            _ => {}
        }
    }

    fn command(&mut self, c: &ast::Command) {
        match c {
            ast::Command::Simple(s) => self.simple(s),
            ast::Command::Compound(cc, redirects) => {
                let saved = self.cwd.clone();
                self.compound(cc);
                if matches!(cc, ast::CompoundCommand::Subshell(_)) {
                    self.cwd = saved;
                }
                for r in redirects.iter().flat_map(|r| r.0.iter()) {
                    self.redirects(r);
                }
            }
            ast::Command::Function(f) => {
                self.compound(&f.body.0);
                for r in f.body.1.iter().flat_map(|r| r.0.iter()) {
                    self.redirects(r);
                }
            }
            ast::Command::ExtendedTest(_) => {}
        }
    }

    fn compound(&mut self, c: &ast::CompoundCommand) {
        use ast::CompoundCommand as C;
        match c {
            C::BraceGroup(b) => self.list(&b.0),
            C::Subshell(s) => self.list(&s.0),
            C::ForClause(f) => self.list(&f.body.0),
            C::ArithmeticForClause(f) => self.list(&f.body.0),
            C::CaseClause(c) => {
                for item in &c.cases {
                    if let Some(l) = &item.cmd {
                        self.list(l);
                    }
                }
            }
            C::IfClause(i) => {
                self.list(&i.condition);
                self.list(&i.then);
                for e in i.elses.iter().flatten() {
                    if let Some(c) = &e.condition {
                        self.list(c);
                    }
                    self.list(&e.body);
                }
            }
            C::WhileClause(w) | C::UntilClause(w) => {
                self.list(&w.0);
                self.list(&w.1 .0);
            }
            C::Arithmetic(_) => {}
        }
    }

    fn simple(&mut self, s: &ast::SimpleCommand) {
        use ast::CommandPrefixOrSuffixItem as I;
        let mut words: Vec<String> = Vec::new();
        if let Some(w) = &s.word_or_name {
            words.push(w.value.clone());
        }
        let prefix = s.prefix.iter().flat_map(|p| p.0.iter()).map(|i| (true, i));
        let suffix = s.suffix.iter().flat_map(|p| p.0.iter()).map(|i| (false, i));
        for (in_prefix, item) in prefix.chain(suffix) {
            match item {
                I::IoRedirect(r) => self.redirects(r),
                I::Word(w) => words.push(w.value.clone()),
                // `VAR=x cmd` sets a variable; after the name (`dd of=x`) it is an argument
                I::AssignmentWord(_, w) if !in_prefix => words.push(w.value.clone()),
                I::AssignmentWord(..) => {}
                I::ProcessSubstitution(_, sub) => {
                    let saved = self.cwd.clone();
                    self.list(&sub.0);
                    self.cwd = saved;
                }
            }
        }
        self.argv(&words);
    }

    /// The writes of one command line, given its (raw) words: the program's row in
    /// [`COMMANDS`] says how its words name what it writes.
    fn argv(&mut self, words: &[String]) {
        let Some(name) = words.first().and_then(|w| plain(w)) else {
            return;
        };
        let prog = Path::new(&name)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let rest = &words[1..];
        match COMMANDS.iter().find(|(n, _)| *n == prog) {
            Some((_, Rule::Wrapper(w))) => self.argv(w.command(rest)),
            Some((_, Rule::Operands(o))) => self.operands(&prog, rest, o),
            Some((_, Rule::Walk(walk))) => walk(self, &prog, rest),
            None => {}
        }
    }

    /// A command whose every operand it writes (see [`Operands`]).
    fn operands(&mut self, prog: &str, rest: &[String], rule: &Operands) {
        if rule.only_if.is_some_and(|on| !rest.iter().any(|w| on(w))) {
            return;
        }
        let tree = has(rest, rule.tree);
        let mut ops = operands(rest, rule.takes);
        if let Some(moved) = rule.first_unless {
            if !rest.iter().any(|w| moved(w)) && !ops.is_empty() {
                ops.remove(0);
            }
        }
        for f in ops {
            self.add_word(&f, rule.how.unwrap_or(prog), tree);
        }
    }

    /// `sh -c SCRIPT`: the script is shell text of its own.
    fn shell(&mut self, _prog: &str, rest: &[String]) {
        let args: Vec<Option<String>> = rest.iter().map(|w| plain(w)).collect();
        let script = args
            .iter()
            .position(|a| {
                a.as_deref()
                    .is_some_and(|a| a.starts_with('-') && a.contains('c'))
            })
            .and_then(|i| args.get(i + 1).cloned().flatten());
        if let Some(script) = script {
            let _ = self.source(&script);
        }
    }

    /// `eval WORDS`: the words, joined, are shell text of their own.
    fn eval(&mut self, _prog: &str, rest: &[String]) {
        let script: Vec<String> = rest.iter().map(|w| plain(w).unwrap_or_default()).collect();
        let _ = self.source(&script.join(" "));
    }

    /// `cd DIR` moves where later relative paths start; `cd` alone (or a word that
    /// expands) goes home.
    fn cd(&mut self, _prog: &str, rest: &[String]) {
        match rest.first().and_then(|w| plain(w)) {
            Some(d) if !d.starts_with('-') => self.cwd = self.abs(&d),
            None => {
                if let Ok(h) = std::env::var("HOME") {
                    self.cwd = PathBuf::from(h);
                }
            }
            _ => {}
        }
    }

    /// `perl -i`: `-pi -e SCRIPT` and `-pie SCRIPT` (the script follows the flag), the
    /// first operand the script when no `-e` gave it.
    fn perl(&mut self, _prog: &str, rest: &[String]) {
        let in_place = rest
            .iter()
            .any(|w| w.starts_with('-') && !w.starts_with("--") && w.contains('i'));
        if !in_place {
            return;
        }
        let script_given = rest
            .iter()
            .any(|w| w.starts_with('-') && (w.ends_with('e') || w.ends_with('E')));
        let mut i = 0;
        let mut files = Vec::new();
        while i < rest.len() {
            let w = &rest[i];
            if w.starts_with('-') && w.len() > 1 {
                if w.ends_with('e') || w.ends_with('E') {
                    i += 1;
                }
            } else {
                files.push(w.clone());
            }
            i += 1;
        }
        if !script_given && !files.is_empty() {
            files.remove(0);
        }
        for f in files {
            self.add_word(&f, "perl -i", false);
        }
    }

    /// `cp`/`mv`/`install`/`rsync`: the target (a file, or the sources' names in a
    /// directory), and `mv`'s sources.
    fn copy(&mut self, prog: &str, rest: &[String]) {
        let ops = operands(
            rest,
            &[
                "-t",
                "--target-directory",
                "-m",
                "--mode",
                "-o",
                "-g",
                "-S",
                "--suffix",
                "-e",
                "--exclude",
                "--include",
                "--chmod",
            ],
        );
        let t = rest
            .iter()
            .position(|w| w == "-t" || w == "--target-directory")
            .and_then(|i| rest.get(i + 1).cloned());
        let (srcs, dest) = match t {
            Some(d) => (ops.clone(), Some(d)),
            None if ops.len() >= 2 => (ops[..ops.len() - 1].to_vec(), ops.last().cloned()),
            // `install -d DIR`: makes directories
            _ => (Vec::new(), None),
        };
        let Some(dest) = dest else { return };
        if prog == "rsync" && dest.contains(':') {
            return;
        }
        let recursive = has(rest, &["-r", "-R", "-a", "--recursive", "--archive"]);
        match plain(&dest) {
            Some(d) if self.abs(&d).is_dir() || d.ends_with('/') => {
                for s in &srcs {
                    if let Some(name) = plain(s)
                        .as_deref()
                        .and_then(|s| Path::new(s.trim_end_matches('/')).file_name())
                        .map(|n| n.to_string_lossy().into_owned())
                    {
                        let target = self.abs(&d).join(name);
                        self.add(target, &format!("{prog} target"), recursive);
                    }
                }
            }
            Some(_) => self.add_word(&dest, &format!("{prog} target"), recursive),
            None => {}
        }
        if prog == "mv" {
            for s in &srcs {
                self.add_word(s, "mv source", true);
            }
        }
    }

    /// `ln SOURCE... DEST`: the link, in DEST when it is a directory.
    fn link(&mut self, _prog: &str, rest: &[String]) {
        let ops = operands(rest, &["-t", "--target-directory", "-S", "--suffix"]);
        if ops.len() < 2 {
            return;
        }
        let dest = ops.last().cloned().unwrap_or_default();
        match plain(&dest) {
            Some(d) if self.abs(&d).is_dir() => {
                for s in &ops[..ops.len() - 1] {
                    if let Some(name) = plain(s)
                        .as_deref()
                        .and_then(|s| Path::new(s).file_name())
                        .map(|n| n.to_string_lossy().into_owned())
                    {
                        let target = self.abs(&d).join(name);
                        self.add(target, "ln", false);
                    }
                }
            }
            _ => self.add_word(&dest, "ln", false),
        }
    }

    /// `dd of=FILE`.
    fn dd(&mut self, _prog: &str, rest: &[String]) {
        for w in rest {
            if let Some(f) = w.strip_prefix("of=") {
                self.add_word(f, "dd of=", false);
            }
        }
    }

    fn git(&mut self, _prog: &str, rest: &[String]) {
        // global options before the subcommand (`-C DIR` moves)
        let mut i = 0;
        let mut dir = self.cwd.clone();
        while i < rest.len() && rest[i].starts_with('-') {
            if rest[i] == "-C" {
                if let Some(d) = rest.get(i + 1).and_then(|w| plain(w)) {
                    dir = normalize(&dir.join(d));
                }
                i += 1;
            } else if rest[i] == "-c" {
                i += 1;
            }
            i += 1;
        }
        let Some(sub) = rest.get(i).and_then(|w| plain(w)) else {
            return;
        };
        let args = &rest[i + 1..];
        let saved = std::mem::replace(&mut self.cwd, dir);
        let after_dashdash: Option<Vec<String>> = args
            .iter()
            .position(|w| w == "--")
            .map(|p| args[p + 1..].to_vec());
        let every_modified = |w: &mut Walker, how: &str| {
            let root = w.cwd.clone();
            w.out.push(Target {
                path: root,
                tree: true,
                if_modified: true,
                how: how.to_string(),
                git: None,
            });
        };
        match sub.as_str() {
            "checkout" | "restore" => {
                let force = args.iter().any(|w| w == "-f" || w == "--force");
                // `git restore --staged` without `--worktree` touches only the index
                let staged_only = sub == "restore"
                    && args.iter().any(|w| w == "--staged" || w == "-S")
                    && !args.iter().any(|w| w == "--worktree" || w == "-W");
                if staged_only {
                    self.cwd = saved;
                    return;
                }
                // the source: `checkout TREE-ISH [--] PATH...`, `restore -s/--source X`;
                // `restore --staged --worktree` takes HEAD; otherwise the index
                let before_dashdash = match args.iter().position(|w| w == "--") {
                    Some(p) => &args[..p],
                    None => args,
                };
                let mut source = None;
                let paths: Vec<String> = match after_dashdash {
                    Some(p) => {
                        if sub == "checkout" {
                            source = before_dashdash
                                .iter()
                                .find(|w| !w.starts_with('-'))
                                .and_then(|w| plain(w));
                        }
                        p
                    }
                    None if sub == "restore" => {
                        let mut out = Vec::new();
                        let mut i = 0;
                        while i < args.len() {
                            if args[i] == "-s" || args[i] == "--source" {
                                i += 1;
                            } else if !args[i].starts_with('-') {
                                out.push(args[i].clone());
                            }
                            i += 1;
                        }
                        out
                    }
                    // `git checkout [TREE-ISH] PATH...`: the words that name existing paths
                    None => {
                        let (named, other): (Vec<&String>, Vec<&String>) = args
                            .iter()
                            .filter(|w| !w.starts_with('-'))
                            .partition(|w| plain(w).is_some_and(|p| self.abs(&p).exists()));
                        source = other.first().and_then(|w| plain(w));
                        named.into_iter().cloned().collect()
                    }
                };
                if sub == "restore" {
                    let mut i = 0;
                    while i < before_dashdash.len() {
                        let w = &before_dashdash[i];
                        if w == "-s" || w == "--source" {
                            source = before_dashdash.get(i + 1).and_then(|w| plain(w));
                            i += 1;
                        } else if let Some(v) = w
                            .strip_prefix("--source=")
                            .or_else(|| w.strip_prefix("-s").filter(|v| !v.is_empty()))
                        {
                            source = plain(v);
                        }
                        i += 1;
                    }
                    let staged = args.iter().any(|w| w == "--staged" || w == "-S");
                    if source.is_none() && staged {
                        source = Some("HEAD".into());
                    }
                }
                let first = self.out.len();
                for p in &paths {
                    self.add_word(p, &format!("git {sub}"), true);
                }
                let pathspec: Vec<String> = paths.iter().filter_map(|w| plain(w)).collect();
                if !pathspec.is_empty() {
                    let check = GitCheck {
                        dir: self.cwd.clone(),
                        source,
                        pathspec,
                    };
                    // one check for the command: what its words name is kept for when
                    // git cannot answer
                    for t in &mut self.out[first..] {
                        t.git = Some(check.clone());
                    }
                    if self.out.len() == first {
                        self.out.push(Target {
                            path: self.cwd.clone(),
                            tree: true,
                            if_modified: false,
                            how: format!("git {sub}"),
                            git: Some(check),
                        });
                    }
                }
                if paths.is_empty() && force {
                    every_modified(self, "git checkout -f");
                }
            }
            "stash" => {
                let what = args.first().and_then(|w| plain(w));
                if matches!(
                    what.as_deref(),
                    None | Some(
                        "push"
                            | "save"
                            | "-u"
                            | "--include-untracked"
                            | "-k"
                            | "--keep-index"
                            | "-m"
                    )
                ) {
                    match after_dashdash {
                        Some(p) => {
                            for p in &p {
                                self.add_word(p, "git stash", true);
                            }
                        }
                        None => every_modified(self, "git stash"),
                    }
                } else if matches!(what.as_deref(), Some("pop" | "apply")) {
                    every_modified(self, "git stash pop");
                }
            }
            "reset"
                if args
                    .iter()
                    .any(|w| w == "--hard" || w == "--merge" || w == "--keep") =>
            {
                every_modified(self, "git reset --hard");
            }
            "rm" | "mv" => {
                for p in args.iter().filter(|w| !w.starts_with('-')) {
                    self.add_word(p, &format!("git {sub}"), true);
                }
            }
            // `merge`, `pull`, `rebase`, `apply`...: which files they write depends on what
            // comes in; the volume still refuses their writes, and PostToolUse explains
            _ => {}
        }
        self.cwd = saved;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(cmd: &str) -> Vec<String> {
        targets(cmd, Path::new("/w"))
            .expect("parses")
            .into_iter()
            .map(|t| t.path.display().to_string())
            .collect()
    }

    #[test]
    fn reads_writes_from_the_syntax() {
        assert_eq!(paths("echo x > a.md"), ["/w/a.md"]);
        assert_eq!(paths("echo 'x > a.md'"), Vec::<String>::new());
        assert_eq!(paths("cat <<'EOF' > 'my file'\nhi\nEOF\n"), ["/w/my file"]);
        assert_eq!(
            paths("cd sub && sed -i 's/a/b/' x.rs y.rs"),
            ["/w/sub/x.rs", "/w/sub/y.rs"]
        );
        assert_eq!(paths("grep -q x a.md || echo y >> b.md"), ["/w/b.md"]);
        assert_eq!(paths("sh -c 'echo hi | tee -a log.txt'"), ["/w/log.txt"]);
        assert_eq!(paths("sudo cp a.md /w/b.md"), ["/w/b.md"]);
        assert_eq!(paths("mv a.md b.md"), ["/w/b.md", "/w/a.md"]);
        assert_eq!(paths("dd if=/dev/zero of=img bs=1 count=1"), ["/w/img"]);
        assert_eq!(paths("perl -pi -e 's/a/b/' c.txt"), ["/w/c.txt"]);
        assert_eq!(paths("echo $X > \"$OUT\""), Vec::<String>::new());
        assert_eq!(paths("ls > /dev/null 2>&1"), Vec::<String>::new());
        assert!(targets("echo 'unterminated", Path::new("/w")).is_none());
    }

    #[test]
    fn git_checkout_and_restore_say_what_git_compares() {
        // `git checkout PATH` without `--` counts the words that name existing paths
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        let w = d.path().display().to_string();
        let check = |cmd: &str| {
            let t = targets(cmd, d.path()).expect("parses");
            let c = t[0].git.clone().expect("a git check");
            assert!(t.iter().all(|x| x.git.as_ref() == Some(&c)), "{cmd}");
            (c.dir.display().to_string(), c.source, c.pathspec)
        };
        let s = |x: &str| Some(x.to_string());
        assert_eq!(check("git checkout ."), (w.clone(), None, vec![".".into()]));
        assert_eq!(
            check("cd sub && git checkout -- a 'b c'"),
            (format!("{w}/sub"), None, vec!["a".into(), "b c".into()])
        );
        assert_eq!(check("git checkout HEAD -- .").1, s("HEAD"));
        assert_eq!(check("git checkout HEAD sub").1, s("HEAD"));
        assert_eq!(check("git restore --source=HEAD~1 a").1, s("HEAD~1"));
        assert_eq!(check("git restore -s main a").1, s("main"));
        assert_eq!(check("git restore -smain a").1, s("main"));
        assert_eq!(check("git restore a").1, None);
        assert_eq!(check("git restore --staged --worktree a").1, s("HEAD"));
        assert_eq!(check("git -C sub restore .").0, format!("{w}/sub"));
        // --staged alone writes no file; a variable is not guessed at
        assert!(targets("git restore --staged a", Path::new("/w"))
            .unwrap()
            .is_empty());
        assert!(targets("git checkout -- \"$F\"", Path::new("/w"))
            .unwrap()
            .is_empty());
    }
}
