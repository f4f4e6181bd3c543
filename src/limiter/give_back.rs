//! What a request takes and must give back when it ends or goes away: the slots of a
//! concurrency limit (held with its response body) and the units booked for a wait.

use std::sync::Arc;

use super::{Limiter, Ticket};
use crate::body::BodyGuard;
use crate::decision::{Decision, Grant, PolicyOutcome};
use crate::key::Key;
use crate::store::private::Sealed as _;
use crate::store::{Check, Checks, Op, Store};

/// What an outcome took: the slots of a concurrency limit, or the units booked for a wait.
fn taken(o: &PolicyOutcome) -> Option<&Grant> {
    o.held().or_else(|| o.booking())
}

impl<St: Store> Limiter<St> {
    /// What gives back what `pick` finds in the decision's outcomes (units booked for a
    /// waiting request, or slots of a concurrency limit) when dropped: one `RELEASE` each, sent
    /// to the store that decided (`local`: the local fallback), counted in `counter`. `None`
    /// when the decision has none.
    pub(super) fn giving_back(
        &self,
        decision: &Decision,
        keys: Option<&[Check]>,
        local: bool,
        pick: fn(&PolicyOutcome) -> Option<&Grant>,
        counter: Option<&'static str>,
    ) -> Option<BodyGuard> {
        let mut checks = Checks::new();
        for o in decision.outcomes() {
            let (Some(grant), Some(keys)) = (pick(o), keys) else {
                continue;
            };
            if let Some(key) = Check::key_of(keys, o.tier().id()) {
                let tier = o.tier().clone();
                checks.push(Check::new(
                    tier,
                    key.clone(),
                    grant.units,
                    Op::Release { at: grant.end },
                ));
            }
        }
        if checks.is_empty() {
            return None;
        }
        let count = move || {
            if let Some(name) = counter {
                metrics::counter!(name).increment(1);
            }
        };
        Some(match (local, &self.fallback) {
            (true, Some(fallback)) => {
                let fallback = fallback.clone();
                BodyGuard::new(move || {
                    count();
                    fallback.check_detached(checks)
                })
            }
            _ => {
                let store = self.store.clone();
                BodyGuard::new(move || {
                    count();
                    store.check_detached(checks)
                })
            }
        })
    }

    /// What gives back the units `decision` (a [`key_decision`](Self::key_decision) for
    /// `key`, as `RateLimitLayer::check` makes) booked for a wait, when dropped: for a call
    /// held in code, not by the engine's future. `None` when it booked nothing.
    pub(crate) fn booked_for(&self, key: &Key, decision: &Decision) -> Option<BodyGuard> {
        let key = match key.is_long() {
            true => key.clone().compact(),
            false => key.clone(),
        };
        let mut keys = Checks::new();
        for o in decision.outcomes().iter().filter(|o| o.booking().is_some()) {
            keys.push(Check::new(o.tier().clone(), key.clone(), 0, Op::Enforce));
        }
        self.giving_back(decision, Some(&keys), false, |o| o.booking(), None)
    }

    /// A request that went away while the store decided: when it asked for slots, what
    /// gives them back once the decision comes (`None` when it asked for none).
    pub(crate) fn abandoned(
        self: &Arc<Self>,
        ticket: &Ticket,
    ) -> Option<Box<dyn FnOnce(St::Future) + Send>> {
        if !ticket.gives_back_later {
            return None;
        }
        let (limiter, keys) = (self.clone(), ticket.keys.clone());
        Some(Box::new(move |decision: St::Future| {
            let store = limiter.store.clone();
            let give_back = move |decision: Decision| {
                // Dropped: the slots go back.
                drop(limiter.giving_back(&decision, keys.as_deref(), false, taken, None));
            };
            store.finish_detached(decision, Box::new(give_back));
        }))
    }
}
