use std::collections::HashMap;

use proptest::prelude::*;

use super::service::percent_decode;
use super::*;

/// A summary's heap is a min-heap by count, and its index finds each entry where it is.
fn assert_consistent(s: &Summary) {
    assert!(s.heap.len() <= s.capacity);
    assert_eq!(s.index.len(), s.heap.len());
    for (i, e) in s.heap.iter().enumerate() {
        if i > 0 {
            assert!(s.heap[(i - 1) / 2].count <= e.count, "heap order at {i}");
        }
        let at = s.index.find(e.hash, |&j| s.heap[j as usize].key == e.key);
        assert_eq!(at, Some(&(i as u32)), "index of entry {i}");
        assert!(e.error <= e.count);
    }
}

fn hash(key: &Key) -> u64 {
    // A poor hash on purpose: collisions must not confuse the index.
    text_of(key).len() as u64 % 3
}

proptest! {
    /// The space-saving guarantees, on any stream: a held count is never below the key's true
    /// count, nor is the count minus its error above it; a key without an entry had at most the
    /// floor; every key denied more than total / capacity times is held; and the summary stays
    /// consistent throughout, even when keys' hashes collide.
    #[test]
    fn a_summary_never_undercounts_and_holds_every_heavy_key(
        stream in prop::collection::vec((0u8..40, 1u64..4), 0..600),
        capacity in 1usize..12,
        colliding in any::<bool>(),
    ) {
        let hasher = RandomState::new();
        let mut summary = Summary::new(capacity);
        summary.clear(1);
        let mut truth: HashMap<u8, u64> = HashMap::new();
        for &(k, w) in &stream {
            let key = Key::from(format!("key-{k}"));
            let h = if colliding { hash(&key) } else { hasher.hash_one(&key) };
            summary.add(&key, h, w);
            *truth.entry(k).or_default() += w;
        }
        assert_consistent(&summary);
        let total: u64 = truth.values().sum();
        prop_assert_eq!(summary.total, total);
        for (k, &c) in &truth {
            let key = Key::from(format!("key-{k}"));
            let h = if colliding { hash(&key) } else { hasher.hash_one(&key) };
            match summary.find(&key, h) {
                Some(e) => {
                    prop_assert!(e.count >= c, "count {} below the true {c}", e.count);
                    prop_assert!(e.count - e.error <= c, "lower bound above the true {c}");
                    prop_assert!(e.error <= total / capacity as u64);
                }
                None => {
                    prop_assert!(c <= summary.floor());
                    prop_assert!(c <= total / capacity as u64, "heavy key {k} ({c}/{total}) lost");
                }
            }
        }
    }

    /// A report over several steps of a sliding period keeps the bounds: its count is never
    /// below what the key was denied in the steps still in the period, and its lower bound
    /// never above it; denials of steps that left the period are forgotten.
    #[test]
    fn a_report_bounds_the_denials_of_the_period(
        stream in prop::collection::vec((0u8..30, 0u64..8), 1..400),
        keys in 1usize..24,
    ) {
        let config = TopLimited::new().keys(keys).period(Duration::from_secs(4));
        let tracker = Tracker::new(&config, None, ["p"]).unwrap();
        // Times in whole seconds (a step is one second), never going back.
        let mut now = 0;
        let mut events = Vec::new();
        for &(k, advance) in &stream {
            now += advance / 4;
            tracker.record("p", &Key::from(format!("key-{k}")), now * 1_000_000);
            events.push((k, now));
        }
        let report = tracker.top("p", usize::MAX, now * 1_000_000);
        let in_period = |k: u8| events.iter().filter(|&&(e, t)| e == k && now - t < 4).count() as u64;
        let total: u64 = (0..30).map(in_period).sum();
        prop_assert_eq!(report.limited(), total);
        for limited in report.keys() {
            let text = limited.text().to_owned();
            let k: u8 = text.trim_start_matches("key-").parse().unwrap();
            prop_assert!(limited.count() >= in_period(k), "{text}: {limited:?}");
            prop_assert!(limited.count() - limited.error() <= in_period(k), "{text}: {limited:?}");
        }
        let counts: Vec<u64> = report.keys().iter().map(LimitedKey::count).collect();
        prop_assert!(counts.windows(2).all(|w| w[0] >= w[1]), "heaviest first: {counts:?}");
    }
}

/// A small deterministic generator (xorshift64*), so that the flood is the same on every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n as u64) as usize
    }
}

/// The case: 100,000 distinct keys, each denied once, shuffled among ten heavy keys
/// denied 20,000, 18,000, ... 2,000 times. The summary's memory is what it was after the first
/// denial, and the ten heaviest keys are reported in order, each count within its error of
/// the truth.
#[test]
fn a_flood_of_distinct_keys_keeps_the_memory_and_the_ten_heaviest() {
    let tracker = Tracker::new(&TopLimited::new(), None, ["per-ip"]).unwrap();
    let heavy: Vec<(String, u64)> = (0..10)
        .map(|i| (format!("heavy-{i}"), 20_000 - 2_000 * i as u64))
        .collect();
    let mut stream: Vec<String> = (0..100_000).map(|i| format!("flood-{i}")).collect();
    for (key, count) in &heavy {
        stream.extend(std::iter::repeat_n(key.clone(), *count as usize));
    }
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for i in (1..stream.len()).rev() {
        stream.swap(i, rng.below(i + 1));
    }
    let memory = tracker.footprint();
    for key in &stream {
        tracker.record("per-ip", &Key::from(key.as_str()), 5);
    }
    assert_eq!(tracker.footprint(), memory, "the summary grew");
    // What `TopLimited::new` says: 86 KiB.
    assert!(memory < 87 * 1024, "{memory} bytes for 256 keys");

    let report = tracker.top("per-ip", 10, 5);
    let total = stream.len() as u64;
    assert_eq!(report.limited(), total);
    let got: Vec<&str> = report.keys().iter().map(LimitedKey::text).collect();
    let want: Vec<&str> = heavy.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(got, want);
    for (limited, (_, count)) in report.keys().iter().zip(&heavy) {
        assert!(limited.count() >= *count, "{limited:?}");
        assert!(limited.count() - limited.error() <= *count, "{limited:?}");
        assert!(limited.error() <= total / 256, "{limited:?}");
        assert_eq!(limited.key(), Some(&Key::from(limited.text())));
    }
}

/// A period slides in quarter steps: denials leave the report once their step is a whole
/// period old, and a step's summary is used again from scratch.
#[test]
fn denials_leave_the_report_a_period_later() {
    let config = TopLimited::new().period(Duration::from_secs(60));
    let tracker = Tracker::new(&config, None, ["p"]).unwrap();
    let s = 1_000_000;
    for _ in 0..5 {
        tracker.record("p", &Key::from("early"), 0);
    }
    for _ in 0..3 {
        tracker.record("p", &Key::from("late"), 30 * s);
    }
    let at = |t: u64| {
        let report = tracker.top("p", 10, t);
        let keys: Vec<(String, u64)> = report
            .keys()
            .iter()
            .map(|k| (k.text().to_owned(), k.count()))
            .collect();
        (report.limited(), keys)
    };
    assert_eq!(
        at(59 * s),
        (8, vec![("early".into(), 5), ("late".into(), 3)])
    );
    // The step of 0-15 s leaves at 60 s.
    assert_eq!(at(60 * s), (3, vec![("late".into(), 3)]));
    assert_eq!(at(90 * s), (0, vec![]));
    // 60 s later the same step is used again, from scratch.
    tracker.record("p", &Key::from("again"), 60 * s);
    assert_eq!(
        at(61 * s),
        (4, vec![("late".into(), 3), ("again".into(), 1)])
    );
}

#[test]
fn keys_are_reported_as_text_hex_or_partition_keys() {
    assert_eq!(text_of(&Key::global()), "global");
    assert_eq!(
        text_of(&Key::from(std::net::IpAddr::from([203, 0, 113, 7]))),
        "203.0.113.7"
    );
    assert_eq!(text_of(&Key::from("alice")), "alice");
    assert_eq!(text_of(&Key::from([0xff, 0xfe].as_slice())), "0xfffe");
    assert_eq!(text_of(&Key::from("tab\there")), "0x7461620968657265");
    assert_eq!(text_of(&Key::from("")), "0x");

    let secret = b"0123456789abcdef-secret";
    let partition = PartitionKeys::new(secret).unwrap();
    let config = TopLimited::new().hashed();
    let tracker = Tracker::new(&config, Some(&partition), ["p"]).unwrap();
    tracker.record("p", &Key::from("alice"), 0);
    let report = tracker.top("p", 1, 0);
    assert_eq!(report.keys()[0].text(), partition.of(&Key::from("alice")));
    assert_eq!(report.keys()[0].key(), None);
}

#[test]
fn absurd_configurations_are_refused() {
    let partition = PartitionKeys::new(b"0123456789abcdef").unwrap();
    let refused =
        |c: TopLimited, p: Option<&PartitionKeys>| Tracker::new(&c, p, []).unwrap_err().to_string();
    assert!(refused(TopLimited::new().keys(0), None).contains("1 to 65536"));
    assert!(refused(TopLimited::new().keys(MAX_KEYS + 1), None).contains("1 to 65536"));
    let zero = TopLimited::new().period(Duration::ZERO);
    assert!(refused(zero, None).contains("1 second to 1 day"));
    let long = TopLimited::new().period(Duration::from_secs(86_401));
    assert!(refused(long, None).contains("1 second to 1 day"));
    assert!(refused(TopLimited::new().hashed(), None).contains("partition_keys"));
    assert!(Tracker::new(&TopLimited::new().hashed(), Some(&partition), []).is_ok());
    assert!(Tracker::new(&TopLimited::new().keys(1), None, []).is_ok());
}

#[test]
fn query_values_are_decoded() {
    assert_eq!(percent_decode("per%2Dip+x"), "per-ip x");
    assert_eq!(percent_decode("100%"), "100%");
    assert_eq!(percent_decode("%zz%4"), "%zz%4");
}
