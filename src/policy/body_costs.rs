//! [`Policy::cost_json`] and [`Policy::cost_graphql`]: a request's cost read from its body.

#[cfg(feature = "json")]
use super::body_cost::BodyCost;
use super::builder::Policy;
#[cfg(feature = "graphql")]
use crate::error::ConfigError;

impl Policy {
    /// The least a cost read from the body ([`cost_json`](Self::cost_json),
    /// [`cost_graphql`](Self::cost_graphql)) counts: 1 by default, so that a client cannot
    /// make itself free by asking for 0 (`{"max_tokens": 0}`, an empty query); each call of
    /// a batch counts at least this much. `min_body_cost(0)` lets a body that states 0 through
    /// uncharged, where a cost of 0 is a real answer (a dry run that costs nothing); a
    /// larger floor charges every request some units (a call's own overhead). A cost
    /// settled after the response ([`settle`](Self::settle)) is the response's, floored by
    /// nothing.
    ///
    /// ```
    /// use tower_ratelimit::{Policy, RateLimitLayer, request_body::BodyLimits};
    ///
    /// # fn main() -> Result<(), tower_ratelimit::ConfigError> {
    /// // Every call costs its `max_tokens`, and at least 16.
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::token_bucket("100000/min").cost_json("/max_tokens").min_body_cost(16))
    ///     .read_bodies(BodyLimits::new())
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn min_body_cost(mut self, units: u32) -> Self {
        self.body_floor = units;
        self
    }

    /// The request's cost is the number at `pointer` (RFC 6901, `/max_tokens`) of its JSON
    /// body: an LLM call charged its tokens asked for, a batch import its rows. The number is a
    /// whole number from 0 to `u32::MAX`, counted at least 1 (at least
    /// [`min_body_cost`](Self::min_body_cost)); a body whose value is absent, negative, fractional,
    /// too large or no number is answered `400` (code `bad_cost`, saying which), and charged
    /// as a refused body is ([`charge_rejected`](crate::request_body::BodyLimits::charge_rejected)):
    /// to the head's keys, at the floor. The layer must read bodies
    /// ([`read_bodies`](crate::RateLimitLayerBuilder::read_bodies)); a pointer that is none
    /// is reported by `build`. Replaces a [`cost`](Self::cost) given before (and is replaced
    /// by one given after). With [`settle`](Self::settle), it is the estimate the response
    /// settles.
    ///
    /// ```
    /// use tower_ratelimit::{Policy, RateLimitLayer, request_body::BodyLimits};
    ///
    /// # fn main() -> Result<(), tower_ratelimit::ConfigError> {
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::token_bucket("100000/min").cost_json("/max_tokens"))
    ///     .read_bodies(BodyLimits::new())
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "json")]
    #[must_use]
    pub fn cost_json(mut self, pointer: &str) -> Self {
        let checked = crate::key::check_pointer(pointer).map(|()| std::sync::Arc::from(pointer));
        let cost = checked.map(BodyCost::Json);
        self.body_cost = Some(cost.map_err(|e| e.context("cost_json")));
        self.cost = None;
        self
    }

    /// The request's cost is the calculated cost of the GraphQL query in its JSON body
    /// (`{"query": ..., "operationName": ..., "variables": ...}`), decided before any resolver
    /// runs: every field costs 1, `first` or `last` multiply their field's selection,
    /// fragments are expanded (see [`graphql`](crate::graphql) for the cost exactly as
    /// computed, and the GitHub and Shopify models beside it). A query deeper than
    /// `max_depth` fields (10 is a common choice) is answered `400` (`graphql_too_deep`),
    /// one that does not parse or has no cost `400` (`bad_graphql`, naming what is wrong and
    /// where), charged as a refused body is
    /// ([`charge_rejected`](crate::request_body::BodyLimits::charge_rejected)). A `max_depth`
    /// of 0 is reported by `build`. The layer must
    /// read bodies ([`read_bodies`](crate::RateLimitLayerBuilder::read_bodies)).
    ///
    /// ```
    /// use tower_ratelimit::{Policy, RateLimitLayer, request_body::BodyLimits};
    ///
    /// # fn main() -> Result<(), tower_ratelimit::ConfigError> {
    /// // 1,000 points a minute per client, as a GraphQL API publishes its own.
    /// let layer = RateLimitLayer::builder()
    ///     .policy(Policy::token_bucket("1000/min").cost_graphql(10))
    ///     .read_bodies(BodyLimits::new())
    ///     .build()?;
    /// # let _ = layer;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "graphql")]
    #[must_use]
    pub fn cost_graphql(mut self, max_depth: u32) -> Self {
        self.body_cost = Some(match max_depth {
            0 => Err(ConfigError::new(
                "cost_graphql(0): a query is at least 1 field deep; give the deepest allowed",
            )),
            max_depth => Ok(BodyCost::Graphql { max_depth }),
        });
        self.cost = None;
        self
    }
}
