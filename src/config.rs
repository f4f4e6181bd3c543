//! Policies from a configuration file (feature `serde`): [`Limits`] and [`PolicyConfig`].
//!
//! Both deserialize from any serde format. Each policy is checked as it is read, so a
//! format that tracks positions (TOML, YAML) reports a bad policy at its line, with the
//! field and what is wrong; [`Limits::policies`] then builds the [`Policy`] values for
//! [`RateLimitLayerBuilder::policy`](crate::RateLimitLayerBuilder::policy) or
//! [`RateLimitControl::reload`](crate::RateLimitControl::reload).
//!
//! ```
//! use tower_ratelimit::{RateLimitLayer, config::Limits};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // Any serde format; here JSON (TOML is shown in the README).
//! let limits: Limits = serde_json::from_str(r#"{
//!     "key": "ip",
//!     "policy": [
//!         { "name": "per-ip", "algorithm": "gcra", "quota": "20/s", "burst": 40 },
//!         { "name": "logins", "algorithm": "sliding_log", "quota": "5/15min",
//!           "routes": ["POST /login"], "charge_if_status": [401] }
//!     ]
//! }"#)?;
//! let layer = RateLimitLayer::builder().policies(limits.policies()?).build()?;
//! assert_eq!(layer.policy_names(), ["per-ip", "logins"]);
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;

use serde::Deserialize;

use crate::algorithm::Algorithm;
use crate::calendar::{Calendar, Weekday};
use crate::error::ConfigError;
use crate::key::{Cidr, ClientIp};
use crate::lists::Lists;
use crate::policy::Policy;
use crate::quota::{Quota, QuotaUnit};

mod key;
mod raw;
mod text;

pub use key::KeySpec;

use text::{BodyMeasure, CostText, DurationText, HeaderNameText, RouteText, Status, Text};

/// A whole configuration: the policies, and the key of those that do not name their own.
///
/// Fields (all optional but `policy`):
///
/// | field | meaning |
/// |---|---|
/// | `key` | the key of every policy without its own (default `"ip"`); see [`KeySpec`] |
/// | `trusted_proxies` | networks of the proxies in front of the service, for `key = "client_ip"` and the lists' networks |
/// | `allow` | networks, addresses and keys never limited nor counted (see [`Lists`]) |
/// | `deny` | networks, addresses and keys answered `403` |
/// | `lists_key` | the key the lists' key entries name, given here or added at runtime (default: `key`); a policy's own key (`lists_key = "header:x-user"`) to list its keys |
/// | `policy` | the policies, in order: a list of [`PolicyConfig`] |
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    #[serde(default)]
    key: Option<KeySpec>,
    #[serde(default)]
    trusted_proxies: Vec<CidrText>,
    #[serde(default)]
    allow: Vec<String>,
    #[serde(default)]
    deny: Vec<String>,
    #[serde(default)]
    lists_key: Option<KeySpec>,
    #[serde(rename = "policy")]
    policies: Vec<PolicyConfig>,
}

impl Limits {
    /// The policies, each with its key (its own, else the configuration's).
    ///
    /// Fails only for a `client_ip` key whose proxies cannot be used; everything else was
    /// checked when the configuration was read.
    pub fn policies(&self) -> Result<Vec<Policy>, ConfigError> {
        let proxies = self.proxies();
        let default = self.key.clone().unwrap_or(KeySpec::Ip);
        if default != KeySpec::ClientIp
            && !proxies.is_empty()
            && !self.has_lists()
            && !self
                .policies
                .iter()
                .any(|p| p.key == Some(KeySpec::ClientIp))
        {
            return Err(ConfigError::new(
                "trusted_proxies is only read by the client_ip key, which no policy uses, and by the lists, which are empty",
            ));
        }
        self.policies
            .iter()
            .map(|p| {
                let spec = p.key().unwrap_or(&default);
                Ok(p.policy().key(spec.extractor(&proxies)?))
            })
            .collect()
    }

    /// The allow and deny lists (`allow`, `deny`; empty when the file has neither), their
    /// networks matched against the client address its `trusted_proxies` find and their keys
    /// against the file's `lists_key`, else its `key` (an entry that key never makes is an
    /// error saying which key the lists follow), for
    /// [`RateLimitLayerBuilder::lists`](crate::RateLimitLayerBuilder::lists) and
    /// [`RateLimitControl::reload_lists`](crate::RateLimitControl::reload_lists). When a policy
    /// of the file takes leases, the lists are the entries the file gives only
    /// ([`kept_in_store(false)`](crate::lists::Lists::kept_in_store)): entries kept in the
    /// store would have every request ask it, and the leases save no call.
    pub fn lists(&self) -> Result<Lists, ConfigError> {
        let proxies = self.proxies();
        let client_ip = (proxies.iter())
            .fold(ClientIp::builder(), |b, &net| b.trusted_network(net))
            .build()?;
        let key = self.lists_key();
        let lists = Lists::new()
            .keyed(key.extractor(&proxies)?)
            .allow(self.allow.iter().cloned())
            .deny(self.deny.iter().cloned())
            .client_ip(client_ip)
            .kept_in_store(!self.policies.iter().any(|p| p.policy().takes_leases()));
        // Checked now, as every other field is checked when read.
        lists
            .check()
            .map_err(|e| ConfigError::new(format!("{e} ({})", self.lists_follow())))?;
        Ok(lists)
    }

    /// The key the lists' key entries name: `lists_key`, else `key`, else `"ip"`.
    pub fn lists_key(&self) -> KeySpec {
        (self.lists_key.clone())
            .or_else(|| self.key.clone())
            .unwrap_or(KeySpec::Ip)
    }

    /// Which key the lists follow, and how to make them follow a policy's own.
    pub fn lists_follow(&self) -> String {
        let key = self.lists_key();
        let field = if self.lists_key.is_some() {
            "lists_key"
        } else {
            "key"
        };
        let mut said = format!("the lists' keys are made by {field} = \"{key}\"");
        let own = (self.policies.iter()).find(|p| p.key().is_some_and(|k| *k != key));
        if let Some((policy, own)) = own.and_then(|p| Some((p, p.key()?))) {
            let name = policy.name().unwrap_or("unnamed");
            said.push_str(&format!(
                "; policy {name:?} has a key of its own: lists_key = \"{own}\" lists its keys"
            ));
        }
        said
    }

    /// The networks of `trusted_proxies`.
    fn proxies(&self) -> Vec<Cidr> {
        self.trusted_proxies.iter().map(|c| c.0).collect()
    }

    /// Whether the file has an `allow` or a `deny` list.
    pub fn has_lists(&self) -> bool {
        !self.allow.is_empty() || !self.deny.is_empty()
    }

    /// The configured policies, as read.
    pub fn policy_configs(&self) -> &[PolicyConfig] {
        &self.policies
    }

    /// Reads a TOML configuration (feature `toml`). A mistake is reported with its line, the
    /// field when there is one, and what is wrong, e.g. `line 7 (quota): invalid quota
    /// "10/fortnight": unknown window unit; use us, ms, s, min, h or d`; a mistake in how a
    /// policy's fields go together is reported at the policy's `[[policy]]` line, e.g.
    /// `line 12: policy #3: policy "b": fixed_window has no burst; ...`.
    ///
    /// ```
    /// use tower_ratelimit::config::Limits;
    ///
    /// let limits = Limits::from_toml(r#"
    /// [[policy]]
    /// name = "api"
    /// quota = "100/min"
    /// "#).unwrap();
    /// assert_eq!(limits.policy_configs()[0].name(), Some("api"));
    ///
    /// let err = Limits::from_toml("[[policy]]\nquota = \"10/fortnight\"\n").unwrap_err();
    /// assert!(err.to_string().starts_with("line 2 (quota): "), "{err}");
    /// ```
    #[cfg(feature = "toml")]
    #[cfg_attr(docsrs, doc(cfg(feature = "toml")))]
    pub fn from_toml(text: &str) -> Result<Limits, ConfigError> {
        toml::from_str(text).map_err(|e| toml_error(text, &e))
    }
}

/// A TOML mistake with its line and field. TOML reports a mistake in how a policy's fields go
/// together at the first `[[policy]]` header, whichever policy it is in: each policy is then
/// read alone to find it.
#[cfg(feature = "toml")]
fn toml_error(text: &str, e: &toml::de::Error) -> ConfigError {
    let line = |offset: usize| text[..offset.min(text.len())].matches('\n').count() + 1;
    let Some(span) = e.span() else {
        return ConfigError::new(e.message().to_owned());
    };
    if text[span.clone()].trim_start().starts_with("[[policy]]") {
        #[derive(Deserialize)]
        struct Outline {
            #[serde(default)]
            policy: Vec<toml::Spanned<toml::Table>>,
        }
        if let Ok(outline) = toml::from_str::<Outline>(text) {
            for (i, table) in outline.policy.into_iter().enumerate() {
                let at = line(table.span().start);
                if let Err(e) = toml::Value::Table(table.into_inner()).try_into::<PolicyConfig>() {
                    let n = i + 1;
                    return ConfigError::new(format!("line {at}: policy #{n}: {}", e.message()));
                }
            }
        }
    }
    let at = line(span.start);
    // The field: the key the line assigns, if it assigns one.
    let field = text
        .lines()
        .nth(at - 1)
        .and_then(|l| l.split_once('='))
        .map(|(key, _)| key.trim())
        .filter(|key| !key.is_empty() && !key.starts_with('['));
    match field {
        Some(field) => ConfigError::new(format!("line {at} ({field}): {}", e.message())),
        None => ConfigError::new(format!("line {at}: {}", e.message())),
    }
}

/// A network read from a string such as `10.0.0.0/8`.
#[derive(Clone, Debug)]
struct CidrText(Cidr);

impl<'de> Deserialize<'de> for CidrText {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse()
            .map(CidrText)
            .map_err(|e: ConfigError| serde::de::Error::custom(e.context("trusted_proxies")))
    }
}

/// One policy as configured, checked when it is read.
///
/// | field | type | meaning ([`Policy`] method) |
/// |---|---|---|
/// | `name` | string | the policy's name ([`name`](Policy::name)); required for tiers |
/// | `algorithm` | string | `gcra` (default), `token_bucket`, `leaky_bucket`, `fixed_window`, `sliding_window`, `sliding_log` |
/// | `quota` | string | e.g. `"10/s"`, `"100/min"`, `"20/10s"`; required but for `concurrency` |
/// | `burst` | integer | bucket algorithms ([`burst`](Policy::burst)) |
/// | `buckets` | integer | sliding window ([`buckets`](Policy::buckets)) |
/// | `key` | string | this policy's key ([`KeySpec`]) |
/// | `routes` | strings | `"/path"`, `"GET /path"`, `"/prefix/*"` ([`route`](Policy::route)) |
/// | `cost` | integer, string | units per request ([`cost`](Policy::cost)), or `"json:<pointer>"`: the number at that JSON pointer of the body ([`cost_json`](Policy::cost_json)), or `"graphql"` (`"graphql:<max depth>"`, 10 by default): its GraphQL query's calculated cost ([`cost_graphql`](Policy::cost_graphql)) |
/// | `min_body_cost` | integer | the least a cost read from the body counts, 1 by default; `0` lets a body stating 0 through uncharged ([`min_body_cost`](Policy::min_body_cost)) |
/// | `shadow` | bool | dry run ([`shadow`](Policy::shadow)) |
/// | `charge_if_status` | integers | charge only responses with these statuses ([`charge_if`](Policy::charge_if)) |
/// | `refund_if_status` | integers | give the cost back for these statuses ([`refund_if`](Policy::refund_if)) |
/// | `unit` | string | `requests` (default), `content-bytes` or `tokens` ([`unit`](Policy::unit)) |
/// | `settle_header`, `settle_trailer` | string | settle each request at the cost this response header, or trailer, reports ([`settle`](Policy::settle)) |
/// | `settle_body` | string | `bytes`: settle each request at the bytes its response body sent; `json:<pointer>`: at the number there in its JSON body, or its last server-sent event's ([`Settle::json`](crate::settle::Settle::json)) |
/// | `settle_at_most` | integer | a reported cost is clamped to this many times the limit ([`Settle::at_most`](crate::settle::Settle::at_most), default 10) |
/// | `time_zone` | string | count calendar periods of this IANA zone, e.g. `"Europe/Paris"` ([`calendar`](Policy::calendar)) |
/// | `week_starts`, `month_starts` | string, integer | a calendar's week day (`"sunday"`) and day of the month (`15`); UTC without `time_zone` |
/// | `tiers` | table | tier name to quota ([`tier`](Policy::tier)) |
/// | `tier_header` | string | a request header naming the tier, e.g. set by an auth layer ([`select_tier`](Policy::select_tier)) |
/// | `tier_keys` | table | key to tier ([`tier_for_key`](Policy::tier_for_key)) |
/// | `lease`, `lease_ttl` | integer, duration | leases ([`lease`](Policy::lease), [`lease_ttl`](Policy::lease_ttl)) |
/// | `wait` | duration | wait for its turn instead of a 429 ([`wait_up_to`](Policy::wait_up_to)) |
/// | `concurrency`, `max_duration` | integer, duration | a concurrency limit ([`concurrency`](Policy::concurrency), [`max_duration`](Policy::max_duration)) |
/// | `adaptive`, `adaptive_min`, `adaptive_max` | string, integers | an adaptive concurrency limit: `gradient2` or `aimd`, and its bounds ([`adaptive_concurrency`](Policy::adaptive_concurrency)) |
/// | `block_for`, `block_after`, `block_within`, `block_max`, `block_factor`, `block_forget_after` | duration, integer, durations, integer, duration | block a key that keeps being denied: first for `block_for`, after `block_after` denials (default 1) within `block_within` (default `"1min"`), multiplied by `block_factor` (default 2) for each new block within `block_forget_after` (default `"1d"`) of the last, at most `block_max` (default `"1h"`) ([`block_on_violation`](Policy::block_on_violation)) |
/// | `near_limit` | integer | warn of a key that used this percent of its limit, e.g. `80` ([`near_limit`](Policy::near_limit)) |
/// | `reserve_header`, `reserve_shares`, `reserve_others` | string, table, integer | capacity kept for priority: the header naming a request's priority, the percent of the capacity each priority may use (e.g. `{ critical = 100 }`), and the others' percent ([`reserve`](Policy::reserve)) |
///
/// Durations are strings such as `"500ms"`, `"30s"`, `"2min"`, `"1h"` (the units of a quota's
/// window).
#[derive(Clone, Debug, Deserialize)]
#[serde(try_from = "RawPolicy")]
pub struct PolicyConfig {
    /// The policy, without its key.
    policy: Policy,
    name: Option<String>,
    key: Option<KeySpec>,
}

impl PolicyConfig {
    /// The policy, without its key: the layer's applies, or the one [`Limits::policies`]
    /// gives it (its own [`key`](Self::key), else the configuration's).
    pub fn policy(&self) -> Policy {
        self.policy.clone()
    }

    /// The policy's own key, if it names one.
    pub fn key(&self) -> Option<&KeySpec> {
        self.key.as_ref()
    }

    /// The policy's name, if it was given one.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }
}

/// A policy as written. Each field is checked as it is read (so a format that tracks
/// positions reports a bad value at its own line); what depends on several fields is checked
/// by [`PolicyConfig::try_from`].
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawPolicy {
    name: Option<String>,
    algorithm: Option<Text<Algorithm>>,
    quota: Option<Text<Quota>>,
    burst: Option<u32>,
    buckets: Option<u32>,
    key: Option<KeySpec>,
    routes: Vec<Text<RouteText>>,
    cost: Option<Text<CostText>>,
    shadow: bool,
    charge_if_status: Vec<Text<Status>>,
    refund_if_status: Vec<Text<Status>>,
    unit: Option<Text<QuotaUnit>>,
    settle_header: Option<Text<HeaderNameText>>,
    settle_trailer: Option<Text<HeaderNameText>>,
    settle_body: Option<Text<BodyMeasure>>,
    settle_at_most: Option<u32>,
    time_zone: Option<Text<Calendar>>,
    week_starts: Option<Text<Weekday>>,
    month_starts: Option<u8>,
    tiers: BTreeMap<String, Text<Quota>>,
    tier_header: Option<Text<HeaderNameText>>,
    tier_keys: BTreeMap<String, String>,
    lease: Option<u32>,
    lease_ttl: Option<Text<DurationText>>,
    wait: Option<Text<DurationText>>,
    concurrency: Option<u32>,
    max_duration: Option<Text<DurationText>>,
    adaptive: Option<String>,
    adaptive_min: Option<u32>,
    adaptive_max: Option<u32>,
    reserve_header: Option<Text<HeaderNameText>>,
    reserve_shares: BTreeMap<String, u8>,
    reserve_others: Option<u8>,
    near_limit: Option<u8>,
    min_body_cost: Option<u32>,
    block_for: Option<Text<DurationText>>,
    block_after: Option<u32>,
    block_within: Option<Text<DurationText>>,
    block_max: Option<Text<DurationText>>,
    block_factor: Option<u32>,
    block_forget_after: Option<Text<DurationText>>,
}

impl TryFrom<RawPolicy> for PolicyConfig {
    type Error = ConfigError;

    fn try_from(mut r: RawPolicy) -> Result<Self, ConfigError> {
        let mut policy = r.base()?;
        if let Some(settle) = r.settle()? {
            policy = policy.settle(settle);
        }
        if let Some(name) = &r.name {
            policy = policy.name(name.as_str());
        }
        if let Some(burst) = r.burst {
            policy = policy.burst(burst);
        }
        if let Some(buckets) = r.buckets {
            policy = policy.buckets(buckets);
        }
        if let Some(calendar) = r.calendar() {
            policy = policy.calendar(calendar);
        }
        for Text(RouteText(method, path)) in std::mem::take(&mut r.routes) {
            policy = policy.route(method, path);
        }
        match r.cost.take().map(|Text(cost)| cost) {
            Some(CostText::Units(units)) => policy = policy.cost(move |_| units),
            #[cfg(feature = "json")]
            Some(CostText::Json(pointer)) => policy = policy.cost_json(&pointer),
            #[cfg(feature = "graphql")]
            Some(CostText::Graphql(depth)) => policy = policy.cost_graphql(depth),
            None => {}
        }
        if let Some(units) = r.min_body_cost {
            policy = policy.min_body_cost(units);
        }
        policy = r.tiered(policy);
        policy = r.taking(policy);
        policy = r.reserving(policy)?;
        if let Some(percent) = r.near_limit {
            policy = policy.near_limit(percent);
        }
        policy = r.blocking(policy)?;
        // Everything a build would say about the policy, said now, where the policy is read.
        policy.prepare(None)?;
        Ok(PolicyConfig {
            policy,
            name: r.name,
            key: r.key,
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::store::Op;

    /// Every way a policy takes part (an operation that does not act on its own, enforcing
    /// aside: it is the default) has its key in the configuration file: the table of keys
    /// links the builder method its row in `operations!` names.
    #[test]
    fn every_way_to_take_part_has_a_key() {
        let source = include_str!("config.rs");
        for &op in Op::KINDS {
            if op.acts() || op == Op::Enforce {
                continue;
            }
            let what = op.what();
            let named = what.find('(').zip(what.rfind(')'));
            let (open, close) = named.unwrap_or_else(|| panic!("{op:?}: names no method"));
            let method = what[open + 1..close].trim_end_matches("()");
            assert!(
                source.contains(&format!("(Policy::{method})")),
                "{op:?} ({what}): no key in the configuration file"
            );
        }
    }
}
