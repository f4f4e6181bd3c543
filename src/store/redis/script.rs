//! The decision script, as Redis runs it: `script.lua`, generated from the helpers the
//! algorithms' Lua twins share, every twin, the fused decision (`fused.lua`), what acts on a
//! state on its own (`act.lua`) and the decision itself (`decide.lua`) by the generator in
//! `luagen/` (a tool of development, compiled into this module's tests only), with what both languages must agree on (algorithm ids,
//! operations and their facts, the shape of the arguments and the reply) taken from Rust.
//!
//! The Lua sources name those numbers (`ALG[GCRA]`, `op == LEASE`, `REPLY_GRANT`); the
//! generated script holds their values, from [`Algorithm::lua_id`](crate::Algorithm), [`Op`]
//! and the constants below, so each number is written once, in Rust. The facts of each
//! operation ([`Op::decides`], [`Op::charge`], [`Op::acts`], [`Op::arg_count`],
//! [`Op::grants`]) become the tables of the script's prelude (`DECIDES[op]`, ...). The test
//! `the_committed_script_is_generated` generates the script again and fails on any
//! difference; `UPDATE_LUA=1 cargo test --lib script` writes it.

use std::sync::LazyLock;

use crate::store::Op;

/// The verdict of a policy that admits the request.
pub(crate) const ADMITTED: i64 = -2;
/// The verdict of a policy that denies a request no wait would admit (written into the script
/// by the generator; read back as a verdict below zero that is not [`ADMITTED`]).
#[cfg_attr(not(test), allow(dead_code))]
pub(crate) const NEVER: i64 = -1;

/// The integers the script adds after the checks' replies for each key decided under a limit
/// of its own: the check's place (from 1), and its quota's limit, window (0 for a month) and
/// burst (0 for none), at the places [`at`] names.
pub(crate) const OWN_WIDTH: usize = 4;

/// Where each integer of the reply is, counted from the start of a check's reply (or of a key's
/// own limit's), from 0. The script names them `AT_...`, counted from 1 as Lua's tables are;
/// both sides read and write the reply by these names only.
pub(crate) mod at {
    /// The verdict: [`ADMITTED`](super::ADMITTED), [`NEVER`](super::NEVER), or the
    /// retry-after in microseconds.
    pub(crate) const VERDICT: usize = 0;
    /// What is left after the request's charges.
    pub(crate) const REMAINING: usize = 1;
    /// The microseconds until the state is fresh again.
    pub(crate) const RESET: usize = 2;
    /// A grant's units (for an operation that grants).
    pub(crate) const UNITS: usize = 3;
    /// A grant's end, on the store's clock.
    pub(crate) const END: usize = 4;
    /// The microseconds from the decision to a grant's end.
    pub(crate) const LASTS: usize = 5;
    /// A key's own limit: its check's place (from 1).
    pub(crate) const OWN_PLACE: usize = 0;
    /// A key's own limit: its quota's limit.
    pub(crate) const OWN_LIMIT: usize = 1;
    /// A key's own limit: its quota's window (0 for a month).
    pub(crate) const OWN_WINDOW: usize = 2;
    /// A key's own limit: its quota's burst (0 for none).
    pub(crate) const OWN_BURST: usize = 3;

    /// Every place, by the name the script knows it by, counted from 1.
    #[cfg(test)]
    pub(crate) const NAMED: [(&str, usize); 10] = [
        ("AT_VERDICT", VERDICT + 1),
        ("AT_REMAINING", REMAINING + 1),
        ("AT_RESET", RESET + 1),
        ("AT_UNITS", UNITS + 1),
        ("AT_END", END + 1),
        ("AT_LASTS", LASTS + 1),
        ("AT_OWN_PLACE", OWN_PLACE + 1),
        ("AT_OWN_LIMIT", OWN_LIMIT + 1),
        ("AT_OWN_WINDOW", OWN_WINDOW + 1),
        ("AT_OWN_BURST", OWN_BURST + 1),
    ];
}

const _: () = assert!(at::LASTS + 1 == Op::REPLY + Op::REPLY_GRANT && at::RESET + 1 == Op::REPLY);
const _: () = assert!(at::OWN_BURST + 1 == OWN_WIDTH);

/// A policy's shape, the first of its arguments: its algorithm and operation, and two flags,
/// one integer (the script decodes it with `%`, as Lua 5.1 has no bit operators). Algorithm
/// ids are below 32, operation ids below 32. Its parameters are not sent: its tag names them.
const MODE_UNIT: u64 = 32;
/// The policy's cost follows the shape (it is 1 when it does not).
const COST_FLAG: u64 = 1024;
/// The time and the TTL slack are the last two arguments (an injected clock).
const CLOCK_FLAG: u64 = 2048;

const _: () = {
    assert!(crate::Algorithm::ALL.len() < MODE_UNIT as usize);
    assert!(Op::KINDS.len() < (COST_FLAG / MODE_UNIT) as usize);
};

/// The shape of a policy with the algorithm `id` and operation `op` whose cost is `cost`.
pub(crate) fn shape(id: u8, op: Op, cost: u64, injected: bool) -> u64 {
    let mut shape = id as u64 + MODE_UNIT * op.id() as u64;
    if cost != 1 {
        shape += COST_FLAG;
    }
    if injected {
        shape += CLOCK_FLAG;
    }
    shape
}

/// The one script every decision runs, with its SHA-1 and its library, made once.
pub(crate) static SCRIPT: LazyLock<Script> = LazyLock::new(Script::assemble);

/// The decision, as a script for `EVAL` and as a library of one function for `FCALL`.
pub(crate) struct Script {
    source: String,
    sha: String,
    library: String,
    function: String,
}

/// The generated script (see the module's docs).
const GENERATED: &str = include_str!("script.lua");

impl Script {
    fn assemble() -> Script {
        let source = format!("{GENERATED}return decide(KEYS, ARGV)\n");
        let sha = redis::Script::new(&source).get_hash().to_owned();
        // Named after the source, so versions of the crate sharing a Redis (a rolling deploy)
        // each call their own.
        let function = format!("tower_ratelimit_{}", &sha[..16]);
        let library = format!(
            "#!lua name={function}\n{GENERATED}redis.register_function('{function}', decide)\n"
        );
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

#[cfg(test)]
#[path = "../../../luagen/mod.rs"]
mod luagen;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Algorithm;
    use crate::algorithm::{LUA_HELPERS, LUA_TWINS};
    use crate::store::op::Charge;

    /// The script, generated from the Lua sources and the numbers Rust gives their names.
    fn generate() -> String {
        let mut names: Vec<(String, String)> = LUA_TWINS
            .iter()
            .map(|(a, _)| (a.name().to_ascii_uppercase(), a.lua_id().to_string()))
            .collect();
        names.extend(
            Op::KINDS
                .iter()
                .map(|op| (op.lua_name().to_owned(), op.id().to_string())),
        );
        names.extend(
            [
                ("REPLY_GRANT", Op::REPLY_GRANT as i64),
                ("ADMITTED", ADMITTED),
                ("NEVER", NEVER),
                ("OWN_WIDTH", OWN_WIDTH as i64),
                ("CHECK_WIDTH", Op::REPLY as i64),
                ("LONGEST", crate::MAX_WINDOW.as_micros() as i64),
                ("MODE_UNIT", MODE_UNIT as i64),
                ("COST_FLAG", COST_FLAG as i64),
                ("CLOCK_FLAG", CLOCK_FLAG as i64),
            ]
            .map(|(name, value)| (name.to_owned(), value.to_string())),
        );
        names.extend(at::NAMED.map(|(name, at)| (name.to_owned(), at.to_string())));
        let mut lua = String::from(concat!(
            "-- tower-ratelimit: its decision script. Generated (luagen/) from\n",
            "-- src/algorithm/lua/*.lua and src/store/redis/{fused,decide}.lua, with the numbers\n",
            "-- Rust gives their names: do not edit it, edit them and run\n",
            "-- `UPDATE_LUA=1 cargo test --lib script`.\n",
            "local ALG = {}\n"
        ));
        lua.push_str(&facts());
        lua.push_str(LUA_HELPERS);
        for (_, twin) in LUA_TWINS {
            let fused = include_str!("fused.lua");
            lua.push_str(&luagen::fuse(
                LUA_HELPERS,
                twin,
                fused,
                &["load", "evaluate", "commit"],
            ));
        }
        lua.push_str(include_str!("act.lua"));
        lua.push_str(include_str!("decide.lua"));
        luagen::substitute(&lua, &names)
    }

    /// `script.lua` is what the sources generate; `UPDATE_LUA=1` writes it.
    #[test]
    fn the_committed_script_is_generated() {
        let generated = generate();
        if std::env::var_os("UPDATE_LUA").is_some() {
            let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/store/redis/script.lua");
            std::fs::write(path, &generated).expect("script.lua written");
            return;
        }
        assert!(
            GENERATED == generated,
            "src/store/redis/script.lua is not what its sources generate: run \
             `UPDATE_LUA=1 cargo test --lib script` and commit the file"
        );
    }

    /// The facts of every operation as Lua tables indexed by its id, written from [`Op`]'s own
    /// methods: `DECIDES` (a denial denies the request), `CHARGES` (0 never, 1 when its own verdict
    /// admits, 2 always, if the request is admitted), `ACTS` (changes the state on its own, then
    /// looks), `ARGS` (integers after the cost), `GRANTS` (its reply has the three integers of a
    /// grant), `WIDTH` (the integers of its reply) and `FUSES` (the algorithm's fused
    /// decisions decide it: it decides, is always charged, neither acts nor grants).
    fn facts() -> String {
        let table = |name: &str, fact: &dyn Fn(Op) -> String| {
            let values: Vec<String> = Op::KINDS.iter().map(|&op| fact(op)).collect();
            format!("local {name} = {{ {} }}\n", values.join(", "))
        };
        let charge = |op: Op| match op.charge() {
            Charge::Never => "0",
            Charge::IfAllowed => "1",
            Charge::Always => "2",
        };
        [
            table("DECIDES", &|op| op.decides().to_string()),
            table("CHARGES", &|op| charge(op).to_owned()),
            table("ACTS", &|op| op.acts().to_string()),
            table("RELIMITS", &|op| op.relimits().to_string()),
            table("ARGS", &|op| op.arg_count().to_string()),
            table("GRANTS", &|op| op.grants().to_string()),
            table("WIDTH", &|op| op.reply_width().to_string()),
            table("FUSES", &|op| fuses(op).to_string()),
        ]
        .concat()
    }

    /// Whether a policy of this operation, alone or beside others of such operations, is
    /// decided by its algorithm's fused decisions (`fused.lua`), which decide and charge as
    /// [`Op::Enforce`] does.
    fn fuses(op: Op) -> bool {
        op.decides() && matches!(op.charge(), Charge::Always) && !op.acts() && !op.grants()
    }

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
        for &op in Op::KINDS {
            assert!(
                !source.contains(&format!("== {}", op.lua_name())),
                "{op:?} substituted"
            );
        }
        assert!(source.contains(&format!("shape % {MODE_UNIT}")));
        // Strings and comments are left alone.
        assert!(source.contains("call('SET', key, value, 'PX', format(INT, ms))"));
    }

    /// `decide.lua` reads what an operation is from the generated tables, and writes an arm
    /// only for what an operation does: an `ACT[...]` arm for exactly the operations whose
    /// fact says they act, and a named branch for exactly the operations with a grant (the
    /// lease, the reservation, the held slots); no other operation is compared by name.
    #[test]
    fn lua_branches_follow_the_facts() {
        let decide = concat!(include_str!("act.lua"), include_str!("decide.lua"));
        let code: String = decide
            .lines()
            .filter(|l| !l.trim_start().starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n");
        for &op in Op::KINDS {
            let name = op.lua_name();
            let arm = code.contains(&format!("ACT[{name}] = function"));
            assert_eq!(arm, op.acts(), "{name}: an ACT arm exactly when it acts");
            let compared = code.contains(&format!("op == {name}"));
            let own_branch = matches!(op, Op::Lease { .. } | Op::Wait { .. } | Op::Concurrency);
            assert_eq!(
                compared, own_branch,
                "{name}: compared by name only for its own arm"
            );
            assert_eq!(
                own_branch,
                op.grants() && !op.acts(),
                "{name}: the granting ones"
            );
        }
        // The ids are the places in the list, from 1.
        for (place, &op) in Op::KINDS.iter().enumerate() {
            assert_eq!(op.id() as usize, place + 1, "{op:?}");
        }
    }
}
