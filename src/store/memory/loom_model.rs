//! The memory store's concurrent parts under the loom model checker, which runs each test in
//! every interleaving of its threads' atomic operations and locks (bounded by
//! `LOOM_MAX_PREEMPTIONS`): a lone word decided by compare-and-swap, words claimed together,
//! a counted word claimed alone, both racing; the exclusive lock's concurrency slots; a
//! reload's new definition met during decisions. Built only with `--cfg loom`
//! (`scripts/loom.sh`).

use std::sync::Arc;

use loom::thread;

use super::MemoryStore;
use crate::clock::ManualClock;
use crate::decision::Decision;
use crate::key::{GlobalKey, Key, KeyExtractor};
use crate::policy::{Policy, Tier};
use crate::store::private::Sealed;
use crate::store::{Check, Op};

/// A store of one shard on a clock that does not move (or `store`), and the first tier of each
/// policy, registered in it (a name already there takes the new definition, as a reload does).
fn store_with(store: Option<&MemoryStore>, policies: &[Policy]) -> (MemoryStore, Vec<Arc<Tier>>) {
    let store = store.cloned().unwrap_or_else(|| {
        MemoryStore::builder()
            .shards(1)
            .clock(ManualClock::new())
            .build()
    });
    let key: Arc<dyn KeyExtractor> = Arc::new(GlobalKey);
    let prepared: Vec<_> = policies
        .iter()
        .map(|p| p.prepare(None).expect("a valid policy"))
        .collect();
    let tiers: Vec<_> = prepared.iter().flat_map(|p| p.tiers()).collect();
    let mut registered = store
        .register(&tiers, &|_| true)
        .expect("registered")
        .into_iter();
    let tiers = prepared
        .into_iter()
        .map(|p| {
            let policy = p.build(&key, &None, &mut registered, &mut std::iter::empty());
            policy.tier(0).clone()
        })
        .collect();
    (store, tiers)
}

/// One request of `cost` against `tiers` on the key "k", each check `op`.
fn run_checks(store: &MemoryStore, tiers: &[Arc<Tier>], cost: u64, op: Op) -> Decision {
    let checks: Vec<Check> = tiers
        .iter()
        .map(|t| Check::new(t.clone(), Key::from("k"), cost, op))
        .collect();
    store.check_locked(&checks)
}

/// What `tier` has left for "k" (a look: nothing charged).
fn remaining(store: &MemoryStore, tier: &Arc<Tier>) -> u64 {
    run_checks(store, std::slice::from_ref(tier), 0, Op::Enforce).outcomes()[0].remaining()
}

/// Runs `f` on `n` threads (the first on this one); how many were admitted.
fn race(n: usize, f: impl Fn(usize) -> bool + Send + Sync + 'static) -> usize {
    let f = loom::sync::Arc::new(f);
    let others: Vec<_> = (1..n)
        .map(|i| {
            let f = f.clone();
            thread::spawn(move || f(i))
        })
        .collect();
    let mut admitted = usize::from(f(0));
    for t in others {
        admitted += usize::from(t.join().expect("no panic"));
    }
    admitted
}

#[test]
fn three_lone_words_admit_exactly_what_is_left() {
    // A GCRA key already charged once: its state is a packed word, decided by
    // compare-and-swap. Three threads race for the two units left: two are admitted.
    loom::model(|| {
        let (store, tiers) = store_with(None, &[Policy::gcra("3/min")]);
        assert!(run_checks(&store, &tiers, 1, Op::Enforce).is_allowed());
        assert_eq!(remaining(&store, &tiers[0]), 2);
        let (s, t) = (store.clone(), tiers.clone());
        let admitted = race(3, move |_| run_checks(&s, &t, 1, Op::Enforce).is_allowed());
        assert_eq!(admitted, 2);
        assert_eq!(remaining(&store, &tiers[0]), 0);
    });
}

/// The first of `policies` with one unit left decided alone on one thread, and beside the
/// second (both packed, their words claimed) on another: exactly one is admitted, and the
/// second, which had `left` units, is charged only if the request of both was.
fn lone_races_claimed(policies: [Policy; 2], left: u64) {
    loom::model(move || {
        let (store, tiers) = store_with(None, &policies);
        assert!(run_checks(&store, &tiers, 1, Op::Enforce).is_allowed());
        let (s, t) = (store.clone(), tiers.clone());
        let both = loom::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = both.clone();
        let admitted = race(2, move |i| {
            let allowed =
                run_checks(&s, if i == 0 { &t[..1] } else { &t }, 1, Op::Enforce).is_allowed();
            if i == 1 && allowed {
                seen.store(true, std::sync::atomic::Ordering::Relaxed);
            }
            allowed
        });
        assert_eq!(admitted, 1);
        assert_eq!(remaining(&store, &tiers[0]), 0);
        let both = both.load(std::sync::atomic::Ordering::Relaxed);
        assert_eq!(remaining(&store, &tiers[1]), left - u64::from(both));
    });
}

#[test]
fn claimed_words_race_a_lone_word_and_charge_all_or_none() {
    // A GCRA (compare-and-swap alone) with one unit left races a request of it and a fixed
    // window with two left.
    lone_races_claimed([Policy::gcra("2/min"), Policy::fixed_window("3/min")], 2);
}

#[test]
fn a_counted_word_alone_races_it_claimed_beside_another() {
    // A fixed window (a word and a count, claimed even alone) with one unit left races a
    // request of it and a GCRA with nine left.
    lone_races_claimed([Policy::fixed_window("2/min"), Policy::gcra("10/min")], 9);
}

#[test]
fn two_claimers_of_one_key_charge_all_or_none() {
    // Two requests of the same two packed policies, their words claimed: of one unit left in
    // the GCRA, one is admitted, and the window is charged once.
    loom::model(|| {
        let (store, tiers) = store_with(
            None,
            &[Policy::gcra("2/min"), Policy::fixed_window("3/min")],
        );
        assert!(run_checks(&store, &tiers, 1, Op::Enforce).is_allowed());
        let (s, t) = (store.clone(), tiers.clone());
        let admitted = race(2, move |_| run_checks(&s, &t, 1, Op::Enforce).is_allowed());
        assert_eq!(admitted, 1);
        assert_eq!(remaining(&store, &tiers[0]), 0);
        assert_eq!(remaining(&store, &tiers[1]), 1);
    });
}

#[test]
fn concurrency_slots_are_never_granted_twice() {
    // A concurrency limit of one, decided under the exclusive lock: of two requests racing,
    // one holds the slot; once it gives the slot back, a third takes it.
    loom::model(|| {
        let (store, tiers) = store_with(None, &[Policy::concurrency(1)]);
        let (s, t) = (store.clone(), tiers.clone());
        let grants = loom::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let kept = grants.clone();
        let admitted = race(2, move |_| {
            let decision = run_checks(&s, &t, 1, Op::Concurrency);
            if let Some(grant) = decision.outcomes()[0].held() {
                kept.lock().expect("not poisoned").push(grant.end);
            }
            decision.is_allowed()
        });
        assert_eq!(admitted, 1);
        assert!(!run_checks(&store, &tiers, 1, Op::Concurrency).is_allowed());
        let end = grants.lock().expect("not poisoned")[0];
        run_checks(&store, &tiers, 1, Op::Release { at: end });
        assert!(run_checks(&store, &tiers, 1, Op::Concurrency).is_allowed());
    });
}

#[test]
fn a_reload_met_during_decisions_loses_no_charge() {
    // A fixed window charged once; one thread decides under its definition while another
    // registers a larger one under the same name (a reload) and decides under it: the
    // state is converted back and forth as each meets it, and both charges are counted.
    loom::model(|| {
        let (store, old) = store_with(None, &[Policy::fixed_window("5/min").name("w")]);
        assert!(run_checks(&store, &old, 1, Op::Enforce).is_allowed());
        let s = store.clone();
        let reloading = thread::spawn(move || {
            let (s, new) = store_with(Some(&s), &[Policy::fixed_window("10/min").name("w")]);
            assert!(run_checks(&s, &new, 1, Op::Enforce).is_allowed());
            new
        });
        assert!(run_checks(&store, &old, 1, Op::Enforce).is_allowed());
        let new = reloading.join().expect("no panic");
        assert_eq!(remaining(&store, &new[0]), 7);
    });
}
