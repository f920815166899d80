//! Routes offered a shortlist ([`Offer::LeastWorkAtEachDepth`]) choose what
//! the same policy chooses among every worker, draw for draw, and the
//! shortlist is short.

use kvbm_events::{BlockHash, BlockStored, KvEvent};
use kvbm_router::{
    Candidate, Decision, KvAware, LeastLoaded, Offer, Policy, RouteRequest, Router, WorkerLoad,
};
use proptest::prelude::*;

/// `P`, offered every worker.
struct Everyone<P>(P);

impl<P: Policy> Policy for Everyone<P> {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn choose(&mut self, request: &RouteRequest<'_>, candidates: &[Candidate]) -> Option<usize> {
        self.0.choose(request, candidates)
    }
}

/// `P`, recording what it was offered.
struct Recording<P>(P, Vec<Vec<Candidate>>);

impl<P: Policy> Recording<P> {
    fn counts(&self) -> Vec<usize> {
        self.1.iter().map(Vec::len).collect()
    }
}

impl<P: Policy> Policy for Recording<P> {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn choose(&mut self, request: &RouteRequest<'_>, candidates: &[Candidate]) -> Option<usize> {
        self.1.push(candidates.to_vec());
        self.0.choose(request, candidates)
    }

    fn offer(&self) -> Offer {
        self.0.offer()
    }
}

/// Block `i` (from 1) of chain `c`: chains share nothing.
fn key(chain: u64, i: u64) -> u64 {
    chain << 8 | i
}

fn stored_on(keys: impl Iterator<Item = u64>, medium: Option<&str>) -> KvEvent {
    let stored = BlockStored::new(keys.map(BlockHash::Int).collect(), None, Vec::new(), 16);
    KvEvent::BlockStored(match medium {
        Some(medium) => stored.with_medium(medium),
        None => stored,
    })
}

/// A load field: small values (many ties), values around the offer's
/// bound of 2^32 tokens, and huge ones.
fn field() -> impl Strategy<Value = u64> {
    prop_oneof![
        6 => 0..4u64,
        2 => 0..3_000u64,
        1 => ((1u64 << 32) - 3)..((1u64 << 32) + 3),
        1 => (1u64 << 28)..(1u64 << 29),
        1 => (u64::MAX - 3)..=u64::MAX,
    ]
}

#[derive(Clone, Debug)]
struct Worker {
    id: u64,
    load: (u64, u64, u64),
    /// Blocks of chain 0 and 1 held on the device, and on the CPU past them.
    device: [u64; 2],
    cpu: [u64; 2],
}

fn worker() -> impl Strategy<Value = Worker> {
    (
        0..64u64,
        (field(), field(), field()),
        [0..4u64, 0..4u64],
        [0..3u64, 0..3u64],
    )
        .prop_map(|(id, load, device, cpu)| Worker {
            id,
            load,
            device,
            cpu,
        })
}

#[derive(Clone, Debug)]
struct Request {
    chain: u64,
    blocks: u64,
    prompt_tokens: usize,
    block_size: usize,
}

fn request() -> impl Strategy<Value = Request> {
    (
        0..3u64,
        0..8u64,
        prop_oneof![
            6 => 0..600usize,
            1 => ((1usize << 32) - 2)..((1usize << 32) + 2),
        ],
        prop_oneof![
            3 => Just(16usize),
            1 => Just(0usize),
            1 => Just(1usize),
            1 => Just(64usize),
            1 => ((1usize << 16) - 1)..((1usize << 16) + 1),
        ],
    )
        .prop_map(|(chain, blocks, prompt_tokens, block_size)| Request {
            chain,
            blocks,
            prompt_tokens,
            block_size,
        })
}

fn router(workers: &[Worker], tiers: bool) -> Router {
    let router = if tiers {
        Router::new().with_medium_weight("CPU", 0.5)
    } else {
        Router::new()
    };
    for w in workers {
        if router.add_worker(w.id).is_err() {
            continue; // a duplicate id: the first one stands
        }
        let (active, queued, running) = w.load;
        (router.set_load(w.id, WorkerLoad::new(active, queued, running))).expect("live");
        for chain in 0..2u64 {
            let (device, cpu) = (w.device[chain as usize], w.cpu[chain as usize]);
            let on_device = (1..=device).map(|i| key(chain, i));
            (router.apply(w.id, &stored_on(on_device, None))).expect("live");
            let on_cpu = (device + 1..=device + cpu).map(|i| key(chain, i));
            (router.apply(w.id, &stored_on(on_cpu, Some("CPU")))).expect("live");
        }
    }
    router
}

/// Each request routed by `shortlisted` and by `everyone` (the same
/// policy, offered every worker), in turn: the same decisions, and what
/// the shortlist offered is every worker's own candidate, in worker order.
fn same_routes<P: Policy>(
    router: &Router,
    requests: &[Request],
    shortlisted: P,
    everyone: &mut dyn Policy,
) -> Result<(), TestCaseError> {
    let mut shortlisted = Recording(shortlisted, Vec::new());
    for r in requests {
        let keys: Vec<u128> = (1..=r.blocks)
            .map(|i| u128::from(key(r.chain, i)))
            .collect();
        let request = RouteRequest::new(&keys, r.prompt_tokens, r.block_size);
        let short: Option<Decision> = router.route(&request, &mut shortlisted);
        prop_assert_eq!(short, router.route(&request, everyone), "{:?}", r);
        let offered = shortlisted.1.pop().unwrap_or_default();
        let all = router.candidates(&request);
        prop_assert!(
            offered.windows(2).all(|w| w[0].worker < w[1].worker),
            "{:?}",
            offered
        );
        for candidate in &offered {
            prop_assert!(
                all.contains(candidate),
                "{:?} not among {:?}",
                candidate,
                all
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(crate::cases()))]

    /// KV-aware (its defaults) and least-loaded choose the same worker
    /// from the shortlist as from every worker, request after request
    /// (so their draws stay in step), with ties, holders at every depth,
    /// lower-tier credit, and loads and prompts on both sides of the
    /// shortlist's bounds.
    #[test]
    fn fuzz_a_shortlist_routes_as_everyone_would(
        workers in prop::collection::vec(worker(), 1..24),
        requests in prop::collection::vec(request(), 1..8),
        tiers in any::<bool>(),
        seed in any::<u64>(),
    ) {
        let router = router(&workers, tiers);
        same_routes(
            &router,
            &requests,
            KvAware::new(seed),
            &mut Everyone(KvAware::new(seed)),
        )?;
        same_routes(&router, &requests, LeastLoaded, &mut Everyone(LeastLoaded))?;
    }
}

/// Among 1,000 workers with loads of their own, 600 holding the whole
/// request, one half of it and the rest nothing: kv-aware is offered the
/// least-loaded worker of each of the three, and chooses as it would among
/// everyone.
#[test]
fn a_route_among_many_workers_offers_few() {
    let router = Router::new();
    for w in 0..1_000u64 {
        router.add_worker(w).expect("fresh");
        // 7,919 is prime to 1,000: every worker's load differs.
        let load = WorkerLoad::new(1 + (w * 7_919) % 1_000, 0, 1);
        router.set_load(w, load).expect("live");
    }
    let keys: Vec<u128> = (1..=8).map(|i| u128::from(key(0, i))).collect();
    for w in 0..600 {
        let whole = stored_on((1..=8).map(|i| key(0, i)), None);
        router.apply(w, &whole).expect("live");
    }
    let half = stored_on((1..=4).map(|i| key(0, i)), None);
    router.apply(700, &half).expect("live");
    let request = RouteRequest::new(&keys, 8 * 16, 16);
    let mut recording = Recording(KvAware::new(3), Vec::new());
    let decision = router.route(&request, &mut recording);
    assert_eq!(recording.counts(), [3], "one worker of each depth");
    let depths: Vec<usize> = recording.1[0].iter().map(|c| c.overlap_blocks).collect();
    assert_eq!(depths.iter().filter(|&&d| d == 8).count(), 1);
    assert!(depths.contains(&4) && depths.contains(&0), "{depths:?}");
    assert_eq!(
        decision,
        router.route(&request, &mut Everyone(KvAware::new(3)))
    );
    // A weight other than 1 weighs everyone.
    let mut weighted = Recording(KvAware::new(3).with_overlap_weight(2.0), Vec::new());
    router.route(&request, &mut weighted);
    assert_eq!(weighted.counts(), [1_000]);
}
