//! The fused decision: for one policy enforced alone (the usual request), a function per
//! algorithm, `fused.lua` with the twin's own `load`, `evaluate`, `commit` and `lag` written
//! into it, so that the decision makes almost no Lua call beyond Redis's commands (a Lua call
//! costs Redis about 500 instructions, a whole decision about 50,000).
//!
//! Nothing is written twice: what is written into it is the twin's code, the functions the
//! general path calls. A function marked by a line `--@inline` before its `local function`
//! line (or a name marked so before `local name = other`, an inline function under another
//! name) is written into its caller in place of a call that is a statement of its own
//! (`local a, b = f(x)`, `a = f(x)` or `f(x)`):
//!
//! ```lua
//! local _i1_1, _i1_2
//! repeat
//!   local params = x
//!   -- the body, each `return e` turned into `_i1_1, _i1_2 = e break`
//! until true
//! local a, b = _i1_1, _i1_2
//! ```
//!
//! `repeat ... until true` compiles to no jump of its own, and `break` leaves it as `return`
//! leaves the function. So an inline function has no `return` inside a loop of its own (it
//! would leave the loop instead), no `return` that does not fill its line, no function inside
//! it and no `...`; and no name it reads from outside is one its caller declares (it would
//! read the caller's local instead). The generator checks all of this and panics naming the
//! function, which the script's tests show; a call inside an expression stays a call.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;

const KEYWORDS: &[&str] = &[
    "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "if", "in", "local",
    "nil", "not", "or", "repeat", "return", "then", "true", "until", "while",
];

/// A token of a line of Lua: a name (or keyword), a number, a string or a symbol, and where
/// it starts.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Tok<'a> {
    Name(&'a str),
    Other(&'a str),
}

/// The tokens of one line and where its code ends (a comment's start, or the line's end).
/// Strings are one token; the Lua sources have no long strings or comments (`[[`).
fn tokens(line: &str) -> (Vec<(usize, Tok<'_>)>, usize) {
    let b = line.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    while i < b.len() {
        let start = i;
        let c = b[i];
        if c.is_ascii_whitespace() {
            i += 1;
            continue;
        }
        if b[i..].starts_with(b"--") {
            assert!(!b[i..].starts_with(b"--[["), "no long comments: {line}");
            return (out, i);
        }
        if c == b'\'' || c == b'"' {
            i += 1;
            while i < b.len() && b[i] != c {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i = (i + 1).min(b.len());
            out.push((start, Tok::Other(&line[start..i])));
            continue;
        }
        if word(c) {
            while i < b.len() && (word(b[i]) || (c.is_ascii_digit() && b[i] == b'.')) {
                i += 1;
            }
            let text = &line[start..i];
            out.push((
                start,
                if c.is_ascii_digit() {
                    Tok::Other(text)
                } else {
                    Tok::Name(text)
                },
            ));
            continue;
        }
        let len = if b[i..].starts_with(b"...") {
            3
        } else if [&b".."[..], b"==", b"~=", b"<=", b">="]
            .iter()
            .any(|s| b[i..].starts_with(s))
        {
            2
        } else {
            1
        };
        assert!(!b[i..].starts_with(b"[["), "no long strings: {line}");
        i += len;
        out.push((start, Tok::Other(&line[start..i])));
    }
    (out, b.len())
}

fn is_name(t: Tok<'_>) -> Option<&str> {
    match t {
        Tok::Name(n) if !KEYWORDS.contains(&n) => Some(n),
        _ => None,
    }
}

/// The names `lines` declare: after `local` (and `local function`) and `for`.
fn declared(lines: &[String]) -> HashSet<String> {
    let mut names = HashSet::new();
    for line in lines {
        let (toks, _) = tokens(line);
        let mut k = 0;
        while k < toks.len() {
            if let Tok::Name("local" | "for" | "function") = toks[k].1 {
                k += 1;
                while let Some(&(_, t)) = toks.get(k) {
                    match t {
                        Tok::Name("function") | Tok::Other(",") => {}
                        t => match is_name(t) {
                            Some(n) => {
                                names.insert(n.to_owned());
                            }
                            None => break,
                        },
                    }
                    k += 1;
                }
                // `function f(a, b)`: its parameters too.
                if toks.get(k).map(|t| t.1) == Some(Tok::Other("(")) {
                    k += 1;
                    while let Some(&(_, t)) = toks.get(k) {
                        if let Some(n) = is_name(t) {
                            names.insert(n.to_owned());
                        } else if t != Tok::Other(",") {
                            break;
                        }
                        k += 1;
                    }
                }
            } else {
                k += 1;
            }
        }
    }
    names
}

/// A function that may be written into its callers.
struct Inline {
    name: String,
    params: Vec<String>,
    body: Vec<String>,
    /// Its parameters and locals.
    declared: HashSet<String>,
    /// The names it reads from outside.
    free: HashSet<String>,
    /// Every name it reads or writes, not as a field.
    used: HashSet<String>,
    /// The names it assigns to without declaring them (its parameters it changes).
    assigned: HashSet<String>,
    /// Whether its one `return` is its last line.
    tail_return: bool,
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
                    l.trim_start().starts_with("return") && indent(l) == margin(&body)
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

/// How far `line` is indented.
fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// How far the least indented of `lines` that are not blank is indented.
fn margin(lines: &[String]) -> usize {
    lines
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| indent(l))
        .min()
        .unwrap_or(0)
}

/// What a read of an inline function's body finds, line by line.
#[derive(Default)]
struct Scan {
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
    fn renamed(&self, names: &HashSet<&str>, suffix: usize) -> Inline {
        let new = |n: &str| format!("{n}_{suffix}");
        let map = |set: &HashSet<String>| -> HashSet<String> {
            set.iter()
                .map(|n| {
                    if names.contains(n.as_str()) {
                        new(n)
                    } else {
                        n.clone()
                    }
                })
                .collect()
        };
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
                    if names.contains(n) && !field && !key {
                        out.push_str(&line[from..at]);
                        out.push_str(&new(n));
                        from = at + n.len();
                    }
                }
                out.push_str(&line[from..]);
                out
            })
            .collect();
        Inline {
            name: self.name.clone(),
            params: self
                .params
                .iter()
                .map(|n| {
                    if names.contains(n.as_str()) {
                        new(n)
                    } else {
                        n.clone()
                    }
                })
                .collect(),
            body,
            declared: map(&self.declared),
            free: self.free.clone(),
            used: map(&self.used),
            assigned: map(&self.assigned),
            tail_return: self.tail_return,
        }
    }
}

/// The items of a comma-separated list (parameters, arguments), split where no bracket is
/// open.
fn split_list(list: &str) -> Vec<String> {
    let mut items = Vec::new();
    let (mut depth, mut from) = (0i32, 0);
    let (toks, _) = tokens(list);
    for (at, t) in toks {
        match t {
            Tok::Other("(" | "[" | "{") => depth += 1,
            Tok::Other(")" | "]" | "}") => depth -= 1,
            Tok::Other(",") if depth == 0 => {
                items.push(list[from..at].trim().to_owned());
                from = at + 1;
            }
            _ => {}
        }
    }
    let last = list[from..].trim();
    if !last.is_empty() || !items.is_empty() {
        items.push(last.to_owned());
    }
    items
}

/// Whether `expr` is one name or literal.
fn plain(expr: &str) -> bool {
    tokens(expr).0.len() == 1
}

/// Whether evaluating `expr` can do nothing but give its value: it calls nothing (the
/// tables of the script have no metatables).
fn pure(expr: &str) -> bool {
    !tokens(expr).0.iter().any(|t| t.1 == Tok::Other("("))
}

/// The inline functions of `lua` (and their other names), added to `scope`.
fn collect(lua: &str, scope: &mut HashMap<String, Rc<Inline>>) {
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

/// A call that is a statement of its own: `[local] a, b = f(args)` or `f(args)`.
struct Call<'a> {
    indent: &'a str,
    local: bool,
    outs: Vec<&'a str>,
    name: &'a str,
    args: &'a str,
}

fn call_statement<'a>(line: &'a str, scope: &HashMap<String, Rc<Inline>>) -> Option<Call<'a>> {
    let (toks, _) = tokens(line);
    let indent = &line[..line.len() - line.trim_start().len()];
    let mut k = 0;
    let local = toks.first()?.1 == Tok::Name("local");
    if local {
        k += 1;
    }
    let mut outs = Vec::new();
    // The names assigned, when there is an `=`.
    if toks.iter().any(|t| t.1 == Tok::Other("=")) {
        loop {
            outs.push(is_name(toks.get(k)?.1)?);
            k += 1;
            match toks.get(k)?.1 {
                Tok::Other(",") => k += 1,
                Tok::Other("=") => break,
                _ => return None,
            }
        }
        k += 1;
    } else if local {
        return None;
    }
    let name = is_name(toks.get(k)?.1).filter(|n| scope.contains_key(*n))?;
    let (open, _) = *toks.get(k + 1).filter(|t| t.1 == Tok::Other("("))?;
    let mut depth = 0;
    for (j, &(at, t)) in toks.iter().enumerate().skip(k + 1) {
        match t {
            Tok::Other("(") => depth += 1,
            Tok::Other(")") => depth -= 1,
            _ => {}
        }
        if depth == 0 {
            // The call must be the whole statement.
            return (j == toks.len() - 1).then(|| Call {
                indent,
                local,
                outs,
                name,
                args: line[open + 1..at].trim(),
            });
        }
    }
    None
}

/// Writes inline functions into the lines of one caller.
struct Fuser<'a> {
    scope: &'a HashMap<String, Rc<Inline>>,
    next: usize,
}

impl Fuser<'_> {
    /// `lines` with every call of an inline function that is a statement of its own replaced
    /// by the function's body; `declared` holds every name the caller declares.
    fn expand(
        &mut self,
        lines: &[String],
        declared: &mut HashSet<String>,
        depth: u32,
    ) -> Vec<String> {
        assert!(depth < 16, "inline functions call each other too deep");
        let mut out = Vec::with_capacity(lines.len());
        for line in lines {
            match call_statement(line, self.scope) {
                Some(call) => self.inline(&call, line, declared, depth, &mut out),
                None => out.push(line.clone()),
            }
        }
        out
    }

    /// Writes the body of the function `call` calls into `out`, in place of the call.
    fn inline(
        &mut self,
        call: &Call<'_>,
        line: &str,
        declared: &mut HashSet<String>,
        depth: u32,
        out: &mut Vec<String>,
    ) {
        self.next += 1;
        let f = self.callee(call, line, declared);
        // The results go straight to the caller's names, declared before the body, unless
        // the body or an argument reads the caller's variable of one of those names.
        let arg_names: HashSet<&str> = tokens(call.args)
            .0
            .into_iter()
            .filter_map(|t| is_name(t.1))
            .collect();
        let direct = !call.local
            || !call
                .outs
                .iter()
                .any(|o| arg_names.contains(o) || f.free.contains(*o));
        let target = if direct {
            call.outs.join(", ")
        } else {
            let temps: Vec<String> = (1..=call.outs.len())
                .map(|j| format!("_i{}_{j}", self.next))
                .collect();
            temps.join(", ")
        };
        let body = self.expand(&body(&f, call, &target), declared, depth + 1);
        let indent = call.indent;
        if !call.outs.is_empty() && (!direct || call.local) {
            out.push(format!("{indent}local {target}"));
        }
        let (open, close) = if f.tail_return {
            ("do", "end")
        } else {
            ("repeat", "until true")
        };
        out.push(format!("{indent}{open} -- {}", f.name));
        out.extend(body);
        out.push(format!("{indent}{close}"));
        if !direct {
            let local = if call.local { "local " } else { "" };
            out.push(format!(
                "{indent}{local}{} = {target}",
                call.outs.join(", ")
            ));
        }
    }

    /// The function `call` calls, its locals named as the call's results renamed (so that
    /// the results can be assigned from inside it), after checking that it reads none of the
    /// caller's names; its names are the caller's from then on.
    fn callee(&self, call: &Call<'_>, line: &str, declared: &mut HashSet<String>) -> Rc<Inline> {
        let mut f = self.scope[call.name].clone();
        let clashes: HashSet<&str> = call
            .outs
            .iter()
            .copied()
            .filter(|o| f.declared.contains(*o))
            .collect();
        if !clashes.is_empty() {
            f = Rc::new(f.renamed(&clashes, self.next));
        }
        if let Some(name) = f.free.iter().find(|n| declared.contains(*n)) {
            panic!(
                "inline function {}: reads `{name}`, which its caller declares: `{}`",
                f.name,
                line.trim()
            );
        }
        declared.extend(f.declared.iter().cloned());
        f
    }
}

/// The lines of `f` written in place of `call`, its results assigned to `target`: its
/// parameters bound to the arguments, then its body, each `return` an assignment and, unless
/// it is the body's last line, a `break`.
fn body(f: &Inline, call: &Call<'_>, target: &str) -> Vec<String> {
    let args = split_list(call.args);
    for extra in args.iter().skip(f.params.len()) {
        assert!(
            pure(extra),
            "{}: an argument it has no parameter for: {extra}",
            f.name
        );
    }
    // A parameter is bound to its argument unless nothing reads it, or the argument is the
    // caller's variable of the same name and the body never changes it.
    let (mut names, mut values) = (Vec::new(), Vec::new());
    for (i, param) in f.params.iter().enumerate() {
        let arg = args.get(i).map_or("nil", String::as_str);
        let unread = !f.used.contains(param) && pure(arg);
        if !unread && (arg != param || f.assigned.contains(param)) {
            names.push(param.as_str());
            values.push(arg);
        }
    }
    let indent = call.indent;
    let mut lines = Vec::with_capacity(f.body.len() + 1);
    if !names.is_empty() {
        let (names, values) = (names.join(", "), values.join(", "));
        lines.push(format!("{indent}  local {names} = {values}"));
    }
    let margin = margin(&f.body);
    let exit = if f.tail_return { "" } else { " break" };
    for l in &f.body {
        let l = l.get(margin..).unwrap_or("");
        let trimmed = l.trim_start();
        let Some(expr) = trimmed.strip_prefix("return").map(str::trim) else {
            lines.push(format!("{indent}  {l}"));
            continue;
        };
        let pad = &l[..l.len() - trimmed.len()];
        let assign = match (call.outs.is_empty(), expr.is_empty() || plain(expr)) {
            (false, true) if expr.is_empty() => format!("{target} = nil"),
            (false, _) => format!("{target} = {expr}"),
            (true, true) => String::new(),
            (true, false) => format!("local _ = {expr}"),
        };
        let text = format!("{assign}{exit}");
        if !text.trim().is_empty() {
            lines.push(format!("{indent}  {pad}{}", text.trim()));
        }
    }
    lines
}

/// `twin` with the fused decision (`template`, one `local function fused`) written into it,
/// before the algorithm's table, and the table's `fused` field; the twin (or `helpers`) must
/// have the inline functions named in `required`. Lines of the template
/// between `--@if name` and `--@end` are kept when the twin (or `helpers`) has an inline
/// function `name`.
pub(super) fn fuse(helpers: &str, twin: &str, template: &str, required: &[&str]) -> String {
    let mut scope = HashMap::new();
    collect(helpers, &mut scope);
    collect(twin, &mut scope);
    for &name in required {
        assert!(
            scope.contains_key(name),
            "the twin has no inline `{name}`:\n{twin}"
        );
    }
    let mut lines = Vec::new();
    let mut keep = true;
    for line in template.lines() {
        let trimmed = line.trim();
        if let Some(name) = trimmed.strip_prefix("--@if ") {
            keep = scope.contains_key(name.trim());
        } else if trimmed == "--@end" {
            keep = true;
        } else if keep {
            lines.push(format!("  {line}"));
        }
    }
    let mut names = declared(&lines);
    let fused = Fuser {
        scope: &scope,
        next: 0,
    }
    .expand(&lines, &mut names, 0);
    let table = twin
        .lines()
        .position(|l| l == "  return {")
        .expect("a twin ends with its table: `  return {`");
    let mut out: Vec<String> = twin.lines().map(str::to_owned).collect();
    out.insert(table + 1, "    fused = fused,".to_owned());
    out.splice(table..table, fused);
    let mut text = out.join("\n");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `lua` with every line's indentation taken away.
    fn squash(lua: &str) -> String {
        lua.lines().map(str::trim).collect::<Vec<_>>().join("\n")
    }

    const HELPERS: &str = "\
--@inline
local function half(a)
  local r = a / 2
  if r < 1 then
    return 0
  end
  return r - r % 1
end
";

    #[test]
    fn a_call_statement_becomes_the_body() {
        let twin = "ALG[1] = function()\n  --@inline\n  local h = half\n  return {\n  }\nend\n";
        let template = "local function fused(x)\n  local y = h(x + 1)\n  return y\nend\n";
        let fused = squash(&fuse(HELPERS, twin, template, &[]));
        assert!(fused.contains("local y\nrepeat -- half\n"), "{fused}");
        assert!(fused.contains("local a = x + 1"), "{fused}");
        assert!(fused.contains("y = 0 break"), "{fused}");
        assert!(fused.contains("y = r - r % 1 break"), "{fused}");
        assert!(fused.contains("\nfused = fused,"), "{fused}");
        assert!(!fused.contains("half("), "{fused}");
    }

    /// A function whose one `return` ends it is a `do` block; a parameter its caller has
    /// under the same name, and never changed, is not bound again; one it changes is; a local
    /// of the body named as a result of the call is renamed.
    #[test]
    fn bindings_are_made_only_where_needed() {
        let helpers =
            "--@inline\nlocal function add(a, b)\n  a = a + b\n  local s = a\n  return s\nend\n";
        let twin = "ALG[1] = function()\n  return {\n  }\nend\n";
        let template =
            "local function fused(a, b)\n  local s = add(a, b)\n  b = add(b, 1)\n  return s\nend\n";
        let fused = squash(&fuse(helpers, twin, template, &[]));
        assert!(
            fused.contains("local s\ndo -- add\nlocal a = a\n"),
            "{fused}"
        );
        assert!(fused.contains("local s_1 = a\ns = s_1\nend\n"), "{fused}");
        assert!(
            fused.contains("local a, b_2 = b, 1\na = a + b_2\n"),
            "{fused}"
        );
        assert!(!fused.contains("break"), "{fused}");
    }

    #[test]
    fn calls_inside_expressions_stay_calls() {
        let twin = "ALG[1] = function()\n  return {\n  }\nend\n";
        let template = "local function fused(x)\n  local y = half(x) + 1\n  return y\nend\n";
        assert!(fuse(HELPERS, twin, template, &[]).contains("local y = half(x) + 1"));
    }

    #[test]
    #[should_panic(expected = "which its caller declares")]
    fn a_name_the_caller_shadows_is_refused() {
        let helpers = "local k = 2\n--@inline\nlocal function f(a)\n  return a * k\nend\n";
        let twin = "ALG[1] = function()\n  return {\n  }\nend\n";
        let template = "local function fused(x)\n  local k = 3\n  local y = f(x)\nend\n";
        fuse(helpers, twin, template, &[]);
    }

    #[test]
    #[should_panic(expected = "a `return` inside a loop")]
    fn a_return_in_a_loop_is_refused() {
        let helpers =
            "--@inline\nlocal function f(a)\n  for i = 1, a do\n    return i\n  end\nend\n";
        fuse(
            helpers,
            "ALG[1] = function()\n  return {\n  }\nend\n",
            "",
            &[],
        );
    }
}
