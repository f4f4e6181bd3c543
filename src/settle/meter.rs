//! What settles a policy's cost after the response: its check's real units, read from the
//! head ([`Settle::settled_by`]) or counted by the [`Meter`] a response body carries as it
//! streams.

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

impl Settle {
    /// `check` (charged its estimate up front: `Op::Settle`'s payload, the check's units
    /// until the real ones replace them) at the units the response head says, if the
    /// estimate does not stand.
    pub(crate) fn settled_by<B>(&self, check: Check, response: &Response<B>) -> Option<Check> {
        let reading = self.read_head(response.headers(), response.extensions());
        let units = self.units(&check, reading)?;
        Some(check.with_cost(units))
    }
}

/// Counts a response body's real cost for the policies that settle from it, and settles
/// them when it is dropped (the body ended, failed, or went away).
pub(crate) struct Meter {
    counting: SmallVec<[Counting; 1]>,
    /// Taken when dropped.
    send: Option<Box<dyn FnOnce(Checks) + Send + Sync>>,
}

/// One policy's count in a [`Meter`]: its check, where its real cost comes from, and the
/// count so far.
struct Counting {
    check: Check,
    settle: Arc<Settle>,
    reading: Reading,
    /// What is read of the body for a cost at a JSON pointer.
    #[cfg(feature = "json")]
    json: Option<Box<super::json::JsonCost>>,
}

impl Meter {
    /// A meter for the checks to settle from the body (each with its settle; `events`: the
    /// body is a stream of server-sent events), whose checks `send` gives the store.
    pub(crate) fn new(
        pending: impl IntoIterator<Item = (Check, Arc<Settle>)>,
        events: bool,
        send: Box<dyn FnOnce(Checks) + Send + Sync>,
    ) -> Self {
        #[cfg(not(feature = "json"))]
        let _ = events;
        let counting = pending
            .into_iter()
            .map(|(check, settle)| {
                // A trailer that never comes is missing; a count starts at 0.
                let reading = match settle.source {
                    CostSource::Trailer(_) => Reading::Missing,
                    #[cfg(feature = "json")]
                    CostSource::Json(_) => Reading::Missing,
                    _ => Reading::Cost(0),
                };
                #[cfg(feature = "json")]
                let json = match &settle.source {
                    CostSource::Json(Ok(pointer)) => Some(Box::new(super::json::JsonCost::new(
                        pointer.clone(),
                        events,
                    ))),
                    _ => None,
                };
                Counting {
                    check,
                    settle,
                    reading,
                    #[cfg(feature = "json")]
                    json,
                }
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
            let add = match &c.settle.source {
                CostSource::BodyBytes => frame.data_ref().map_or(0, |d| d.len() as u64),
                CostSource::Body(count) => count(frame),
                CostSource::Trailer(Ok(name)) => {
                    if let Some(trailers) = frame.trailers_ref() {
                        c.reading = Reading::of(trailers.get(name));
                    }
                    0
                }
                #[cfg(feature = "json")]
                CostSource::Json(_) => {
                    if let (Some(json), Some(data)) = (&mut c.json, frame.data_ref()) {
                        json.observe(data);
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
            #[cfg(feature = "json")]
            let reading = c.json.map_or(c.reading, |json| json.finish());
            #[cfg(not(feature = "json"))]
            let reading = c.reading;
            if let Some(units) = c.settle.units(&c.check, reading) {
                checks.push(c.check.with_cost(units));
            }
        }
        if let Some(send) = self.send.take().filter(|_| !checks.is_empty()) {
            send(checks);
        }
    }
}
