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

/// Ends an assignment whose names hold nil (as if just declared): an inline function called
/// there may write its results into them without setting them to nil first.
pub(super) const FRESH: &str = " --@fresh";

impl Inline {
    /// The function writing the results of its last line's `return` that are locals it
    /// declares once, on a line of its own at its margin, straight into the caller's `outs`
    /// of the same places: each such local renamed to the caller's name and declared no more
    /// (its result is then no copy of a value, each of which costs Redis a Lua instruction).
    /// Also gives, for each of `outs`, whether the `return` still assigns it. None when no
    /// result can be so written. `fresh`: the caller's names are declared just before the
    /// body (so hold nil, as the locals did).
    pub(super) fn returning_into(&self, outs: &[&str], fresh: bool) -> Option<(Inline, Vec<bool>)> {
        let margin = margin(&self.body);
        let last = self.body.iter().rposition(|l| !l.trim().is_empty())?;
        let results = split_list(self.body[last].trim().strip_prefix("return")?);
        if !self.tail_return || results.len() != outs.len() {
            return None;
        }
        let map = self.returned_locals(&results, outs, margin);
        if map.is_empty() {
            return None;
        }
        let mut f = self.replaced(&|n| map.get(n).cloned());
        let outer: HashSet<&String> = map.values().collect();
        let kept: Vec<bool> = results.iter().map(|r| !map.contains_key(r)).collect();
        let left: Vec<&str> = (results.iter())
            .filter(|r| !map.contains_key(*r))
            .map(String::as_str)
            .collect();
        let pad = " ".repeat(margin);
        f.body[last] = format!("{pad}return {}", left.join(", "))
            .trim_end()
            .to_owned();
        let mut body = Vec::with_capacity(f.body.len() + 1);
        for line in &f.body {
            let (toks, _) = tokens(line);
            let names = declared(std::slice::from_ref(line));
            let local = toks.first().map(|t| t.1) == Some(Tok::Name("local"));
            if !local || indent(line) != margin || !names.iter().any(|n| outer.contains(n)) {
                body.push(line.clone());
                continue;
            }
            undeclared(line, &outer, fresh, &pad, &mut body);
        }
        f.body = body;
        for out in map.values() {
            f.declared.remove(out);
        }
        Some((f, kept))
    }

    /// Which of `results` (the last line's, at the body's `margin`) are locals that can be
    /// the caller's `outs` of the same places: declared once, by the first line that names
    /// them (so the caller's variable holds what it held until then), at the margin, not
    /// parameters; the caller's name read nowhere else in the body.
    fn returned_locals(
        &self,
        results: &[String],
        outs: &[&str],
        margin: usize,
    ) -> HashMap<String, String> {
        let mut map: HashMap<String, String> = HashMap::new();
        for (result, &out) in results.iter().zip(outs) {
            let mut found =
                (self.body.iter()).filter(|l| declared(std::slice::from_ref(*l)).contains(result));
            let mentions = |l: &String| tokens(l).0.iter().any(|t| is_name(t.1) == Some(result));
            let first = self.body.iter().find(|l| mentions(l));
            let once = match (found.next(), found.next()) {
                (Some(l), None) => {
                    let toks = tokens(l).0;
                    first == Some(l)
                        && indent(l) == margin
                        && toks.first().map(|t| t.1) == Some(Tok::Name("local"))
                        && !toks.iter().any(|t| t.1 == Tok::Name("function"))
                }
                _ => false,
            };
            let free = !self.free.contains(out) && (out == result || !self.used.contains(out));
            if once
                && free
                && !self.params.contains(result)
                && !map.contains_key(result)
                && !map.values().any(|o| o == out)
            {
                map.insert(result.clone(), out.to_owned());
            }
        }
        map
    }
}

/// `line`, `local a, b = rhs` with `a` the caller's (in `outer`), written into `body` as
/// `local b` and `a, b = rhs` (marked [`FRESH`] when the caller's names were); without a
/// value, the caller's names set to nil unless they are fresh.
fn undeclared(
    line: &str,
    outer: &HashSet<&String>,
    fresh: bool,
    pad: &str,
    body: &mut Vec<String>,
) {
    let rest = line.trim_start()["local".len()..].trim();
    let (list, rhs) = match rest.split_once('=') {
        Some((list, rhs)) => (list, Some(rhs.trim())),
        None => (rest, None),
    };
    let list = split_list(list);
    let (theirs, own): (Vec<&String>, Vec<&String>) = list.iter().partition(|n| outer.contains(n));
    if !own.is_empty() {
        let own: Vec<&str> = own.iter().map(|n| n.as_str()).collect();
        body.push(format!("{pad}local {}", own.join(", ")));
    }
    match rhs {
        Some(rhs) => {
            let mark = if fresh { FRESH } else { "" };
            body.push(format!("{pad}{} = {rhs}{mark}", list.join(", ")));
        }
        None if !fresh => {
            let theirs: Vec<&str> = theirs.iter().map(|n| n.as_str()).collect();
            body.push(format!("{pad}{} = nil", theirs.join(", ")));
        }
        None => {}
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
