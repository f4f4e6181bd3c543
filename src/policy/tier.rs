//! [`Tier`]: one quota of a compiled policy as stores and decisions know it, with how it takes
//! part in a decision ([`Part`]).

use std::fmt;
use std::sync::Arc;

use http::HeaderValue;

use super::builder::StatusFn;
use super::escalation::Escalation;
use super::reserve::Reserve;
use crate::algorithm::{Compiled, compact};
use crate::error::ConfigError;
use crate::headers::value::number;
use crate::key::RequestRef;
use crate::quota::{Quota, QuotaUnit};
use crate::store::Op;

/// Where a policy tier is registered in a store: its id, the same for every definition its
/// name has had (so a reloaded policy finds its keys again), and the number of its present
/// definition (a state written under another is converted before it is used).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Registered {
    pub(crate) id: u32,
    pub(crate) def: u32,
}

/// The letter that starts a tag: `A` for the algorithm of Lua id 0, `B` for 1, and so on. A
/// state is digits, spaces and colons, so the first letter of a value starts its tag.
fn tag_letter(lua_id: u8) -> char {
    const {
        assert!(
            crate::Algorithm::ALL.len() < 26,
            "an algorithm id is one letter"
        )
    };
    char::from(b'A' + lua_id)
}

/// One quota of a compiled policy, as stores and decisions know it (the policy's own quota is
/// its first tier): name, id in the store, algorithm; and what every response for it reuses,
/// built once: its limit as a header value and its metrics keys.
#[derive(Debug)]
pub(crate) struct Tier {
    name: Arc<str>,
    id: u32,
    /// The number of the tier's definition in its store: a state written under another is
    /// converted before it is used.
    def: u32,
    algorithm: Compiled,
    /// The tag of the tier's definition in the Redis script: the algorithm's letter and its
    /// parameters (`compact`), written after every state (see `store` in `helpers.lua`).
    tag: Box<str>,
    /// The limit clients are told, as a header value.
    limit_header: HeaderValue,
    /// `ratelimit_decisions_total{policy, outcome}` for allowed, limited and shadow-limited,
    /// so that counting a decision allocates no label list.
    decisions_metric: [metrics::Key; 3],
    /// How the tier takes part in a decision.
    part: Part,
    /// What the tier's units are (the IETF `qu`).
    unit: QuotaUnit,
    /// The quota of a key's own limit, for a tier made by [`relimited`](Self::relimited).
    own: Option<Quota>,
    /// The units of its capacity this tier keeps from its requests, for a tier made by
    /// [`seen`](Self::seen): clients are told the rest.
    kept: u64,
    /// The tier each priority is judged under, when the policy keeps capacity for priority.
    levels: Option<Box<Levels>>,
    /// The percentage of the limit past which a key is warned of (0: never).
    near: u8,
    /// How a key that keeps being denied is blocked, and the tag a Redis call sends: the
    /// tag with the escalation after it (boxed: most tiers have none).
    escalation: Option<Box<(Escalation, Box<str>)>>,
}

/// How a policy tier takes part in a decision: the operation its checks make, and what that
/// operation is given per tier (the statuses a charge after the response waits for, the lease
/// an enforced tier takes). The one value every other piece asks.
#[derive(Clone)]
pub(crate) struct Part {
    op: Op,
    charge_if: Option<StatusFn>,
    lease: Option<LeaseSpec>,
}

impl Part {
    /// A tier making `op`.
    pub(crate) fn new(op: Op) -> Self {
        Part {
            op,
            charge_if: None,
            lease: None,
        }
    }

    /// The same, charged after responses whose status `when` accepts.
    pub(crate) fn charged_if(mut self, when: Option<StatusFn>) -> Self {
        self.charge_if = when;
        self
    }

    /// The same, taking leases.
    pub(crate) fn leasing(mut self, lease: Option<LeaseSpec>) -> Self {
        self.lease = lease;
        self
    }

    /// The operation the tier's checks make (a lease's tier is enforced: its leases are asked
    /// for by the leases' own planning, `lease.rs`).
    pub(crate) fn op(&self) -> Op {
        self.op
    }
}

impl fmt::Debug for Part {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Part")
            .field("op", &self.op)
            .field("charge_if", &self.charge_if.is_some())
            .field("lease", &self.lease)
            .finish()
    }
}

/// A policy tier's lease: how many units an instance takes at once, and for how long at most.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LeaseSpec {
    units: u64,
    ttl_us: u64,
}

/// A [`Reserve`] compiled for one tier: the tier each of its levels is judged under (`None`:
/// the tier itself, for a share of 100%), the others' last.
struct Levels {
    reserve: Reserve,
    seen: Box<[Option<Arc<Tier>>]>,
}

impl fmt::Debug for Levels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Levels")
            .field("reserve", &self.reserve)
            .finish_non_exhaustive()
    }
}

impl LeaseSpec {
    pub(crate) fn new(units: u64, ttl_us: u64) -> Self {
        LeaseSpec { units, ttl_us }
    }

    /// Units taken at once.
    pub(crate) fn units(&self) -> u64 {
        self.units
    }

    /// The longest life of a lease, in microseconds.
    pub(crate) fn ttl_us(&self) -> u64 {
        self.ttl_us
    }
}

impl Tier {
    /// A tier of `algorithm` and `quota` making `op`, registered at `id` outside any policy
    /// or store (for unit tests and the fuzz targets).
    #[cfg(any(test, fuzzing))]
    pub(crate) fn alone(
        name: &str,
        id: u32,
        algorithm: crate::algorithm::Algorithm,
        quota: Quota,
        op: Op,
    ) -> Result<Arc<Tier>, ConfigError> {
        let compiled = Compiled::new(algorithm, quota, Default::default())?;
        let at = Registered { id, def: 0 };
        Ok(Arc::new(Tier::new(
            Arc::from(name),
            at,
            compiled,
            Part::new(op),
        )))
    }

    pub(crate) fn new(name: Arc<str>, at: Registered, algorithm: Compiled, part: Part) -> Self {
        let tag = Self::tag_of(&algorithm);
        let limit_header = number(algorithm.reported_limit());
        let decisions_metric = ["allowed", "limited", "shadow_limited"].map(|outcome| {
            metrics::Key::from_parts(
                "ratelimit_decisions_total",
                vec![
                    metrics::Label::new("policy", metrics::SharedString::from(name.clone())),
                    metrics::Label::from_static_parts("outcome", outcome),
                ],
            )
        });
        Tier {
            name,
            id: at.id,
            def: at.def,
            algorithm,
            tag,
            limit_header,
            decisions_metric,
            part,
            unit: QuotaUnit::Requests,
            own: None,
            kept: 0,
            levels: None,
            near: 0,
            escalation: None,
        }
    }

    /// The same tier keeping capacity for priority as `reserve` says (checked against its
    /// capacity), if it does: a tier of each share below 100%, judged keeping what the
    /// share leaves out of the capacity.
    pub(crate) fn reserving(mut self, reserve: Option<&Reserve>) -> Self {
        self.levels = reserve.map(|reserve| {
            let capacity = self.algorithm.reported_limit();
            let seen = |kept: u64| (kept > 0).then(|| Arc::new(self.seen(kept)));
            Box::new(Levels {
                reserve: reserve.clone(),
                seen: reserve.kept(capacity).map(seen).collect(),
            })
        });
        self
    }

    /// The tier a request of a share is judged under: the same name, place, definition and
    /// algorithm (so the same state, read as it is), judged keeping `kept` units of the
    /// capacity ([`Op::Reserve`]), and telling clients the rest as its limit.
    pub(crate) fn seen(&self, kept: u64) -> Tier {
        let part = Part::new(Op::Reserve { keep: kept });
        let mut tier = self.sibling(self.algorithm.clone(), part);
        tier.kept = kept;
        tier.limit_header = number(tier.limit());
        tier
    }

    /// A tier of the same name, place and definition in the store, counting the same units,
    /// deciding with `algorithm` and taking part as `part` says.
    fn sibling(&self, algorithm: Compiled, part: Part) -> Tier {
        let at = Registered {
            id: self.id,
            def: self.def,
        };
        let mut tier = Tier::new(self.name.clone(), at, algorithm, part);
        tier.unit = self.unit;
        tier.near = self.near;
        tier.escalating(self.escalation().copied())
    }

    /// The tier `request` is judged under: the one of its priority's share, when the
    /// policy keeps capacity for priority, else this one.
    #[inline]
    pub(crate) fn seen_by<'t>(self: &'t Arc<Tier>, request: &RequestRef<'_>) -> &'t Arc<Tier> {
        match &self.levels {
            None => self,
            Some(levels) => levels.seen[levels.reserve.level(request)]
                .as_ref()
                .unwrap_or(self),
        }
    }

    /// The limit clients are told about: units per window, or the burst for bucket
    /// algorithms; less the units kept for higher priorities, for a request of a share.
    pub(crate) fn limit(&self) -> u64 {
        self.algorithm.reported_limit() - self.kept
    }

    /// The tier a key of this one is decided under with a limit of its own of `quota`
    /// (`RateLimitControl::set_limit`): the same name, place and definition in the store, the
    /// same way of taking part, its algorithm with that quota. A calendar tier's key keeps its
    /// period; a concurrency limit is the same for every key.
    pub(crate) fn relimited(&self, quota: Quota) -> Result<Tier, ConfigError> {
        if self.limits_in_flight() {
            return Err(ConfigError::new(
                "a concurrency limit is the same for every key; set a key's own limit on a rate policy",
            ));
        }
        let algorithm = self.algorithm.relimited(quota)?;
        let mut tier = self.sibling(algorithm, self.part.clone());
        tier.own = Some(quota);
        Ok(tier)
    }

    /// The quota of a key's own limit, for a tier made by [`relimited`](Self::relimited).
    pub(crate) fn own_quota(&self) -> Option<Quota> {
        self.own
    }

    /// How the tier takes part in a decision.
    pub(crate) fn part(&self) -> &Part {
        &self.part
    }

    /// Charge after responses whose status matches, for a tier charged after the response.
    pub(crate) fn charge_if(&self) -> Option<&StatusFn> {
        self.part.charge_if.as_ref()
    }

    /// Its window, in microseconds (for a concurrency limit: how long a slot is held at most).
    pub(crate) fn window_us(&self) -> u64 {
        self.algorithm.window_us()
    }

    /// Whether the tier limits requests in flight.
    pub(crate) fn limits_in_flight(&self) -> bool {
        matches!(self.part.op, Op::Concurrency)
    }

    /// The longest wait for a booked time, in microseconds (0: requests never wait).
    pub(crate) fn wait_us(&self) -> u64 {
        match self.part.op {
            Op::Wait { max_wait_us } => max_wait_us,
            _ => 0,
        }
    }

    /// The same tier blocking a key that keeps being denied as `escalation` says, if it does.
    pub(crate) fn escalating(mut self, escalation: Option<Escalation>) -> Self {
        self.escalation = escalation.map(|e| {
            let tag = format!("{}{}", self.tag, e.lua_suffix()).into_boxed_str();
            Box::new((e, tag))
        });
        self
    }

    /// How a key that keeps being denied is blocked, if it is.
    pub(crate) fn escalation(&self) -> Option<&Escalation> {
        self.escalation.as_ref().map(|e| &e.0)
    }

    /// The tag of a tier of `algorithm`: its algorithm and parameters, as short as it can
    /// be (a state and its tag are one string, whose allocation grows by 16 bytes past 12 and
    /// past 28 characters; a GCRA state is 16 digits).
    fn tag_of(algorithm: &Compiled) -> Box<str> {
        let (lua_id, params) = algorithm.lua_args();
        let params: Vec<String> = params.iter().map(|&n| compact(n)).collect();
        format!("{}{}", tag_letter(lua_id), params.join(",")).into_boxed_str()
    }

    /// The tag a Redis call sends: the tag, with the escalation after it (see
    /// [`Escalation::lua_suffix`]).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn call_tag(&self) -> &str {
        self.escalation.as_ref().map_or(&self.tag, |e| &e.1)
    }

    /// The same tier warning when a key has used `percent` of its limit (0: never).
    pub(crate) fn warning_near(mut self, percent: u8) -> Self {
        self.near = percent;
        self
    }

    /// Whether an outcome of this tier that leaves `remaining` of its `limit` is near it.
    pub(crate) fn is_near(&self, remaining: u64, limit: u64) -> bool {
        self.near > 0
            && u128::from(remaining) * 100 <= u128::from(limit) * u128::from(100 - self.near)
    }

    /// The same tier counting `unit`s.
    pub(crate) fn with_unit(mut self, unit: QuotaUnit) -> Self {
        self.unit = unit;
        self
    }

    /// What the tier's units are.
    pub(crate) fn unit(&self) -> QuotaUnit {
        self.unit
    }

    /// The tier's lease, if it takes leases.
    pub(crate) fn lease(&self) -> Option<LeaseSpec> {
        self.part.lease
    }

    /// The tier's name: the policy's, then `:TIER` for a named tier.
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The tier's name as a metric label value, shared, not copied.
    pub(crate) fn label(&self) -> metrics::SharedString {
        metrics::SharedString::from(self.name.clone())
    }

    /// The tier's id in its store.
    pub(crate) fn id(&self) -> u32 {
        self.id
    }

    /// The number of the tier's definition in its store.
    pub(crate) fn def(&self) -> u32 {
        self.def
    }

    /// The tag of the tier's definition in the Redis script.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn tag(&self) -> &str {
        &self.tag
    }

    pub(crate) fn algorithm(&self) -> &Compiled {
        &self.algorithm
    }

    /// `X-RateLimit-Limit`.
    pub(crate) fn limit_header(&self) -> &HeaderValue {
        &self.limit_header
    }

    /// Counts one decision of this tier in `ratelimit_decisions_total`.
    pub(crate) fn count(&self, allowed: bool, shadow: bool) {
        static METADATA: metrics::Metadata<'static> =
            metrics::Metadata::new(module_path!(), metrics::Level::INFO, Some(module_path!()));
        let key = &self.decisions_metric[match (allowed, shadow) {
            (true, _) => 0,
            (false, false) => 1,
            (false, true) => 2,
        }];
        metrics::with_recorder(|r| r.register_counter(key, &METADATA).increment(1));
    }
}

#[cfg(test)]
mod tests {
    use super::tag_letter;
    use crate::algorithm::compact;

    #[test]
    fn a_parameter_is_written_in_its_shorter_form() {
        // Round numbers of microseconds in decimal with an exponent, the others in base 36.
        assert_eq!(compact(86_400_000_000), "864E8");
        assert_eq!(compact(6_000_000), "6E6");
        assert_eq!(compact(360_000_000), "36E7");
        assert_eq!(compact(333_333), "7579");
        assert_eq!(compact(10), "a");
        assert_eq!(compact(100), "2s");
        assert_eq!(compact(0), "0");
        assert_eq!(compact(u64::MAX), "3w5e11264sgsf");
        assert_eq!(tag_letter(0), 'A');
        assert_eq!(tag_letter(5), 'F');
    }
}
