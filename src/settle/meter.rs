//! What settles a policy's cost after the response: the check waiting for it ([`Pending`]),
//! and the [`Meter`] a response body carries to count the cost as it streams.

use std::sync::Arc;

use bytes::Bytes;
use http::Response;
use http_body::Frame;
use smallvec::SmallVec;

use super::{CostSource, Reading, Settle};
use crate::store::{Check, Checks};

impl Settle {
    /// `reading` as the units to settle `check` (charged its estimate up front) at: clamped to
    /// the bound, counted when it was not a clean number; `None` when the estimate stands.
    fn units(&self, check: &Check, reading: Reading) -> Option<u64> {
        let tier = check.tier();
        let bound = tier
            .algorithm()
            .reported_limit()
            .saturating_mul(u64::from(self.at_most));
        let (units, clamped) = match reading {
            Reading::Cost(units) if units > bound => (Some(bound), Some("too_large")),
            Reading::Cost(units) => (Some(units), None),
            Reading::Negative => (Some(0), Some("negative")),
            Reading::Invalid => (None, Some("not_a_number")),
            Reading::Missing => (None, Some("missing")),
        };
        if let Some(reason) = clamped {
            metrics::counter!(
                "ratelimit_costs_clamped_total",
                "policy" => tier.label(),
                "reason" => reason,
            )
            .increment(1);
        }
        units
    }
}

/// One policy's check to settle after a response: charged `estimate` up front
/// (`Op::Settle`'s payload, the check's units until the real ones replace them), and where
/// its real cost comes from.
pub(crate) struct Pending {
    check: Check,
    settle: Arc<Settle>,
}

impl Pending {
    pub(crate) fn new(check: Check, settle: Arc<Settle>) -> Self {
        Pending { check, settle }
    }

    /// Whether its cost is counted from the response body (else read from the head).
    pub(crate) fn reads_body(&self) -> bool {
        self.settle.reads_body()
    }

    /// The check that settles it from the response head, if the estimate does not stand.
    pub(crate) fn settled_by<B>(self, response: &Response<B>) -> Option<Check> {
        let reading = self
            .settle
            .read_head(response.headers(), response.extensions());
        let units = self.settle.units(&self.check, reading)?;
        Some(self.check.with_cost(units))
    }
}

/// Counts a response body's real cost for the policies that settle from it, and settles
/// them when it is dropped (the body ended, failed, or went away).
pub(crate) struct Meter {
    counting: SmallVec<[Counting; 1]>,
    /// Taken when dropped.
    send: Option<Box<dyn FnOnce(Checks) + Send + Sync>>,
}

/// One policy's count in a [`Meter`].
struct Counting {
    pending: Pending,
    reading: Reading,
}

impl Meter {
    /// A meter for `pending` (read from the body), whose checks `send` gives the store.
    pub(crate) fn new(
        pending: impl IntoIterator<Item = Pending>,
        send: Box<dyn FnOnce(Checks) + Send + Sync>,
    ) -> Self {
        let counting = pending
            .into_iter()
            .map(|pending| {
                // A trailer that never comes is missing; a count starts at 0.
                let reading = match pending.settle.source {
                    CostSource::Trailer(_) => Reading::Missing,
                    _ => Reading::Cost(0),
                };
                Counting { pending, reading }
            })
            .collect();
        Meter {
            counting,
            send: Some(send),
        }
    }

    /// Counts one frame of the body.
    pub(crate) fn observe(&mut self, frame: &Frame<Bytes>) {
        for c in &mut self.counting {
            let add = match &c.pending.settle.source {
                CostSource::BodyBytes => frame.data_ref().map_or(0, |d| d.len() as u64),
                CostSource::Body(count) => count(frame),
                CostSource::Trailer(Ok(name)) => {
                    if let Some(trailers) = frame.trailers_ref() {
                        c.reading = Reading::of(trailers.get(name));
                    }
                    0
                }
                CostSource::Trailer(Err(_)) | CostSource::Extension | CostSource::Header(_) => 0,
            };
            if let Reading::Cost(n) = &mut c.reading {
                *n = n.saturating_add(add);
            }
        }
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        let mut checks = Checks::new();
        for c in self.counting.drain(..) {
            let Counting { pending, reading } = c;
            if let Some(units) = pending.settle.units(&pending.check, reading) {
                checks.push(pending.check.with_cost(units));
            }
        }
        if let Some(send) = self.send.take().filter(|_| !checks.is_empty()) {
            send(checks);
        }
    }
}
