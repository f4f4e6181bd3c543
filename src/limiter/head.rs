//! What a layer that reads bodies decides on a request's head alone, before it reads the body
//! (the exemptions, the lists, the deny cache, a key already out of budget), and the charge of
//! a body it refused (too large, too slow, not JSON, a batch it bounds) to the head's keys.
//!
//! A look takes the policies whose key is in the head: a key read from the body is not known
//! before it. A refused body is charged to every policy that applies, a key read from the
//! body keyed [`UNREAD`](crate::key::UNREAD). A policy whose cost is in the body is looked
//! at, and charged, at its floor ([`Policy::min_body_cost`](crate::Policy::min_body_cost)): a
//! key out of budget for that is out of budget whatever the body says. With Redis both carry
//! the key's record of runtime list entries: a listed key is answered as the list says.

use tracing::Span;

use super::{Limiter, Next, Ticket};
use crate::decision::Decision;
use crate::error::{KeyRejection, StoreError, StoreErrorKind};
use crate::key::{Key, KeyExtractor, RequestRef};
use crate::lists::Judged;
use crate::refusal::Refusal;
use crate::request_body::{BodyLimits, Reader};
use crate::store::{Check, Checks, Op, Store};

use super::route::Route;

/// A look at a request's head keys in the store, made while its body is awaited.
pub(crate) struct Looking<F> {
    future: F,
    checks: Vec<Check>,
    /// Whether the look read the key's record of runtime list entries (after the checks).
    lists: bool,
}

impl<F: std::future::Future + Unpin> Looking<F> {
    /// The store's answer, once it came.
    pub(crate) fn poll(&mut self, cx: &mut std::task::Context<'_>) -> std::task::Poll<F::Output> {
        std::pin::Pin::new(&mut self.future).poll(cx)
    }
}

/// What a layer that reads bodies does with a request, from its head.
pub(crate) enum Head {
    /// Read its body within these limits, counted among its key's bodies being read while
    /// it is, then decide.
    Read(BodyLimits, Option<Reader>),
    /// Hand it on, its body unread: no policy that reads the body applies, it is exempt, or
    /// a list allows it.
    Stream,
    /// Refuse it at once: a list denies it, or a key of the head is out of budget.
    Refuse(Refusal),
}

/// A refused body's charge to the head's keys: its answer, or the store's decision to wait
/// for (then [`Limiter::charged`] with the ticket and the rejection).
pub(crate) enum Charged<F> {
    Answer(Refusal),
    Deciding(F, Ticket, KeyRejection),
}

impl<St: Store> Limiter<St> {
    /// What to do with `request` before its body is read.
    pub(crate) fn before_body(&self, request: &RequestRef<'_>) -> Head {
        let Some(wanted) = self.reading(request) else {
            return Head::Stream;
        };
        if self.exempt.as_ref().is_some_and(|f| f(request)) {
            return Head::Stream;
        }
        match self.listed_on_head::<()>(request) {
            Some(Next::Refuse(refusal)) => return Head::Refuse(refusal),
            Some(Next::Call(_)) => return Head::Stream,
            _ => {}
        }
        let route = self.policies.load();
        if let Some(refusal) = self.out_of_budget(request, &route) {
            return Head::Refuse(refusal);
        }
        let Some(readers) = &self.readers else {
            return Head::Read(wanted, None);
        };
        match readers.enter(self.reader_key(request)) {
            Some(reader) => Head::Read(wanted, Some(reader)),
            None => Head::Refuse(self.body_rejected(KeyRejection::new(
                http::StatusCode::TOO_MANY_REQUESTS,
                "bodies_in_flight",
                format!(
                    "{} bodies of this client are being read; send the next when one is done",
                    wanted.get_reading_per_key()
                ),
            ))),
        }
    }

    /// The key `request`'s body is counted under among the bodies being read: the layer's
    /// key, else (a key of the body, which has none yet, or a key the head lacks) the peer's
    /// address, so that a client cannot share, or step out of, its count.
    fn reader_key(&self, request: &RequestRef<'_>) -> Key {
        let layer = (!self.key.reads_body()).then(|| self.key.extract(request).ok());
        layer
            .flatten()
            .or_else(|| crate::key::PeerIp::new().extract(request).ok())
            .unwrap_or_else(Key::global)
    }

    /// The checks of `request`'s head: of each policy that applies, at its cost from the head
    /// (a cost read from the body at its floor), as `op`. A look (`charge` false) takes the
    /// policies keyed by their head that decide at once; a refused body's charge takes those
    /// keyed by the body too, their body parts [`UNREAD`](crate::key::UNREAD), and those that
    /// wait (charged, not waited for). Policies that hold units (concurrency), adaptive ones
    /// and shadows take no part.
    fn head_checks(&self, request: &RequestRef<'_>, route: &Route, op: Op, charge: bool) -> Checks {
        let mut checks = Checks::new();
        let unread = request.unread();
        for policy in route.iter() {
            let skipped = !charge && policy.keyed_by_body();
            if skipped || !policy.applies(request) || policy.adaptive().is_some() {
                continue;
            }
            let Ok(key) = policy.key(&unread) else {
                continue;
            };
            // A key of the body alone would be one for every client: not charged.
            if key == Key::from(crate::key::UNREAD) {
                continue;
            }
            let cost = policy.head_cost(request);
            let tier = policy
                .tier(policy.tier_index(&unread, &key))
                .seen_by(request);
            let takes_part = match tier.part().op() {
                Op::Enforce | Op::ChargeIf | Op::Reserve { .. } | Op::Lease { .. } => true,
                Op::Wait { .. } => charge,
                _ => false,
            };
            if cost > 0 && takes_part {
                checks.push(Check::new(tier.clone(), key, cost, op));
            }
        }
        checks
    }

    /// The denial of `request` on its head, when a key of it is out of budget as far as this
    /// instance knows without a store call: the deny cache, or the memory store's look.
    fn out_of_budget(&self, request: &RequestRef<'_>, route: &Route) -> Option<Refusal> {
        let checks = self.head_checks(request, route, Op::Enforce, false);
        if checks.is_empty() {
            return None;
        }
        if let Some(Next::Refuse(refusal)) =
            self.known_denied(&checks, &Span::none(), route.steps())
        {
            return Some(refusal);
        }
        if !St::DECIDES_ALONE {
            return None;
        }
        let looks: Checks = checks.iter().map(|c| c.with_op(Op::ChargeIf)).collect();
        let decision = self.store.check_now(&looks).filter(|d| !d.is_allowed())?;
        self.denial(decision, Some(&checks), route.steps())
    }

    /// The store's look at `request`'s head keys, for a body that is slow to come, when the
    /// store does not decide at once (in memory [`before_body`](Self::before_body) looked):
    /// one store call, made while the body is awaited, to answer `429` without it.
    pub(crate) fn look_while_reading(
        &self,
        request: &RequestRef<'_>,
    ) -> Option<Box<Looking<St::Future>>> {
        if St::DECIDES_ALONE {
            return None;
        }
        let route = self.policies.load();
        let checks = self.head_checks(request, &route, Op::Enforce, false);
        let mut looks: Checks = checks.iter().map(|c| c.with_op(Op::ChargeIf)).collect();
        let key = match self.judged_on_head(request) {
            Judged::Neither(key) => key,
            _ => None,
        };
        let lists = self.push_list_check(key, &mut looks);
        if looks.is_empty() {
            return None;
        }
        let future = self.store.check(looks);
        Some(Box::new(Looking {
            future,
            checks: checks.into_vec(),
            lists,
        }))
    }

    /// The answer of a look while the body was awaited: `403` when the key is on the deny
    /// list, `429` when a key is out of budget (remembered by the deny cache), else none (the
    /// body is awaited as before; a key on the allow list, or a failed store, changes nothing).
    pub(crate) fn looked<F>(
        &self,
        looking: &Looking<F>,
        result: Result<Decision, StoreError>,
    ) -> Option<Refusal> {
        let decision = result.ok()?;
        if looking.lists {
            match self.unlisted::<()>(&decision, &mut None) {
                Some(Next::Refuse(refusal)) => return Some(refusal),
                Some(_) if decision.listing() != crate::store::Listing::Neither => return None,
                _ => {}
            }
        }
        let checks = &looking.checks;
        let decision = Some(decision).filter(|d| !d.is_allowed())?;
        if let Some(cache) = &self.deny_cache {
            cache.remember(checks, &decision, self.clock.now_micros());
        }
        self.denial(decision, Some(checks), self.policies.load().steps())
    }

    /// The answer to `request`, whose body was refused (`rejection`): when the layer charges
    /// refused bodies, charged to the keys of its head, and `429` when one is out of budget.
    pub(crate) fn rejected(
        &self,
        request: &RequestRef<'_>,
        rejection: KeyRejection,
    ) -> Charged<St::Future> {
        let charges = self.bodies.is_some_and(|b| b.get_charge_rejected());
        let route = self.policies.load();
        if !charges {
            return Charged::Answer(self.body_rejected(rejection));
        }
        let key = match self.judged_on_head(request) {
            Judged::Denied(why) => match self.denied::<()>(why) {
                Next::Refuse(refusal) => return Charged::Answer(refusal),
                _ => None,
            },
            Judged::Allowed => return Charged::Answer(self.body_rejected(rejection)),
            Judged::Neither(key) => key,
        };
        let mut checks = self.head_checks(request, &route, Op::Enforce, true);
        let mut keys = checks.to_vec();
        let lists = self.push_list_check(key, &mut checks);
        if checks.is_empty() {
            return Charged::Answer(self.body_rejected(rejection));
        }
        let mut ticket = Ticket::planned(None, Vec::new(), Span::none(), route.steps());
        if lists {
            // `unlisted` takes the record's check out of the kept checks.
            keys.push(checks.last().expect("pushed above").clone());
        }
        ticket.keys = Some(keys);
        ticket.lists = lists;
        if let Some(breaker) = &self.breaker {
            ticket.gate = breaker.gate(|| self.clock.now_micros());
        }
        if ticket.gate == crate::resilience::Gate::Reject {
            return Charged::Answer(self.body_rejected(rejection));
        }
        if let Some(decision) = self.store.check_now(&checks) {
            return Charged::Answer(self.charged(ticket, Ok(decision), rejection));
        }
        Charged::Deciding(self.store.check(checks), ticket, rejection)
    }

    /// The answer to a refused body once its charge is decided: `429` when a key was out of
    /// budget (remembered by the deny cache), else the refusal; a failed store changes nothing
    /// (the refusal stands, the failure policy is not asked).
    pub(crate) fn charged(
        &self,
        ticket: Ticket,
        result: Result<Decision, StoreError>,
        rejection: KeyRejection,
    ) -> Refusal {
        let mut ticket = ticket;
        let denied = match result {
            Ok(decision) => {
                if let Some(breaker) = &self.breaker {
                    breaker.success(ticket.gate);
                }
                if ticket.lists {
                    match self.unlisted::<()>(&decision, &mut ticket.keys) {
                        Some(Next::Refuse(refusal)) => return refusal,
                        Some(_) if decision.listing() != crate::store::Listing::Neither => {
                            return self.body_rejected(rejection);
                        }
                        _ => {}
                    }
                }
                (!decision.is_allowed()).then_some(decision)
            }
            Err(error) => {
                if let (Some(breaker), true) =
                    (&self.breaker, error.kind() != StoreErrorKind::CircuitOpen)
                {
                    breaker.failure(ticket.gate, self.clock.now_micros());
                }
                None
            }
        };
        let Some(decision) = denied else {
            return self.body_rejected(rejection);
        };
        let (keys, now) = (ticket.keys.as_deref(), self.clock.now_micros());
        if let (Some(cache), Some(keys)) = (&self.deny_cache, keys) {
            cache.remember(keys, &decision, now);
        }
        // The refusal is counted as every refused body is, and answered `429`.
        let refused = self.body_rejected(rejection);
        self.denial(decision, keys, ticket.steps).unwrap_or(refused)
    }

    /// The limiter's response to `decision`, a denial of a request's head keys (`keys`),
    /// counted as every denial is (`finish`, with no charge after it).
    fn denial(
        &self,
        decision: Decision,
        keys: Option<&[Check]>,
        steps: super::route::Steps,
    ) -> Option<Refusal> {
        let next: Next<()> = self.finish(decision, Vec::new(), keys, false, &Span::none(), steps);
        match next {
            Next::Refuse(refusal) => Some(refusal),
            _ => None,
        }
    }

    /// The answer to `request`, whose body gives a policy no key or cost (a batch of too many
    /// keys, a cost that is not a number): the refusal, charged as a refused body is.
    #[inline(never)]
    pub(super) fn body_key_rejected(
        &self,
        request: &RequestRef<'_>,
        rejection: KeyRejection,
    ) -> Next<St::Future> {
        tracing::debug!(
            code = rejection.code(),
            "rate-limit key rejected by the body"
        );
        match self.rejected(request, rejection) {
            Charged::Answer(refusal) => Next::Refuse(refusal),
            Charged::Deciding(future, mut ticket, rejection) => {
                ticket.rejected = Some(Box::new(rejection));
                Next::Store(future, ticket)
            }
        }
    }
}
