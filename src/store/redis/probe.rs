//! The permission probe: `build()` runs every command the decision calls inside Redis once,
//! so that a Redis user without one of them, or a Redis that refuses `TIME` in scripts
//! (ElastiCache Serverless, some proxies), is an error of `build()` naming the command, not a
//! failure of every decision. A unit test holds the probe to the decision's own commands.

use std::time::Duration;

use super::conn::Conn;
use crate::error::StoreError;

/// The probe's source.
const PROBE: &str = include_str!("probe.lua");

/// How the probe went, when it did not fail.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Probed {
    /// Every command ran.
    Allowed,
    /// Redis is out of memory (`maxmemory` with `noeviction`): the writes could not be tried.
    Full,
}

/// Runs the probe on `<prefix>probe:{tower-ratelimit}` within `timeout`; `redis_time` when
/// decisions read Redis's `TIME`.
pub(super) async fn run(
    conn: &Conn,
    prefix: &str,
    redis_time: bool,
    timeout: Duration,
) -> Result<Probed, StoreError> {
    let key = format!("{prefix}probe:{{tower-ratelimit}}");
    let probing = conn.with(|mut c| async move {
        let mut cmd = redis::cmd("EVAL");
        cmd.arg(PROBE).arg(1).arg(&key).arg(u8::from(redis_time));
        cmd.query_async::<redis::Value>(&mut c).await.map(drop)
    });
    let error = match tokio::time::timeout(timeout, probing).await {
        Ok(Ok(())) => return Ok(Probed::Allowed),
        Ok(Err(e)) => e.to_string(),
        Err(_) => "timed out".to_owned(),
    };
    let lower = error.to_ascii_lowercase();
    if lower.contains("oom") {
        return Ok(Probed::Full);
    }
    let refused = lower.contains("noperm")
        || lower.contains("not allowed")
        || lower.contains("can't run this command");
    if !refused {
        return Err(StoreError::new(format!(
            "cannot check the Redis user's permissions: {error}"
        )));
    }
    // Redis names the script's line, not always the command.
    let command = refused_command(&error).unwrap_or("a command");
    if redis_time && command == "TIME" {
        return Err(StoreError::new(format!(
            "Redis refuses TIME inside scripts ({error}): decide on the instances' clock with RedisStoreBuilder::clock(SystemClock::new()) (their clocks must then agree, e.g. by NTP)"
        )));
    }
    Err(StoreError::new(format!(
        "the Redis user may not run {command} on the store's keys, which the decision needs ({error}); the Redis guide gives the ACL line that allows what the store needs"
    )))
}

/// The command on the probe's line that Redis's error names (`@user_script:<line>`).
fn refused_command(error: &str) -> Option<&'static str> {
    let line: usize = error
        .split("@user_script:")
        .nth(1)?
        .split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()?;
    let source = PROBE.lines().nth(line.checked_sub(1)?)?;
    source.split("call('").nth(1)?.split('\'').next()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::super::script::SCRIPT;

    /// The commands `source` calls with `call('X'` or `redis.call('X'`.
    fn commands(source: &str) -> BTreeSet<&str> {
        source
            .split("call('")
            .skip(1)
            .filter_map(|rest| rest.split('\'').next())
            .collect()
    }

    #[test]
    fn a_refusal_is_told_by_its_command() {
        let error = "The user executing the script can't run this command or subcommand script: 4514, on @user_script:7.";
        assert_eq!(super::refused_command(error), Some("TIME"));
        assert_eq!(super::refused_command("@user_script:999"), None);
        assert_eq!(super::refused_command("no line"), None);
    }

    #[test]
    fn the_probe_runs_every_command_of_the_decision() {
        let decision = commands(SCRIPT.source());
        assert!(
            decision.contains("ZADD") && decision.contains("TIME"),
            "{decision:?}"
        );
        assert_eq!(commands(super::PROBE), decision);
    }
}
