//! A step before the decision: the allow and deny lists (`lists.rs`), before any policy.
//!
//! A network or key given to the layer answers here, without a store call. A key listed at
//! runtime has one record in the store holding the end of each of its entries (deny and
//! allow: `store/entries.rs`), written by `Sealed::keep_entry`. With Redis, `plan` adds a
//! check of the records' tier after the policies': the script reads the key's record before
//! any policy, and a listed key is answered (a typed `Listing` in the decision) with nothing
//! charged, in the same atomic step, by every instance from its next request; `unlisted`
//! reads it. In memory, `begin` asks before the lane (`listed_at_once`), and reads the
//! registry's records only once an entry was ever added (`Registry::listed`): a layer with
//! lists keeps its lane.

use super::route::Pending;
use super::{Limiter, Next};
use crate::decision::Decision;
use crate::key::{Key, RequestRef};
use crate::lists::{Judged, Why};
use crate::store::{Check, Checks, Listing, Op, Store};

impl<St: Store> Limiter<St> {
    /// What the lists say of `request` on a store that does not decide at once (in memory
    /// they answered in `begin`): `Err` with its answer when they decide it (denied, or
    /// allowed: not limited), else the key whose runtime entries its store call reads.
    // Inlined into `plan`, which returns the answer at once: nothing large is moved.
    #[allow(clippy::result_large_err)]
    #[inline]
    pub(super) fn listed<F>(&self, request: &RequestRef<'_>) -> Result<Option<Key>, Next<F>> {
        let Some(lists) = self.lists.as_ref().filter(|_| !St::DECIDES_ALONE) else {
            return Ok(None);
        };
        let present = lists.present();
        // Never decided on networks older than the store's interval: wait for a fresh read.
        if present.in_store()
            && let Some(reading) = self.store.read_networks(self.clock.now_micros())
        {
            return Err(Next::Pending(Pending::new(async move {
                reading.await;
                Ok(None)
            })));
        }
        let networks = self.store.registry().networks();
        match present.judge(request, true, networks, &|| self.clock.now_micros()) {
            Judged::Denied(why) => Err(self.denied(why)),
            Judged::Allowed => Err(Self::allowed("layer")),
            Judged::Neither(key) => Ok(key),
        }
    }

    /// What the lists say of `request` before its body is read, without waiting: the answer
    /// when they decide it. Networks listed at runtime count only while fresh; older, they
    /// are read again on a task of their own, for the decision after the body, and only a
    /// denial of what the layer was given answers here.
    pub(super) fn listed_on_head<F>(&self, request: &RequestRef<'_>) -> Option<Next<F>> {
        if St::DECIDES_ALONE {
            return self.listed_at_once(request);
        }
        let present = self.lists.as_ref()?.present();
        let now = || self.clock.now_micros();
        let reading = present
            .in_store()
            .then(|| self.store.read_networks(now()))
            .flatten();
        let stale = reading.is_some();
        if let (Some(reading), Ok(runtime)) = (reading, tokio::runtime::Handle::try_current()) {
            drop(runtime.spawn(reading));
        }
        let none = crate::store::Networks::default();
        let networks = match stale {
            true => &none,
            false => self.store.registry().networks(),
        };
        match present.judge(request, false, networks, &now) {
            Judged::Denied(why) => Some(self.denied(why)),
            Judged::Allowed if !stale => Some(Self::allowed("layer")),
            _ => None,
        }
    }

    /// What the lists say of `request`'s head on a store that does not decide at once (in
    /// memory `before_body` asked them), with the networks read last: for a look or a
    /// refused body's charge, which carry the key's record of runtime entries (`Neither`'s
    /// key) to answer a listed key as the list says.
    pub(super) fn judged_on_head(&self, request: &RequestRef<'_>) -> Judged {
        let Some(lists) = self.lists.as_ref().filter(|_| !St::DECIDES_ALONE) else {
            return Judged::Neither(None);
        };
        let networks = self.store.registry().networks();
        (lists.present()).judge(request, true, networks, &|| self.clock.now_micros())
    }

    /// What the lists say of `request`, on a store that decides at once (in memory, before
    /// the lane: the lists take no `Check` lane of their own): the answer when they decide
    /// it. The key's runtime entries are looked at in a decision of their own, and only once
    /// an entry was ever added to the store.
    #[inline]
    pub(super) fn listed_at_once<F>(&self, request: &RequestRef<'_>) -> Option<Next<F>> {
        let lists = self.lists.as_ref()?;
        let registry = self.store.registry();
        let now = || self.clock.now_micros();
        match (lists.present()).judge(request, registry.listed(), registry.networks(), &now) {
            Judged::Denied(why) => Some(self.denied(why)),
            Judged::Allowed => Some(Self::allowed("layer")),
            Judged::Neither(None) => None,
            Judged::Neither(Some(key)) => {
                let listing = registry.entries().listing(&key, now());
                self.listing_says(listing)
            }
        }
    }

    /// Adds the look at `key`'s record of runtime entries, if it has one to read, after a
    /// request's policies' checks; whether it did.
    pub(super) fn push_list_check(&self, key: Option<Key>, checks: &mut Checks) -> bool {
        let (Some(lists), Some(key)) = (&self.lists, key) else {
            return false;
        };
        checks.push(Check::new(lists.records().clone(), key, 0, Op::ChargeIf));
        true
    }

    /// The store's answer to a request whose call carried its key's record last: the answer
    /// when the key is on a list, else none (the record's check taken out of the kept
    /// checks, as the decision has no outcome of it).
    pub(super) fn unlisted<F>(
        &self,
        decision: &Decision,
        keys: &mut Option<Vec<Check>>,
    ) -> Option<Next<F>> {
        let listing = decision.listing();
        if let Some(keys) = keys {
            // A deny entry seen is remembered, to answer while the store fails.
            if let (Some(remembered), Listing::Denied { left_us }, Some(check)) =
                (&self.remembered, listing, keys.last())
            {
                let now = self.clock.now_micros();
                remembered.listed(check.key().clone(), now.saturating_add(left_us), now);
            }
            keys.pop();
        }
        match self.listing_says(listing) {
            None if decision.outcomes().is_empty() => Some(Next::nothing()),
            said => said,
        }
    }

    /// The answer a key's runtime entries give, if it is on a list.
    fn listing_says<F>(&self, listing: Listing) -> Option<Next<F>> {
        match listing {
            Listing::Denied { .. } => Some(self.denied(Why::Entry)),
            Listing::Allowed => Some(Self::allowed("store")),
            Listing::Neither => None,
        }
    }

    /// The answer to a request on the deny list.
    pub(super) fn denied<F>(&self, why: Why) -> Next<F> {
        metrics::counter!("ratelimit_listed_total", "list" => "deny", "by" => why.label())
            .increment(1);
        tracing::debug!(by = why.label(), "request denied by the deny list");
        Next::Refuse(crate::refusal::Refusal::Denied(why))
    }

    /// A request on the allow list, found by `by`: let through, with nothing added.
    fn allowed<F>(by: &'static str) -> Next<F> {
        metrics::counter!("ratelimit_listed_total", "list" => "allow", "by" => by).increment(1);
        Next::nothing()
    }

    /// The layer's time, in microseconds (what a connection's messages refused locally are
    /// timed on, `streams/decide.rs`).
    pub(crate) fn now_micros(&self) -> u64 {
        self.clock.now_micros()
    }

    /// What names the present policy set, changed by a reload (a connection's refusals kept
    /// locally are forgotten then).
    pub(crate) fn policies_id(&self) -> usize {
        std::ptr::from_ref::<super::route::Route>(&self.policies.load()) as usize
    }
}
