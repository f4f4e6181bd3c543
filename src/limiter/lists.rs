//! A step before the decision: the allow and deny lists (`lists.rs`), before any policy.
//!
//! A network or key given to the layer answers here, without a store call. An entry added at
//! runtime is kept in the store as a block of the key in one of two tiers registered under
//! names no policy may take (`!deny`, `!allow`), looked at by a check of each
//! (`Op::ChargeIf` at cost 0, which decides without being charged). With Redis, `plan` adds
//! the two after the policies' checks: a listed key makes the store charge nothing, in the
//! same atomic step, and every instance sharing the store sees an entry from its next
//! request; `unlisted` takes their outcomes out of the decision. In memory, `begin` asks
//! before the lane (`listed_at_once`), and looks at the entries only once one was ever added
//! to the store (`Registry::listed`): a layer with lists keeps its lane.

use std::future::Future;
use std::time::SystemTime;

use super::admin::Answer;
use super::{Limiter, Next};
use crate::decision::{Decision, PolicyOutcome};
use crate::error::{ConfigError, LimitError};
use crate::key::{Cidr, Key, RequestRef};
use crate::lists::{Judged, Lists, Why};
use crate::store::{Check, Checks, Listed, Op, Store, Stored};

/// The checks a request's store call carries after its policies' for the lists' entries.
pub(super) const LIST_CHECKS: usize = 2;

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
        if present.in_store() {
            self.store.read_networks();
        }
        let networks = self.store.registry().networks();
        match present.judge(request, true, networks, &|| self.clock.now_micros()) {
            Judged::Denied(why) => Err(self.denied(why)),
            Judged::Allowed => Err(Self::allowed("layer")),
            Judged::Neither(key) => Ok(key),
        }
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
            Judged::Neither(key) => {
                let mut checks = Checks::new();
                self.push_list_checks(key, &mut checks);
                let decision = self.store.check_now(&checks)?;
                self.entries_say(decision.outcomes())
            }
        }
    }

    /// Adds the looks at `key`'s runtime entries, if it has some to read, after a request's
    /// policies' checks; whether it did.
    pub(super) fn push_list_checks(&self, key: Option<Key>, checks: &mut Checks) -> bool {
        let (Some(lists), Some(key)) = (&self.lists, key) else {
            return false;
        };
        checks.push(Check::new(
            lists.deny().clone(),
            key.clone(),
            0,
            Op::ChargeIf,
        ));
        checks.push(Check::new(lists.allow().clone(), key, 0, Op::ChargeIf));
        true
    }

    /// The store's answer to a request whose call carried its key's entries last: their
    /// outcomes taken out (and the kept checks' too), and the answer when one is on a list.
    pub(super) fn unlisted<F>(
        &self,
        decision: &mut Decision,
        keys: &mut Option<Vec<Check>>,
    ) -> Option<Next<F>> {
        let entries = decision.take_last(LIST_CHECKS);
        if let Some(keys) = keys {
            // A deny entry seen is remembered, to answer while the store fails.
            if let (Some(remembered), [deny, _]) = (&self.remembered, &entries[..])
                && !deny.is_allowed()
                && let Some(check) = keys.len().checked_sub(LIST_CHECKS).map(|i| &keys[i])
            {
                let now = self.clock.now_micros();
                let ends = deny.retry_after().map_or(0, |r| r.as_micros() as u64);
                remembered.listed(check.key().clone(), now.saturating_add(ends), now);
            }
            keys.truncate(decision.outcomes().len());
        }
        match self.entries_say(&entries) {
            None if decision.outcomes().is_empty() => Some(Next::nothing()),
            said => said,
        }
    }

    /// The answer the outcomes of a key's two runtime entries give (deny, then allow: an entry
    /// is a block, so a denial), if one is there.
    fn entries_say<F>(&self, entries: &[PolicyOutcome]) -> Option<Next<F>> {
        match entries {
            [deny, _] if !deny.is_allowed() => Some(self.denied(Why::Entry)),
            [_, allow] if !allow.is_allowed() => Some(Self::allowed("store")),
            _ => None,
        }
    }

    /// The answer to a request on the deny list.
    pub(super) fn denied<F>(&self, why: Why) -> Next<F> {
        metrics::counter!("ratelimit_listed_total", "list" => "deny", "by" => why.label())
            .increment(1);
        tracing::debug!(by = why.label(), "request denied by the deny list");
        Next::Respond(self.responses.denied(why.detail()))
    }

    /// A request on the allow list, found by `by`: let through, with nothing added.
    fn allowed<F>(by: &'static str) -> Next<F> {
        metrics::counter!("ratelimit_listed_total", "list" => "allow", "by" => by).increment(1);
        Next::nothing()
    }

    /// Puts `key` on the deny list (`deny`) or the allow list until `until` (`None`: until it
    /// is removed), kept in the store; or takes it off (`until` in the past, or `remove`).
    pub(crate) fn list_key(
        &self,
        deny: bool,
        key: &Key,
        until: Option<SystemTime>,
        remove: bool,
    ) -> Result<Answer<St::Future>, LimitError> {
        let lists = self
            .lists
            .as_ref()
            .filter(|l| l.present().in_store())
            .ok_or(LimitError::NoLists)?;
        let tier = if deny { lists.deny() } else { lists.allow() };
        let keys = (lists.present().entry_keys(key)).map_err(LimitError::Entry)?;
        self.store.registry().mark_listed();
        // An end already past is an error, never a removal.
        let op = match (remove, until) {
            (true, _) => Op::Reset,
            (false, None) => Op::Block {
                us: LISTED_FOR_GOOD_US,
            },
            (false, Some(until)) => {
                let (until, now) = self.until_us(until)?;
                Op::Block {
                    us: (until - now).min(LISTED_FOR_GOOD_US),
                }
            }
        };
        let mut checks = Checks::new();
        for key in keys {
            if !deny && !remove {
                self.forget_denials(&key);
            }
            // This instance holds its own word through an outage of the store.
            if deny && let Some(remembered) = &self.remembered {
                match op {
                    Op::Block { us } => {
                        let now = self.clock.now_micros();
                        remembered.listed(key.clone(), now.saturating_add(us), now);
                    }
                    _ => remembered.unlisted(&key),
                }
            }
            checks.push(Check::new(tier.clone(), key, 0, op));
        }
        Ok(self.store_decision(checks))
    }

    /// Puts `network` on the deny list (`deny`) or the allow list until `until` (`None`:
    /// until it is removed), or takes it off (`remove`): in the registry's networks at once
    /// in memory; with Redis in the string every instance reads, and this instance's then.
    pub(crate) fn list_network(
        &self,
        deny: bool,
        network: Cidr,
        until: Option<SystemTime>,
        remove: bool,
    ) -> Result<impl Future<Output = Result<(), LimitError>> + use<St>, LimitError> {
        self.lists
            .as_ref()
            .filter(|l| l.present().in_store())
            .ok_or(LimitError::NoLists)?;
        let now = self.clock.now_micros();
        let until_us = match (remove, until) {
            (true, _) => now,
            (false, None) => now.saturating_add(LISTED_FOR_GOOD_US),
            (false, Some(until)) => self.until_us(until)?.0,
        };
        let entry = Listed::new(network, deny, until_us);
        let stored = self.store.store_network(entry, remove, now);
        let store = self.store.clone();
        Ok(async move {
            let networks = store.registry().networks();
            match stored.await.map_err(LimitError::Store)? {
                Stored::Here => networks
                    .change(entry, remove, now)
                    .map_err(LimitError::Network)?,
                Stored::Text(text) => networks.replace(&text),
                Stored::Full => return Err(LimitError::Network(crate::store::full_networks())),
            }
            Ok(())
        })
    }

    /// Replaces the lists given to the layer (its runtime entries stay).
    pub(crate) fn reload_lists(&self, lists: &Lists) -> Result<(), ConfigError> {
        let Some(present) = &self.lists else {
            return Err(ConfigError::new(
                "the layer was built without lists; build it with .lists(Lists::new()) to reload them",
            ));
        };
        let compiled = lists.compile(&self.key)?;
        crate::lists::leases_with_lists::<St>(self.leases().is_some(), compiled.in_store())?;
        present.replace(compiled);
        Ok(())
    }
}

/// How long an entry without an end lasts: a hundred years.
const LISTED_FOR_GOOD_US: u64 = 100 * 365 * 86_400 * 1_000_000;
