//! Lua read a line at a time: its tokens, the names it declares, and lists split at
//! their commas.

use std::collections::HashSet;

pub(super) const KEYWORDS: &[&str] = &[
    "and", "break", "do", "else", "elseif", "end", "false", "for", "function", "if", "in", "local",
    "nil", "not", "or", "repeat", "return", "then", "true", "until", "while",
];

/// A token of a line of Lua: a name (or keyword), a number, a string or a symbol, and where
/// it starts.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Tok<'a> {
    Name(&'a str),
    Other(&'a str),
}

/// The tokens of one line and where its code ends (a comment's start, or the line's end).
/// Strings are one token; the Lua sources have no long strings or comments (`[[`).
pub(super) fn tokens(line: &str) -> (Vec<(usize, Tok<'_>)>, usize) {
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

pub(super) fn is_name(t: Tok<'_>) -> Option<&str> {
    match t {
        Tok::Name(n) if !KEYWORDS.contains(&n) => Some(n),
        _ => None,
    }
}

/// The names `lines` declare: after `local` (and `local function`) and `for`.
pub(super) fn declared(lines: &[String]) -> HashSet<String> {
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

pub(super) fn split_list(list: &str) -> Vec<String> {
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
pub(super) fn plain(expr: &str) -> bool {
    tokens(expr).0.len() == 1
}

/// Whether evaluating `expr` can do nothing but give its value: it calls nothing (the
/// tables of the script have no metatables).
pub(super) fn pure(expr: &str) -> bool {
    !tokens(expr).0.iter().any(|t| t.1 == Tok::Other("("))
}

/// How far `line` is indented.
pub(super) fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// How far the least indented of `lines` that are not blank is indented.
pub(super) fn margin(lines: &[String]) -> usize {
    lines
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| indent(l))
        .min()
        .unwrap_or(0)
}
