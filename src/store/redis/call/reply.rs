//! The decision script's reply read back: each check's verdict, grant and own limit, or the
//! key's listing.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use crate::algorithm::Verdict;
use crate::decision::{Decision, Grant, Outcomes, PolicyOutcome};
use crate::error::StoreError;
use crate::policy::Tier;
use crate::quota::Quota;
use crate::store::redis::script::{
    ADMITTED, LISTED_ALLOW, LISTED_DENY, LISTED_WIDTH, OWN_WIDTH, at,
};
use crate::store::{Check, Listing, Op};

/// What the script says of one check: its verdict, the lease granted or the time booked
/// with it, if any, and the tier of the key's own limit, when it has one.
pub(super) type Reply = (Verdict, Option<Grant>, Option<Arc<Tier>>);

/// What one script call said: each policy's reply; or, when the call carried the key's record
/// of runtime list entries and the key is on a list, that (no policy decided).
pub(super) enum Said {
    Replies(Vec<Reply>),
    Listed(Listing),
}

/// The quota of a key's own limit, as the script tells it.
fn own_quota(entry: &[i64]) -> Option<Quota> {
    let get = |at: usize| entry.get(at).copied();
    let (limit, window, burst) = (
        get(at::OWN_LIMIT)?,
        get(at::OWN_WINDOW)?,
        get(at::OWN_BURST)?,
    );
    let limit = NonZeroU32::new(u32::try_from(limit).ok()?)?;
    let quota = match window {
        0 => Quota::per_month(limit),
        w => Quota::new(limit.get(), Duration::from_micros(u64::try_from(w).ok()?)).ok()?,
    };
    match burst {
        0 => Some(quota),
        b => quota.try_with_burst(u32::try_from(b).ok()?).ok(),
    }
}

/// The decision of `checks` from what the script said: of each policy, or of the key's list
/// entries.
pub(super) fn decision_of(checks: &[Check], said: Said) -> Decision {
    let verdicts = match said {
        Said::Replies(verdicts) => verdicts,
        Said::Listed(listing) => return Decision::listed(listing),
    };
    let outcomes: Outcomes = checks
        .iter()
        .zip(verdicts)
        .map(|(check, (verdict, grant, own))| {
            let tier = own.as_ref().unwrap_or(check.tier());
            PolicyOutcome::new(tier, check.op() == Op::Shadow, verdict).with_grant(grant)
        })
        .collect();
    Decision::new(outcomes)
}

/// The script's reply to `checks` read back (`record`: the last is the key's record of list
/// entries, which has no reply of its own): the key's listing when the record put it on a
/// list, else each check's verdict and grant, then the keys decided under their own limit
/// (`OWN_WIDTH` integers each).
pub(super) fn read_reply(
    checks: &[Check],
    reply: &[i64],
    record: bool,
) -> Result<Said, StoreError> {
    if record && reply.len() == LISTED_WIDTH {
        return match reply[0] {
            LISTED_DENY => Ok(Said::Listed(Listing::Denied {
                left_us: reply[1].max(0) as u64,
            })),
            LISTED_ALLOW => Ok(Said::Listed(Listing::Allowed)),
            other => Err(StoreError::new(format!(
                "unexpected list entry {other} from the decision script"
            ))),
        };
    }
    let policies = &checks[..checks.len() - usize::from(record)];
    read_reply_of(policies, reply).map(Said::Replies)
}

fn read_reply_of(checks: &[Check], reply: &[i64]) -> Result<Vec<Reply>, StoreError> {
    let expected: usize = checks.iter().map(|c| c.op().reply_width()).sum();
    if reply.len() < expected || !(reply.len() - expected).is_multiple_of(OWN_WIDTH) {
        return Err(StoreError::new(format!(
            "unexpected reply of {} integers from the decision script",
            reply.len()
        )));
    }
    let mut own: SmallVec<[Option<Arc<Tier>>; 2]> = smallvec::smallvec![None; checks.len()];
    for limit in reply[expected..].chunks(OWN_WIDTH) {
        // A block a policy that blocks on violation started: its place, negated, and level.
        if let Some(check) = (limit[at::OWN_PLACE].checked_neg())
            .and_then(|place| usize::try_from(place - 1).ok())
            .and_then(|i| checks.get(i))
        {
            let level = u32::try_from(limit[at::OWN_LIMIT]).unwrap_or(0);
            crate::telemetry::count_block(check.tier(), level);
            continue;
        }
        let check = usize::try_from(limit[at::OWN_PLACE] - 1)
            .ok()
            .and_then(|i| Some((i, checks.get(i)?)));
        if let (Some((i, check)), Some(quota)) = (check, own_quota(limit)) {
            own[i] = check.tier().relimited(quota).ok().map(Arc::new);
        }
    }
    let mut own = own.into_iter();
    let mut rest = &reply[..expected];
    Ok(checks
        .iter()
        .map(|c| {
            let (r, tail) = rest.split_at(c.op().reply_width());
            rest = tail;
            let verdict = Verdict {
                allowed: r[at::VERDICT] == ADMITTED,
                remaining: r[at::REMAINING].max(0) as u64,
                reset_after_us: r[at::RESET].max(0) as u64,
                retry_after_us: (r[at::VERDICT] >= 0).then_some(r[at::VERDICT] as u64),
            };
            let grant = c.op().grants().then(|| Grant {
                units: r[at::UNITS].max(0) as u64,
                end: r[at::END].max(0) as u64,
                lasts_us: r[at::LASTS].max(0) as u64,
            });
            (verdict, grant.filter(|g| g.units > 0), own.next().flatten())
        })
        .collect())
}
