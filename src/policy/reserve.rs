//! Capacity kept for priority: [`Reserve`], which share of one policy's capacity a request
//! may use by its priority (compiled per tier in `tier.rs`; the builder method in
//! `priority.rs`).

use std::fmt;
use std::sync::Arc;

use http::HeaderName;

use crate::error::ConfigError;
use crate::key::RequestRef;

/// A request's priority, from a function of the request.
type PriorityFn = Arc<dyn Fn(&RequestRef<'_>) -> Option<&'static str> + Send + Sync>;

/// Where a request's priority comes from.
#[derive(Clone)]
enum Source {
    Header(Result<HeaderName, ConfigError>),
    Select(PriorityFn),
}

/// Which share of a policy's capacity a request may use, by its priority: capacity kept for
/// what matters ([`Policy::reserve`](crate::Policy::reserve)).
///
/// A request's priority is a name, read from a header or chosen by a function. Each priority
/// named with [`share`](Self::share) may use that percentage of the policy's capacity; any
/// other, or none, may use the share of [`others`](Self::others) (all of it unless set). With
/// `critical` at 100% and the others at 80%, the others are refused once 80% of the capacity
/// is used, and the last 20% is left to critical requests.
///
/// It is decided on the policy's one state, atomically, in both stores: a request of a share
/// is judged as if it asked for the units its share leaves out on top of its cost, and
/// charged its cost alone. So the reserve holds exactly across every instance sharing a
/// store, with no second counter. Its headers tell each request the limit it saw: its share
/// of the capacity, and what is left of it.
///
/// ```
/// use tower_ratelimit::{Policy, RateLimitLayer, policy::Reserve};
///
/// # fn main() -> Result<(), tower_ratelimit::ConfigError> {
/// // 1,000 requests a minute for everyone, of which the last 200 only for `critical`.
/// let layer = RateLimitLayer::builder()
///     .policy(
///         Policy::gcra("1000/min")
///             .name("api")
///             .reserve(Reserve::header("x-priority").share("critical", 100).others(80)),
///     )
///     .build()?;
/// # let _ = layer;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Reserve {
    source: Source,
    shares: Vec<(String, u8)>,
    others: u8,
}

impl fmt::Debug for Reserve {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let source = match &self.source {
            Source::Header(Ok(name)) => name.as_str(),
            Source::Header(Err(_)) => "(a bad header name)",
            Source::Select(_) => "(a function)",
        };
        f.debug_struct("Reserve")
            .field("source", &source)
            .field("shares", &self.shares)
            .field("others", &self.others)
            .finish()
    }
}

impl Reserve {
    /// A request's priority is the value of its header `name` (a bad name is an error of
    /// [`build`](crate::RateLimitLayerBuilder::build)).
    pub fn header(name: &str) -> Self {
        let name = HeaderName::try_from(name)
            .map_err(|_| ConfigError::new(format!("reserve: {name:?} is not a header name")));
        Self::from_source(Source::Header(name))
    }

    /// A request's priority is what `select` says (`None`: it has none, and gets the share of
    /// [`others`](Self::others)).
    pub fn select<F>(select: F) -> Self
    where
        F: Fn(&RequestRef<'_>) -> Option<&'static str> + Send + Sync + 'static,
    {
        Self::from_source(Source::Select(Arc::new(select)))
    }

    fn from_source(source: Source) -> Self {
        Reserve {
            source,
            shares: Vec::new(),
            others: 100,
        }
    }

    /// Requests of `priority` may use `percent` of the capacity (1 to 100).
    #[must_use]
    pub fn share(mut self, priority: impl Into<String>, percent: u8) -> Self {
        self.shares.push((priority.into(), percent));
        self
    }

    /// Requests of any other priority, or of none, may use `percent` of the capacity (1 to
    /// 100; 100 unless set).
    #[must_use]
    pub fn others(mut self, percent: u8) -> Self {
        self.others = percent;
        self
    }

    /// Checked: a header name, shares of 1 to 100, no priority named twice, and one share
    /// below 100 (else nothing is kept).
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if let Source::Header(Err(e)) = &self.source {
            return Err(e.clone());
        }
        if let Some(bad) = self.percents().find(|p| !(1..=100).contains(p)) {
            return Err(ConfigError::new(format!(
                "reserve: a share is 1 to 100 percent of the capacity (got {bad})"
            )));
        }
        for (i, (name, _)) in self.shares.iter().enumerate() {
            if self.shares[..i].iter().any(|(n, _)| n == name) {
                return Err(ConfigError::new(format!(
                    "reserve: the priority {name:?} has two shares"
                )));
            }
        }
        if self.percents().all(|p| p == 100) {
            return Err(ConfigError::new(
                "reserve: every share is 100%, so nothing is kept; give the others less",
            ));
        }
        Ok(())
    }

    /// Checked against a tier's `capacity`: each share of it at least one unit.
    pub(super) fn check_capacity(&self, capacity: u64) -> Result<(), ConfigError> {
        match self.percents().find(|&p| allowed(capacity, p) == 0) {
            Some(percent) => Err(ConfigError::new(format!(
                "reserve: {percent}% of a capacity of {capacity} is not one unit"
            ))),
            None => Ok(()),
        }
    }

    /// The shares, the others' last.
    fn percents(&self) -> impl Iterator<Item = u8> + Clone + '_ {
        self.shares.iter().map(|(_, p)| *p).chain([self.others])
    }

    /// The level of `request`: the place of its priority among the shares, the others' (the
    /// last) when it has none or another.
    pub(super) fn level(&self, request: &RequestRef<'_>) -> usize {
        let priority = match &self.source {
            Source::Header(Ok(name)) => (request.headers().get(name)).and_then(|v| v.to_str().ok()),
            Source::Header(Err(_)) => None,
            Source::Select(select) => select(request),
        };
        priority
            .and_then(|p| self.shares.iter().position(|(n, _)| *n == p))
            .unwrap_or(self.shares.len())
    }

    /// The units each level keeps of `capacity` (checked with
    /// [`check_capacity`](Self::check_capacity)), the others' last.
    pub(super) fn kept(&self, capacity: u64) -> impl Iterator<Item = u64> + '_ {
        self.percents()
            .map(move |p| capacity - allowed(capacity, p))
    }
}

/// The units of `capacity` a share of `percent` may use.
fn allowed(capacity: u64, percent: u8) -> u64 {
    capacity.saturating_mul(u64::from(percent)) / 100
}
