//! Property tests for the six algorithms.
//!
//! Every test builds a policy with [`Compiled::new`] from a small random quota (limit 1..=50,
//! window 1..=10 000µs, a burst 1..=50 for the bucket algorithms, a bucket count that divides the
//! window for the sliding window) and drives it as a store does: `evaluate` each request, and
//! `commit` it only when it is allowed. Requests are random `(time step, cost)` sequences.
//!
//! Two kinds of clocks are used:
//!
//! * **forward**: time never goes back, as the [`Clock`](crate::Clock) contract requires. The
//!   guarantees about what is admitted over time (window and rate bounds) and the accuracy of
//!   `Retry-After` are stated for such clocks;
//! * **wandering**: time may also jump backwards (as a [`ManualClock`](crate::ManualClock) set
//!   back can do). The statements that do not depend on elapsed time (remaining, expiry,
//!   token/leaky equivalence, robustness) are checked under it.
//!
//! The per-algorithm properties live in one module per property, with one test per algorithm,
//! so a failure names both and shrinks for that algorithm alone.

use std::time::Duration;

use proptest::prelude::*;
use proptest::sample::select;

use super::{Algorithm, Compiled, Guarantee, Options, State, Verdict};
use crate::quota::Quota;

/// Most sub-window buckets generated: the sliding window's retry search is quadratic in them.
const MAX_TEST_BUCKETS: u64 = 64;

/// A random quota that every algorithm accepts once the options it does not take are dropped.
#[derive(Clone, Debug)]
struct Spec {
    limit: u32,
    window: u64,
    /// Burst of the bucket algorithms (token bucket, leaky bucket, GCRA); ignored by the others.
    burst: Option<u32>,
    /// Sub-window buckets of the sliding window (divides `window`); ignored by the others.
    buckets: u32,
}

impl Spec {
    fn compile(&self, algorithm: Algorithm) -> Compiled {
        let mut quota = Quota::new(self.limit, Duration::from_micros(self.window)).unwrap();
        if let (true, Some(burst)) = (algorithm.has_burst(), self.burst) {
            quota = quota.try_with_burst(burst).unwrap();
        }
        let mut options = Options::default();
        if algorithm == Algorithm::SlidingWindow {
            options.buckets = Some(self.buckets);
        }
        let compiled = Compiled::new(algorithm, quota, options).unwrap();
        assert_eq!(compiled.reported_limit(), self.capacity(algorithm));
        compiled
    }

    /// The largest cost `algorithm` can ever admit: the burst, or the limit.
    fn capacity(&self, algorithm: Algorithm) -> u64 {
        match self.burst {
            Some(burst) if algorithm.has_burst() => burst as u64,
            _ => self.limit as u64,
        }
    }

    /// The largest capacity over all algorithms, to scale generated costs.
    fn top(&self) -> u64 {
        self.limit.max(self.burst.unwrap_or(0)) as u64
    }
}

fn spec() -> impl Strategy<Value = Spec> {
    // Short windows (often shorter than the limit: fractional per-microsecond rates) as often
    // as long ones.
    let window = prop_oneof![1u64..=100, 1u64..=10_000];
    (1u32..=50, window, proptest::option::of(1u32..=50)).prop_flat_map(|(limit, window, burst)| {
        let divisors: Vec<u32> = (1..=window.min(MAX_TEST_BUCKETS))
            .filter(|d| window % d == 0)
            .map(|d| d as u32)
            .collect();
        select(divisors).prop_map(move |buckets| Spec {
            limit,
            window,
            burst,
            buckets,
        })
    })
}

/// Where the clock starts: zero, anywhere, or where `ManualClock::new` starts.
fn start() -> impl Strategy<Value = u64> {
    prop_oneof![
        1 => Just(0u64),
        4 => 0u64..1_000_000_000_000,
        1 => Just(1_000_000_000_000_000u64),
    ]
}

/// Costs: mostly one or two units, sometimes zero, up to the largest capacity, or just above.
fn cost(top: u64) -> impl Strategy<Value = u64> {
    prop_oneof![
        1 => Just(0u64),
        8 => 1u64..=2,
        3 => 1..=top,
        1 => top + 1..=top + 3,
    ]
}

/// Microseconds between two requests on a forward clock, relative to the window.
fn forward_step(window: u64) -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => Just(0u64),
        4 => 0..=window / 4,
        3 => 0..=window,
        2 => 0..=3 * window,
        1 => 0..=20 * window,
    ]
}

/// A quota and requests `(now, cost)` at non-decreasing times.
fn forward_case(max_len: usize) -> impl Strategy<Value = (Spec, Vec<(u64, u64)>)> {
    spec()
        .prop_flat_map(move |spec| {
            let steps = proptest::collection::vec(
                (forward_step(spec.window), cost(spec.top())),
                1..=max_len,
            );
            (Just(spec), start(), steps)
        })
        .prop_map(|(spec, start, steps)| {
            let mut now = start;
            let requests = steps
                .into_iter()
                .map(|(dt, cost)| {
                    now += dt;
                    (now, cost)
                })
                .collect();
            (spec, requests)
        })
}

/// How the clock moves between two requests on a wandering clock.
#[derive(Clone, Copy, Debug)]
enum Move {
    /// Forward or backward by this many microseconds (saturating at zero).
    By(i64),
    /// To this absolute time.
    To(u64),
}

fn wandering_step(window: u64) -> impl Strategy<Value = Move> {
    let w = window as i64;
    prop_oneof![
        2 => Just(Move::By(0)),
        4 => (-w..=w).prop_map(Move::By),
        3 => (-3 * w..=3 * w).prop_map(Move::By),
        1 => (0..=20 * w).prop_map(Move::By),
        1 => (0u64..1 << 50).prop_map(Move::To),
    ]
}

fn wander(start: u64, moves: Vec<(Move, u64)>) -> Vec<(u64, u64)> {
    let mut now = start;
    moves
        .into_iter()
        .map(|(m, cost)| {
            now = match m {
                Move::By(d) => now.saturating_add_signed(d),
                Move::To(t) => t,
            };
            (now, cost)
        })
        .collect()
}

/// A quota and requests `(now, cost)` whose times may go backwards.
fn wandering_case(max_len: usize) -> impl Strategy<Value = (Spec, Vec<(u64, u64)>)> {
    spec()
        .prop_flat_map(move |spec| {
            let steps = proptest::collection::vec(
                (wandering_step(spec.window), cost(spec.top())),
                1..=max_len,
            );
            (Just(spec), start(), steps)
        })
        .prop_map(|(spec, start, moves)| (spec, wander(start, moves)))
}

/// Like [`wandering_case`], with costs anywhere in `u64` as well.
fn hostile_case(max_len: usize) -> impl Strategy<Value = (Spec, Vec<(u64, u64)>)> {
    spec()
        .prop_flat_map(move |spec| {
            let costs = prop_oneof![
                6 => cost(spec.top()),
                1 => Just(u32::MAX as u64),
                1 => Just(u64::MAX),
                1 => any::<u64>(),
            ];
            let steps =
                proptest::collection::vec((wandering_step(spec.window), costs), 1..=max_len);
            (Just(spec), start(), steps)
        })
        .prop_map(|(spec, start, moves)| (spec, wander(start, moves)))
}

/// One request as a store handles it.
#[derive(Clone, Debug)]
struct Handled {
    now: u64,
    cost: u64,
    /// The key's state when the request came.
    before: Option<State>,
    verdict: Verdict,
    /// The key's state after the request (charged if it was allowed).
    after: Option<State>,
    /// What `commit` returned, when the request was charged.
    expires_at: Option<u64>,
}

/// Evaluates every request and commits those allowed.
fn drive(algorithm: &Compiled, requests: &[(u64, u64)]) -> Vec<Handled> {
    let mut state = None;
    requests
        .iter()
        .map(|&(now, cost)| {
            let before = state.clone();
            let verdict = algorithm.evaluate(state.as_ref(), now, cost);
            let expires_at = verdict
                .allowed
                .then(|| algorithm.commit(&mut state, now, cost));
            Handled {
                now,
                cost,
                before,
                verdict,
                after: state.clone(),
                expires_at,
            }
        })
        .collect()
}

/// `(time, cost)` of the admitted requests that cost something, in order.
fn admitted(trace: &[Handled]) -> Vec<(u64, u64)> {
    trace
        .iter()
        .filter(|s| s.verdict.allowed && s.cost > 0)
        .map(|s| (s.now, s.cost))
        .collect()
}

/// The most units admitted in any span `(t − len, t]`, and the `t` it ends at. Admission times
/// must be non-decreasing. The worst span ends at an admission, so only those are tried.
fn busiest_span(admitted: &[(u64, u64)], len: u64) -> (u64, u64) {
    let mut best = (0, 0);
    let mut lo = 0;
    let mut sum = 0;
    for (hi, &(t, c)) in admitted.iter().enumerate() {
        sum += c;
        while lo <= hi && admitted[lo].0 + len <= t {
            sum -= admitted[lo].1;
            lo += 1;
        }
        if sum > best.0 {
            best = (sum, t);
        }
    }
    best
}

/// Checks `sum of costs admitted in [a, b] <= bound(b − a)` for every closed interval whose ends
/// are admission times (the worst intervals are among those). Times must be non-decreasing.
fn check_intervals(
    admitted: &[(u64, u64)],
    bound: impl Fn(u64) -> u64,
) -> Result<(), TestCaseError> {
    for i in 0..admitted.len() {
        let mut sum = 0;
        for j in i..admitted.len() {
            sum += admitted[j].1;
            let (a, b) = (admitted[i].0, admitted[j].0);
            prop_assert!(
                sum <= bound(b - a),
                "{sum} units admitted in [{a}, {b}], more than the bound {}",
                bound(b - a)
            );
        }
    }
    Ok(())
}

// Properties 1–4: how much is admitted over time (forward clock).

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Property 1: The sliding log is exact: every window-long span `(t − window, t]` admits at
    /// most `limit` units.
    #[test]
    fn sliding_log_never_exceeds_the_limit_in_any_window((spec, requests) in forward_case(80)) {
        let trace = drive(&spec.compile(Algorithm::SlidingLog), &requests);
        let (most, end) = busiest_span(&admitted(&trace), spec.window);
        prop_assert!(
            most <= spec.limit as u64,
            "{most} units admitted in ({}, {end}]", end.saturating_sub(spec.window)
        );
    }

    /// Property 2: The fixed window admits at most `limit` units per aligned window, hence at most
    /// twice the limit in any window-long span (the end of one window and the start of the next).
    #[test]
    fn fixed_window_admits_the_limit_per_window_and_twice_across_a_boundary(
        (spec, requests) in forward_case(80)
    ) {
        let trace = drive(&spec.compile(Algorithm::FixedWindow), &requests);
        let admitted = admitted(&trace);
        let (most, end) = busiest_span(&admitted, spec.window);
        prop_assert!(
            most <= 2 * spec.limit as u64,
            "{most} units admitted in ({}, {end}]", end.saturating_sub(spec.window)
        );
        for chunk in admitted.chunk_by(|a, b| a.0 / spec.window == b.0 / spec.window) {
            let units: u64 = chunk.iter().map(|&(_, c)| c).sum();
            let start = chunk[0].0 / spec.window * spec.window;
            prop_assert!(
                units <= spec.limit as u64,
                "{units} units admitted in the window starting at {start}"
            );
        }
    }

    /// Property 3: The sliding window counter admits at most `limit` units in any span of
    /// `window − window/buckets`: a request at bucket `c`, offset `x`, is admitted only if the
    /// buckets `c − buckets + 1 ..= c`, which cover `[t − (window − bucket) − x, t]`, hold at most
    /// `limit` minus its cost, the weighted oldest bucket only adding to the estimate.
    #[test]
    fn sliding_window_never_exceeds_the_limit_in_a_window_minus_one_bucket(
        (spec, requests) in forward_case(80)
    ) {
        let trace = drive(&spec.compile(Algorithm::SlidingWindow), &requests);
        let span = spec.window - spec.window / spec.buckets as u64;
        let (most, end) = busiest_span(&admitted(&trace), span);
        prop_assert!(
            most <= spec.limit as u64,
            "{most} units admitted in ({}, {end}] (span {span})", end.saturating_sub(span)
        );
    }

    /// Property 4, token bucket: at most `burst + floor((b − a)·limit/window)` units in any
    /// interval `[a, b]`.
    ///
    /// Tokens are exact multiples of `1/unit`: the bucket holds at most `burst·unit` when the first
    /// request of the interval comes, gains exactly `(b − a)·rate` until the last, and never goes
    /// negative, so `units·unit <= burst·unit + (b − a)·rate`, with `rate/unit = limit/window`.
    /// (The `ceil` bound is weaker; the `floor` one is tight.)
    #[test]
    fn token_bucket_admits_at_most_burst_plus_rate((spec, requests) in forward_case(80)) {
        let (burst, limit) = (spec.capacity(Algorithm::TokenBucket), spec.limit as u64);
        let trace = drive(&spec.compile(Algorithm::TokenBucket), &requests);
        check_intervals(&admitted(&trace), |d| burst + d * limit / spec.window)?;
    }

    /// Property 4, leaky bucket: the same bound as the token bucket, by the same argument on free
    /// space.
    #[test]
    fn leaky_bucket_admits_at_most_burst_plus_rate((spec, requests) in forward_case(80)) {
        let (burst, limit) = (spec.capacity(Algorithm::LeakyBucket), spec.limit as u64);
        let trace = drive(&spec.compile(Algorithm::LeakyBucket), &requests);
        check_intervals(&admitted(&trace), |d| burst + d * limit / spec.window)?;
    }

    /// Property 4, GCRA: at most `burst + floor((b − a)/T)` units in any `[a, b]`, `T` the emission
    /// interval, hence at most `burst + floor((b − a)·limit/window)`.
    ///
    /// Each admission moves the TAT to `max(TAT, now) + cost·T` and needs `TAT − now <= burst·T`
    /// afterwards. Over the admissions in `[a, b]` the TAT thus grows from at least `a` by
    /// `units·T`, and ends at most at `b + burst·T`: `units·T <= (b − a) + burst·T`. As
    /// `T = ceil(window/limit) >= window/limit`, the token bucket's bound holds too.
    #[test]
    fn gcra_admits_at_most_burst_plus_rate((spec, requests) in forward_case(80)) {
        let compiled = spec.compile(Algorithm::Gcra);
        let Compiled::Gcra(gcra) = &compiled else { unreachable!() };
        let params = super::Kernel::lua_params(gcra);
        let (interval, burst) = (params[0], params[1] / params[0]);
        let limit = spec.limit as u64;
        let trace = drive(&compiled, &requests);
        let admitted = admitted(&trace);
        check_intervals(&admitted, |d| burst + d / interval)?;
        check_intervals(&admitted, |d| burst + d * limit / spec.window)?;
    }
}

// Property 5: the leaky bucket as a meter is the token bucket.

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    /// Property 5: For the same quota and requests (even with the clock going back), the token and
    /// leaky buckets give the same verdicts (allowed, remaining, reset, retry) and expiries.
    #[test]
    fn token_and_leaky_buckets_decide_alike((spec, requests) in wandering_case(80)) {
        let token = drive(&spec.compile(Algorithm::TokenBucket), &requests);
        let leaky = drive(&spec.compile(Algorithm::LeakyBucket), &requests);
        for (t, l) in token.iter().zip(&leaky) {
            prop_assert_eq!(
                (t.verdict, t.expires_at),
                (l.verdict, l.expires_at),
                "at now={} cost={}", t.now, t.cost
            );
        }
    }
}

// Properties 6–9: one test per algorithm.

/// Declares module `$name` with one proptest per algorithm of `with_algorithms!` (named as its
/// module), each running `$check(algorithm, &spec, &requests)` on `$cases` cases drawn from
/// `$strategy`.
macro_rules! for_each_algorithm {
    ($(#[$doc:meta])* $name:ident, $cases:expr, $strategy:expr, $check:path) => {
        with_algorithms!(algorithm_tests! { ($(#[$doc])* $name, $cases, $strategy, $check) });
    };
}

/// [`for_each_algorithm!`] given the algorithms' entries.
macro_rules! algorithm_tests {
    (
        ($(#[$doc:meta])* $name:ident, $cases:expr, $strategy:expr, $check:path)
        $($(#[doc = $_d:literal])* $variant:ident => $module:ident :: $ty:ident,)*
    ) => {
        $(#[$doc])*
        mod $name {
            use super::*;

            proptest! {
                #![proptest_config(ProptestConfig::with_cases($cases))]

                $(
                    #[test]
                    fn $module((spec, requests) in $strategy) {
                        $check(Algorithm::$variant, &spec, &requests)?;
                    }
                )*
            }
        }
    };
}

/// Property 6: When a request is denied with `retry_after_us = Some(r)`, the same request with no
/// traffic in between is admitted at `now + r` and still denied at `now + r − 1`.
///
/// Stated for a forward clock. Every algorithm measures the time to wait from `now`, except that
/// the sliding window, token bucket and leaky bucket, seeing a `now` before their last update,
/// treat it as "no time has passed" and so count the wait from that update instead (fixed
/// window, sliding log and GCRA still count from the real `now`): after the clock went back, their
/// retry-after is short by how far it went back.
fn retry_after_is_exact(
    algorithm: Algorithm,
    spec: &Spec,
    requests: &[(u64, u64)],
) -> Result<(), TestCaseError> {
    let compiled = spec.compile(algorithm);
    for step in drive(&compiled, requests) {
        let Some(r) = step.verdict.retry_after_us else {
            continue;
        };
        let (now, cost, before) = (step.now, step.cost, step.before.as_ref());
        prop_assert!(r > 0, "retry after 0 for a denied request at {now}");
        prop_assert!(
            compiled.evaluate(before, now + r, cost).allowed,
            "denied at {now} with retry after {r}, but still denied at {}",
            now + r
        );
        prop_assert!(
            !compiled.evaluate(before, now + r - 1, cost).allowed,
            "denied at {now} with retry after {r}, but already admitted at {}",
            now + r - 1
        );
    }
    Ok(())
}

for_each_algorithm!(
    /// Property 6, see [`retry_after_is_exact`].
    retry_after_is_exact_and_tight,
    128,
    forward_case(64),
    retry_after_is_exact
);

/// Property 6, the weaker statement that holds when the clock goes back: the request is still
/// denied at `now + r − 1`, and is admitted once `r` has passed since both `now` and the latest
/// time the key was charged at (which is where the algorithms that saw time go back count from).
fn retry_after_is_enough_from_the_last_update(
    algorithm: Algorithm,
    spec: &Spec,
    requests: &[(u64, u64)],
) -> Result<(), TestCaseError> {
    let compiled = spec.compile(algorithm);
    let mut last_charged = 0;
    for step in drive(&compiled, requests) {
        let (now, cost, before) = (step.now, step.cost, step.before.as_ref());
        if let Some(r) = step.verdict.retry_after_us {
            let from = now.max(last_charged);
            prop_assert!(
                !compiled.evaluate(before, now + r - 1, cost).allowed,
                "denied at {now} with retry after {r}, but already admitted at {}",
                now + r - 1
            );
            prop_assert!(
                compiled.evaluate(before, from + r, cost).allowed,
                "denied at {now} (last charged at {last_charged}) with retry after {r}, but \
                 still denied at {}",
                from + r
            );
        }
        if step.expires_at.is_some() {
            last_charged = last_charged.max(now);
        }
    }
    Ok(())
}

for_each_algorithm!(
    /// Property 6 on a wandering clock, see [`retry_after_is_enough_from_the_last_update`].
    retry_after_when_the_clock_goes_back,
    96,
    wandering_case(48),
    retry_after_is_enough_from_the_last_update
);

/// Property 7: After a request admitted with `remaining = n`, `n` more requests of cost 1 at the
/// same instant are admitted and the next one is denied (for `n = 0` too: the next one is denied).
fn remaining_is_what_can_still_be_spent(
    algorithm: Algorithm,
    spec: &Spec,
    requests: &[(u64, u64)],
) -> Result<(), TestCaseError> {
    let compiled = spec.compile(algorithm);
    for step in drive(&compiled, requests) {
        if !step.verdict.allowed {
            continue;
        }
        let (now, n) = (step.now, step.verdict.remaining);
        let mut state = step.after;
        for i in 0..n {
            prop_assert!(
                compiled.evaluate(state.as_ref(), now, 1).allowed,
                "remaining {n} at {now}, but unit {} of them is denied",
                i + 1
            );
            compiled.commit(&mut state, now, 1);
        }
        prop_assert!(
            !compiled.evaluate(state.as_ref(), now, 1).allowed,
            "remaining {n} at {now}, but one more unit is admitted"
        );
    }
    Ok(())
}

for_each_algorithm!(
    /// Property 7, see [`remaining_is_what_can_still_be_spent`].
    remaining_is_exact,
    96,
    wandering_case(48),
    remaining_is_what_can_still_be_spent
);

/// Property 8: A state at or past the `expires_at` its last commit returned is a fresh key: at any
/// time `>= expires_at`, evaluating any cost with it gives the same verdict as with no state, and
/// charging it leaves the same state as charging a fresh key. (The memory store relies on this when
/// it drops such states.)
fn expired_state_is_a_fresh_key(
    algorithm: Algorithm,
    spec: &Spec,
    requests: &[(u64, u64)],
) -> Result<(), TestCaseError> {
    let compiled = spec.compile(algorithm);
    let capacity = spec.capacity(algorithm);
    for step in drive(&compiled, requests) {
        let Some(expires_at) = step.expires_at else {
            continue;
        };
        let offsets = [0, 1, spec.window / 3, spec.window, 7 * spec.window + 5];
        let costs = [0, 1, 2, capacity, capacity + 1];
        for now in offsets.map(|o| expires_at + o) {
            for cost in costs {
                let verdict = compiled.evaluate(step.after.as_ref(), now, cost);
                prop_assert_eq!(
                    verdict,
                    compiled.evaluate(None, now, cost),
                    "state {:?} expired at {}, evaluated at {} for cost {}",
                    &step.after,
                    expires_at,
                    now,
                    cost
                );
                if verdict.allowed && cost > 0 {
                    let (mut old, mut fresh) = (step.after.clone(), None);
                    prop_assert_eq!(
                        compiled.commit(&mut old, now, cost),
                        compiled.commit(&mut fresh, now, cost)
                    );
                    prop_assert_eq!(old, fresh, "charged at {} for cost {}", now, cost);
                }
            }
        }
    }
    Ok(())
}

for_each_algorithm!(
    /// Property 8, see [`expired_state_is_a_fresh_key`].
    expired_state_is_fresh,
    96,
    wandering_case(48),
    expired_state_is_a_fresh_key
);

/// Property 9: Any sequence (time jumping back and forth, cost 0, costs far above the capacity, up
/// to `u64::MAX`) is handled without panicking, and the verdicts keep their shape: a cost above the
/// capacity is denied with no retry-after; an admitted request has no retry-after; a denied request
/// within the capacity has a positive retry-after; `remaining` never exceeds the capacity.
fn verdicts_are_well_formed(
    algorithm: Algorithm,
    spec: &Spec,
    requests: &[(u64, u64)],
) -> Result<(), TestCaseError> {
    let compiled = spec.compile(algorithm);
    let capacity = spec.capacity(algorithm);
    for step in drive(&compiled, requests) {
        let (v, now, cost) = (step.verdict, step.now, step.cost);
        prop_assert!(
            v.remaining <= capacity,
            "remaining {} at {now}",
            v.remaining
        );
        if cost > capacity {
            prop_assert!(
                !v.allowed && v.retry_after_us.is_none(),
                "{v:?} for cost {cost}"
            );
        } else if v.allowed {
            prop_assert_eq!(v.retry_after_us, None);
        } else {
            prop_assert!(
                matches!(v.retry_after_us, Some(r) if r > 0),
                "{:?} for cost {} at {}",
                v,
                cost,
                now
            );
        }
    }
    Ok(())
}

for_each_algorithm!(
    /// Property 9, see [`verdicts_are_well_formed`].
    robust_to_any_input,
    128,
    hostile_case(64),
    verdicts_are_well_formed
);

/// Extra property (cost 0 is a look): on a forward clock, a request of cost 0 right after any
/// request is admitted, and reports the same `remaining` and `reset_after_us` as that request did.
///
/// Only on a forward clock: after time went back, the sliding window (which then looks at its
/// newest bucket from its start, where the oldest bucket still weighs in full) and GCRA (whose
/// `TAT − now` then exceeds the tolerance) can count more than the limit as spent, and deny
/// even cost 0, with a retry-after.
fn cost_zero_is_a_look(
    algorithm: Algorithm,
    spec: &Spec,
    requests: &[(u64, u64)],
) -> Result<(), TestCaseError> {
    let compiled = spec.compile(algorithm);
    for step in drive(&compiled, requests) {
        let look = compiled.evaluate(step.after.as_ref(), step.now, 0);
        let v = step.verdict;
        prop_assert_eq!(
            look,
            Verdict::allow(v.remaining, v.reset_after_us),
            "a look at {} after {:?} for cost {}",
            step.now,
            v,
            step.cost
        );
    }
    Ok(())
}

for_each_algorithm!(
    /// Extra property, see [`cost_zero_is_a_look`].
    cost_zero_is_a_look_on_a_forward_clock,
    64,
    forward_case(64),
    cost_zero_is_a_look
);

/// Extra property: a state that packs (the memory store's shared path) is the state itself.
/// Its word is the expiry its commit returned (so the store keeps it packed), it unpacks to
/// the same state (or, packed as no state, decides as a fresh key), and a request decided on
/// it gets the same verdict as on the state and,
/// charged, leaves the packed form of the charged state. Every request is tried on every
/// state of the run, on a wandering clock.
fn a_packed_state_decides_as_the_state(
    algorithm: Algorithm,
    spec: &Spec,
    requests: &[(u64, u64)],
) -> Result<(), TestCaseError> {
    let compiled = spec.compile(algorithm);
    let trace = drive(&compiled, requests);
    for step in &trace {
        let Some(packed) = compiled.pack(step.after.as_ref()) else {
            prop_assert!(!compiled.packs(), "{:?} does not pack", &step.after);
            continue;
        };
        if packed.word() == 0 {
            // No state: only a state a fresh key decides as packs to it (a GCRA's TAT of 0,
            // which a charge of 0 at the time 0 leaves here; a store charges nothing then).
            for &(now, cost) in requests {
                let fresh = compiled.evaluate(None, now, cost);
                prop_assert_eq!(compiled.evaluate(step.after.as_ref(), now, cost), fresh);
            }
        } else {
            prop_assert_eq!(&compiled.unpack(packed), &step.after);
        }
        if let Some(expires_at) = step.expires_at {
            prop_assert_eq!(packed.word(), expires_at);
        }
        for &(now, cost) in requests {
            let (verdict, next) = compiled.judge_packed(packed, now, cost);
            prop_assert_eq!(verdict, compiled.evaluate(step.after.as_ref(), now, cost));
            let mut charged = step.after.clone();
            if verdict.allowed && cost > 0 {
                compiled.commit(&mut charged, now, cost);
            }
            prop_assert_eq!(
                Some(next),
                compiled.pack(charged.as_ref()),
                "at {} for {}",
                now,
                cost
            );
        }
    }
    Ok(())
}

for_each_algorithm!(
    /// Extra property, see [`a_packed_state_decides_as_the_state`].
    a_packed_state_is_the_state,
    64,
    wandering_case(32),
    a_packed_state_decides_as_the_state
);

// Leases: instances that take units of a key at once and spend them locally.

/// One event of the lease simulation: after `dt` microseconds, instance `who` has a request of
/// `cost` units; `plain` requests are decided by the store one by one (a policy without a lease
/// on the same key), and an instance `idle` gives back what its lease has left.
#[derive(Clone, Debug)]
struct LeaseEvent {
    dt: u64,
    who: usize,
    cost: u64,
    plain: bool,
    idle: bool,
}

/// A lease held by an instance: units left and the last moment they may be spent.
#[derive(Clone, Copy, Debug)]
struct ModelLease {
    left: u64,
    end: u64,
}

fn lease_case() -> impl Strategy<Value = (Spec, u64, u64, u64, Vec<LeaseEvent>)> {
    spec().prop_flat_map(|spec| {
        let top = spec.top();
        let events = proptest::collection::vec(
            (
                forward_step(spec.window / 4 + 1),
                0usize..3,
                prop_oneof![1 => Just(0u64), 8 => Just(1u64), 2 => 1..=top],
                prop_oneof![6 => Just(false), 1 => Just(true)],
                prop_oneof![8 => Just(false), 1 => Just(true)],
            )
                .prop_map(|(dt, who, cost, plain, idle)| LeaseEvent {
                    dt,
                    who,
                    cost,
                    plain,
                    idle,
                }),
            1..=120,
        );
        (
            Just(spec.clone()),
            start(),
            1..=spec.window,
            1..=top,
            events,
        )
    })
}

/// Runs the lease simulation for `algorithm`: three instances sharing one store state, each
/// spending its lease locally until it ends, giving back what is left when it asks for the
/// next one or goes idle. Returns the units admitted, in time order.
fn drive_leases(
    compiled: &Compiled,
    start: u64,
    ttl: u64,
    want: u64,
    events: &[LeaseEvent],
) -> Vec<(u64, u64)> {
    let mut state = None;
    let mut held: [Option<ModelLease>; 3] = [None; 3];
    let mut now = start;
    let mut admitted = Vec::new();
    for e in events {
        now += e.dt;
        let mine = &mut held[e.who];
        if e.idle {
            if let Some(h) = mine.take() {
                compiled.give_back(&mut state, now, h.end, h.left);
            }
            continue;
        }
        if e.plain {
            if compiled.evaluate(state.as_ref(), now, e.cost).allowed {
                compiled.commit(&mut state, now, e.cost);
                admitted.push((now, e.cost));
            }
            continue;
        }
        if let Some(h) = mine
            && now <= h.end
            && h.left >= e.cost
        {
            h.left -= e.cost;
            admitted.push((now, e.cost));
            continue;
        }
        // The store: what is left of the old lease goes back in the same step.
        if let Some(h) = mine.take() {
            compiled.give_back(&mut state, now, h.end, h.left);
        }
        let (verdict, _) = compiled.lease_verdict(state.as_ref(), now, ttl, e.cost);
        if verdict.allowed {
            let lease = compiled.take_lease(&mut state, now, ttl, e.cost, want.max(e.cost));
            assert!(
                lease.verdict.allowed,
                "a lease admitted at {now} was then refused"
            );
            assert!(lease.units >= e.cost && lease.units <= want.max(e.cost));
            assert!(lease.end >= now && lease.end <= now + ttl);
            *mine = Some(ModelLease {
                left: lease.units - e.cost,
                end: lease.end,
            });
            admitted.push((now, e.cost));
        }
    }
    admitted.retain(|&(_, c)| c > 0);
    admitted
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Leases never admit more than the algorithm's own bound (properties 1–4), whatever the
    /// interleaving of instances spending leases, requests decided one by one, and units given
    /// back: the store counts each lease as spent at its worst moment.
    #[test]
    fn leases_never_exceed_the_limit((spec, start, ttl, want, events) in lease_case()) {
        for algorithm in Algorithm::ALL {
            let compiled = spec.compile(algorithm);
            let want = want.min(spec.capacity(algorithm));
            let admitted = drive_leases(&compiled, start, ttl, want, &events);
            check_bounds(&spec, algorithm, &admitted)?;
        }
    }
}

/// Each algorithm's bound on what it admits over time (properties 1–4), on `admitted`:
/// `(time, cost)` in time order.
fn check_bounds(
    spec: &Spec,
    algorithm: Algorithm,
    admitted: &[(u64, u64)],
) -> Result<(), TestCaseError> {
    let limit = spec.limit as u64;
    match algorithm.guarantee() {
        Guarantee::AnyWindow => {
            let (most, end) = busiest_span(admitted, spec.window);
            prop_assert!(
                most <= limit,
                "{algorithm}: {most} units in the window ending {end}"
            );
        }
        Guarantee::AlignedWindows => {
            for chunk in admitted.chunk_by(|a, b| a.0 / spec.window == b.0 / spec.window) {
                let units: u64 = chunk.iter().map(|&(_, c)| c).sum();
                prop_assert!(units <= limit, "{algorithm}: {units} units in one window");
            }
        }
        Guarantee::WindowLessABucket => {
            let span = spec.window - spec.window / spec.buckets as u64;
            let (most, end) = busiest_span(admitted, span);
            prop_assert!(
                most <= limit,
                "{algorithm}: {most} units in the span ending {end}"
            );
        }
        Guarantee::BurstAndRate => {
            let burst = spec.capacity(algorithm);
            check_intervals(admitted, |d| burst + d * limit / spec.window)
                .map_err(|e| TestCaseError::fail(format!("{algorithm}: {e}")))?;
        }
    }
    Ok(())
}

/// One request of a booking case: when it comes (a forward step), its cost, whether it
/// may wait, and, if it waits, whether its client goes away first (and when, as a share of its
/// wait in 0..=255).
type Waiter = (u64, u64, bool, Option<u8>);

fn booking_case() -> impl Strategy<Value = (Spec, u64, u64, Vec<Waiter>)> {
    spec().prop_flat_map(|spec| {
        let max_wait = prop_oneof![1..=spec.window, 1..=4 * spec.window];
        let request = (
            forward_step(spec.window),
            cost(spec.top()),
            proptest::bool::weighted(0.7),
            proptest::option::weighted(0.2, any::<u8>()),
        );
        (
            Just(spec),
            start(),
            max_wait,
            proptest::collection::vec(request, 1..=60),
        )
    })
}

/// Runs the requests as a store that books waits does: a request that may wait and is denied
/// now books its time when it is at most `max_wait` away, and is charged there; a waiting
/// request whose client goes away gives its units back (a `GIVE_BACK` of its time) before its
/// time. Returns `(time, cost)` of what went on, at the time it went on, in time order.
fn drive_bookings(
    compiled: &Compiled,
    start: u64,
    max_wait: u64,
    requests: &[Waiter],
) -> Result<Vec<(u64, u64)>, TestCaseError> {
    let mut state = None;
    let mut now = start;
    // Waiting requests: (at, cost, when the client goes away).
    let mut waiting: Vec<(u64, u64, Option<u64>)> = Vec::new();
    let mut went_on = Vec::new();
    for &(dt, cost, may_wait, leaves) in requests {
        now += dt;
        // Clients that went away by now give back; those whose at came went on.
        waiting.retain(|&(at, cost, gone)| match gone {
            Some(gone) if gone <= now => {
                compiled.release(&mut state, now, at, cost);
                false
            }
            _ if at <= now => {
                went_on.push((at, cost));
                false
            }
            _ => true,
        });
        let verdict = compiled.evaluate(state.as_ref(), now, cost);
        if verdict.allowed {
            if cost > 0 {
                compiled.commit(&mut state, now, cost);
                went_on.push((now, cost));
            }
            continue;
        }
        if !may_wait {
            continue;
        }
        if let Some(wait) = compiled.booking(state.as_ref(), now, cost, &verdict, max_wait) {
            prop_assert!(wait > 0 && wait <= max_wait, "a wait of {wait}");
            let at = now + wait;
            compiled.book_commit(&mut state, now, at, cost);
            let gone = leaves.map(|share| now + wait * u64::from(share) / 256);
            waiting.push((at, cost, gone));
        }
    }
    went_on.extend(
        waiting
            .into_iter()
            .filter(|&(_, _, gone)| gone.is_none())
            .map(|(at, cost, _)| (at, cost)),
    );
    went_on.sort_unstable();
    Ok(went_on)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Property 11: Reservations keep every algorithm's bound, counted at the time requests
    /// go on (their booked time for those that waited): requests that wait mixed with requests that
    /// do not, some of the waiting ones' clients going away and giving their units back.
    #[test]
    fn bookings_keep_every_bound((spec, start, max_wait, requests) in booking_case()) {
        for algorithm in Algorithm::ALL {
            let compiled = spec.compile(algorithm);
            let went_on = drive_bookings(&compiled, start, max_wait, &requests)?;
            check_bounds(&spec, algorithm, &went_on)?;
        }
    }
}

/// A reload's conversion ([`Compiled::convert`]), after random traffic on a forward clock.
mod conversion {
    use super::*;

    /// The state at `gap` after the last request, as the store holds it.
    fn state_after(old: &Compiled, requests: &[(u64, u64)], gap: u64) -> (Option<State>, u64) {
        let trace = drive(old, requests);
        let last = trace.last().expect("at least one request");
        (last.after.clone(), last.now + gap)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(600))]

        /// Property 10: a new limit (and burst) over the same window keeps the units used:
        /// `remaining` under the new quota is its capacity less what was used under the old
        /// one (5 used of 10, then 15 of 20), on every algorithm.
        #[test]
        fn a_new_limit_keeps_the_units_used(
            algorithm in select(Algorithm::ALL.to_vec()),
            (spec, requests) in forward_case(40),
            limit in 1u32..=50,
            burst in proptest::option::of(1u32..=50),
            gap in prop_oneof![Just(0u64), 0u64..=200],
        ) {
            let new_spec = Spec { limit, burst, ..spec.clone() };
            let (old, new) = (spec.compile(algorithm), new_spec.compile(algorithm));
            let (mut state, now) = state_after(&old, &requests, gap);
            let used = spec.capacity(algorithm) - old.evaluate(state.as_ref(), now, 0).remaining;
            new.convert(&old, &mut state, now, 0);
            let remaining = new.evaluate(state.as_ref(), now, 0).remaining;
            prop_assert_eq!(remaining, new_spec.capacity(algorithm).saturating_sub(used));
        }

        /// Property 11: converting to any other quota (window and buckets too) and back is never
        /// more generous than the state was, and is at most one unit stricter, plus what one
        /// microsecond of the other quota is worth (a usage beyond its capacity is kept as time
        /// ahead, in whole microseconds: a fraction of a unit at any real rate, several units
        /// at rates above one unit per microsecond); except the sliding window, whose buckets
        /// merge when they grow (then it is only never more generous), and which forgets,
        /// through a shorter window, the buckets that window no longer counts (so it is
        /// checked through windows at least as long).
        #[test]
        fn a_round_trip_never_gives_units_away(
            algorithm in select(Algorithm::ALL.to_vec()),
            (spec, requests) in forward_case(40),
            other in spec(),
            gap in prop_oneof![Just(0u64), 0u64..=200],
        ) {
            prop_assume!(algorithm != Algorithm::SlidingWindow || other.window >= spec.window);
            let (a, b) = (spec.compile(algorithm), other.compile(algorithm));
            let (mut state, now) = state_after(&a, &requests, gap);
            let before = a.evaluate(state.as_ref(), now, 0).remaining;
            b.convert(&a, &mut state, now, 0);
            a.convert(&b, &mut state, now, 0);
            let after = a.evaluate(state.as_ref(), now, 0).remaining;
            prop_assert!(after <= before, "{after} > {before}");
            if algorithm != Algorithm::SlidingWindow {
                // One microsecond of the other quota, in units of this one.
                let per_us = other.limit as f64 / other.window as f64;
                let worth = per_us * spec.capacity(algorithm) as f64
                    / other.capacity(algorithm) as f64;
                let slack = (1.0 + worth).floor() as u64;
                prop_assert!(after + slack >= before, "{after} + {slack} < {before}");
            }
        }
    }
}
