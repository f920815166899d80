//! The shipped policies, on candidates written out by hand.

use kvbm_router::{
    Candidate, KvAware, LeastLoaded, Policy, Random, RoundRobin, RouteRequest, WorkerLoad,
};

fn candidate(worker: u64, overlap_blocks: usize, active: u64, queued: u64) -> Candidate {
    Candidate::new(
        worker,
        overlap_blocks,
        WorkerLoad::new(active, queued, active / 4),
    )
}

/// A 10-block (160-token) request.
const REQUEST: RouteRequest<'static> = RouteRequest::new(&[], 160, 16);

fn picks(policy: &mut dyn Policy, candidates: &[Candidate], n: usize) -> Vec<usize> {
    (0..n)
        .map(|_| policy.choose(&REQUEST, candidates).unwrap())
        .collect()
}

#[test]
fn no_candidates_no_choice() {
    let policies: [&mut dyn Policy; 4] = [
        &mut Random::new(1),
        &mut RoundRobin::new(),
        &mut LeastLoaded,
        &mut KvAware::new(1),
    ];
    for policy in policies {
        assert_eq!(policy.choose(&REQUEST, &[]), None, "{}", policy.name());
    }
}

#[test]
fn round_robin_takes_turns() {
    let c = [
        candidate(1, 0, 0, 0),
        candidate(2, 0, 0, 0),
        candidate(3, 0, 0, 0),
    ];
    assert_eq!(picks(&mut RoundRobin::new(), &c, 5), [0, 1, 2, 0, 1]);
}

#[test]
fn random_is_seeded_and_reaches_everyone() {
    let c: Vec<Candidate> = (0..4).map(|w| candidate(w, 0, 0, 0)).collect();
    let a = picks(&mut Random::new(42), &c, 400);
    assert_eq!(
        a,
        picks(&mut Random::new(42), &c, 400),
        "same seed, same draws"
    );
    assert_ne!(a, picks(&mut Random::new(43), &c, 400));
    for i in 0..4 {
        let share = a.iter().filter(|&&p| p == i).count();
        assert!(
            (60..140).contains(&share),
            "worker {i} drawn {share} times of 400"
        );
    }
}

#[test]
fn least_loaded_weighs_queued_tokens_and_active_blocks() {
    // Work in tokens: 10*16 + 0 = 160; 2*16 + 200 = 232; 4*16 + 64 = 128.
    let c = [
        candidate(1, 9, 10, 0),
        candidate(2, 0, 2, 200),
        candidate(3, 0, 4, 64),
    ];
    assert_eq!(picks(&mut LeastLoaded, &c, 1), [2]);
}

#[test]
fn kv_aware_trades_cached_blocks_against_load_by_dynamos_cost() {
    let policy = KvAware::new(0);
    // Worker 1 caches 8 of 10 blocks but decodes 30; worker 2 caches none
    // and decodes 5.
    let warm = candidate(1, 8, 30, 0);
    let cold = candidate(2, 0, 5, 0);
    // logit = 1 × prefill + decode: warm 2 + (30 + 10) = 42, cold 10 + 15 = 25.
    assert_eq!(policy.logit(&REQUEST, &warm), 42.0);
    assert_eq!(policy.logit(&REQUEST, &cold), 25.0);
    assert_eq!(picks(&mut KvAware::new(0), &[warm, cold], 1), [1]);
    // Weighting cached blocks 4×: warm 8 + 40 = 48, cold 40 + 15 = 55.
    let mut heavy = KvAware::new(0).with_overlap_weight(4.0);
    assert_eq!(picks(&mut heavy, &[warm, cold], 1), [0]);
    // Queued prefill counts as prefill work: 320 queued tokens are 20 blocks.
    let queued = candidate(3, 10, 0, 320);
    assert_eq!(policy.logit(&REQUEST, &queued), 20.0 + 10.0);
    // An overlap longer than the prompt is capped at the prompt.
    assert_eq!(policy.logit(&REQUEST, &candidate(4, 99, 0, 0)), 10.0);
}

#[test]
fn kv_aware_breaks_ties_at_random_and_temperature_spreads_choices() {
    let tied = [
        candidate(1, 0, 5, 0),
        candidate(2, 0, 5, 0),
        candidate(3, 0, 50, 0),
    ];
    let chosen = picks(&mut KvAware::new(9), &tied, 200);
    assert!(chosen.contains(&0) && chosen.contains(&1) && !chosen.contains(&2));
    // With temperature, even the worst is chosen sometimes; the best most.
    let spread = picks(&mut KvAware::new(9).with_temperature(1.0), &tied, 3000);
    let count = |i| spread.iter().filter(|&&p| p == i).count();
    assert!(count(2) > 0 && count(2) < count(0) && count(2) < count(1));
    // A tiny temperature is practically greedy.
    let greedy = picks(&mut KvAware::new(9).with_temperature(1e-6), &tied, 200);
    assert!(!greedy.contains(&2));
    // Nonsense settings mean the defaults' extremes, never a NaN choice.
    let mut odd = KvAware::new(1)
        .with_temperature(f64::NAN)
        .with_overlap_weight(-3.0);
    assert_eq!(odd.choose(&REQUEST, &tied).map(|i| i < 2), Some(true));
}

proptest::proptest! {
    /// Without temperature, KV-aware always picks a candidate at the
    /// lowest logit (ties, NaN credits and huge loads included), and the
    /// same ones for the same seed.
    #[test]
    fn kv_aware_picks_a_lowest_logit_reproducibly(
        workers in proptest::collection::vec(
            (0usize..12, 0u64..6, 0u64..3, proptest::sample::select(vec![0.0, 0.5, f64::NAN])),
            1..12,
        ),
        seed: u64,
        huge: bool,
    ) {
        let scale = if huge { u64::MAX / 8 } else { 1 };
        let candidates: Vec<Candidate> = (workers.iter().enumerate())
            .map(|(i, &(overlap, active, queued, credit))| {
                let load = WorkerLoad::new(active.saturating_mul(scale), queued * 16, active);
                let mut candidate = Candidate::new(i as u64, overlap, load);
                candidate.tier_credit = credit;
                candidate
            })
            .collect();
        let logits: Vec<f64> = (candidates.iter())
            .map(|c| KvAware::new(0).logit(&REQUEST, c))
            .collect();
        let min = logits.iter().copied().fold(f64::INFINITY, f64::min);
        let (mut first, mut second) = (KvAware::new(seed), KvAware::new(seed));
        let chosen = picks(&mut first, &candidates, 64);
        proptest::prop_assert_eq!(&chosen, &picks(&mut second, &candidates, 64));
        for &i in &chosen {
            proptest::prop_assert_eq!(logits[i], min);
        }
    }
}
