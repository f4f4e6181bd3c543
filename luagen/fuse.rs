//! The fused decision written: each call of an inline function that is a statement of
//! its own replaced by the function's body.

use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use super::inline::{FRESH, Inline, collect};
use super::tokens::{Tok, declared, is_name, margin, plain, pure, split_list, tokens};

/// A call that is a statement of its own: `[local] a, b = f(args)` or `f(args)`.
pub(super) struct Call<'a> {
    indent: &'a str,
    local: bool,
    outs: Vec<&'a str>,
    name: &'a str,
    args: &'a str,
}

pub(super) fn call_statement<'a>(
    line: &'a str,
    scope: &HashMap<String, Rc<Inline>>,
) -> Option<Call<'a>> {
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
pub(super) struct Fuser<'a> {
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
                None => out.push(line.strip_suffix(FRESH).unwrap_or(line).to_owned()),
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
        // The results go straight to the caller's names, declared before the body, unless
        // the body or an argument reads the caller's variable of one of those names.
        let arg_names: HashSet<&str> = tokens(call.args)
            .0
            .into_iter()
            .filter_map(|t| is_name(t.1))
            .collect();
        let free = &self.scope[call.name].free;
        let direct = !call.local
            || !call
                .outs
                .iter()
                .any(|o| arg_names.contains(o) || free.contains(*o));
        let (f, kept) = self.callee(call, line, declared, direct);
        let target = if direct {
            let outs = call.outs.iter().zip(&kept).filter(|(_, k)| **k);
            outs.map(|(o, _)| *o).collect::<Vec<_>>().join(", ")
        } else {
            let temps: Vec<String> = (1..=call.outs.len())
                .map(|j| format!("_i{}_{j}", self.next))
                .collect();
            temps.join(", ")
        };
        let body = self.expand(&body(&f, call, &target), declared, depth + 1);
        let indent = call.indent;
        if !call.outs.is_empty() && (!direct || call.local) {
            let names = if direct {
                call.outs.join(", ")
            } else {
                target.clone()
            };
            out.push(format!("{indent}local {names}"));
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
    fn callee(
        &self,
        call: &Call<'_>,
        line: &str,
        declared: &mut HashSet<String>,
        direct: bool,
    ) -> (Rc<Inline>, Vec<bool>) {
        let mut f = self.scope[call.name].clone();
        let mut kept = vec![true; call.outs.len()];
        let fresh = call.local || line.ends_with(FRESH);
        if let Some((g, k)) = direct
            .then(|| f.returning_into(&call.outs, fresh))
            .flatten()
        {
            (f, kept) = (Rc::new(g), k);
        }
        let clashes: HashSet<&str> = (call.outs.iter().copied())
            .filter(|o| f.declared.contains(*o))
            .collect();
        if !clashes.is_empty() {
            f = Rc::new(f.renamed(&clashes, self.next));
        }
        // A parameter the body never changes, given a number or a variable of the caller's,
        // is that number or variable wherever the body reads it: no copy is made (each costs
        // Redis a Lua instruction), and Lua folds `0 + 1` and indexes `t[1]` by a constant. A
        // variable is so written unless the body declares the same name, or the call
        // assigns it.
        let args = split_list(call.args);
        let given: HashMap<String, String> = f
            .params
            .iter()
            .zip(&args)
            .filter(|(p, a)| {
                let variable = tokens(a).0.len() == 1
                    && is_name(tokens(a).0[0].1).is_some()
                    && !f.declared.contains(a.as_str())
                    && !call.outs.contains(&a.as_str());
                !f.assigned.contains(*p) && (a.parse::<f64>().is_ok() || variable)
            })
            .map(|(p, a)| (p.clone(), a.clone()))
            .collect();
        if !given.is_empty() {
            let mut g = f.replaced(&|n| given.get(n).cloned());
            // What the parameters were given is the caller's, not declared by the body.
            for value in given.values() {
                g.declared.remove(value);
            }
            f = Rc::new(g);
        }
        if let Some(name) = f.free.iter().find(|n| declared.contains(*n)) {
            panic!(
                "inline function {}: reads `{name}`, which its caller declares: `{}`",
                f.name,
                line.trim()
            );
        }
        declared.extend(f.declared.iter().cloned());
        (f, kept)
    }
}

/// The lines of `f` written in place of `call`, its results assigned to `target`: its
/// parameters bound to the arguments, then its body, each `return` an assignment and, unless
/// it is the body's last line, a `break`.
pub(super) fn body(f: &Inline, call: &Call<'_>, target: &str) -> Vec<String> {
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
        if trimmed.starts_with("--") {
            // Its comments are read where the function is written, not in every copy.
            continue;
        }
        // A line that is a `return` statement: its first token is the keyword (a name such
        // as `returned` is not).
        let first = tokens(trimmed).0.first().map(|t| t.1);
        if first != Some(Tok::Name("return")) {
            lines.push(format!("{indent}  {l}"));
            continue;
        }
        let expr = trimmed["return".len()..].trim();
        let pad = &l[..l.len() - trimmed.len()];
        let assign = match (target.is_empty(), expr.is_empty() || plain(expr)) {
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

/// The first call of a function of `scope` among `lines`, and its line.
fn surviving_call<'a>(
    lines: &'a [String],
    scope: &HashMap<String, Rc<Inline>>,
) -> Option<(String, &'a str)> {
    lines.iter().find_map(|line| {
        let (toks, _) = tokens(line);
        toks.iter().enumerate().find_map(|(k, &(_, t))| {
            // A field, or the name a function is defined under, is not a call of it.
            let field =
                k > 0 && matches!(toks[k - 1].1, Tok::Other("." | ":") | Tok::Name("function"));
            let called = toks.get(k + 1).map(|t| t.1) == Some(Tok::Other("("));
            let name = is_name(t).filter(|n| !field && called && scope.contains_key(*n))?;
            Some((name.to_owned(), line.as_str()))
        })
    })
}

/// `twin` with the fused decisions (`template`: its functions, each a `local function` line
/// at the margin) written into it, before the algorithm's table, and a field of the table for
/// each function, of its name; the twin (or `helpers`) must have the inline functions named
/// in `required`. An inline function of the template is written only into its callers,
/// unless it is one of `methods`: then it is a field too. Lines of the template between
/// `--@if name` and `--@end` are kept when the twin (or `helpers`) has an inline function
/// `name`.
pub(crate) fn fuse(
    helpers: &str,
    twin: &str,
    template: &str,
    required: &[&str],
    methods: &[&str],
) -> String {
    let mut scope = HashMap::new();
    collect(helpers, &mut scope);
    collect(twin, &mut scope);
    if let Some(name) = required.iter().find(|n| !scope.contains_key(**n)) {
        panic!("the twin has no inline `{name}`:\n{twin}");
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
    // The template's own inline functions, as kept for this twin.
    let mut own = HashMap::new();
    collect(&lines.join("\n"), &mut own);
    own.retain(|name, _| !methods.contains(&name.as_str()));
    collect(&lines.join("\n"), &mut scope);
    let mut names = local_names(&lines, 2);
    let fused = Fuser {
        scope: &scope,
        next: 0,
    }
    .expand(&lines, &mut names, 0);
    if let Some((name, line)) = surviving_call(&fused, &scope) {
        panic!(
            "inline function {name}: still called in the fused decision (a call inside an \
             expression, or over several lines, stays a call): `{}`",
            line.trim()
        );
    }
    let table = twin
        .lines()
        .position(|l| l == "  return {")
        .expect("a twin ends with its table: `  return {`");
    let mut out: Vec<String> = twin.lines().map(str::to_owned).collect();
    let fields = template.lines().filter_map(|l| {
        let name = l.strip_prefix("local function ")?.split('(').next()?;
        (!own.contains_key(name)).then(|| format!("    {name} = {name},"))
    });
    out.splice(table + 1..table + 1, fields);
    out.splice(table..table, without_definitions(fused, &own));
    let mut text = out.join("\n");
    text.push('\n');
    text
}

/// `lines` without the definitions of the functions of `inline` (each written into its
/// callers), their comments and `--@inline` line with them.
fn without_definitions(lines: Vec<String>, inline: &HashMap<String, Rc<Inline>>) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(lines.len());
    let mut skipping = false;
    for line in lines {
        if skipping {
            skipping = line != "  end";
            continue;
        }
        let defined = line
            .strip_prefix("  local function ")
            .and_then(|rest| rest.split('(').next());
        if defined.is_some_and(|name| inline.contains_key(name)) {
            while out.last().is_some_and(|l| l.trim_start().starts_with("--")) {
                out.pop();
            }
            skipping = true;
            continue;
        }
        out.push(line);
    }
    out
}

/// The names `lines` declare inside their functions: not the functions and tables declared at
/// the top level (`indent`), which an inline function reads as its caller does, unless a
/// function declares the name again.
fn local_names(lines: &[String], indent: usize) -> HashSet<String> {
    let (top, inner): (Vec<String>, Vec<String>) = lines
        .iter()
        .cloned()
        .partition(|l| super::tokens::indent(l) == indent && l.trim_start().starts_with("local "));
    let mut names = declared(&inner);
    for line in &top {
        let header = line.trim_start().strip_prefix("local ").unwrap_or("");
        // A top-level function's parameters are its body's names.
        if let Some(f) = header.strip_prefix("function ") {
            let params = declared(&[format!("function {f}")]);
            names.extend(
                params
                    .into_iter()
                    .filter(|n| !f.starts_with(&format!("{n}("))),
            );
        }
    }
    names
}

/// `lua` with every call of an inline function of `helpers` or of `lua` itself that is a
/// statement of its own written in place (the decision, `decide.lua`).
pub(crate) fn inline_calls(helpers: &str, lua: &str) -> String {
    let mut scope = HashMap::new();
    collect(helpers, &mut scope);
    collect(lua, &mut scope);
    let lines: Vec<String> = lua.lines().map(str::to_owned).collect();
    let mut names = local_names(&lines, 0);
    let out = Fuser {
        scope: &scope,
        next: 0,
    }
    .expand(&lines, &mut names, 0);
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
        let fused = squash(&fuse(HELPERS, twin, template, &[], &[]));
        assert!(fused.contains("local y\nrepeat -- half\n"), "{fused}");
        assert!(fused.contains("local a = x + 1"), "{fused}");
        assert!(fused.contains("y = 0 break"), "{fused}");
        assert!(fused.contains("y = r - r % 1 break"), "{fused}");
        assert!(fused.contains("\nfused = fused,"), "{fused}");
        assert!(!fused.contains("half("), "{fused}");
    }

    /// A function whose one `return` ends it is a `do` block; a parameter its caller has
    /// under the same name, and never changed, is not bound again; one it changes is; one
    /// given a number is that number; a local of the body named as a result of the call is
    /// renamed.
    #[test]
    fn bindings_are_made_only_where_needed() {
        let helpers =
            "--@inline\nlocal function add(a, b)\n  a = a + b\n  local s = a\n  return s\nend\n";
        let twin = "ALG[1] = function()\n  return {\n  }\nend\n";
        let template =
            "local function fused(a, b)\n  local s = add(a, b)\n  b = add(b, 1)\n  return s\nend\n";
        let fused = squash(&fuse(helpers, twin, template, &[], &[]));
        assert!(
            fused.contains("local s\ndo -- add\nlocal a = a\n"),
            "{fused}"
        );
        // A local the body returns is the caller's own: no copy.
        assert!(fused.contains("a = a + b\ns = a\nend\n"), "{fused}");
        // A number given to a parameter the body never changes is written in its place.
        assert!(fused.contains("local a = b\na = a + 1\n"), "{fused}");
        assert!(!fused.contains("break"), "{fused}");
    }

    #[test]
    fn returned_locals_are_the_callers_names() {
        let helpers = "--@inline\nlocal function pair(x)\n  local a, b\n  if x > 0 then\n    \
                       a = x\n  end\n  local c = x + 1\n  b = c\n  return a, b, c\nend\n";
        let twin = "ALG[1] = function()\n  return {\n  }\nend\n";
        let template = "local function fused(x)\n  local p, q, r = pair(x)\n  \
                        p, q, r = pair(p)\n  return p, q, r\nend\n";
        let fused = squash(&fuse(helpers, twin, template, &[], &[]));
        // Declared just before: they hold nil, as the body's locals did.
        let first = "local p, q, r\ndo -- pair\nif x > 0 then\np = x\nend\nr = x + 1\nq = r\nend\n";
        assert!(fused.contains(first), "{fused}");
        // Assigned: set to nil where the body declared them without a value.
        let second = "do -- pair\nlocal x = p\np, q = nil\nif x > 0 then\np = x\nend\n\
                      r = x + 1\nq = r\nend\n";
        assert!(fused.contains(second), "{fused}");
    }

    #[test]
    #[should_panic(expected = "inline function half: still called in the fused decision")]
    fn a_call_left_inside_an_expression_fails() {
        let twin = "ALG[1] = function()\n  return {\n  }\nend\n";
        let template = "local function fused(x)\n  local y = half(x) + 1\n  return y\nend\n";
        fuse(HELPERS, twin, template, &[], &[]);
    }

    #[test]
    #[should_panic(expected = "inline function half: still called in the fused decision")]
    fn a_call_over_two_lines_fails() {
        let twin = "ALG[1] = function()\n  return {\n  }\nend\n";
        let template = "local function fused(x)\n  local y = half(x +\n    1)\n  return y\nend\n";
        fuse(HELPERS, twin, template, &[], &[]);
    }

    /// Only the keyword is a `return`: a name that begins with one is left as it is.
    #[test]
    fn a_name_beginning_with_return_is_no_return() {
        let helpers = "--@inline\nlocal function f(returned)\n  returned = returned + 1\n  return returned\nend\n";
        let twin = "ALG[1] = function()\n  return {\n  }\nend\n";
        let template = "local function fused(x)\n  local y = f(x)\n  return y\nend\n";
        let fused = squash(&fuse(helpers, twin, template, &[], &[]));
        assert!(
            fused.contains("\nreturned = returned + 1\ny = returned\n"),
            "{fused}"
        );
    }

    #[test]
    #[should_panic(expected = "which its caller declares")]
    fn a_name_the_caller_shadows_is_refused() {
        let helpers = "local k = 2\n--@inline\nlocal function f(a)\n  return a * k\nend\n";
        let twin = "ALG[1] = function()\n  return {\n  }\nend\n";
        let template = "local function fused(x)\n  local k = 3\n  local y = f(x)\nend\n";
        fuse(helpers, twin, template, &[], &[]);
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
            &[],
        );
    }

    /// A template's inline function is written into its callers only, unless it is one of
    /// the methods: then it stays, a field of the table.
    #[test]
    fn a_template_inline_function_is_a_field_only_as_a_method() {
        let twin = "ALG[1] = function()\n  return {\n  }\nend\n";
        let template = "-- Twice.\n--@inline\nlocal function twice(x)\n  return x + x\nend\n\n\
                        --@inline\nlocal function thrice(x)\n  return x * 3\nend\n\n\
                        local function both(x)\n  local a = twice(x)\n  local b = thrice(x)\n  \
                        return a + b\nend\n";
        let fused = squash(&fuse("", twin, template, &[], &["thrice"]));
        assert!(!fused.contains("function twice"), "{fused}");
        assert!(!fused.contains("Twice."), "{fused}");
        assert!(!fused.contains("twice = twice"), "{fused}");
        assert!(fused.contains("local function thrice(x)"), "{fused}");
        assert!(fused.contains("thrice = thrice,"), "{fused}");
        assert!(fused.contains("both = both,"), "{fused}");
        assert!(!fused.contains("twice("), "{fused}");
    }
}
