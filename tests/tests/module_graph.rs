//! The module import graph of the library crates has no cycle: each crate's top-level modules
//! form layers, and no module reaches into a layer above it.
//!
//! # The rule, exactly
//!
//! Each library crate's module tree is read from `src/lib.rs`, following `mod name;`
//! declarations (`name.rs` or `name/mod.rs`, also inside inline `mod name { … }` blocks).
//! Nodes are the crate's top-level modules (`crate::engine::execute` belongs to `engine`); the
//! crate root (`lib.rs`) is no node: its re-exports are the crate's face, not a dependency.
//! There is an edge A → B when code in A names B by a path:
//!
//! - `crate::B…` or `$crate::B…` (in macros), including each branch of a use tree
//!   (`use crate::{B::x, C}` names B and C);
//! - `super::…` and `self::…` resolved against the module they appear in (inline modules
//!   included): `super::B` in a top-level file `a.rs` is `crate::B`; inside `a/x.rs` it is
//!   `crate::a::B`, still `a`.
//!
//! - a path in a string inside an attribute, such as serde's or schemars' `with = "path"`:
//!   the derived code names it.
//!
//! Ignored: comments (doc links included: a doc may point at the layer above), string and
//! character literals elsewhere, and every item under exactly `#[cfg(test)]` (a `mod tests { … }` block,
//! a `#[cfg(test)] mod x;` file, a test-only `use` or `fn`): tests may reach anywhere. Items
//! under a feature (`#[cfg(feature = "…")]`) count: they are library code.
//!
//! A cycle is a strongly connected set of more than one module (Tarjan); a failure names each
//! of its edges with the first place the edge is written.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The crates whose module graph must have no cycle: the library crates.
const ACYCLIC: &[&str] = &["nodus-core", "nodus-store", "nodus-server", "nodus-sandbox"];

#[test]
fn the_library_crates_have_no_import_cycle() {
    let mut failures = Vec::new();
    for crate_name in ACYCLIC {
        let graph = Graph::of_crate(crate_name);
        for cycle in graph.cycles() {
            failures.push(graph.describe(crate_name, &cycle));
        }
    }
    assert!(
        failures.is_empty(),
        "import cycles:\n{}",
        failures.join("\n")
    );
}

/// The rule's reader on small sources: each path form, and what is ignored.
#[test]
fn the_reader_finds_paths_and_ignores_comments_strings_and_tests() {
    let source = r##"
        //! See [`crate::ignored_doc`].
        use crate::{alpha::X, beta::{self, Y}, gamma};
        use super::delta;
        #[serde(with = "crate::theta::dates")]
        fn f() { let _ = "crate::in_string"; let _ = r#"crate::raw"#; let _ = '"'; crate::epsilon::g(); }
        /* crate::in_block /* nested */ crate::still_comment */
        #[cfg(test)]
        use crate::test_only;
        #[cfg(test)]
        mod tests { use crate::in_tests; }
        #[cfg(feature = "x")]
        fn featured<'a>(s: &'a str) -> &'a str { $crate::zeta::h(); s }
        mod inner { use super::super::eta; use self::local; }
    "##;
    let mut refs = BTreeSet::new();
    let parsed = read_module(source, &["top".to_owned()]);
    for reference in &parsed.references {
        refs.insert(reference.target.clone());
    }
    assert_eq!(
        refs,
        [
            "alpha", "beta", "delta", "epsilon", "eta", "gamma", "theta", "top", "zeta",
        ]
        .into_iter()
        .map(str::to_owned)
        .collect::<BTreeSet<_>>()
    );
    assert!(parsed.children.is_empty());
}

#[test]
fn a_cycle_is_found_and_named() {
    let mut graph = Graph::default();
    for (from, to) in [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")] {
        graph.add(from, to, Path::new("x.rs"), 1);
    }
    assert_eq!(graph.cycles(), vec![vec!["a", "b", "c"]]);
    let text = graph.describe("demo", &graph.cycles()[0]);
    assert!(text.contains("a -> b (x.rs:1)"), "{text}");
}

/// A top-level module's edges, each with the first place it is written.
#[derive(Default)]
struct Graph {
    edges: BTreeMap<String, BTreeMap<String, (PathBuf, usize)>>,
}

impl Graph {
    fn of_crate(crate_name: &str) -> Graph {
        let src = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(crate_name)
            .join("src");
        let mut graph = Graph::default();
        let root = src.join("lib.rs");
        let text = read(&root);
        let parsed = read_module(&text, &[]);
        let mut pending: Vec<(Vec<String>, PathBuf)> = parsed
            .children
            .iter()
            .map(|child| (child.clone(), child_file(&src, child)))
            .collect();
        let modules: BTreeSet<String> = pending.iter().map(|(path, _)| path[0].clone()).collect();
        while let Some((module, file)) = pending.pop() {
            let text = read(&file);
            let parsed = read_module(&text, &module);
            for reference in parsed.references {
                if reference.target != module[0] && modules.contains(&reference.target) {
                    let relative = file.strip_prefix(&src).unwrap_or(&file);
                    graph.add(&module[0], &reference.target, relative, reference.line);
                }
            }
            for child in parsed.children {
                let path = child_file(&src, &child);
                pending.push((child, path));
            }
        }
        graph
    }

    fn add(&mut self, from: &str, to: &str, file: &Path, line: usize) {
        let place = (file.to_path_buf(), line);
        let targets = self.edges.entry(from.to_owned()).or_default();
        let entry = targets
            .entry(to.to_owned())
            .or_insert_with(|| place.clone());
        if place < *entry {
            *entry = place;
        }
        self.edges.entry(to.to_owned()).or_default();
    }

    /// The strongly connected sets of more than one module, each sorted, sorted (Tarjan).
    fn cycles(&self) -> Vec<Vec<String>> {
        struct Walk<'g> {
            graph: &'g Graph,
            index: BTreeMap<&'g str, usize>,
            low: BTreeMap<&'g str, usize>,
            stack: Vec<&'g str>,
            on_stack: BTreeSet<&'g str>,
            found: Vec<Vec<String>>,
        }
        impl<'g> Walk<'g> {
            fn visit(&mut self, node: &'g str) {
                let number = self.index.len();
                self.index.insert(node, number);
                self.low.insert(node, number);
                self.stack.push(node);
                self.on_stack.insert(node);
                for next in self.graph.edges[node].keys() {
                    let next = next.as_str();
                    if !self.index.contains_key(next) {
                        self.visit(next);
                        let low = self.low[node].min(self.low[next]);
                        self.low.insert(node, low);
                    } else if self.on_stack.contains(next) {
                        let low = self.low[node].min(self.index[next]);
                        self.low.insert(node, low);
                    }
                }
                if self.low[node] == self.index[node] {
                    let mut set = Vec::new();
                    loop {
                        let member = self.stack.pop().expect("the node itself is on the stack");
                        self.on_stack.remove(member);
                        set.push(member.to_owned());
                        if member == node {
                            break;
                        }
                    }
                    if set.len() > 1 {
                        set.sort();
                        self.found.push(set);
                    }
                }
            }
        }
        let mut walk = Walk {
            graph: self,
            index: BTreeMap::new(),
            low: BTreeMap::new(),
            stack: Vec::new(),
            on_stack: BTreeSet::new(),
            found: Vec::new(),
        };
        for node in self.edges.keys() {
            if !walk.index.contains_key(node.as_str()) {
                walk.visit(node);
            }
        }
        walk.found.sort();
        walk.found
    }

    fn describe(&self, crate_name: &str, cycle: &[String]) -> String {
        let mut lines = vec![format!("{crate_name}: cycle through {}", cycle.join(", "))];
        for from in cycle {
            for (to, (file, line)) in &self.edges[from] {
                if cycle.contains(to) {
                    lines.push(format!("  {from} -> {to} ({}:{line})", file.display()));
                }
            }
        }
        lines.join("\n")
    }
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The file of module `path` (from the crate root): `a/b.rs` or `a/b/mod.rs`.
fn child_file(src: &Path, path: &[String]) -> PathBuf {
    let mut base = src.to_path_buf();
    for part in path {
        base.push(part);
    }
    let flat = base.with_extension("rs");
    if flat.exists() {
        return flat;
    }
    let nested = base.join("mod.rs");
    assert!(nested.exists(), "module {} has no file", path.join("::"));
    nested
}

/// What one file says: the top-level modules it names, and the file modules it declares (full
/// paths from the crate root).
struct Module {
    references: Vec<Reference>,
    children: Vec<Vec<String>>,
}

struct Reference {
    target: String,
    line: usize,
}

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    PathSep,
    Punct(char),
}

/// Reads one file of module `path` (empty for the crate root).
fn read_module(text: &str, path: &[String]) -> Module {
    let tokens = tokenize(&strip_comments_and_literals(text));
    let mut module = Module {
        references: Vec::new(),
        children: Vec::new(),
    };
    // The inline modules we are in: their name and the brace depth their body opened at.
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < tokens.len() {
        let (token, line) = &tokens[i];
        let current: Vec<String> = path
            .iter()
            .cloned()
            .chain(inline.iter().map(|(name, _)| name.clone()))
            .collect();
        match token {
            Token::Punct('#') if is_cfg_test(&tokens, i) => {
                i = skip_item(&tokens, skip_attribute(&tokens, i));
                continue;
            }
            Token::Punct('{') => depth += 1,
            Token::Punct('}') => {
                depth = depth.saturating_sub(1);
                if inline.last().is_some_and(|(_, open)| *open == depth) {
                    inline.pop();
                }
            }
            Token::Ident(word) if word == "mod" => {
                if let (Some((Token::Ident(name), _)), Some((next, _))) =
                    (tokens.get(i + 1), tokens.get(i + 2))
                {
                    let mut child = current.clone();
                    child.push(name.clone());
                    match next {
                        Token::Punct(';') => module.children.push(child),
                        Token::Punct('{') => {
                            inline.push((name.clone(), depth));
                            depth += 1;
                            i += 3;
                            continue;
                        }
                        _ => {}
                    }
                }
            }
            Token::Ident(word)
                if matches!(word.as_str(), "crate" | "super" | "self")
                    && tokens.get(i + 1).map(|t| &t.0) == Some(&Token::PathSep) =>
            {
                // `crate::…` names from the root; each `super::` goes one module up.
                let mut base: Vec<String> = match word.as_str() {
                    "crate" => Vec::new(),
                    _ => current.clone(),
                };
                let mut j = i;
                if word == "super" {
                    base = current.clone();
                    while tokens.get(j).map(|t| &t.0) == Some(&Token::Ident("super".into()))
                        && tokens.get(j + 1).map(|t| &t.0) == Some(&Token::PathSep)
                    {
                        base.pop();
                        j += 2;
                    }
                } else {
                    j += 2;
                }
                let targets = if let Some(top) = base.first() {
                    vec![top.clone()]
                } else {
                    first_segments(&tokens, j)
                };
                for target in targets {
                    module.references.push(Reference {
                        target,
                        line: *line,
                    });
                }
                i = j;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    module
}

/// The first segment of each path a use tree starting at `at` names: `a::b` gives `a`;
/// `{a::b, c::{d}, self}` gives `a`, `c` (and `self` names the base itself: skipped).
fn first_segments(tokens: &[(Token, usize)], at: usize) -> Vec<String> {
    match tokens.get(at).map(|t| &t.0) {
        Some(Token::Ident(name)) if name != "self" => vec![name.clone()],
        Some(Token::Punct('{')) => {
            let mut names = Vec::new();
            let mut depth = 0;
            let mut element_start = true;
            for (token, _) in &tokens[at..] {
                match token {
                    Token::Punct('{') => {
                        depth += 1;
                        if depth == 1 {
                            element_start = true;
                        }
                    }
                    Token::Punct('}') => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    Token::Punct(',') if depth == 1 => element_start = true,
                    Token::Ident(name) if depth == 1 && element_start => {
                        element_start = false;
                        if name != "self" {
                            names.push(name.clone());
                        }
                    }
                    _ => {
                        if depth == 1 {
                            element_start = false;
                        }
                    }
                }
            }
            names
        }
        _ => Vec::new(),
    }
}

/// Whether the attribute starting at `at` (`#`) is exactly `#[cfg(test)]`.
fn is_cfg_test(tokens: &[(Token, usize)], at: usize) -> bool {
    let expected = [
        Token::Punct('#'),
        Token::Punct('['),
        Token::Ident("cfg".into()),
        Token::Punct('('),
        Token::Ident("test".into()),
        Token::Punct(')'),
        Token::Punct(']'),
    ];
    tokens.len() >= at + expected.len()
        && tokens[at..at + expected.len()]
            .iter()
            .map(|t| &t.0)
            .eq(expected.iter())
}

/// The index after the attribute starting at `at` (`#[…]`, brackets nested).
fn skip_attribute(tokens: &[(Token, usize)], at: usize) -> usize {
    let mut depth = 0;
    for (offset, (token, _)) in tokens[at..].iter().enumerate() {
        match token {
            Token::Punct('[') => depth += 1,
            Token::Punct(']') => {
                depth -= 1;
                if depth == 0 {
                    return at + offset + 1;
                }
            }
            _ => {}
        }
    }
    tokens.len()
}

/// The index after the item starting at `at`: its other attributes, then up to a `;` outside
/// any brackets or through the first `{ … }` block, whichever comes first.
fn skip_item(tokens: &[(Token, usize)], mut at: usize) -> usize {
    while tokens.get(at).map(|t| &t.0) == Some(&Token::Punct('#')) {
        at = skip_attribute(tokens, at);
    }
    let mut depth = 0;
    for (offset, (token, _)) in tokens[at..].iter().enumerate() {
        match token {
            Token::Punct('(' | '[') => depth += 1,
            Token::Punct(')' | ']') => depth -= 1,
            Token::Punct(';') if depth == 0 => return at + offset + 1,
            Token::Punct('{') => depth += 1,
            Token::Punct('}') => {
                depth -= 1;
                if depth == 0 {
                    return at + offset + 1;
                }
            }
            _ => {}
        }
    }
    tokens.len()
}

/// Identifiers (`$crate` read as `crate`), `::`, and single punctuation, each with its line.
fn tokenize(text: &str) -> Vec<(Token, usize)> {
    let chars: Vec<char> = text.chars().collect();
    let mut tokens = Vec::new();
    let mut line = 1;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\n' {
            line += 1;
            i += 1;
        } else if c.is_whitespace() {
            i += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            tokens.push((Token::Ident(chars[start..i].iter().collect()), line));
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            tokens.push((Token::PathSep, line));
            i += 2;
        } else if c == '$' {
            i += 1;
        } else {
            tokens.push((Token::Punct(c), line));
            i += 1;
        }
    }
    tokens
}

/// The text with comments and the insides of string and character literals blanked (lines
/// kept), so that nothing written in them reads as a path; a string inside an attribute
/// (`#[serde(with = "path")]`) is kept, as the code derived from it names the path.
fn strip_comments_and_literals(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    // Inside an attribute: the depth of its brackets.
    let mut attribute: Option<usize> = None;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        match (c, attribute) {
            ('#', None)
                if next == Some('[') || (next == Some('!') && chars.get(i + 2) == Some(&'[')) =>
            {
                attribute = Some(0);
            }
            ('[', Some(depth)) => attribute = Some(depth + 1),
            (']', Some(depth)) => attribute = (depth > 1).then(|| depth - 1),
            _ => {}
        }
        let previous_is_ident = i > 0 && ident(chars[i - 1]);
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if c == 'r'
            && !previous_is_ident
            && matches!(next, Some('"' | '#'))
            && raw_string_hashes(&chars, i + 1).is_some()
        {
            // r"…", r#"…"#: ends at a quote followed by as many hashes.
            let hashes = raw_string_hashes(&chars, i + 1).unwrap_or(0);
            let opening = 1 + hashes + 1;
            out.push_str(&" ".repeat(opening));
            i += opening;
            while i < chars.len() {
                if chars[i] == '"' && (1..=hashes).all(|k| chars.get(i + k) == Some(&'#')) {
                    out.push_str(&" ".repeat(1 + hashes));
                    i += 1 + hashes;
                    break;
                }
                out.push(blank(chars[i]));
                i += 1;
            }
        } else if c == '"' && attribute.is_some() {
            // Through the closing quote, kept as written.
            out.push(c);
            i += 1;
            while i < chars.len() {
                out.push(chars[i]);
                i += 1;
                if chars[i - 1] == '"' {
                    break;
                }
            }
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < chars.len() {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' && (next == Some('\\') || chars.get(i + 2) == Some(&'\'')) {
            // A character literal ('x', '\n', '\u{…}'); a lifetime ('a) is left alone.
            out.push(' ');
            i += 1;
            while i < chars.len() && chars[i] != '\'' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                out.push(' ');
                i += 1;
            }
            out.push(' ');
            i += 1;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// After an `r`: the number of `#` before the opening quote of a raw string, if one opens here.
fn raw_string_hashes(chars: &[char], at: usize) -> Option<usize> {
    let hashes = chars[at..].iter().take_while(|c| **c == '#').count();
    (chars.get(at + hashes) == Some(&'"')).then_some(hashes)
}
