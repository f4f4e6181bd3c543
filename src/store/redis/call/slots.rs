//! A decision across a cluster's hash slots: one script per key's slot, all at once, a denial
//! standing whatever else fails, and what was charged refunded when one denies.

use super::reply::{Reply, Said};
use crate::algorithm::Verdict;
use crate::error::StoreError;
use crate::store::Check;
use crate::store::redis::Inner;
use crate::store::redis::link::Link;
use crate::store::redis::script::record_follows;

impl Inner {
    /// Whether `checks` are decided across a cluster's hash slots (by one script each).
    pub(super) fn across_slots(&self, checks: &[Check]) -> bool {
        let link = self.linking.link();
        link.is_some_and(|l| l.conn.is_cluster()) && !one_hash_slot(checks)
    }

    /// On a cluster, policies keyed by different caller keys live in different slots, which
    /// no single script may touch. Each key's policies are decided by one script, the scripts
    /// of every key at once (one round trip, whatever the number of keys); when one denies the
    /// request, what the others charged is refunded (not when one failed and none denied: the
    /// failure policy's answer, let through or not, leaves what was charged charged). No request is ever admitted past a
    /// limit; a concurrent request may briefly see a charge that is then refunded, so the
    /// error is on the strict side. A denial stands whatever else failed: a script that
    /// failed or missed the deadline (`bounded`: each is cut at the store's deadline) makes
    /// the decision fail only when no other denied. The key's record of runtime list entries,
    /// when the call carries it, is read first, with the policies of its slot: a listed key
    /// is answered before anything is charged.
    pub(super) async fn across_hash_slots(
        &self,
        link: &Link,
        checks: &[Check],
        bounded: bool,
    ) -> Result<Said, StoreError> {
        let (mut groups, policies) = by_key(checks);
        let mut verdicts = vec![None; checks.len()];
        let run = |group: &[usize]| {
            let batch: Vec<Check> = group.iter().map(|&i| checks[i].clone()).collect();
            async move {
                let deciding = self.run(link, &batch);
                match bounded {
                    true => (tokio::time::timeout(self.deadline, deciding).await)
                        .unwrap_or_else(|_| Err(self.missed_deadline())),
                    false => deciding.await,
                }
            }
        };
        let mut said = Vec::with_capacity(groups.len());
        if record_follows(checks) {
            // The record's group alone first: a listed key is charged nothing anywhere.
            let first = groups.remove(0);
            match run(&first).await? {
                Said::Replies(result) => said.push((first, Ok(result))),
                listed => return Ok(listed),
            }
        }
        let results = futures_util::future::join_all(groups.iter().map(|g| run(g))).await;
        for (group, result) in groups.into_iter().zip(results) {
            said.push((group, result.and_then(replies)));
        }
        let (mut charged, mut denied, mut failed) = (Vec::new(), false, None);
        for (group, result) in said {
            let result = match result {
                Ok(result) => result,
                Err(error) => {
                    failed.get_or_insert(error);
                    continue;
                }
            };
            let admitted = (group.iter().zip(&result))
                .all(|(&i, (v, ..))| v.allowed || !checks[i].op().decides());
            denied |= !admitted;
            if admitted {
                // A script that denied charged nothing (all or none).
                charged.extend(undo_of(checks, &group, &result));
            }
            for (&i, v) in group.iter().zip(result) {
                verdicts[i] = Some(v);
            }
        }
        if denied {
            self.refund(link, &charged).await;
        }
        if let (false, Some(error)) = (denied, failed) {
            return Err(error);
        }
        Ok(Said::Replies(decided(verdicts, checks, policies, denied)))
    }

    /// Refunds the `charged` checks (of slots that admitted a request another denied), each
    /// within the deadline, all at once.
    async fn refund(&self, link: &Link, charged: &[Check]) {
        let refunds = (charged.iter()).map(|refund| {
            let refunding = self.run(link, std::slice::from_ref(refund));
            async {
                (tokio::time::timeout(self.deadline, refunding).await)
                    .unwrap_or_else(|_| Err(self.missed_deadline()))
            }
        });
        for refunded in futures_util::future::join_all(refunds).await {
            if let Err(error) = refunded {
                tracing::warn!(%error, "could not refund a charge on another cluster hash slot");
            }
        }
    }
}

/// Whether every check of `checks` is of one key (one hash slot on a cluster).
pub(super) fn one_hash_slot(checks: &[Check]) -> bool {
    checks.iter().all(|c| c.key() == checks[0].key())
}

/// The verdict of `check` whose script failed while another denied the request: charged
/// nothing, its state not read (its whole limit said to be left).
fn unknown(check: &Check) -> Verdict {
    Verdict {
        allowed: true,
        remaining: check.tier().algorithm().reported_limit(),
        reset_after_us: 0,
        retry_after_us: None,
    }
}

/// The replies of a script call that carried no key's record.
fn replies(said: Said) -> Result<Vec<Reply>, StoreError> {
    match said {
        Said::Replies(replies) => Ok(replies),
        Said::Listed(_) => Err(StoreError::new(
            "a list's answer to a call that read no list",
        )),
    }
}

/// The checks undoing what the script's `result` charged the checks of `group`.
fn undo_of<'a>(
    checks: &'a [Check],
    group: &'a [usize],
    result: &'a [Reply],
) -> impl Iterator<Item = Check> + 'a {
    group.iter().zip(result).filter_map(|(&i, (v, grant, _))| {
        let c = &checks[i];
        let undo = c
            .op()
            .undo(v.allowed, c.cost(), grant.as_ref().map(|g| g.end))?;
        let units = grant.as_ref().map_or(c.cost(), |g| g.units);
        Some(Check::new(c.tier().clone(), c.key().clone(), units, undo))
    })
}

/// The places of `checks` grouped by key (one hash slot each), in order, but that the group of
/// the key's record of list entries (the last check, if it is one) comes first; and how many
/// checks are policies'.
fn by_key(checks: &[Check]) -> (Vec<Vec<usize>>, usize) {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    for (i, c) in checks.iter().enumerate() {
        match groups.iter_mut().find(|g| checks[g[0]].key() == c.key()) {
            Some(g) => g.push(i),
            None => groups.push(vec![i]),
        }
    }
    let policies = checks.len() - usize::from(record_follows(checks));
    if let Some(with_record) = groups.iter().position(|g| g.contains(&policies)) {
        groups[..=with_record].rotate_right(1);
    }
    (groups, policies)
}

/// Each policy's reply of `checks` from the `verdicts` of their slots (`denied`: the request
/// was; its leases were given back); a check whose slot failed while another denied is charged
/// nothing and not known.
fn decided(
    verdicts: Vec<Option<Reply>>,
    checks: &[Check],
    policies: usize,
    denied: bool,
) -> Vec<Reply> {
    (verdicts.into_iter().zip(checks).take(policies))
        .map(|(v, check)| match v {
            Some((verdict, grant, own)) => (verdict, grant.filter(|_| !denied), own),
            None => (unknown(check), None, None),
        })
        .collect()
}
