//! How an adaptive limit moves: each completed request is a sample (its round trip, the
//! requests in flight when it began, whether it failed), and the [`Learner`] of one key turns
//! its samples into a limit, by Gradient2 or by AIMD.

use super::Rule;

/// Windows of Gradient2 whose mean makes its first long-term round trip.
const WARM_UP: u32 = 10;

/// AIMD's unloaded round trip moves up by this part of the difference a slower sample makes:
/// a service that became slower for good is learnt again over a few thousand requests.
const FORGET: f64 = 1_000.0;

/// A request is never slow by AIMD's tolerance for taking less than this more than the
/// unloaded round trip (microseconds): the jitter of a fast service is no overload.
const SLOW_BY_AT_LEAST_US: f64 = 1_000.0;

/// What one key's adaptive limit has learnt: the limit, and what its rule keeps between
/// samples.
#[derive(Debug)]
pub(crate) struct Learner {
    rule: Rule,
    min: f64,
    max: f64,
    limit: f64,
    /// The window of samples Gradient2 is gathering: when it began, how many, their round
    /// trips' sum, the most requests in flight any saw, and whether one failed.
    window_us: u64,
    window_samples: u32,
    began: Option<u64>,
    samples: u32,
    rtt_sum: u64,
    most_in_flight: u32,
    failed: bool,
    /// Gradient2's long-term round trip (microseconds), and the windows it has seen.
    long_rtt: f64,
    windows: u32,
    /// AIMD's unloaded round trip (microseconds; 0 before a sample): the least seen, moving
    /// up slowly; and when a slow request last moved the limit down.
    unloaded_rtt: f64,
    slowed_at: Option<u64>,
}

/// One completed request: its round trip in microseconds, the requests in flight when it
/// began (itself included), and whether it failed (an error, a `5xx`, a timeout).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sample {
    pub(crate) rtt_us: u64,
    pub(crate) in_flight: u32,
    pub(crate) failed: bool,
}

impl Learner {
    /// A learner starting from `initial`, kept within `min..=max`; Gradient2 gathers windows
    /// of at least `window_us` and `window_samples` samples.
    pub(crate) fn new(rule: Rule, initial: u32, min: u32, max: u32, window: (u64, u32)) -> Self {
        Learner {
            rule,
            min: f64::from(min),
            max: f64::from(max),
            limit: f64::from(initial),
            window_us: window.0,
            window_samples: window.1,
            began: None,
            samples: 0,
            rtt_sum: 0,
            most_in_flight: 0,
            failed: false,
            long_rtt: 0.0,
            windows: 0,
            unloaded_rtt: 0.0,
            slowed_at: None,
        }
    }

    /// The limit, in whole requests.
    pub(crate) fn limit(&self) -> u32 {
        self.limit as u32
    }

    /// Learns from `sample`, completed at `now` (microseconds); the limit after it.
    pub(crate) fn learn(&mut self, now: u64, sample: Sample) -> u32 {
        match self.rule {
            Rule::Aimd {
                backoff,
                timeout_us,
                tolerance,
            } => {
                let slow = match timeout_us {
                    Some(timeout_us) => sample.rtt_us > timeout_us,
                    None => self.slower_than_unloaded(sample.rtt_us, tolerance),
                };
                // One queue makes every request in it slow: the limit moves down for the
                // first of them, then for a request that began after that.
                let began = now.saturating_sub(sample.rtt_us);
                let slow = slow && self.slowed_at.is_none_or(|at| began >= at);
                if slow {
                    self.slowed_at = Some(now);
                }
                if sample.failed || slow {
                    self.limit = (self.limit * backoff).max(self.min);
                } else if f64::from(sample.in_flight) * 2.0 >= self.limit {
                    // One more a round trip: each success adds its share of one.
                    self.limit = (self.limit + 1.0 / self.limit).min(self.max);
                }
            }
            Rule::Gradient2 { .. } => self.gather(now, sample),
        }
        self.limit()
    }

    /// Whether a round trip of `rtt_us` took more than `tolerance` times the unloaded one and
    /// at least [`SLOW_BY_AT_LEAST_US`] more; the unloaded round trip learns from it.
    fn slower_than_unloaded(&mut self, rtt_us: u64, tolerance: f64) -> bool {
        let (rtt, unloaded) = (rtt_us as f64, self.unloaded_rtt);
        let slow =
            unloaded > 0.0 && rtt > tolerance * unloaded && rtt - unloaded >= SLOW_BY_AT_LEAST_US;
        self.unloaded_rtt = match unloaded {
            u if u == 0.0 || rtt < u => rtt.max(1.0),
            u => u + (rtt - u) / FORGET,
        };
        slow
    }

    /// Adds `sample` to the window, and moves the limit when the window is full.
    fn gather(&mut self, now: u64, sample: Sample) {
        let began = *self.began.get_or_insert(now);
        self.samples += 1;
        self.rtt_sum += sample.rtt_us;
        self.most_in_flight = self.most_in_flight.max(sample.in_flight);
        self.failed |= sample.failed;
        if self.samples < self.window_samples || now.saturating_sub(began) < self.window_us {
            return;
        }
        let short = (self.rtt_sum as f64 / f64::from(self.samples)).max(1.0);
        let (most, failed) = (self.most_in_flight, self.failed);
        self.began = None;
        (self.samples, self.rtt_sum, self.most_in_flight, self.failed) = (0, 0, 0, false);
        self.gradient2(short, most, failed);
    }

    /// Gradient2 on a full window whose mean round trip was `short`: the long-term round
    /// trip follows the windows slowly (their mean during the warm-up), and is pulled down
    /// when it is more than twice the short; the limit is multiplied by the gradient, the
    /// tolerance times long over short, between 0.5 and 1 (0.5 when a request failed), plus
    /// a queue of its square root, smoothed, within its bounds. A window whose requests in
    /// flight never reached half the limit leaves it as it is: the limit was not what held
    /// them back.
    fn gradient2(&mut self, short: f64, most_in_flight: u32, failed: bool) {
        let Rule::Gradient2 {
            tolerance,
            smoothing,
            long_window,
        } = self.rule
        else {
            return;
        };
        self.long_rtt = match self.windows {
            n if n < WARM_UP => (self.long_rtt * f64::from(n) + short) / f64::from(n + 1),
            _ => self.long_rtt + (short - self.long_rtt) / f64::from(long_window),
        };
        self.windows = self.windows.saturating_add(1);
        if self.long_rtt / short > 2.0 {
            self.long_rtt *= 0.95;
        }
        if !failed && f64::from(most_in_flight) < self.limit / 2.0 {
            return;
        }
        let gradient = match failed {
            true => 0.5,
            false => (tolerance * self.long_rtt / short).clamp(0.5, 1.0),
        };
        let next = self.limit * gradient + self.limit.sqrt();
        self.limit = (self.limit * (1.0 - smoothing) + next * smoothing).clamp(self.min, self.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000;

    fn gradient2() -> Rule {
        Rule::Gradient2 {
            tolerance: 1.5,
            smoothing: 0.2,
            long_window: 600,
        }
    }

    /// A backend serving `capacity` requests at a time, each taking `service` (µs), the rest
    /// queued: with `n` in flight, a request takes `service * n / capacity`, at least
    /// `service`. `clients` send one request after another, at most `limit` at once; every
    /// 100 ms, every request in flight completes that window's share. Runs `seconds` and
    /// returns the limit and the round trip of the last second.
    fn run(
        learner: &mut Learner,
        now: &mut u64,
        (capacity, service): (u32, u64),
        clients: u32,
        seconds: u64,
    ) -> (u32, u64) {
        let mut rtt = 0;
        for _ in 0..seconds * 10 {
            let n = clients.min(learner.limit()).max(1);
            rtt = service * u64::from(n.max(capacity)) / u64::from(capacity);
            // Requests done in 100 ms by n in flight, each taking rtt.
            let done = (u64::from(n) * 100 * MS / rtt).max(1);
            for i in 0..done {
                let at = *now + 100 * MS * (i + 1) / done;
                let sample = Sample {
                    rtt_us: rtt,
                    in_flight: n,
                    failed: false,
                };
                learner.learn(at, sample);
            }
            *now += 100 * MS;
        }
        (learner.limit(), rtt)
    }

    #[test]
    fn gradient2_settles_near_the_backends_capacity_and_follows_it_when_it_speeds_up() {
        let mut learner = Learner::new(gradient2(), 4, 2, 200, (1_000 * MS, 10));
        let mut now = 1_000_000;
        // 64 clients against 8 at a time, 20 ms each: unloaded, a request takes 20 ms.
        let (limit, rtt) = run(&mut learner, &mut now, (8, 20 * MS), 64, 30);
        assert!((8..=16).contains(&limit), "near the capacity of 8: {limit}");
        assert!(rtt <= 40 * MS, "at most twice the unloaded latency: {rtt}");
        // The backend serves 32 at a time now: the limit grows to use it.
        let (limit, rtt) = run(&mut learner, &mut now, (32, 20 * MS), 64, 60);
        assert!(
            (32..=64).contains(&limit),
            "near the new capacity of 32: {limit}"
        );
        assert!(rtt <= 40 * MS, "{rtt}");
        // And back to 8: the limit comes down again.
        let (limit, _) = run(&mut learner, &mut now, (8, 20 * MS), 64, 60);
        assert!(limit <= 20, "back near 8: {limit}");
    }

    #[test]
    fn gradient2_leaves_the_limit_when_the_clients_do_not_reach_it() {
        let mut learner = Learner::new(gradient2(), 50, 2, 200, (1_000 * MS, 10));
        let mut now = 0;
        let (limit, _) = run(&mut learner, &mut now, (8, 20 * MS), 4, 10);
        assert_eq!(limit, 50, "4 clients never reach half of 50");
    }

    #[test]
    fn gradient2_halves_on_a_window_with_a_failure_within_its_bounds() {
        let mut learner = Learner::new(gradient2(), 40, 10, 200, (0, 1));
        let failed = Sample {
            rtt_us: 20 * MS,
            in_flight: 40,
            failed: true,
        };
        // Smoothed: 40 * 0.8 + (40 * 0.5 + sqrt(40)) * 0.2 = 37.26...
        assert_eq!(learner.learn(0, failed), 37);
        for t in 1..100 {
            learner.learn(t, failed);
        }
        assert_eq!(learner.limit(), 10, "never below the minimum");
    }

    #[test]
    fn aimd_halves_on_errors_and_timeouts_and_adds_one_a_round_trip() {
        let rule = Rule::Aimd {
            backoff: 0.5,
            timeout_us: Some(100 * MS),
            tolerance: 2.0,
        };
        let mut learner = Learner::new(rule, 20, 2, 30, (0, 1));
        let ok = |in_flight| Sample {
            rtt_us: 10 * MS,
            in_flight,
            failed: false,
        };
        let failed = Sample {
            failed: true,
            ..ok(20)
        };
        let slow = Sample {
            rtt_us: 200 * MS,
            ..ok(20)
        };
        assert_eq!(learner.learn(0, failed), 10);
        assert_eq!(learner.learn(0, slow), 5);
        // 5 successes with 5 in flight: one more.
        for _ in 0..5 {
            learner.learn(0, ok(5));
        }
        assert_eq!(learner.limit(), 5, "4.99...: just short of 6");
        learner.learn(0, ok(5));
        assert_eq!(learner.limit(), 6);
        // Successes of a client that never comes near the limit add nothing.
        for _ in 0..100 {
            learner.learn(0, ok(1));
        }
        assert_eq!(learner.limit(), 6);
        for _ in 0..10_000 {
            learner.learn(0, ok(30));
        }
        assert_eq!(learner.limit(), 30, "never above the maximum");
        for _ in 0..10 {
            learner.learn(0, failed);
        }
        assert_eq!(learner.limit(), 2, "never below the minimum");
    }

    #[test]
    fn aimd_without_a_timeout_halves_on_requests_slower_than_twice_the_unloaded() {
        let rule = Rule::Aimd {
            backoff: 0.5,
            timeout_us: None,
            tolerance: 2.0,
        };
        let mut learner = Learner::new(rule, 16, 1, 30, (0, 1));
        let took = |rtt_us| Sample {
            rtt_us,
            in_flight: 1,
            failed: false,
        };
        // 20 ms unloaded; 39 ms is within twice that, 41 ms is not.
        assert_eq!(learner.learn(0, took(20 * MS)), 16);
        assert_eq!(learner.learn(0, took(39 * MS)), 16);
        assert_eq!(learner.learn(100 * MS, took(41 * MS)), 8);
        // Slow requests that began before it, in the same queue, move it no further; one that
        // began after does.
        assert_eq!(learner.learn(110 * MS, took(45 * MS)), 8);
        assert_eq!(learner.learn(160 * MS, took(50 * MS)), 4);
        // A fast service's jitter is no overload: 0.2 ms against 0.05 ms.
        let mut fast = Learner::new(rule, 16, 1, 30, (0, 1));
        fast.learn(0, took(50));
        assert_eq!(fast.learn(0, took(200)), 16);
        assert_eq!(
            fast.learn(0, took(2 * MS)),
            8,
            "slow by more than a millisecond"
        );
        // A service that became slower for good is learnt again.
        let mut slower = Learner::new(rule, 16, 1, 30, (0, 1));
        slower.learn(0, took(10 * MS));
        for _ in 0..5_000 {
            slower.learn(0, took(19 * MS));
        }
        let before = slower.limit();
        assert_eq!(
            slower.learn(0, took(30 * MS)),
            before,
            "30 ms is no longer slow"
        );
    }
}
