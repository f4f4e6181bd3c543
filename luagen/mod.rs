//! The generator of the Redis decision script, a tool of development: compiled into the
//! crate's unit tests only (`store/redis/script.rs` includes it by its path, and its test
//! `the_committed_script_is_generated` writes or checks `store/redis/script.lua`), never into
//! the library, which loads the generated file as it is.
//!
//! It works on the Lua sources' text, a line and its tokens at a time, and does two things:
//! names become numbers (`substitute`: `ALG[GCRA]` is `ALG[6]`, so each number is written once,
//! in Rust), and inline functions are written in place of their calls (`fuse`, and
//! `inline_calls` for the decision itself, `decide.lua`).
//!
//! The two phases of a decision for one policy are written once, in `phases.lua`, and written
//! into each algorithm's twin (`fuse`: `phases`, which runs them over a call's policies, and
//! `enforced`, a policy enforced alone), with the twin's own `load`, `evaluate`, `commit`
//! and `lag` written into them, so that the decision makes almost no Lua call beyond Redis's
//! commands (a Lua call costs Redis about 500 instructions, an instruction of its interpreter
//! 50 to 80, a whole decision about 50,000).
//!
//! Nothing is written twice: what is written into them is the twin's code, the functions the
//! operations' own arms call. A function marked by a line `--@inline` before its `local function`
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
//! A parameter the body never changes, given a number or one of the caller's variables, is
//! not bound: the number or variable is written in its place (so `REPLY[base + 1]` given 0
//! is `REPLY[0 + 1]`, which Lua folds to a constant).
//!
//! `repeat ... until true` compiles to no jump of its own, and `break` leaves it as `return`
//! leaves the function. So an inline function has no `return` inside a loop of its own (it
//! would leave the loop instead), no `return` that does not fill its line, no function inside
//! it and no `...`; and no name it reads from outside is one its caller declares (it would
//! read the caller's local instead). The generator checks all of this and panics naming the
//! function; and a call of an inline function left in the fused decision (inside an
//! expression, or over several lines) fails the generation, naming it.

mod fuse;
mod inline;
mod tokens;

pub(crate) use fuse::{fuse, inline_calls};

/// `lua` with every identifier that is one of `names` replaced by its value. String literals
/// and comments are copied as they are.
pub(crate) fn substitute(lua: &str, names: &[(String, String)]) -> String {
    let b = lua.as_bytes();
    let mut out = String::with_capacity(lua.len());
    let mut i = 0;
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    while i < b.len() {
        let start = i;
        if b[i..].starts_with(b"--") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i] == b'\'' || b[i] == b'"' {
            let quote = b[i];
            i += 1;
            while i < b.len() && b[i] != quote {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
        } else if ident(b[i]) {
            while i < b.len() && ident(b[i]) {
                i += 1;
            }
            if let Some((_, value)) = names.iter().find(|(n, _)| n.as_bytes() == &b[start..i]) {
                out.push_str(value);
                continue;
            }
        } else {
            i += 1;
        }
        out.push_str(&lua[start..i.min(b.len())]);
    }
    out
}

#[test]
fn substitution_touches_whole_identifiers_only() {
    let names = [("BLOCK".to_owned(), "6".to_owned())];
    let lua = "if mode == BLOCK then x = BLOCKED .. 'BLOCK' .. \"BLOCK\" end -- BLOCK\nBLOCK";
    assert_eq!(
        substitute(lua, &names),
        "if mode == 6 then x = BLOCKED .. 'BLOCK' .. \"BLOCK\" end -- BLOCK\n6"
    );
}
