//! A key's own limit (`RateLimitControl::set_limit`): set on its row, and the conversion of
//! its state between the policy's definition and the key's limit.

use std::sync::Arc;

use super::{Cell, CheckRef, Limit, Marks, Row, Shard, Unpacked};
use crate::algorithm::Compiled;
use crate::policy::Tier;
use crate::store::Registry;

impl Shard {
    /// Puts the key under a limit of its own, `check`'s tier's algorithm (the policy's with
    /// the key's quota), until `until`: its state, written under the policy's present
    /// definition or under a limit of its own set before, converted.
    pub(super) fn limit(
        &mut self,
        check: &CheckRef<'_>,
        hash: u64,
        now: u64,
        until: u64,
        capacity: usize,
        registry: &Registry,
    ) {
        registry.own_limit_set();
        // No end given: the longest window's time from now.
        let until = match until {
            0 => now + crate::MAX_WINDOW.as_micros() as u64,
            until => until,
        };
        let tier = check.tier();
        let limit = Arc::new(Limit {
            tier: tier.clone(),
            until,
        });
        match self.find_mut(check, hash) {
            Some(row) => {
                let from = match row.limit() {
                    Some(before) => before.tier.algorithm().clone(),
                    None => registry.definition(row.def),
                };
                row.put_under(tier, &from, Some(limit), now);
            }
            None => {
                let entry = Unpacked {
                    state: None,
                    expires_at: until,
                    marks: Some(Box::new(Marks {
                        blocked_until: 0,
                        strikes: Default::default(),
                        limit: Some(limit),
                    })),
                };
                self.insert_row(Row::new(check, entry), hash, now, capacity);
            }
        }
    }
}

impl Row {
    /// Puts the state, written under `from`, under `tier`'s algorithm, or under the key's own
    /// `limit` (which then ends when it says): converted as a reload converts it.
    pub(super) fn put_under(
        &mut self,
        tier: &Tier,
        from: &Compiled,
        limit: Option<Arc<Limit>>,
        now: u64,
    ) {
        let mut entry = self.read(from, Unpacked::copy);
        let to = limit
            .as_deref()
            .map_or(tier.algorithm(), |l| l.tier.algorithm());
        let expires_at = to.convert(from, &mut entry.state, now, entry.expires_at);
        let until = limit.as_ref().map_or(0, |l| l.until);
        entry.expires_at = expires_at.max(entry.blocked_until()).max(until);
        match (limit, &mut entry.marks) {
            (limit @ Some(_), _) => entry.marks_mut().limit = limit,
            (None, Some(marks)) => marks.limit = None,
            (None, None) => {}
        }
        if entry.marks.as_ref().is_some_and(|m| m.is_empty()) {
            entry.marks = None;
        }
        self.def = tier.def();
        self.cell = Cell::new(tier.algorithm(), entry);
    }
}
