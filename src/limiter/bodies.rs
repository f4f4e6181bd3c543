//! The request bodies a layer reads: which requests' bodies its policies need, and the answer
//! to a body that could not be read. The reading itself is the service's
//! (`request_body/service.rs`): it waits for the body, which no step can.

use super::Limiter;
use crate::error::{ConfigError, KeyRejection};
#[cfg(feature = "json")]
use crate::key::Key;
use crate::key::RequestRef;
#[cfg(feature = "json")]
use crate::policy::CompiledPolicy;
use crate::refusal::{CallOver, Refusal};
use std::sync::Arc;

use crate::key::KeyExtractor;
use crate::policy::Policy;
use crate::request_body::BodyLimits;

impl<St> Limiter<St> {
    /// What `request`'s policies need of its body, if any applies that reads it.
    pub(crate) fn reading(&self, request: &RequestRef<'_>) -> Option<BodyLimits> {
        let limits = self.bodies?;
        let route = self.policies.load();
        if !route.reads_body() {
            return None;
        }
        (route.iter())
            .any(|p| p.reads_body() && p.applies(request))
            .then_some(limits)
    }

    /// The refusal of a request whose body could not be read as its policies need, counted.
    pub(crate) fn body_rejected(&self, rejection: KeyRejection) -> Refusal {
        tracing::debug!(code = rejection.code(), "request body rejected");
        metrics::counter!("ratelimit_body_rejected_total", "code" => rejection.code()).increment(1);
        Refusal::Rejected(rejection)
    }
}

/// Why `policies` (the layer's key `key`) cannot run on a layer that reads bodies within
/// `bodies` (`None`: none), if they cannot: a policy reads the body and the layer does not.
/// Checked before anything is registered.
pub(super) fn check_bodies(
    policies: &[Policy],
    key: &Arc<dyn KeyExtractor>,
    bodies: Option<BodyLimits>,
) -> Result<(), ConfigError> {
    if let Some(limits) = bodies {
        return limits.check();
    }
    match policies.iter().find(|p| p.reads_body(key)) {
        Some(p) => Err(ConfigError::new(format!(
            "{} reads the request body (its key or cost): build the layer with \
             .read_bodies(BodyLimits::new()) to have bodies read",
            p.described()
        ))),
        None => Ok(()),
    }
}

/// The calls of `request`'s JSON-RPC batch (its body a JSON array), when `policy` reads the
/// body: each call is keyed and costed on its own.
#[cfg(feature = "json")]
#[inline]
pub(super) fn batch<'a>(
    policy: &CompiledPolicy,
    request: &RequestRef<'a>,
) -> Option<&'a [serde_json::Value]> {
    if !policy.reads_body() {
        return None;
    }
    request.json()?.as_array().map(Vec::as_slice)
}

/// The cost of a request to a policy that does not read the body: `cost` for each call of
/// its batch (a batch of 32 calls is 32 requests to a client's limit), else `cost`.
#[cfg(feature = "json")]
#[inline]
pub(super) fn per_call(cost: u64, request: &RequestRef<'_>) -> u64 {
    match request.json().and_then(serde_json::Value::as_array) {
        Some(calls) => cost.saturating_mul(calls.len() as u64),
        None => cost,
    }
}

#[cfg(feature = "json")]
impl<St: crate::store::Store> Limiter<St> {
    /// The checks of `policy` for the `calls` of `request`'s batch: one per tier and key, at
    /// the cost of its calls together (two checks of one key in one decision would each see
    /// the key's state before the other's charge), or why a call has no key or cost.
    pub(super) fn batch_checks(
        &self,
        policy: &CompiledPolicy,
        request: &RequestRef<'_>,
        calls: &[serde_json::Value],
        (checks, fallback, after): super::Planned<'_>,
    ) -> Result<(), KeyRejection> {
        for group in groups(policy, request, calls, self.batch_keys())? {
            let planned = (&mut *checks, &mut *fallback, &mut *after);
            Self::push_check(policy, request, group.tier, group.key, group.cost, planned);
        }
        Ok(())
    }
}

impl<St> Limiter<St> {
    /// The most distinct keys a policy makes of a batch.
    #[cfg(feature = "json")]
    fn batch_keys(&self) -> usize {
        self.bodies
            .map_or(BodyLimits::DEFAULT_BATCH_KEYS, |b| b.get_batch_keys())
    }

    /// The calls of `request`, a JSON-RPC batch that `refusal` denied, that were over: each
    /// one's place in the batch, its `id` and the policies it was over (`None` when the
    /// request is no denied batch). A call's keys are made again as they were planned: a
    /// policy's outcomes are in the order of its checks, one per key in the order the calls
    /// first made them.
    #[inline]
    pub(crate) fn calls_over(
        &self,
        request: &RequestRef<'_>,
        refusal: &Refusal,
    ) -> Option<Vec<CallOver>> {
        #[cfg(feature = "json")]
        if self.bodies.is_some() {
            return self.batch_over(request, refusal.decision()?);
        }
        let _ = (request, refusal);
        None
    }

    #[cfg(feature = "json")]
    #[inline(never)]
    fn batch_over(
        &self,
        request: &RequestRef<'_>,
        decision: &crate::Decision,
    ) -> Option<Vec<CallOver>> {
        let calls = request.json()?.as_array()?;
        let mut over: Vec<Vec<&str>> = vec![Vec::new(); calls.len()];
        let route = self.policies.load();
        for policy in route.iter().filter(|p| p.applies(request)) {
            // A policy that does not read the body has one check, made by every call.
            let groups: Vec<Vec<usize>> = match policy.reads_body() {
                true => groups(policy, request, calls, self.batch_keys())
                    .map(|gs| gs.into_iter().map(|g| g.calls).collect())
                    .unwrap_or_default(),
                false => vec![(0..calls.len()).collect()],
            };
            let outcomes: Vec<_> = (decision.outcomes().iter())
                .filter(|o| policy.tiers().any(|t| t.name() == o.policy()))
                .collect();
            let exact = outcomes.len() == groups.len();
            for (n, outcome) in outcomes.iter().enumerate() {
                if outcome.is_allowed() {
                    continue;
                }
                // Else (a denial remembered by the deny cache, of one key) every call of the
                // policy is named.
                let named = if exact { &groups[n..=n] } else { &groups[..] };
                for i in named.iter().flatten() {
                    over[*i].push(outcome.policy());
                }
            }
        }
        let named = (over.iter().enumerate())
            .filter(|(_, policies)| !policies.is_empty())
            .map(|(i, policies)| {
                let id = calls[i].get("id");
                let named = serde_json::json!({"index": i, "id": id, "policies": policies});
                CallOver::new(named.to_string())
            });
        Some(named.collect())
    }
}

/// The calls of a batch that make one check of a policy: of one tier and key, at their cost
/// together (two checks of one key in one decision would each see the key's state before the
/// other's charge).
#[cfg(feature = "json")]
struct Group {
    tier: usize,
    key: Key,
    cost: u64,
    calls: Vec<usize>,
}

/// The checks of `policy` the `calls` of `request`'s batch make, in the order the calls first
/// make them, or why a call has no key or cost, or why they make more than `most` checks.
/// Each call is compared with at most `most` groups: linear in the calls.
#[cfg(feature = "json")]
fn groups(
    policy: &CompiledPolicy,
    request: &RequestRef<'_>,
    calls: &[serde_json::Value],
    most: usize,
) -> Result<Vec<Group>, KeyRejection> {
    let mut groups: Vec<Group> = Vec::new();
    for (i, call) in calls.iter().enumerate() {
        let call = request.with_call(call);
        let key = policy.key(&call)?;
        let cost = policy.cost(&call)?;
        let tier = policy.tier_index(&call, &key);
        let full = groups.len() >= most;
        match groups.iter_mut().find(|g| g.tier == tier && g.key == key) {
            Some(g) => {
                g.cost = g.cost.saturating_add(cost);
                g.calls.push(i);
            }
            None if full => return Err(too_many_keys(policy, most)),
            None => groups.push(Group {
                tier,
                key,
                cost,
                calls: vec![i],
            }),
        }
    }
    Ok(groups)
}

/// The refusal of a batch whose calls make more than `most` keys of `policy`.
#[cfg(feature = "json")]
fn too_many_keys(policy: &CompiledPolicy, most: usize) -> KeyRejection {
    KeyRejection::new(
        http::StatusCode::PAYLOAD_TOO_LARGE,
        "batch_too_many_keys",
        format!(
            "the batch's calls make more than the {most} keys of policy {} a rate-limited \
             batch may make",
            policy.name()
        ),
    )
}
