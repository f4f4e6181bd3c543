//! The decision script: the helpers the algorithms' Lua twins share, every twin, and the
//! decision itself, with the numbers both languages must agree on (algorithm ids, modes, the
//! shape of the arguments and the reply) taken from Rust.
//!
//! The Lua sources name those numbers (`ALG[GCRA]`, `mode == BLOCK`, `ARGS_PER_POLICY`);
//! assembling the script puts in their values from [`Algorithm::lua_id`](crate::Algorithm),
//! [`Mode`] and the constants below, so each number is written once, in Rust, and the script
//! Redis runs holds literals: no per-call cost for the names.

use std::sync::LazyLock;

use crate::algorithm::{LUA_HELPERS, LUA_TWINS, LuaParams};
use crate::store::Mode;

/// Integers per policy in the reply: the verdict, remaining, reset.
pub(crate) const REPLY_PER_CHECK: usize = 3;
/// Integers a [`Mode::Lease`] policy's reply has after those: the units leased, the lease's
/// end and the microseconds until then.
pub(crate) const REPLY_PER_LEASE: usize = 3;
/// The verdict of a policy that admits the request.
pub(crate) const ADMITTED: i64 = -2;
/// The verdict of a policy that denies a request no wait would admit.
pub(crate) const NEVER: i64 = -1;

/// A policy's shape, the first of its arguments: its algorithm, mode and parameter count, and
/// two flags, one integer (the script decodes it with `%`, as Lua 5.1 has no bit operators).
/// Algorithm ids are below 8, modes below 16, and at most 4 parameters are sent.
const MODE_UNIT: u64 = 8;
const ARITY_UNIT: u64 = 128;
/// The policy's cost follows the shape (it is 1 when it does not).
const COST_FLAG: u64 = 1024;
/// The time and the TTL slack are the last two arguments (an injected clock).
const CLOCK_FLAG: u64 = 2048;

const _: () = {
    assert!(crate::Algorithm::ALL.len() < MODE_UNIT as usize);
    assert!(Mode::ALL.len() <= (ARITY_UNIT / MODE_UNIT) as usize);
    assert!(4 < (COST_FLAG / ARITY_UNIT) as usize);
};

/// The shape of a policy with the algorithm `id`, `mode` and `params` whose cost is `cost`.
pub(crate) fn shape(id: u8, mode: Mode, params: &LuaParams, cost: u64, injected: bool) -> u64 {
    let mut shape = id as u64 + MODE_UNIT * mode as u64 + ARITY_UNIT * params.len() as u64;
    if cost != 1 {
        shape += COST_FLAG;
    }
    if injected {
        shape += CLOCK_FLAG;
    }
    shape
}

/// The one script every decision runs, assembled once.
pub(crate) static SCRIPT: LazyLock<Script> = LazyLock::new(Script::assemble);

/// The decision, as a script for `EVAL` and as a library of one function for `FCALL`.
pub(crate) struct Script {
    source: String,
    sha: String,
    library: String,
    function: String,
}

impl Script {
    fn assemble() -> Script {
        let mut names: Vec<(String, String)> = LUA_TWINS
            .iter()
            .map(|(a, _)| (a.name().to_ascii_uppercase(), a.lua_id().to_string()))
            .collect();
        names.extend(Mode::ALL.map(|m| (m.lua_name().to_owned(), (m as u8).to_string())));
        names.extend(
            [
                ("REPLY_PER_POLICY", REPLY_PER_CHECK as i64),
                ("ADMITTED", ADMITTED),
                ("NEVER", NEVER),
                ("MODE_UNIT", MODE_UNIT as i64),
                ("ARITY_UNIT", ARITY_UNIT as i64),
                ("COST_FLAG", COST_FLAG as i64),
                ("CLOCK_FLAG", CLOCK_FLAG as i64),
            ]
            .map(|(name, value)| (name.to_owned(), value.to_string())),
        );
        let mut lua = String::from("-- tower-ratelimit: its decision script.\nlocal ALG = {}\n");
        lua.push_str(LUA_HELPERS);
        for (_, twin) in LUA_TWINS {
            lua.push_str(twin);
        }
        lua.push_str(include_str!("decide.lua"));
        let body = substitute(&lua, &names);
        let source = format!("{body}return decide(KEYS, ARGV)\n");
        let sha = redis::Script::new(&source).get_hash().to_owned();
        // Named after the source, so versions of the crate sharing a Redis (a rolling deploy)
        // each call their own.
        let function = format!("tower_ratelimit_{}", &sha[..16]);
        let library =
            format!("#!lua name={function}\n{body}redis.register_function('{function}', decide)\n");
        Script {
            source,
            sha,
            library,
            function,
        }
    }

    /// The whole script, for `EVAL`.
    pub(crate) fn source(&self) -> &str {
        &self.source
    }

    /// The script's SHA-1, for `EVALSHA`.
    pub(crate) fn sha(&self) -> &str {
        &self.sha
    }

    /// The library, for `FUNCTION LOAD`.
    pub(crate) fn library(&self) -> &str {
        &self.library
    }

    /// The name of the library's one function, for `FCALL`.
    pub(crate) fn function(&self) -> &str {
        &self.function
    }
}

/// `lua` with every identifier that is one of `names` replaced by its value. String literals
/// and comments are copied as they are.
fn substitute(lua: &str, names: &[(String, String)]) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Algorithm;

    #[test]
    fn numbers_come_from_rust() {
        let source = SCRIPT.source();
        for algorithm in Algorithm::ALL {
            let id = algorithm.lua_id();
            assert_eq!(
                id as usize,
                1 + Algorithm::ALL.iter().position(|a| *a == algorithm).unwrap()
            );
            let twin = LUA_TWINS.iter().find(|(a, _)| *a == algorithm).unwrap().1;
            let name = algorithm.name().to_ascii_uppercase();
            assert!(
                twin.contains(&format!("ALG[{name}] = function()")),
                "{name} registers itself by name"
            );
            assert!(
                source.contains(&format!("ALG[{id}] = function()")),
                "{name} is ALG[{id}]"
            );
        }
        let decide = include_str!("decide.lua");
        for mode in Mode::ALL {
            let named = format!("mode == {}", mode.lua_name());
            let named_at_charge = format!("m == {}", mode.lua_name());
            assert!(
                decide.contains(&named) || decide.contains(&named_at_charge),
                "decide.lua compares with {}",
                mode.lua_name()
            );
            assert!(
                !source.contains(&format!("== {}", mode.lua_name())),
                "{mode:?} substituted"
            );
        }
        assert!(source.contains(&format!("shape % {MODE_UNIT}")));
        // Strings and comments are left alone.
        assert!(
            source.contains("call('SET', key, value, 'PX', format(INT, ttl_ms(now, expires_at)))")
        );
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
}
