//! Arbitrary call sequences and engine reports against the tiers, checking
//! after every call: every pool's conservation and the transfers' books
//! (`audit`); no block in flight is ever handed out again (as a new
//! transfer's destination, or to a request); a block is matchable in a tier
//! only if a request computed it there (the device) or a copy into that
//! tier completed, so a failed, abandoned or unfinished copy never becomes
//! a hit; load sources stay where they are while in flight; bad reports
//! change nothing.

use std::collections::{HashMap, HashSet};

use kvbm_blocks::{BlockId, ImmutableBlock, SequenceHash};
use kvbm_tiers::{
    OffloadPolicy, Outcome, Settled, TierConfig, TierId, Tiers, Transfer, TransferId, TransferKind,
};
use proptest::prelude::*;

use crate::support::{BLOCK, Gpu, batch, chain, device};

#[derive(Clone, Debug)]
enum Op {
    /// A request computes a chain's blocks on the device and keeps them.
    Compute {
        seed: u8,
        len: u8,
    },
    /// A running request finishes: its blocks go to the device's cache.
    Finish(u8),
    /// A request's blocks are offered for offload.
    Offload(u8),
    /// A prefix is matched on the device and its hits recorded.
    Hit {
        seed: u8,
        len: u8,
    },
    WriteBack,
    Onboard {
        seed: u8,
        len: u8,
        max: u8,
    },
    /// Other requests take (and give back) device blocks, evicting.
    Pressure(u8),
    Report {
        pick: u16,
        ok: bool,
    },
    Abandon(u16),
    /// A report of a transfer that was never planned.
    Bogus(u64),
    /// A request's blocks copied down at once.
    OffloadNow(u8),
    /// A prefix brought up at once.
    OnboardNow {
        seed: u8,
        len: u8,
        max: u8,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..6, 1u8..6).prop_map(|(seed, len)| Op::Compute { seed, len }),
        3 => any::<u8>().prop_map(Op::Finish),
        3 => any::<u8>().prop_map(Op::Offload),
        2 => (0u8..6, 1u8..6).prop_map(|(seed, len)| Op::Hit { seed, len }),
        1 => Just(Op::WriteBack),
        3 => (0u8..6, 1u8..6, 0u8..8).prop_map(|(seed, len, max)| Op::Onboard { seed, len, max }),
        2 => (1u8..8).prop_map(Op::Pressure),
        6 => (any::<u16>(), prop::bool::weighted(0.8)).prop_map(|(pick, ok)| Op::Report { pick, ok }),
        1 => any::<u16>().prop_map(Op::Abandon),
        1 => any::<u64>().prop_map(Op::Bogus),
        2 => any::<u8>().prop_map(Op::OffloadNow),
        2 => (0u8..6, 1u8..6, 0u8..8).prop_map(|(seed, len, max)| Op::OnboardNow { seed, len, max }),
    ]
}

fn policy() -> impl Strategy<Value = OffloadPolicy> {
    prop_oneof![
        Just(OffloadPolicy::WriteThrough),
        (0u8..4).prop_map(|min_hits| OffloadPolicy::Selective { min_hits }),
        Just(OffloadPolicy::WriteBack),
    ]
}

/// What the checker knows.
#[derive(Default)]
struct Model {
    /// Per tier level: hash values that may be matchable there.
    valid: Vec<HashSet<u128>>,
    /// Transfers handed out and not settled.
    in_flight: HashMap<TransferId, Transfer>,
    abandoned: HashSet<TransferId>,
}

impl Model {
    /// Blocks of `tier` some transfer in flight reads or writes.
    fn busy(&self, tier: TierId) -> HashSet<BlockId> {
        let mut busy = HashSet::new();
        for transfer in self.in_flight.values() {
            for (source, destination) in transfer.pairs() {
                if transfer.source == tier {
                    busy.insert(source);
                }
                if transfer.destination == tier {
                    busy.insert(destination);
                }
            }
        }
        busy
    }

    /// Blocks of `tier` some transfer in flight reads, with the hash each
    /// is read for.
    fn sources(&self, tier: TierId) -> HashMap<BlockId, u128> {
        let mut sources = HashMap::new();
        for transfer in self.in_flight.values().filter(|t| t.source == tier) {
            for ((source, _), hash) in transfer.pairs().zip(&transfer.hashes) {
                sources.insert(source, hash.value());
            }
        }
        sources
    }

    /// Takes the newly planned transfers, checking none reuses a block in
    /// flight as its destination.
    fn take(&mut self, tiers: &mut Tiers<Gpu>) -> Result<(), TestCaseError> {
        let mut planned = Vec::new();
        tiers.take_planned(&mut planned);
        for transfer in planned {
            let busy = self.busy(transfer.destination);
            for (_, destination) in transfer.pairs() {
                prop_assert!(
                    !busy.contains(&destination),
                    "a destination in flight reused"
                );
            }
            prop_assert_eq!(transfer.hashes.len(), transfer.blocks());
            prop_assert!(self.in_flight.insert(transfer.id, transfer).is_none());
        }
        Ok(())
    }
}

fn universe() -> Vec<SequenceHash> {
    (0..6).flat_map(|seed| chain(seed, 6)).collect()
}

fn run(
    sizes: (usize, usize, usize),
    policies: (OffloadPolicy, OffloadPolicy),
    ops: &[Op],
) -> Result<(), TestCaseError> {
    let device = device(sizes.0);
    let configs = vec![
        TierConfig::new("CPU", sizes.1)
            .with_offload(policies.0)
            .with_write_back_headroom(2)
            .with_max_incoming_blocks(6),
        TierConfig::new("DISK", sizes.2)
            .with_offload(policies.1)
            .with_write_back_headroom(2),
    ];
    let mut tiers = Tiers::new(device.clone(), configs).unwrap();
    let universe = universe();
    let mut model = Model {
        valid: vec![HashSet::new(); 3],
        ..Model::default()
    };
    let mut running: Vec<Vec<ImmutableBlock<Gpu>>> = Vec::new();
    let mut loaded: Vec<kvbm_blocks::ImmutableBlocks<Gpu>> = Vec::new();
    for op in ops {
        match op {
            Op::Compute { seed, len } => {
                let hashes = chain(u128::from(*seed), usize::from(*len));
                let matched = device.match_blocks(&hashes);
                let rest = &hashes[matched.len()..];
                if let Ok(blocks) = device.allocate_blocks(rest.len()) {
                    let busy = model.busy(TierId::DEVICE);
                    for block in &blocks {
                        prop_assert!(
                            !busy.contains(&block.block_id()),
                            "a device block in flight handed out"
                        );
                    }
                    let staged = (blocks.into_iter().zip(rest))
                        .map(|(block, &hash)| block.stage(hash, BLOCK).unwrap())
                        .collect();
                    let registered = device.register_blocks(staged).unwrap();
                    for block in registered.iter() {
                        model.valid[0].insert(block.hash_value());
                    }
                    let mut all: Vec<ImmutableBlock<Gpu>> = matched.into_iter().collect();
                    all.extend(registered);
                    running.push(all);
                }
            }
            Op::Finish(i) => {
                if !running.is_empty() {
                    running.swap_remove(usize::from(*i) % running.len());
                }
                loaded.clear();
            }
            Op::Offload(i) => {
                if !running.is_empty() {
                    let blocks = running[usize::from(*i) % running.len()].clone();
                    tiers.offload(blocks);
                }
            }
            Op::Hit { seed, len } => {
                let matched = device.match_blocks(&chain(u128::from(*seed), usize::from(*len)));
                tiers.record_hits(&matched);
            }
            Op::WriteBack => tiers.write_back(),
            Op::Onboard { seed, len, max } => {
                let hashes = chain(u128::from(*seed), usize::from(*len));
                let on_device = device.match_blocks(&hashes);
                let rest = &hashes[on_device.len()..];
                let found = tiers.lookup(rest);
                let onboard = tiers.onboard(rest, usize::from(*max));
                prop_assert!(onboard.blocks <= usize::from(*max));
                prop_assert!(onboard.blocks <= found.iter().sum::<usize>());
            }
            Op::OffloadNow(i) => {
                if !running.is_empty() {
                    let blocks = &running[usize::from(*i) % running.len()];
                    // Computed on the device: a completed copy is valid
                    // wherever it lands.
                    for level in 1..model.valid.len() {
                        for block in blocks {
                            model.valid[level].insert(block.sequence_hash().value());
                        }
                    }
                    tiers.offload_now(&batch(blocks));
                }
            }
            Op::OnboardNow { seed, len, max } => {
                let hashes = chain(u128::from(*seed), usize::from(*len));
                let on_device = device.match_blocks(&hashes);
                let rest = &hashes[on_device.len()..];
                let busy = model.busy(TierId::DEVICE);
                let reading = model.sources(TierId::DEVICE);
                let (blocks, from) = tiers.onboard_now(rest, usize::from(*max));
                prop_assert!(blocks.len() <= usize::from(*max));
                // The prefix, by registry key (the toy chains collide).
                let values = |hashes: &[SequenceHash]| -> Vec<u128> {
                    hashes.iter().map(|hash| hash.value()).collect()
                };
                prop_assert_eq!(
                    values(&blocks.sequence_hashes()),
                    values(&rest[..blocks.len()])
                );
                if !blocks.is_empty() {
                    prop_assert_eq!(from.iter().sum::<usize>(), blocks.len());
                }
                for block in blocks.iter() {
                    // A loaded hash the device already holds comes back as
                    // that block (deduplicated): sharing a registered block
                    // that a store is reading is reading it too. Any other
                    // block in flight (a load's destination, or a source
                    // under another hash: reused) must not come back.
                    let shared = reading.get(&block.block_id()) == Some(&block.hash_value());
                    prop_assert!(
                        shared || !busy.contains(&block.block_id()),
                        "a device block in flight handed out"
                    );
                    let value = block.hash_value();
                    prop_assert!(
                        (1..model.valid.len()).any(|level| model.valid[level].contains(&value)),
                        "loaded a copy that never completed"
                    );
                    // Loaded, and copied at once into any selective tier
                    // below that now takes it.
                    for valid in &mut model.valid {
                        valid.insert(value);
                    }
                }
                loaded.push(blocks);
            }
            Op::Pressure(n) => {
                if let Ok(blocks) = device.allocate_blocks(usize::from(*n)) {
                    let busy = model.busy(TierId::DEVICE);
                    for block in &blocks {
                        prop_assert!(
                            !busy.contains(&block.block_id()),
                            "a device block in flight handed out"
                        );
                    }
                }
            }
            Op::Report { pick, ok } => {
                model.take(&mut tiers)?;
                let mut ids: Vec<TransferId> = model.in_flight.keys().copied().collect();
                ids.sort();
                if let Some(&id) = ids.get(usize::from(*pick) % ids.len().max(1)) {
                    let transfer = model.in_flight.remove(&id).unwrap();
                    let abandoned = model.abandoned.remove(&id);
                    let outcome = if *ok {
                        Outcome::Completed
                    } else {
                        Outcome::Failed
                    };
                    let settled = tiers.settle_all(&[(id, outcome)]).unwrap().pop().unwrap();
                    match (&settled, ok, abandoned) {
                        (Settled::Stored { tier, .. }, true, false) => {
                            prop_assert_eq!(*tier, transfer.destination);
                            for hash in &transfer.hashes {
                                model.valid[tier.level()].insert(hash.value());
                            }
                        }
                        (Settled::Loaded { blocks, .. }, true, false) => {
                            prop_assert_eq!(transfer.kind, TransferKind::Load);
                            for block in blocks.iter() {
                                model.valid[0].insert(block.hash_value());
                            }
                        }
                        (Settled::Dropped { failed, .. }, _, _) => {
                            prop_assert_eq!(*failed, !*ok);
                            prop_assert!(!*ok || abandoned);
                        }
                        (other, ok, abandoned) => {
                            prop_assert!(false, "{other:?} for ok={ok} abandoned={abandoned}");
                        }
                    }
                    if let Settled::Loaded { blocks, .. } = settled {
                        loaded.push(blocks);
                    }
                }
            }
            Op::Abandon(pick) => {
                model.take(&mut tiers)?;
                let mut ids: Vec<TransferId> = model.in_flight.keys().copied().collect();
                ids.sort();
                if let Some(&id) = ids.get(usize::from(*pick) % ids.len().max(1)) {
                    tiers.abandon(id).unwrap();
                    model.abandoned.insert(id);
                }
            }
            Op::Bogus(raw) => {
                let before = tiers.transfer_counts();
                // A number never handed out, or one already settled.
                let raw = if raw % 2 == 0 {
                    before.planned.saturating_add(*raw)
                } else {
                    raw % before.planned.max(1)
                };
                let id = TransferId::from_raw(raw);
                if !model.in_flight.contains_key(&id) && !tiers.in_flight(id) {
                    prop_assert!(tiers.complete(id).is_err());
                    prop_assert!(tiers.fail(id).is_err());
                    prop_assert!(tiers.abandon(id).is_err());
                    prop_assert!(tiers.settle_all(&[(id, Outcome::Completed)]).is_err());
                }
                prop_assert_eq!(tiers.transfer_counts(), before);
            }
        }
        model.take(&mut tiers)?;
        tiers
            .audit()
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        device
            .audit()
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        // Matchable only where a request computed it or a copy completed.
        let present = device.scan_matches(&universe);
        for (hash, present) in universe.iter().zip(present) {
            prop_assert!(
                !present || model.valid[0].contains(&hash.value()),
                "device holds an unfinished copy"
            );
        }
        for tier in tiers.lower_ids().collect::<Vec<_>>() {
            let present = tiers.pool(tier).unwrap().scan_matches(&universe);
            for (hash, present) in universe.iter().zip(present) {
                prop_assert!(
                    !present || model.valid[tier.level()].contains(&hash.value()),
                    "{} holds an unfinished copy",
                    tier
                );
            }
        }
        // A load's sources stay in their tier while it is in flight.
        for transfer in model
            .in_flight
            .values()
            .filter(|t| t.kind == TransferKind::Load)
        {
            let pool = tiers.pool(transfer.source).unwrap();
            prop_assert!(pool.scan_matches(&transfer.hashes).into_iter().all(|p| p));
        }
    }
    // The engine reports everything: nothing stays pinned.
    model.take(&mut tiers)?;
    loop {
        let ids: Vec<TransferId> = model.in_flight.drain().map(|(id, _)| id).collect();
        if ids.is_empty() {
            break;
        }
        for id in ids {
            tiers.complete(id).unwrap();
        }
        model.take(&mut tiers)?;
    }
    drop(running);
    drop(loaded);
    let audit = tiers
        .audit()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    prop_assert_eq!(audit.in_flight, 0);
    prop_assert_eq!(device.metrics().in_use_blocks, 0, "every pin released");
    for tier in tiers.lower_ids().collect::<Vec<_>>() {
        prop_assert_eq!(tiers.pool(tier).unwrap().metrics().in_use_blocks, 0);
    }
    Ok(())
}

fn cases() -> u32 {
    std::env::var("KVBM_FUZZ_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(256)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn fuzz_no_block_in_flight_is_reused_and_no_failed_copy_is_a_hit(
        sizes in (2usize..12, 1usize..10, 1usize..14),
        policies in (policy(), policy()),
        ops in prop::collection::vec(op(), 0..120),
    ) {
        run(sizes, policies, &ops)?;
    }
}
