//! The decision script: a prelude generated from the Rust constants (algorithm ids, modes, the
//! shape of its arguments and reply), the helpers the algorithms' Lua twins share, every twin,
//! and the decision itself.

use std::fmt::Write as _;
use std::sync::LazyLock;

use crate::algorithm::{LUA_HELPERS, LUA_TWINS};
use crate::store::Mode;

/// Arguments per policy after `ARGV[2]`: algorithm id, its four parameters, cost, mode.
pub(crate) const ARGS_PER_CHECK: usize = 7;
/// Integers per policy in the reply (after the time): allowed, remaining, reset, retry.
pub(crate) const REPLY_PER_CHECK: usize = 4;

/// The one script every decision runs, assembled once.
pub(crate) static SCRIPT: LazyLock<Script> = LazyLock::new(Script::assemble);

/// The script's source.
pub(crate) struct Script {
    source: String,
}

impl Script {
    fn assemble() -> Script {
        let mut source = String::from(
            "-- tower-ratelimit. Generated from the Rust sources: the algorithms' ids and the modes.\n",
        );
        source.push_str("local ALG = {}\n");
        for (algorithm, _) in LUA_TWINS {
            let _ = writeln!(
                source,
                "local {} = {}",
                algorithm.name().to_ascii_uppercase(),
                algorithm.lua_id()
            );
        }
        let _ = writeln!(source, "local ARGS_PER_POLICY = {ARGS_PER_CHECK}");
        let _ = writeln!(source, "local REPLY_PER_POLICY = {REPLY_PER_CHECK}");
        for mode in Mode::ALL {
            let _ = writeln!(source, "local {} = {}", mode.lua_name(), mode as u8);
        }
        source.push_str(LUA_HELPERS);
        for (_, twin) in LUA_TWINS {
            source.push_str(twin);
        }
        source.push_str(include_str!("decide.lua"));
        Script { source }
    }

    /// The whole script.
    pub(crate) fn source(&self) -> &str {
        &self.source
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Algorithm;

    #[test]
    fn ids_and_modes_come_from_rust() {
        let source = SCRIPT.source();
        for (i, algorithm) in Algorithm::ALL.into_iter().enumerate() {
            assert_eq!(algorithm.lua_id() as usize, i + 1);
            let name = algorithm.name().to_ascii_uppercase();
            assert!(source.contains(&format!("local {name} = {}\n", i + 1)));
            assert!(
                source.contains(&format!("ALG[{name}] = {{")),
                "{name} has a Lua twin"
            );
        }
        for mode in Mode::ALL {
            assert!(source.contains(&format!("local {} = {}\n", mode.lua_name(), mode as u8)));
        }
        assert!(source.contains(&format!("local ARGS_PER_POLICY = {ARGS_PER_CHECK}\n")));
        assert!(source.contains(&format!("local REPLY_PER_POLICY = {REPLY_PER_CHECK}\n")));
        // No number is retyped in Lua: algorithms and modes are named, never numbered.
        assert!(!source.contains("ALG[1]") && !source.contains("mode == 0"));
    }
}
