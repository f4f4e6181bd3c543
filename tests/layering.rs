//! The shape of `src/`: imports go one way (no cycle among its files), and modules call each
//! other's methods rather than read each other's fields.
//!
//! A file depends on the file that defines each item it names (`use` paths and inline
//! `crate::`/`super::`/`self::` paths), followed through `pub use` re-exports, so a module that
//! only re-exports (`lib.rs`, a `mod.rs`) is looked through, not depended on. Test modules are
//! left out: they may use anything.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type ModPath = Vec<String>;

struct Module {
    file: PathBuf,
    /// The source without comments, string contents and test modules.
    code: String,
}

/// Every module of `src/` that has a file, by module path.
fn modules() -> BTreeMap<ModPath, Module> {
    fn walk(dir: &Path, path: &ModPath, out: &mut BTreeMap<ModPath, Module>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let file = entry.unwrap().path();
            let name = file.file_stem().unwrap().to_string_lossy().into_owned();
            if file.is_dir() {
                let mut p = path.clone();
                p.push(name);
                walk(&file, &p, out);
            } else if file.extension().is_some_and(|e| e == "rs") {
                let mut p = path.clone();
                if name != "mod" && name != "lib" {
                    p.push(name);
                }
                let code = strip(&std::fs::read_to_string(&file).unwrap());
                out.insert(p, Module { file, code });
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
        &Vec::new(),
        &mut out,
    );
    out
}

/// Removes comments, the contents of string and char literals, and `#[cfg(test)]` modules.
fn strip(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(i) => &text[..i],
        None => text,
    };
    let b = text.as_bytes();
    let mut out = String::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            i += 2;
            while i < b.len() && !b[i..].starts_with(b"*/") {
                i += 1;
            }
            i += 2;
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // A char literal ('"', '\n'); lifetimes have no closing quote.
            i += 1;
            while i < b.len() && b[i] != b'\'' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// A `use` statement: whether it re-exports, and the paths it brings in with their names.
struct Use {
    public: bool,
    paths: Vec<(Vec<String>, String)>,
}

/// Expands a use tree (`a::{b, c::d as e}`) into whole paths and the names they bind.
fn expand(tree: &str, prefix: &[String], out: &mut Vec<(Vec<String>, String)>) {
    let tree = tree.trim();
    if tree.is_empty() {
        return;
    }
    if let Some(open) = tree.find('{') {
        let head: Vec<String> = tree[..open]
            .split("::")
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
        let inner = &tree[open + 1..tree.rfind('}').expect("balanced braces")];
        let mut depth = 0;
        let mut start = 0;
        let mut base = prefix.to_vec();
        base.extend(head);
        for (i, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand(&inner[start..i], &base, out);
                    start = i + 1;
                }
                _ => {}
            }
        }
        expand(&inner[start..], &base, out);
        return;
    }
    let (path, alias) = match tree.split_once(" as ") {
        Some((p, a)) => (p, Some(a.trim())),
        None => (tree, None),
    };
    let mut segs = prefix.to_vec();
    segs.extend(path.split("::").map(|s| s.trim().to_owned()));
    if segs.last().is_some_and(|s| s == "self") {
        segs.pop();
    }
    let name = alias
        .map(String::from)
        .unwrap_or_else(|| segs.last().cloned().unwrap_or_default());
    out.push((segs, name));
}

fn uses(code: &str) -> Vec<Use> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = find_use(rest) {
        let before = rest[..i].trim_end();
        let public = before.ends_with("pub") || before.ends_with("pub(crate)");
        let end = rest[i..].find(';').expect("a use ends with ;") + i;
        let mut paths = Vec::new();
        expand(&rest[i + 4..end], &[], &mut paths);
        out.push(Use { public, paths });
        rest = &rest[end + 1..];
    }
    out
}

/// The start of the next `use ` keyword that begins a statement.
fn find_use(code: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(i) = code[from..].find("use ") {
        let at = from + i;
        let prev = code[..at].chars().next_back();
        if prev.is_none_or(|c| c.is_whitespace() || c == ';' || c == '{' || c == '}' || c == ')') {
            return Some(at);
        }
        from = at + 4;
    }
    None
}

/// Inline `crate::`, `super::` and `self::` paths outside `use` statements.
fn inline_paths(code: &str) -> Vec<Vec<String>> {
    let mut code = code.to_owned();
    while let Some(i) = find_use(&code) {
        let end = code[i..].find(';').unwrap() + i;
        code.replace_range(i..=end, " ");
    }
    let mut out = Vec::new();
    let b = code.as_bytes();
    for root in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(i) = code[from..].find(root) {
            let at = from + i;
            from = at + root.len();
            if at > 0 && (b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_') {
                continue;
            }
            let mut end = at;
            while end < b.len()
                && (b[end].is_ascii_alphanumeric() || b[end] == b'_' || b[end] == b':')
            {
                end += 1;
            }
            out.push(
                code[at..end]
                    .trim_end_matches(':')
                    .split("::")
                    .map(String::from)
                    .collect(),
            );
        }
    }
    out
}

struct Tree {
    modules: BTreeMap<ModPath, Module>,
    uses: BTreeMap<ModPath, Vec<Use>>,
}

impl Tree {
    /// The module whose file defines what `path`, written in module `at`, names; `None` for
    /// other crates.
    fn resolve(&self, at: &ModPath, path: &[String], depth: usize) -> Option<ModPath> {
        assert!(depth < 32, "re-exports loop at {at:?} {path:?}");
        let mut module: ModPath;
        let mut rest = path;
        match path.first().map(String::as_str) {
            Some("crate") => {
                module = Vec::new();
                rest = &path[1..];
            }
            Some("self") => {
                module = at.clone();
                rest = &path[1..];
            }
            Some("super") => {
                module = at.clone();
                while rest.first().is_some_and(|s| s == "super") {
                    module.pop();
                    rest = &rest[1..];
                }
            }
            Some(first) => {
                let mut child = at.clone();
                child.push(first.to_owned());
                if !self.modules.contains_key(&child) {
                    return None; // another crate, or std
                }
                module = at.clone();
            }
            None => return None,
        }
        for (i, seg) in rest.iter().enumerate() {
            let mut child = module.clone();
            child.push(seg.clone());
            if self.modules.contains_key(&child) {
                module = child;
                continue;
            }
            if seg == "*" {
                return Some(module);
            }
            // An item of `module`: defined there, or re-exported from elsewhere.
            let reexport = self.uses[&module]
                .iter()
                .filter(|u| u.public)
                .flat_map(|u| &u.paths)
                .find(|(_, name)| name == seg);
            return match reexport {
                Some((target, _)) => {
                    let mut target = target.clone();
                    target.extend(rest[i + 1..].iter().cloned());
                    self.resolve(&module, &target, depth + 1).or(Some(module))
                }
                None => Some(module),
            };
        }
        Some(module)
    }

    /// Each file's dependencies on other files of `src/`.
    fn edges(&self) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
        let mut edges = BTreeMap::new();
        for (at, module) in &self.modules {
            let mut to = BTreeSet::new();
            let own = self.uses[at]
                .iter()
                .filter(|u| !u.public)
                .flat_map(|u| u.paths.iter().map(|(p, _)| p.clone()));
            for path in own.chain(inline_paths(&module.code)) {
                if let Some(target) = self.resolve(at, &path, 0)
                    && target != *at
                {
                    to.insert(target);
                }
            }
            edges.insert(at.clone(), to);
        }
        edges
    }
}

fn name(m: &ModPath) -> String {
    if m.is_empty() {
        "lib".to_owned()
    } else {
        m.join("::")
    }
}

#[test]
fn no_import_cycle_among_source_files() {
    let modules = modules();
    let uses = modules
        .iter()
        .map(|(p, m)| (p.clone(), uses(&m.code)))
        .collect();
    let tree = Tree { modules, uses };
    let edges = tree.edges();
    // Depth-first search for a back edge; report the cycle it closes.
    fn visit(
        m: &ModPath,
        edges: &BTreeMap<ModPath, BTreeSet<ModPath>>,
        stack: &mut Vec<ModPath>,
        done: &mut BTreeSet<ModPath>,
    ) {
        if done.contains(m) {
            return;
        }
        if let Some(i) = stack.iter().position(|s| s == m) {
            let cycle: Vec<String> = stack[i..].iter().chain([m]).map(name).collect();
            panic!("import cycle among src/ files: {}", cycle.join(" -> "));
        }
        stack.push(m.clone());
        for next in &edges[m] {
            visit(next, edges, stack, done);
        }
        stack.pop();
        done.insert(m.clone());
    }
    let mut done = BTreeSet::new();
    for m in edges.keys() {
        visit(m, &edges, &mut Vec::new(), &mut done);
    }
    // The checker sees real dependencies: the engine depends on the store and the policies,
    // and nothing it depends on depends on it.
    let engine = vec!["limiter".to_owned()];
    let depends_on = |top: &str| edges[&engine].iter().any(|m| m[0] == top);
    assert!(depends_on("policy"));
    assert!(depends_on("store"));
    assert!(edges.values().filter(|to| to.contains(&engine)).count() >= 2);
    if std::env::var_os("LAYERING_PRINT").is_some() {
        for (m, to) in &edges {
            let to: Vec<String> = to.iter().map(name).collect();
            println!(
                "{} ({}) -> {}",
                name(m),
                tree.modules[m].file.display(),
                to.join(", ")
            );
        }
    }
}

#[test]
fn fields_are_read_through_methods() {
    // Crate-visible struct fields, outside test modules: at most half of the 93 there were
    // before the request engine was built, so that modules call each other's methods.
    let fields: Vec<String> = modules()
        .values()
        .flat_map(|m| {
            m.code
                .lines()
                .filter(|l| {
                    let l = l.trim_start();
                    l.strip_prefix("pub(crate) ").is_some_and(|rest| {
                        rest.split_once(':').is_some_and(|(name, _)| {
                            name.chars()
                                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                                && !name.is_empty()
                        })
                    })
                })
                .map(|l| format!("{}: {}", m.file.display(), l.trim()))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        fields.len() <= 46,
        "{} pub(crate) fields (at most 46):\n{}",
        fields.len(),
        fields.join("\n")
    );
}
