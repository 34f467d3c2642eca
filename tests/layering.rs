//! The layering of `src/`, checked on the source text (no compiler help):
//!
//! * no import cycle between files: file A names file B when a
//!   `crate::`/`super::`/`self::`/`rate_ctl::` path in A (a `use` tree,
//!   braces expanded, or a path written inline in code) resolves to B's
//!   module (`a/b.rs` or `a/b/mod.rs`, the longest prefix that is a file).
//!   A file naming one of its ancestors (a child naming its parent module,
//!   `super::*`) is not an edge, nor are comments, doc links and strings.
//!   A cycle is reported as its files and, for each edge between them, the
//!   naming file:line.
//! * the rules in [`RULES`]: which part of `src/` may not name which other
//!   part; a breach is reported as file:line and the line's text.
//!
//! The cycles `core` still had when the check was written are in
//! [`ALLOWED_CYCLES`]; any other cycle, or a file joining one of them, fails.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Cycles present when this check was written, each as its sorted files.
/// A cycle found must be a subset of one of these; the helpers removing
/// them leave this list empty.
const ALLOWED_CYCLES: &[&[&str]] = &[];

/// Module paths of the core writer (before and after core's regrouping).
const WRITER: &[&str] = &["core::shm::writer"];

/// A layering rule: files under `from` (a `src/`-relative prefix) may not
/// name a module under any of `to` (`::`-joined module paths; `ngx` is the
/// crate). `except` lists files the rule does not apply to.
struct Rule {
    from: &'static str,
    to: &'static [&'static str],
    except: &'static [&'static str],
    why: &'static str,
}

const RULES: &[Rule] = &[
    Rule {
        from: "core/",
        to: &[
            "ngx", "module", "agent", "serve", "store", "client", "cli", "fleet",
        ],
        except: &[],
        why: "core is nginx-free and below the module and the binary",
    },
    Rule {
        from: "store/",
        to: &["client", "serve", "agent", "cli"],
        except: &[],
        why: "the store is below its clients",
    },
    Rule {
        from: "serve/",
        to: &["agent"],
        except: &[],
        why: "serve and the agent share fleet/, not each other",
    },
    Rule {
        from: "fleet/",
        to: &["agent", "serve", "cli"],
        except: &[],
        why: "fleet/ is shared by the agent and serve, below both",
    },
    Rule {
        from: "",
        to: WRITER,
        except: &["agent/publish.rs", "core/"],
        why: "only the agent's publisher writes the shared-memory file",
    },
];

// ---------------------------------------------------------------- lexing

/// The source with comments, strings and char literals blanked (newlines
/// kept, so line numbers stay right).
fn strip(src: &str) -> Vec<char> {
    let s: Vec<char> = src.chars().collect();
    let mut out = s.clone();
    let blank = |out: &mut Vec<char>, from: usize, to: usize| {
        for c in out.iter_mut().take(to.min(s.len())).skip(from) {
            if *c != '\n' {
                *c = ' ';
            }
        }
    };
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        let next = s.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            let end = s[i..]
                .iter()
                .position(|&c| c == '\n')
                .map_or(s.len(), |p| i + p);
            blank(&mut out, i, end);
            i = end;
        } else if c == '/' && next == Some('*') {
            let (mut depth, mut j) = (1, i + 2);
            while j < s.len() && depth > 0 {
                if s[j] == '/' && s.get(j + 1) == Some(&'*') {
                    depth += 1;
                    j += 2;
                } else if s[j] == '*' && s.get(j + 1) == Some(&'/') {
                    depth -= 1;
                    j += 2;
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if c == '"' {
            // Raw string? Look back over `#`s to an `r` (or `br`) that
            // starts a token.
            let mut k = i;
            while k > 0 && s[k - 1] == '#' {
                k -= 1;
            }
            let hashes = i - k;
            let raw = k > 0 && s[k - 1] == 'r' && {
                let mut b = k - 1;
                if b > 0 && s[b - 1] == 'b' {
                    b -= 1;
                }
                b == 0 || !ident(s[b - 1])
            };
            let mut j = i + 1;
            if raw {
                'outer: while j < s.len() {
                    if s[j] == '"' && (0..hashes).all(|h| s.get(j + 1 + h) == Some(&'#')) {
                        j += 1 + hashes;
                        break 'outer;
                    }
                    j += 1;
                }
            } else {
                while j < s.len() && s[j] != '"' {
                    j += if s[j] == '\\' { 2 } else { 1 };
                }
                j += 1;
            }
            blank(&mut out, i + 1, j.saturating_sub(1));
            i = j;
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{..}'), not a lifetime ('a).
            if next == Some('\\') {
                let mut j = i + 2;
                while j < s.len() && s[j] != '\'' {
                    j += 1;
                }
                blank(&mut out, i + 1, j);
                i = j + 1;
            } else if s.get(i + 2) == Some(&'\'') {
                blank(&mut out, i + 1, i + 2);
                i += 3;
            } else {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    out
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Path, // ::
    Punct(char),
}

fn tokens(src: &str) -> Vec<(Tok, usize)> {
    let s = strip(src);
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < s.len() {
        let c = s[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c.is_alphabetic() || c == '_' || (c == '$' && s.get(i + 1) == Some(&'c')) {
            let start = i;
            i += 1;
            while i < s.len() && (s[i].is_alphanumeric() || s[i] == '_') {
                i += 1;
            }
            let mut word: String = s[start..i].iter().collect();
            if let Some(raw) = word.strip_prefix("r#") {
                word = raw.to_string();
            }
            out.push((Tok::Ident(word), line));
        } else if c.is_ascii_digit() {
            while i < s.len() && (s[i].is_alphanumeric() || s[i] == '_' || s[i] == '.') {
                i += 1;
            }
        } else if c == ':' && s.get(i + 1) == Some(&':') {
            out.push((Tok::Path, line));
            i += 2;
        } else {
            out.push((Tok::Punct(c), line));
            i += 1;
        }
    }
    out
}

// ---------------------------------------------------------------- paths

/// A path named in a file: its segments as written and its line.
#[derive(Debug, Clone)]
struct Named {
    segs: Vec<String>,
    line: usize,
    /// The inline `mod` blocks it sits in (for `self::`/`super::`).
    inline: Vec<String>,
}

/// Expands a `use` tree starting at `toks[*i]`, appending full paths.
fn use_tree(
    toks: &[(Tok, usize)],
    i: &mut usize,
    prefix: &[String],
    out: &mut Vec<(Vec<String>, usize)>,
) {
    let mut segs = prefix.to_vec();
    let mut line = toks.get(*i).map_or(0, |t| t.1);
    loop {
        match toks.get(*i) {
            Some((Tok::Path, _)) => *i += 1,
            Some((Tok::Ident(w), l)) if w == "as" => {
                *i += 2; // `as name`
                let _ = l;
                out.push((segs, line));
                return;
            }
            Some((Tok::Ident(w), l)) => {
                if segs.len() == prefix.len() {
                    line = *l;
                }
                if w != "self" || segs.is_empty() {
                    segs.push(w.clone());
                }
                *i += 1;
            }
            Some((Tok::Punct('{'), _)) => {
                *i += 1;
                loop {
                    match toks.get(*i) {
                        Some((Tok::Punct('}'), _)) => {
                            *i += 1;
                            return;
                        }
                        Some((Tok::Punct(','), _)) => *i += 1,
                        None => return,
                        _ => use_tree(toks, i, &segs, out),
                    }
                }
            }
            Some((Tok::Punct('*'), _)) => {
                *i += 1;
                out.push((segs, line));
                return;
            }
            _ => {
                out.push((segs, line));
                return;
            }
        }
    }
}

/// Whether the item whose first token (after `pub`/attributes) is at
/// `toks[i]` carries `#[cfg(test)]` (or `#[cfg(all(test, ..))]`): its
/// attributes are the `#[..]` groups right before it.
fn cfg_test_before(toks: &[(Tok, usize)], mut i: usize) -> bool {
    let ident = |i: usize, w: &str| matches!(&toks[i].0, Tok::Ident(x) if x == w);
    // Skip a visibility: `pub`, `pub(crate)`, `pub(super)`, `pub(in path)`.
    if i > 0 && toks[i - 1].0 == Tok::Punct(')') {
        let mut j = i - 1;
        while j > 0 && toks[j].0 != Tok::Punct('(') {
            j -= 1;
        }
        if j > 0 && ident(j - 1, "pub") {
            i = j - 1;
        }
    } else if i > 0 && ident(i - 1, "pub") {
        i -= 1;
    }
    // Walk back over `#[ ... ]` groups.
    while i > 0 && toks[i - 1].0 == Tok::Punct(']') {
        let (mut j, mut d) = (i - 1, 0i32);
        loop {
            match toks[j].0 {
                Tok::Punct(']') => d += 1,
                Tok::Punct('[') => d -= 1,
                _ => {}
            }
            if d == 0 || j == 0 {
                break;
            }
            j -= 1;
        }
        if j == 0 || toks[j - 1].0 != Tok::Punct('#') {
            return false;
        }
        let attr = &toks[j + 1..i - 1];
        if matches!(attr, [(Tok::Ident(c), _), (Tok::Punct('('), _), rest @ ..]
            if c == "cfg" && matches!(rest.first(), Some((Tok::Ident(t), _)) if t == "test"
                || (t == "all" && matches!(rest.get(2), Some((Tok::Ident(t), _)) if t == "test"))))
        {
            return true;
        }
        i = j - 1;
    }
    false
}

/// The child modules a file declares `#[cfg(test)] mod name;`: test-only
/// files.
fn test_children(src: &str) -> Vec<String> {
    let toks = tokens(src);
    (1..toks.len().saturating_sub(2))
        .filter(|&i| toks[i].0 == Tok::Ident("mod".into()) && toks[i + 2].0 == Tok::Punct(';'))
        .filter(|&i| cfg_test_before(&toks, i))
        .filter_map(|i| match &toks[i + 1].0 {
            Tok::Ident(n) => Some(n.clone()),
            _ => None,
        })
        .collect()
}

/// Every path a file names: `use` trees (expanded) and inline paths
/// (`a::b` not preceded by `::`; which of them name this crate is the
/// resolver's business).
fn named_paths(src: &str) -> Vec<Named> {
    let toks = tokens(src);
    let mut out = Vec::new();
    let mut depth = 0usize;
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        match &toks[i].0 {
            Tok::Ident(w) if w == "use" => {
                i += 1;
                let mut found = Vec::new();
                use_tree(&toks, &mut i, &[], &mut found);
                let here: Vec<String> = inline.iter().map(|m| m.0.clone()).collect();
                out.extend(found.into_iter().map(|(segs, line)| Named {
                    segs,
                    line,
                    inline: here.clone(),
                }));
            }
            Tok::Ident(w) if w == "mod" => {
                if let (Some((Tok::Ident(name), _)), Some((Tok::Punct('{'), _))) =
                    (toks.get(i + 1), toks.get(i + 2))
                {
                    if cfg_test_before(&toks, i) {
                        // Test code: skip to the module's closing brace.
                        let mut d = 0usize;
                        i += 2;
                        while let Some((t, _)) = toks.get(i) {
                            i += 1;
                            match t {
                                Tok::Punct('{') => d += 1,
                                Tok::Punct('}') => {
                                    d -= 1;
                                    if d == 0 {
                                        break;
                                    }
                                }
                                _ => {}
                            }
                        }
                        continue;
                    }
                    inline.push((name.clone(), depth));
                    depth += 1;
                    i += 3;
                } else {
                    i += 1;
                }
            }
            Tok::Ident(w)
                if toks.get(i + 1).map(|t| &t.0) == Some(&Tok::Path)
                    && (i == 0 || toks[i - 1].0 != Tok::Path) =>
            {
                let line = toks[i].1;
                let mut segs = vec![w.clone()];
                i += 1;
                while let (Some((Tok::Path, _)), Some((Tok::Ident(n), _))) =
                    (toks.get(i), toks.get(i + 1))
                {
                    segs.push(n.clone());
                    i += 2;
                }
                out.push(Named {
                    segs,
                    line,
                    inline: inline.iter().map(|m| m.0.clone()).collect(),
                });
            }
            Tok::Punct('{') => {
                depth += 1;
                i += 1;
            }
            Tok::Punct('}') => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|m| m.1 == depth) {
                    inline.pop();
                }
                i += 1;
            }
            _ => i += 1,
        }
    }
    out
}

// ---------------------------------------------------------------- the tree

/// A source tree: `src/`-relative file name → text.
type Tree = BTreeMap<String, String>;

/// The module path of a file (`core/keys.rs` and `core/keys/mod.rs` →
/// `core::keys`; `lib.rs`, `main.rs` → the root).
fn module_of(file: &str) -> Vec<String> {
    let stem = file.strip_suffix(".rs").unwrap_or(file);
    let mut segs: Vec<String> = stem.split('/').map(str::to_string).collect();
    if matches!(segs.last().map(String::as_str), Some("mod")) || matches!(stem, "lib" | "main") {
        segs.pop();
    }
    segs
}

struct Layout<'a> {
    tree: &'a Tree,
    /// module path → file
    files: BTreeMap<Vec<String>, String>,
    /// top-level modules of the binary (declared in main.rs)
    bin_tops: BTreeSet<String>,
    /// modules declared `#[cfg(test)] mod name;`
    tests: BTreeSet<Vec<String>>,
}

impl<'a> Layout<'a> {
    fn new(tree: &'a Tree) -> Self {
        let files = tree
            .keys()
            .filter(|f| f.as_str() != "main.rs")
            .map(|f| (module_of(f), f.clone()))
            .collect();
        let toks = tree.get("main.rs").map(|s| tokens(s)).unwrap_or_default();
        let bin_tops = toks
            .windows(3)
            .filter_map(|w| match (&w[0].0, &w[1].0, &w[2].0) {
                (Tok::Ident(m), Tok::Ident(n), Tok::Punct(';')) if m == "mod" => Some(n.clone()),
                _ => None,
            })
            .collect();
        let tests = tree
            .iter()
            .flat_map(|(f, src)| {
                test_children(src).into_iter().map(move |c| {
                    let mut m = module_of(f);
                    m.push(c);
                    m
                })
            })
            .collect();
        Layout {
            tree,
            files,
            bin_tops,
            tests,
        }
    }

    /// Test code is not part of the layering: tests may build their
    /// fixtures from anywhere.
    fn is_test(&self, file: &str) -> bool {
        let m = module_of(file);
        self.tests.iter().any(|t| m.starts_with(t))
    }

    fn in_bin(&self, file: &str) -> bool {
        file == "main.rs"
            || module_of(file)
                .first()
                .is_some_and(|t| self.bin_tops.contains(t))
    }

    /// The absolute module path a named path points at (`ngx::..` kept as
    /// is), or None for paths outside this crate pair (std, other crates).
    fn absolute(&self, file: &str, named: &Named) -> Option<Vec<String>> {
        let mut here = module_of(file);
        here.extend(named.inline.iter().cloned());
        let mut segs = named.segs.iter();
        let first = segs.next()?;
        let mut abs = match first.as_str() {
            "crate" | "$crate" | "rate_ctl" => Vec::new(),
            "self" => here,
            "super" => {
                here.pop();
                here
            }
            "ngx" => vec!["ngx".to_string()],
            _ => {
                // A `use` of a child module by its bare name (2018 paths).
                let mut child = here.clone();
                child.push(first.clone());
                if self.files.contains_key(&child) {
                    child
                } else {
                    return None;
                }
            }
        };
        for s in segs {
            if s == "super" {
                abs.pop();
            } else {
                abs.push(s.clone());
            }
        }
        Some(abs)
    }

    /// The file a module path lives in: the longest prefix that is a file.
    fn file_of(&self, file: &str, abs: &[String]) -> Option<String> {
        for n in (0..=abs.len()).rev() {
            if n == 0 {
                return Some(
                    if self.in_bin(file) {
                        "main.rs"
                    } else {
                        "lib.rs"
                    }
                    .to_string(),
                )
                .filter(|f| self.tree.contains_key(f));
            }
            if let Some(f) = self.files.get(&abs[..n]) {
                return Some(f.clone());
            }
        }
        None
    }
}

/// An edge: `from` names `to` on these lines.
type Edges = BTreeMap<(String, String), Vec<usize>>;

fn edges(tree: &Tree) -> Edges {
    let layout = Layout::new(tree);
    let mut edges = Edges::new();
    for (file, src) in tree.iter().filter(|(f, _)| !layout.is_test(f)) {
        let here = module_of(file);
        for named in named_paths(src) {
            let Some(abs) = layout.absolute(file, &named) else {
                continue;
            };
            if abs.first().is_some_and(|s| s == "ngx") {
                continue;
            }
            let Some(to) = layout.file_of(file, &abs) else {
                continue;
            };
            let target = module_of(&to);
            // Self, or a child naming an ancestor: not an edge.
            if to == *file || here.starts_with(&target) {
                continue;
            }
            let lines = edges.entry((file.clone(), to)).or_default();
            if !lines.contains(&named.line) {
                lines.push(named.line);
            }
        }
    }
    edges
}

/// Strongly connected components of more than one file (Tarjan).
fn cycles(edges: &Edges) -> Vec<Vec<String>> {
    let mut next: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        next.entry(from).or_default().push(to);
        next.entry(to).or_default();
    }
    struct State<'s> {
        index: BTreeMap<&'s str, usize>,
        low: BTreeMap<&'s str, usize>,
        stack: Vec<&'s str>,
        on: BTreeSet<&'s str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'s>(v: &'s str, next: &BTreeMap<&'s str, Vec<&'s str>>, st: &mut State<'s>) {
        let n = st.index.len();
        st.index.insert(v, n);
        st.low.insert(v, n);
        st.stack.push(v);
        st.on.insert(v);
        for &w in &next[v] {
            if !st.index.contains_key(w) {
                visit(w, next, st);
                let lw = st.low[w];
                let lv = st.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if st.on.contains(w) {
                let iw = st.index[w];
                let lv = st.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if st.low[v] == st.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = st.stack.pop() {
                st.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                st.out.push(comp);
            }
        }
    }
    let mut st = State {
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in next.keys() {
        if !st.index.contains_key(v) {
            visit(v, &next, &mut st);
        }
    }
    st.out.sort();
    st.out
}

/// One report per cycle not covered by `allowed`: its files and each edge
/// between them with the naming lines.
fn cycle_reports(tree: &Tree, allowed: &[&[&str]]) -> Vec<String> {
    let edges = edges(tree);
    cycles(&edges)
        .into_iter()
        .filter(|c| {
            !allowed
                .iter()
                .any(|a| c.iter().all(|f| a.contains(&f.as_str())))
        })
        .map(|c| {
            let mut r = format!("import cycle between {} files: {}\n", c.len(), c.join(", "));
            for ((from, to), lines) in &edges {
                if c.contains(from) && c.contains(to) {
                    let at: Vec<String> = lines.iter().map(|l| format!("src/{from}:{l}")).collect();
                    r += &format!("  {from} -> {to}  ({})\n", at.join(", "));
                }
            }
            r
        })
        .collect()
}

/// One report per line that breaks a rule.
fn rule_reports(tree: &Tree, rules: &[Rule]) -> Vec<String> {
    let layout = Layout::new(tree);
    let mut out = Vec::new();
    for (file, src) in tree.iter().filter(|(f, _)| !layout.is_test(f)) {
        let lines: Vec<&str> = src.lines().collect();
        for rule in rules {
            if !file.starts_with(rule.from) || rule.except.iter().any(|e| file.starts_with(e)) {
                continue;
            }
            let mut seen = BTreeSet::new();
            for named in named_paths(src) {
                let Some(abs) = layout.absolute(file, &named) else {
                    continue;
                };
                let abs = abs.join("::");
                let hit = rule
                    .to
                    .iter()
                    .find(|t| abs == **t || abs.starts_with(&format!("{t}::")));
                if let Some(t) = hit {
                    if seen.insert(named.line) {
                        let text = lines.get(named.line - 1).map_or("", |l| l.trim());
                        out.push(format!(
                            "src/{file}:{}: names {t} ({}): {text}",
                            named.line, rule.why
                        ));
                    }
                }
            }
        }
    }
    out
}

fn read_tree(dir: &Path, rel: &str, tree: &mut Tree) {
    let mut entries: Vec<_> = std::fs::read_dir(dir.join(rel))
        .unwrap_or_else(|e| panic!("reading src/{rel}: {e}"))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let rel_name = if rel.is_empty() {
            name
        } else {
            format!("{rel}/{name}")
        };
        if path.is_dir() {
            read_tree(dir, &rel_name, tree);
        } else if rel_name.ends_with(".rs") {
            tree.insert(rel_name, std::fs::read_to_string(&path).unwrap());
        }
    }
}

fn src_tree() -> Tree {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut tree = Tree::new();
    read_tree(&src, "", &mut tree);
    assert!(tree.len() > 50, "src/ read as {} files", tree.len());
    tree
}

#[test]
fn no_import_cycles_between_files() {
    let reports = cycle_reports(&src_tree(), ALLOWED_CYCLES);
    assert!(reports.is_empty(), "\n{}", reports.join("\n"));
}

#[test]
fn layering_rules_hold() {
    let reports = rule_reports(&src_tree(), RULES);
    assert!(reports.is_empty(), "\n{}", reports.join("\n"));
}

/// Every allowed cycle is still there: an entry that no longer matches a
/// cycle is stale and goes.
#[test]
fn allowed_cycles_are_not_stale() {
    let found = cycles(&edges(&src_tree()));
    for allowed in ALLOWED_CYCLES {
        assert!(
            found
                .iter()
                .any(|c| c.iter().all(|f| allowed.contains(&f.as_str()))),
            "ALLOWED_CYCLES has {allowed:?}, which is no longer a cycle: remove it"
        );
    }
}

// ---------------------------------------------------------------- the checker's own tests

fn tree(files: &[(&str, &str)]) -> Tree {
    files
        .iter()
        .map(|(f, s)| (f.to_string(), s.to_string()))
        .collect()
}

/// `report` holds `part` (else the report is the failure message).
fn assert_has(report: &str, part: &str) {
    assert!(report.contains(part), "no {part:?} in:\n{report}");
}

#[test]
fn checker_reports_a_cycle_with_its_lines() {
    let t = tree(&[
        ("lib.rs", "pub mod core;\n"),
        ("core/mod.rs", "pub mod a;\npub mod b;\npub mod c;\n"),
        ("core/a.rs", "use crate::core::{\n    b::{self, B},\n    c,\n};\n"),
        ("core/b.rs", "// use crate::core::a;\nfn f() {\n    let s = \"crate::core::a\";\n    super::c::g();\n}\n"),
        ("core/c.rs", "pub fn g() {}\nfn h() -> u8 {\n    self::super::a::X\n}\n"),
    ]);
    let reports = cycle_reports(&t, &[]);
    assert_eq!(reports.len(), 1, "{reports:?}");
    let r = &reports[0];
    assert!(
        r.starts_with("import cycle between 3 files: core/a.rs, core/b.rs, core/c.rs"),
        "{r}"
    );
    assert_has(r, "core/a.rs -> core/b.rs  (src/core/a.rs:2)");
    assert_has(r, "core/a.rs -> core/c.rs  (src/core/a.rs:3)");
    assert_has(r, "core/b.rs -> core/c.rs  (src/core/b.rs:4)");
    assert_has(r, "core/c.rs -> core/a.rs  (src/core/c.rs:3)");
    // The comment and the string in b.rs name nothing.
    assert!(!r.contains("core/b.rs -> core/a.rs"), "{r}");
    // Allowed as a whole: nothing to report; a superset is not allowed.
    assert!(cycle_reports(&t, &[&["core/a.rs", "core/b.rs", "core/c.rs"]]).is_empty());
    assert_eq!(cycle_reports(&t, &[&["core/a.rs", "core/b.rs"]]).len(), 1);
}

#[test]
fn checker_ignores_parents_and_inline_test_modules() {
    let t = tree(&[
        ("lib.rs", "pub mod core;\n"),
        ("core/mod.rs", "pub mod keys;\npub use self::keys::Key;\n"),
        (
            "core/keys.rs",
            "mod state;\nuse state::S;\npub struct Key;\n#[cfg(test)]\nmod more;\n#[cfg(test)]\npub(crate) mod tests {\n    use crate::core::other::O;\n    fn f() { let _ = '{'; }\n}\nfn g() -> &'static str { \"}\" }\n",
        ),
        ("core/keys/more.rs", "use crate::core::other::O;\n"),
        ("core/other.rs", "use crate::core::keys::Key;\npub struct O;\n"),
        (
            "core/keys/state.rs",
            "use crate::core::keys::Key;\nuse super::Key as K;\npub struct S;\n#[cfg(test)]\nmod tests {\n    use super::S;\n    use super::super::Key;\n}\n",
        ),
    ]);
    assert!(cycle_reports(&t, &[]).is_empty(), "{:?}", edges(&t));
    // Test code (an inline `#[cfg(test)]` module, a `#[cfg(test)] mod
    // more;` file) names nothing.
    assert!(!edges(&t)
        .keys()
        .any(|(from, to)| from == "core/keys/more.rs" || to == "core/other.rs"));
    assert!(edges(&t).contains_key(&("core/other.rs".into(), "core/keys.rs".into())));
    // The parent naming its child by a bare `use` path is an edge.
    assert!(edges(&t).contains_key(&("core/keys.rs".into(), "core/keys/state.rs".into())));
}

#[test]
fn checker_maps_mod_rs_and_the_binary_crate() {
    let t = tree(&[
        ("lib.rs", "pub mod core;\n"),
        ("main.rs", "mod agent;\nmod serve;\n"),
        ("core/mod.rs", "pub mod writer;\n"),
        ("core/writer.rs", "pub struct Writer;\n"),
        ("agent/mod.rs", "pub mod lease;\nuse crate::serve::Api;\npub fn run() {}\n"),
        ("agent/lease.rs", "pub fn lease() {}\n"),
        ("serve/mod.rs", "pub struct Api;\nfn f() { crate::agent::run(); crate::agent::lease::lease(); rate_ctl::core::shm::writer::Writer; }\n"),
    ]);
    let r = cycle_reports(&t, &[]);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_has(&r[0], "agent/mod.rs -> serve/mod.rs  (src/agent/mod.rs:2)");
    assert_has(&r[0], "serve/mod.rs -> agent/mod.rs  (src/serve/mod.rs:2)");
    // lease.rs is named but names nothing back: not in the cycle.
    assert!(!r[0].contains("lease"), "{}", r[0]);
    assert!(
        r[0].starts_with("import cycle between 2 files: agent/mod.rs, serve/mod.rs\n"),
        "{}",
        r[0]
    );
    let rules = rule_reports(&t, RULES);
    assert_eq!(rules.len(), 2, "{rules:?}");
    assert!(
        rules[0].starts_with("src/serve/mod.rs:2: names agent (serve and"),
        "{rules:?}"
    );
    assert!(
        rules[1].starts_with("src/serve/mod.rs:2: names core::shm::writer (only"),
        "{rules:?}"
    );
}

#[test]
fn checker_reports_rule_breaches_with_the_line() {
    let t = tree(&[
        ("lib.rs", "pub mod core;\n"),
        ("main.rs", "mod store;\nmod client;\n"),
        ("core/mod.rs", "pub mod shm;\n"),
        ("core/shm.rs", "fn f() {}\nuse ngx::ffi::ngx_str_t;\n"),
        ("client/mod.rs", "pub mod wire;\n"),
        ("client/wire.rs", "pub struct W;\n"),
        ("store/mod.rs", "use crate::client::{wire::W};\n"),
    ]);
    let r = rule_reports(&t, RULES);
    assert_eq!(
        r,
        [
            "src/core/shm.rs:2: names ngx (core is nginx-free and below the module and the binary): \
             use ngx::ffi::ngx_str_t;",
            "src/store/mod.rs:1: names client (the store is below its clients): \
             use crate::client::{wire::W};",
        ]
    );
}
