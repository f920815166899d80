//! [`Policy`]: how a worker is chosen among the candidates, and the four
//! this crate ships: random, round-robin, least-loaded and KV-aware.

use crate::{WorkerId, WorkerLoad};

/// One request, as a policy sees it.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct RouteRequest<'a> {
    /// Its blocks' keys, prefix first (see [`block_key`](crate::block_key)).
    pub keys: &'a [u128],
    /// Its prompt length in tokens.
    pub prompt_tokens: usize,
    /// Tokens per block (the engines').
    pub block_size: usize,
}

impl<'a> RouteRequest<'a> {
    /// A request of `prompt_tokens` tokens whose blocks of `block_size`
    /// tokens have `keys`, prefix first.
    pub const fn new(keys: &'a [u128], prompt_tokens: usize, block_size: usize) -> Self {
        Self {
            keys,
            prompt_tokens,
            block_size,
        }
    }

    /// Blocks the prompt fills (the last one possibly partial).
    pub fn prompt_blocks(&self) -> usize {
        self.prompt_tokens.div_ceil(self.block_size.max(1))
    }
}

/// One worker the request could go to.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct Candidate {
    /// Who.
    pub worker: WorkerId,
    /// Leading blocks of the request it holds on its device (from its KV
    /// events).
    pub overlap_blocks: usize,
    /// The blocks past those that it holds in lower tiers (host, disk), each
    /// weighed by its medium's weight ([`Router::with_medium_weight`](crate::Router::with_medium_weight));
    /// 0 with no weights set. A block worth 0.5 costs half its prefill.
    pub tier_credit: f64,
    /// Its last reported load.
    pub load: WorkerLoad,
}

impl Candidate {
    /// A candidate with no lower-tier credit.
    pub fn new(worker: WorkerId, overlap_blocks: usize, load: WorkerLoad) -> Self {
        Self {
            worker,
            overlap_blocks,
            tier_credit: 0.0,
            load,
        }
    }
}

/// Chooses a worker for a request. Implement it to route your own way; the
/// router hands over every live worker, in worker order, or the shortlist
/// the policy asks for with [`offer`](Self::offer).
pub trait Policy {
    /// A short name for reports (`"kv-aware"`).
    fn name(&self) -> &str;

    /// The index in `candidates` of the chosen worker (`None` only when
    /// there are none).
    fn choose(&mut self, request: &RouteRequest<'_>, candidates: &[Candidate]) -> Option<usize>;

    /// Which workers [`choose`](Self::choose) must see: every live worker
    /// (the default), or a shortlist ([`Offer`]) that a policy may ask for
    /// only if its choice among every worker is always on it, and is the
    /// same whether it is offered everyone or the shortlist.
    fn offer(&self) -> Offer {
        Offer::Everyone
    }
}

/// The workers a [`Router`](crate::Router) offers a [`Policy`], in worker
/// order either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Offer {
    /// Every live worker.
    Everyone,
    /// For each number of the request's leading blocks a worker holds on
    /// its device (none included), the workers holding that many with the
    /// least work, ties included: queued prefill tokens plus active blocks
    /// times the request's block size (at least 1), the integer
    /// [`LeastLoaded`] and [`KvAware`] order equally placed workers by.
    /// With medium weights ([`Router::with_medium_weight`](crate::Router::with_medium_weight))
    /// every worker holding something on any medium is offered, and of the
    /// rest those with the least work. A route then builds a few
    /// candidates in a pass over the loads, not one for every worker.
    /// Everyone is offered instead when some least work reaches 2^32
    /// tokens, the prompt 2^32 tokens or the block size 2^16, where a
    /// policy computing in `f64` could no longer order different work
    /// exactly.
    LeastWorkAtEachDepth,
}

/// A small seeded generator (SplitMix64): policies must be reproducible
/// from a seed, and need a few draws per request, not a crypto RNG.
#[derive(Clone, Debug)]
struct Draws(u64);

impl Draws {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next()) * n as u128) >> 64) as usize
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Any worker, uniformly (seeded).
#[derive(Clone, Debug)]
pub struct Random(Draws);

impl Random {
    /// Draws from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(Draws(seed))
    }
}

impl Policy for Random {
    fn name(&self) -> &str {
        "random"
    }

    fn choose(&mut self, _: &RouteRequest<'_>, candidates: &[Candidate]) -> Option<usize> {
        (!candidates.is_empty()).then(|| self.0.below(candidates.len()))
    }
}

/// Each worker in turn.
#[derive(Clone, Debug, Default)]
pub struct RoundRobin {
    next: usize,
}

impl RoundRobin {
    /// Starting with the first worker.
    pub fn new() -> Self {
        Self::default()
    }
}

impl Policy for RoundRobin {
    fn name(&self) -> &str {
        "round-robin"
    }

    fn choose(&mut self, _: &RouteRequest<'_>, candidates: &[Candidate]) -> Option<usize> {
        if candidates.is_empty() {
            return None;
        }
        let chosen = self.next % candidates.len();
        self.next = self.next.wrapping_add(1);
        Some(chosen)
    }
}

/// The worker with the least work: fewest queued prefill tokens plus
/// active blocks' tokens, then fewest running requests, then the first.
#[derive(Clone, Debug, Default)]
pub struct LeastLoaded;

impl Policy for LeastLoaded {
    fn name(&self) -> &str {
        "least-loaded"
    }

    /// The least work anywhere is the least at some depth, and every
    /// worker at it is offered (in order, so the first of the ties is the
    /// same).
    fn offer(&self) -> Offer {
        Offer::LeastWorkAtEachDepth
    }

    fn choose(&mut self, request: &RouteRequest<'_>, candidates: &[Candidate]) -> Option<usize> {
        let block_size = request.block_size.max(1) as u64;
        (candidates.iter().enumerate())
            .min_by_key(|(_, c)| {
                let work = (c.load.queued_prefill_tokens)
                    .saturating_add(c.load.active_blocks.saturating_mul(block_size));
                (work, c.load.running_requests)
            })
            .map(|(i, _)| i)
    }
}

/// NVIDIA Dynamo's KV router cost: for each worker,
///
/// ```text
/// logit = overlap_weight × prefill_blocks + decode_blocks
/// prefill_blocks = (queued prefill tokens + prompt tokens not cached there) / block size
/// decode_blocks  = active blocks + the request's blocks
/// ```
///
/// where a block cached in a lower tier counts as cached by its medium's
/// weight ([`Candidate::tier_credit`]): loading it is cheaper than
/// computing it, dearer than finding it on the device.
///
/// and the lowest logit wins (ties drawn at random). With a temperature
/// above zero the choice is a softmax draw over the logits normalized to
/// `0..=1`, `p ∝ exp(-logit / temperature)`, which spreads load when
/// several workers are nearly as good.
#[derive(Clone, Debug)]
pub struct KvAware {
    overlap_weight: f64,
    temperature: f64,
    draws: Draws,
    logits: Vec<f64>,
}

impl KvAware {
    /// Dynamo's defaults: overlap weight 1, temperature 0; draws from `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            overlap_weight: 1.0,
            temperature: 0.0,
            draws: Draws(seed),
            logits: Vec::new(),
        }
    }

    /// How much a cached block is worth against an active one (Dynamo's
    /// `--kv-overlap-score-weight`); negative or non-finite means 0.
    pub fn with_overlap_weight(mut self, weight: f64) -> Self {
        self.overlap_weight = if weight.is_finite() {
            weight.max(0.0)
        } else {
            0.0
        };
        self
    }

    /// Softmax temperature (Dynamo's `--router-temperature`); negative or
    /// non-finite means 0 (always the best).
    pub fn with_temperature(mut self, temperature: f64) -> Self {
        self.temperature = if temperature.is_finite() {
            temperature.max(0.0)
        } else {
            0.0
        };
        self
    }

    /// The logit of one candidate.
    pub fn logit(&self, request: &RouteRequest<'_>, candidate: &Candidate) -> f64 {
        self.logit_of(&LogitTerms::of(request), candidate)
    }

    /// [`logit`](Self::logit), with the request's terms worked out once
    /// for all candidates (the same operations in the same order, so the
    /// same bits).
    fn logit_of(&self, terms: &LogitTerms, candidate: &Candidate) -> f64 {
        let cached_tokens =
            (candidate.overlap_blocks.saturating_mul(terms.block_size)).min(terms.prompt_tokens);
        let credit = if candidate.tier_credit.is_finite() {
            candidate.tier_credit.max(0.0)
        } else {
            0.0
        };
        let new_tokens = ((terms.prompt_tokens - cached_tokens) as f64
            - credit * terms.block_size as f64)
            .max(0.0);
        let prefill_blocks =
            (candidate.load.queued_prefill_tokens as f64 + new_tokens) / terms.block_size_f64;
        let decode_blocks = candidate.load.active_blocks as f64 + terms.prompt_blocks;
        self.overlap_weight * prefill_blocks + decode_blocks
    }
}

/// What [`KvAware::logit`] reads of the request, the same for every
/// candidate.
struct LogitTerms {
    block_size: usize,
    /// At least 1.
    block_size_f64: f64,
    prompt_tokens: usize,
    prompt_blocks: f64,
}

impl LogitTerms {
    fn of(request: &RouteRequest<'_>) -> Self {
        Self {
            block_size: request.block_size,
            block_size_f64: request.block_size.max(1) as f64,
            prompt_tokens: request.prompt_tokens,
            prompt_blocks: request.prompt_blocks() as f64,
        }
    }
}

impl Policy for KvAware {
    fn name(&self) -> &str {
        "kv-aware"
    }

    /// A shortlist with the default weight and temperature: workers that
    /// hold the same leading blocks (and no lower tier's) then have the
    /// logit `(work + tokens to compute) / block size + prompt blocks`
    /// (work as [`Offer::LeastWorkAtEachDepth`] counts it), so more work
    /// is a higher logit by at least `1 / block size`, far above the
    /// rounding of values below the offer's bounds: the lowest logit and
    /// every tie at it are on the shortlist, in the same order, and the
    /// same draw picks the same worker. Any other weight or temperature
    /// weighs every worker's exact logit, so everyone is offered.
    fn offer(&self) -> Offer {
        if self.overlap_weight == 1.0 && self.temperature == 0.0 {
            Offer::LeastWorkAtEachDepth
        } else {
            Offer::Everyone
        }
    }

    fn choose(&mut self, request: &RouteRequest<'_>, candidates: &[Candidate]) -> Option<usize> {
        if candidates.is_empty() {
            return None;
        }
        let mut logits = std::mem::take(&mut self.logits);
        logits.clear();
        let terms = LogitTerms::of(request);
        // The logits, their minimum and how many reach it, in one pass (a
        // NaN reaches nothing, as `f64::min` skips it).
        let (mut min, mut ties) = (f64::INFINITY, 0usize);
        logits.extend(candidates.iter().map(|c| {
            let logit = self.logit_of(&terms, c);
            if logit < min {
                (min, ties) = (logit, 1);
            } else if logit == min {
                ties += 1;
            }
            logit
        }));
        let max = match self.temperature == 0.0 {
            true => min,
            false => logits.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        };
        let chosen = if max == min {
            // Ties at the minimum drawn uniformly.
            let pick = self.draws.below(ties);
            (logits.iter().enumerate())
                .filter(|(_, l)| **l == min)
                .nth(pick)
                .map(|(i, _)| i)
        } else {
            let weights = logits
                .iter()
                .map(|l| (-((l - min) / (max - min)) / self.temperature).exp());
            let total: f64 = weights.clone().sum();
            let mut target = self.draws.unit() * total;
            let mut chosen = candidates.len() - 1;
            for (i, weight) in weights.enumerate() {
                if target < weight {
                    chosen = i;
                    break;
                }
                target -= weight;
            }
            Some(chosen)
        };
        self.logits = logits;
        chosen
    }
}
