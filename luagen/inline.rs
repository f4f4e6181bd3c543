//! The functions marked `--@inline`: read, checked, and renamed for a caller.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use super::tokens::{Tok, declared, indent, is_name, margin, split_list, tokens};

/// A function that may be written into its callers.
pub(super) struct Inline {
    pub(super) name: String,
    pub(super) params: Vec<String>,
    pub(super) body: Vec<String>,
    /// Its parameters and locals.
    pub(super) declared: HashSet<String>,
    /// The names it reads from outside.
    pub(super) free: HashSet<String>,
    /// Every name it reads or writes, not as a field.
    pub(super) used: HashSet<String>,
    /// The names it assigns to without declaring them (its parameters it changes).
    pub(super) assigned: HashSet<String>,
    /// Whether its one `return` is its last line.
    pub(super) tail_return: bool,
}

impl Inline {
    /// The function whose `local function` line is `header`, with `body` the lines up to its
    /// `end`; panics when it cannot be written into a caller.
    fn new(header: &str, body: Vec<String>) -> Inline {
        let sig = header
            .trim()
            .strip_prefix("local function ")
            .and_then(|s| s.strip_suffix(')'))
            .unwrap_or_else(|| panic!("--@inline before `{header}`"));
        let (name, params) = sig.split_once('(').expect("a function's parameters");
        let name = name.trim().to_owned();
        let mut all = body.clone();
        all.insert(0, header.to_owned());
        let mut declared = declared(&all);
        // Its own name is not one of its locals.
        declared.remove(&name);
        let mut scan = Scan::default();
        for n in 0..body.len() {
            scan.line(&name, &body, n, &declared);
        }
        // Its one `return` is its last line, at the body's own depth.
        let tail_return = scan.returns == 1
            && body
                .iter()
                .rev()
                .find(|l| !l.trim().is_empty())
                .is_some_and(|l| {
                    tokens(l).0.first().map(|t| t.1) == Some(Tok::Name("return"))
                        && indent(l) == margin(&body)
                });
        Inline {
            name,
            params: split_list(params),
            body,
            declared,
            free: scan.free,
            used: scan.used,
            assigned: scan.assigned,
            tail_return,
        }
    }
}

/// What a read of an inline function's body finds, line by line.
#[derive(Default)]
pub(super) struct Scan {
    free: HashSet<String>,
    used: HashSet<String>,
    assigned: HashSet<String>,
    returns: usize,
    /// Whether each enclosing block of the body is a loop.
    blocks: Vec<bool>,
    /// A `for` or `while` whose `do` is still to come.
    pending_loop: bool,
}

impl Scan {
    /// Reads line `n` of the body of the function `name` (whose locals are `declared`).
    fn line(&mut self, name: &str, body: &[String], n: usize, declared: &HashSet<String>) {
        let line = &body[n];
        let (toks, end) = tokens(line);
        let statement = !matches!(toks.first(), Some((_, Tok::Name("local" | "for"))));
        let lhs_end = toks.iter().position(|t| t.1 == Tok::Other("="));
        let fail = |why: &str| -> ! { panic!("inline function {name}: {why}: `{}`", line.trim()) };
        for (k, &(_, t)) in toks.iter().enumerate() {
            match t {
                Tok::Name("function") => fail("a function inside"),
                Tok::Other("...") => fail("`...`"),
                Tok::Name("for" | "while") => self.pending_loop = true,
                Tok::Name("do") => self.blocks.push(std::mem::take(&mut self.pending_loop)),
                Tok::Name("if") => self.blocks.push(false),
                Tok::Name("repeat") => self.blocks.push(true),
                Tok::Name("end" | "until") => {
                    self.blocks.pop();
                }
                Tok::Name("break") if !self.blocks.contains(&true) => {
                    fail("`break` outside a loop")
                }
                Tok::Name("return") => {
                    self.returns += 1;
                    if let Err(why) = self.a_return(body, n, k, end) {
                        fail(why);
                    }
                }
                t => {
                    let field = k > 0 && matches!(toks[k - 1].1, Tok::Other("." | ":"));
                    let Some(n) = is_name(t).filter(|_| !field) else {
                        continue;
                    };
                    self.used.insert(n.to_owned());
                    if !declared.contains(n) {
                        self.free.insert(n.to_owned());
                    }
                    let next = toks.get(k + 1).map(|t| t.1);
                    if statement
                        && lhs_end.is_some_and(|e| k < e)
                        && matches!(next, Some(Tok::Other("," | "=")))
                    {
                        self.assigned.insert(n.to_owned());
                    }
                }
            }
        }
    }

    /// Whether the `return`, token `k` of line `n` (whose code ends at `end`), can become an
    /// assignment and a `break`: it begins its line, fills it, is in no loop of the body.
    fn a_return(
        &self,
        body: &[String],
        n: usize,
        k: usize,
        end: usize,
    ) -> Result<(), &'static str> {
        if k != 0 {
            return Err("a `return` that does not begin its line");
        }
        if self.blocks.contains(&true) {
            return Err("a `return` inside a loop");
        }
        if end < body[n].len() {
            return Err("a comment after a `return`");
        }
        let next = body[n + 1..]
            .iter()
            .find_map(|l| tokens(l).0.first().map(|t| t.1));
        match next {
            None | Some(Tok::Name("end" | "else" | "elseif" | "until")) => Ok(()),
            _ => Err("a `return` longer than its line"),
        }
    }
}

impl Inline {
    /// The function with its locals (and parameters) named in `names` renamed, `x` to
    /// `x_{suffix}`.
    pub(super) fn renamed(&self, names: &HashSet<&str>, suffix: usize) -> Inline {
        self.replaced(&|n| names.contains(n).then(|| format!("{n}_{suffix}")))
    }

    /// The function with each of its names that `new` maps written as what it maps it to
    /// (wherever it is a variable, not a field).
    pub(super) fn replaced(&self, new: &dyn Fn(&str) -> Option<String>) -> Inline {
        let one = |n: &String| new(n).unwrap_or_else(|| n.clone());
        let map = |set: &HashSet<String>| -> HashSet<String> { set.iter().map(one).collect() };
        let mut braces = 0i32;
        let body = self
            .body
            .iter()
            .map(|line| {
                let (toks, _) = tokens(line);
                let mut out = String::with_capacity(line.len() + 8);
                let mut from = 0;
                for (k, &(at, t)) in toks.iter().enumerate() {
                    match t {
                        Tok::Other("{") => braces += 1,
                        Tok::Other("}") => braces -= 1,
                        _ => {}
                    }
                    let Tok::Name(n) = t else { continue };
                    let field = k > 0 && matches!(toks[k - 1].1, Tok::Other("." | ":"));
                    let key = braces > 0 && toks.get(k + 1).map(|t| t.1) == Some(Tok::Other("="));
                    if let Some(to) = new(n).filter(|_| !field && !key) {
                        out.push_str(&line[from..at]);
                        out.push_str(&to);
                        from = at + n.len();
                    }
                }
                out.push_str(&line[from..]);
                out
            })
            .collect();
        Inline {
            name: self.name.clone(),
            params: self.params.iter().map(one).collect(),
            body,
            declared: map(&self.declared),
            free: self.free.clone(),
            used: map(&self.used),
            assigned: map(&self.assigned),
            tail_return: self.tail_return,
        }
    }
}

/// The inline functions of `lua` (and their other names), added to `scope`.
pub(super) fn collect(lua: &str, scope: &mut HashMap<String, Rc<Inline>>) {
    let lines: Vec<&str> = lua.lines().collect();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() != "--@inline" {
            i += 1;
            continue;
        }
        let header = lines[i + 1];
        let alias = header
            .trim()
            .strip_prefix("local ")
            .and_then(|s| s.split_once(" = "))
            .filter(|(name, _)| !name.starts_with("function"));
        if let Some((name, other)) = alias {
            let f = scope
                .get(other.trim())
                .unwrap_or_else(|| panic!("--@inline: {other} is not inline"))
                .clone();
            scope.insert(name.trim().to_owned(), f);
            i += 2;
            continue;
        }
        let mut depth = 0i32;
        let mut end = None;
        for (j, line) in lines.iter().enumerate().skip(i + 1) {
            for (_, t) in tokens(line).0 {
                match t {
                    Tok::Name("function" | "if" | "do" | "repeat") => depth += 1,
                    Tok::Name("end" | "until") => depth -= 1,
                    _ => {}
                }
            }
            if depth == 0 {
                end = Some(j);
                break;
            }
        }
        let end = end.unwrap_or_else(|| panic!("--@inline: no end for `{header}`"));
        assert_eq!(
            lines[end].trim(),
            "end",
            "--@inline: `{header}` ends alone on its line"
        );
        let body = lines[i + 2..end].iter().map(|l| l.to_string()).collect();
        let f = Inline::new(header, body);
        scope.insert(f.name.clone(), Rc::new(f));
        i = end + 1;
    }
}
