//! What settles a policy's cost after the response: its check's real units, read from the
//! head ([`Settle::settled_by`]) or counted by the [`Meter`] a response body carries as it
//! streams.

use std::sync::Arc;

use bytes::Bytes;
use http_body::Frame;
use smallvec::SmallVec;

use super::{CostSource, Reading, Settle};
use crate::store::{Check, Checks};

impl Settle {
    /// `reading` as the units to settle `check` (charged its estimate up front) at: clamped to
    /// the bound, counted when it was not a clean number; `None` when the estimate stands.
    fn units(&self, check: &Check, reading: Reading) -> Option<u64> {
        let tier = check.tier();
        let limit = tier.algorithm().reported_limit();
        let mut bound = limit.saturating_mul(u64::from(self.at_most));
        if let Some(pause) = self.owing_at_most_us {
            // The units the policy's rate pays back in `pause`, past the estimate charged.
            let window = u128::from(tier.window_us().max(1));
            let owed = u128::from(limit) * u128::from(pause) / window;
            let owed = u64::try_from(owed).unwrap_or(u64::MAX);
            bound = bound.min(check.cost().saturating_add(owed));
        }
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
    pub(crate) fn settled_by(
        &self,
        check: Check,
        headers: &http::HeaderMap,
        extensions: &http::Extensions,
    ) -> Option<Check> {
        let reading = self.read_head(headers, extensions);
        let units = self.units(&check, reading)?;
        Some(check.with_cost(units))
    }
}

/// Counts a response body's real cost for the policies that settle from it, and settles
/// them when it is dropped (the body ended, failed, or went away).
///
/// The body's JSON is read once for every check that settles from it: the checks of a
/// batch (one a key) at one pointer share one reader, so what is kept and parsed is one
/// response's, however many keys settle from it.
pub(crate) struct Meter {
    counting: SmallVec<[Counting; 1]>,
    /// What is read of the body, one reader a distinct pointer (the body is read as JSON or
    /// as events for every check alike).
    #[cfg(feature = "json")]
    readers: SmallVec<[Box<super::json::JsonCost>; 1]>,
    /// Taken when dropped.
    send: Option<Box<dyn FnOnce(Checks) + Send + Sync>>,
}

/// One policy's count in a [`Meter`]: its check, where its real cost comes from, and the
/// count so far.
struct Counting {
    check: Check,
    settle: Arc<Settle>,
    reading: Reading,
    /// The reader of [`Meter::readers`] whose reading this check settles at, for a cost at a
    /// JSON pointer.
    #[cfg(feature = "json")]
    json: Option<usize>,
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
        #[cfg(feature = "json")]
        let mut readers: SmallVec<[Box<super::json::JsonCost>; 1]> = SmallVec::new();
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
                    CostSource::Json(Ok(pointer)) => Some(reader_of(&mut readers, pointer, events)),
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
            #[cfg(feature = "json")]
            readers,
            send: Some(send),
        }
    }

    /// How many readers of the body's JSON the meter keeps (one a distinct pointer).
    #[cfg(all(test, feature = "json"))]
    pub(crate) fn readers(&self) -> usize {
        self.readers.len()
    }

    /// Counts one frame of the body.
    pub(crate) fn observe(&mut self, frame: &Frame<Bytes>) {
        #[cfg(feature = "json")]
        if let Some(data) = frame.data_ref() {
            for reader in &mut self.readers {
                reader.observe(data);
            }
        }
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
                CostSource::Json(_) => 0,
                CostSource::Trailer(Err(_)) | CostSource::Extension | CostSource::Header(_) => 0,
            };
            if let Reading::Cost(n) = &mut c.reading {
                *n = n.saturating_add(add);
            }
        }
    }
}

/// The index in `readers` of the reader of `pointer`, added when there is none yet.
#[cfg(feature = "json")]
fn reader_of(
    readers: &mut SmallVec<[Box<super::json::JsonCost>; 1]>,
    pointer: &Arc<str>,
    events: bool,
) -> usize {
    if let Some(at) = readers.iter().position(|r| r.pointer() == &**pointer) {
        return at;
    }
    readers.push(Box::new(super::json::JsonCost::new(
        pointer.clone(),
        events,
    )));
    readers.len() - 1
}

impl Drop for Meter {
    fn drop(&mut self) {
        // Each reader's document parsed once, whatever the number of checks that read it.
        #[cfg(feature = "json")]
        let read: SmallVec<[Reading; 1]> = self.readers.drain(..).map(|r| r.finish()).collect();
        let mut checks = Checks::new();
        for c in self.counting.drain(..) {
            #[cfg(feature = "json")]
            let reading = c.json.map_or(c.reading, |at| read[at]);
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

#[cfg(all(test, feature = "json"))]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use bytes::Bytes;
    use http_body::Frame;

    use super::Meter;
    use crate::algorithm::Algorithm;
    use crate::key::Key;
    use crate::policy::Tier;
    use crate::quota::Quota;
    use crate::settle::Settle;
    use crate::store::{Check, Op};

    /// A meter of `keys` checks settling at `/usage/total_tokens` (and one at another
    /// pointer), and the units each was settled at when it is dropped.
    fn metered(keys: u64, body: &[&str]) -> (usize, Vec<u64>) {
        let quota = Quota::new(1_000, Duration::from_secs(60)).unwrap();
        let op = Op::Settle { estimate: 1 };
        let tier = Tier::alone("tokens", 0, Algorithm::TokenBucket, quota, op).unwrap();
        let usage = Arc::new(Settle::json("/usage/total_tokens"));
        let other = Arc::new(Settle::json("/usage/prompt_tokens"));
        let pending = (0..keys)
            .map(|k| (Check::new(tier.clone(), Key::from(k), 1, op), usage.clone()))
            .chain([(Check::new(tier.clone(), Key::from("p"), 1, op), other)]);
        let settled = Arc::new(Mutex::new(Vec::new()));
        let sent = settled.clone();
        let send = Box::new(move |checks: crate::store::Checks| {
            let units = checks.iter().map(Check::cost);
            sent.lock().unwrap().extend(units);
        });
        let mut meter = Meter::new(pending, false, send);
        let readers = meter.readers();
        for piece in body {
            meter.observe(&Frame::data(Bytes::copy_from_slice(piece.as_bytes())));
        }
        drop(meter);
        let settled = settled.lock().unwrap().clone();
        (readers, settled)
    }

    #[test]
    fn the_checks_of_a_batch_share_one_reading_of_the_response() {
        let body = [
            r#"{"usage": {"total_tokens": 42,"#,
            r#" "prompt_tokens": 5}}"#,
        ];
        for keys in [1, 10, 3_400] {
            let (readers, settled) = metered(keys, &body);
            // One reader a pointer, whatever the number of keys.
            assert_eq!(readers, 2, "{keys} keys");
            let mut expected = vec![42; keys as usize];
            expected.push(5);
            assert_eq!(settled, expected, "{keys} keys");
        }
    }
}
