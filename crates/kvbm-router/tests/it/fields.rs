//! What the router does with each field of vLLM's events: `medium` (kept
//! per medium; routing credits the device medium), `block_size` (one per
//! router; another is refused and counted) and `lora_name` (ignored: the
//! adapter is already in the hashes).

use std::sync::Arc;

use kvbm_blocks::{EventBatch, EventMessage};
use kvbm_events::{BlockHash, BlockRemoved, BlockStored, HashForm, KvEvent, WireFormat};
use kvbm_router::{KvAware, PrefixIndex, RouteRequest, Router, RouterError, WorkerId, WorkerStats};

use crate::stored;

/// A stored event of `keys` on `medium`, of `block_size` tokens per block.
fn stored_on(keys: &[u64], medium: Option<&str>, block_size: u32) -> KvEvent {
    let mut stored = BlockStored::new(
        keys.iter().map(|&k| BlockHash::Int(k)).collect(),
        None,
        Vec::new(),
        block_size,
    );
    stored.medium = medium.map(str::to_owned);
    KvEvent::BlockStored(stored)
}

fn removed_on(keys: &[u64], medium: Option<&str>) -> KvEvent {
    let mut removed = BlockRemoved::new(keys.iter().map(|&k| BlockHash::Int(k)).collect());
    removed.medium = medium.map(str::to_owned);
    KvEvent::BlockRemoved(removed)
}

fn router(workers: &[WorkerId]) -> Router {
    let router = Router::new();
    for &worker in workers {
        router.add_worker(worker).unwrap();
    }
    router
}

fn keys(keys: &[u64]) -> Vec<u128> {
    keys.iter().map(|&k| u128::from(k)).collect()
}

#[test]
fn a_removal_on_another_medium_leaves_the_device_copy() {
    let router = router(&[1]);
    router
        .apply(1, &stored_on(&[1, 2], Some("GPU"), 16))
        .unwrap();
    router.apply(1, &stored_on(&[1], Some("CPU"), 16)).unwrap();
    assert_eq!(
        router.stats(1).unwrap().held_blocks,
        3,
        "every medium counts"
    );
    // The CPU copy goes; the device copy still earns credit.
    router.apply(1, &removed_on(&[1], Some("CPU"))).unwrap();
    assert_eq!(router.index().overlaps(&keys(&[1, 2])), [(1, 2)]);
    assert_eq!(router.index().held_on(1, Some("CPU")), 0);
    // Block 2 was never on the CPU: an unknown removal, the device copy
    // stays.
    router.apply(1, &removed_on(&[2], Some("CPU"))).unwrap();
    assert_eq!(router.index().overlaps(&keys(&[1, 2])), [(1, 2)]);
    let stats = router.stats(1).unwrap();
    assert_eq!((stats.held_blocks, stats.unknown_removals), (2, 1));
    router.audit().unwrap();
}

#[test]
fn no_medium_and_gpu_are_both_the_device_medium() {
    let router = router(&[1]);
    router.apply(1, &stored_on(&[1, 2], None, 16)).unwrap();
    router.apply(1, &removed_on(&[1], Some("GPU"))).unwrap();
    router.apply(1, &stored_on(&[3], Some("GPU"), 16)).unwrap();
    router.apply(1, &removed_on(&[3], None)).unwrap();
    assert_eq!(router.index().held_on(1, None), 1);
    assert_eq!(router.index().held_on(1, Some("GPU")), 1);
    assert_eq!(router.index().holders(2), [1]);
    assert_eq!(router.stats(1).unwrap().unknown_removals, 0);
    assert_eq!(router.audit().unwrap().media, 1, "one medium, two names");
}

#[test]
fn routing_credits_the_device_medium_only() {
    let router = router(&[1, 2]);
    // Worker 1 offloaded the whole prompt to its CPU; worker 2 has its
    // first block on the GPU.
    router
        .apply(1, &stored_on(&[1, 2, 3], Some("CPU"), 16))
        .unwrap();
    router.apply(2, &stored_on(&[1], Some("GPU"), 16)).unwrap();
    let request_keys = keys(&[1, 2, 3]);
    let request = RouteRequest::new(&request_keys, 48, 16);
    let overlaps: Vec<(WorkerId, usize)> = (router.candidates(&request).iter())
        .map(|c| (c.worker, c.overlap_blocks))
        .collect();
    assert_eq!(overlaps, [(1, 0), (2, 1)]);
    assert_eq!(
        router.route(&request, &mut KvAware::new(0)).unwrap().worker,
        2
    );
    // What a policy weighing lower tiers could read.
    assert_eq!(
        router.index().overlaps_on(Some("CPU"), request.keys),
        [(1, 3)]
    );
    assert!(
        router
            .index()
            .overlaps_on(Some("DISK"), request.keys)
            .is_empty()
    );
    assert_eq!(router.index().holders(1), [2]);
}

#[test]
fn all_blocks_cleared_clears_every_medium() {
    let router = router(&[1]);
    router
        .apply(1, &stored_on(&[1, 2], Some("GPU"), 16))
        .unwrap();
    router.apply(1, &stored_on(&[3], Some("CPU"), 16)).unwrap();
    router.apply(1, &KvEvent::AllBlocksCleared).unwrap();
    assert!(router.index().is_empty());
    assert_eq!(router.stats(1).unwrap().held_blocks, 0);
    // Still live, and relearns from its next stores on any medium.
    router.apply(1, &stored_on(&[3], Some("CPU"), 16)).unwrap();
    assert_eq!(router.index().held_on(1, Some("CPU")), 1);
    router.audit().unwrap();
}

#[test]
fn media_past_the_limit_are_refused_and_change_nothing() {
    let router = router(&[1, 2]);
    let names: Vec<String> = (1..PrefixIndex::MAX_MEDIA)
        .map(|i| format!("tier{i}"))
        .collect();
    for (i, name) in names.iter().enumerate() {
        router
            .apply(1, &stored_on(&[i as u64], Some(name), 16))
            .unwrap();
    }
    let before = router.stats(1).unwrap();
    let audit = router.audit().unwrap();
    assert_eq!(audit.media, PrefixIndex::MAX_MEDIA);
    assert_eq!(
        router.apply(1, &stored_on(&[99], Some("one-too-many"), 16)),
        Err(RouterError::TooManyMedia {
            medium: "one-too-many".to_owned(),
            max: PrefixIndex::MAX_MEDIA
        })
    );
    let long = "m".repeat(PrefixIndex::MAX_MEDIUM_NAME + 1);
    assert_eq!(
        router.apply(1, &stored_on(&[99], Some(&long), 16)),
        Err(RouterError::MediumNameTooLong {
            len: long.len(),
            max: PrefixIndex::MAX_MEDIUM_NAME
        })
    );
    let after = router.stats(1).unwrap();
    assert_eq!(after.medium_refusals, 2);
    assert_eq!(without_refusals(after), without_refusals(before));
    assert_eq!(router.audit().unwrap(), audit, "nothing changed");
    assert!(router.index().holders(99).is_empty());
    // Known media, the device medium and removals on unknown ones still go.
    router
        .apply(2, &stored_on(&[5], Some("tier3"), 16))
        .unwrap();
    router.apply(2, &stored_on(&[5], None, 16)).unwrap();
    router
        .apply(2, &removed_on(&[5], Some("one-too-many")))
        .unwrap();
    let stats = router.stats(2).unwrap();
    assert_eq!((stats.held_blocks, stats.unknown_removals), (2, 1));
    assert_eq!(stats.medium_refusals, 0, "counted per worker");
}

/// `stats` with the refusal counters zeroed.
fn without_refusals(mut stats: WorkerStats) -> WorkerStats {
    stats.medium_refusals = 0;
    stats.block_size_refusals = 0;
    stats
}

#[test]
fn a_block_size_other_than_the_routers_is_refused_and_counted() {
    let router = Router::with_block_size(16);
    router.add_worker(1).unwrap();
    router.add_worker(2).unwrap();
    assert_eq!(router.block_size(), Some(16));
    assert_eq!(
        router.apply(1, &stored_on(&[1, 2], None, 32)),
        Err(RouterError::BlockSizeMismatch {
            worker: 1,
            router: 16,
            event: 32
        })
    );
    let stats = router.stats(1).unwrap();
    assert_eq!(stats.block_size_refusals, 1);
    assert_eq!((stats.held_blocks, stats.stored_blocks), (0, 0));
    assert!(router.index().is_empty(), "nothing stored");
    assert_eq!(router.stats(2).unwrap().block_size_refusals, 0);
    // Removals carry no block size; the right size goes.
    router.apply(1, &removed_on(&[1], None)).unwrap();
    router.apply(1, &stored_on(&[1, 2], None, 16)).unwrap();
    assert_eq!(router.index().overlaps(&keys(&[1, 2])), [(1, 2)]);
    let message = RouterError::BlockSizeMismatch {
        worker: 1,
        router: 16,
        event: 32,
    }
    .to_string();
    assert!(
        message.contains("16") && message.contains("32"),
        "{message}"
    );
}

#[test]
fn the_first_accepted_store_fixes_the_block_size() {
    let router = router(&[1, 2]);
    assert_eq!(router.block_size(), None);
    router.apply(1, &removed_on(&[1], None)).unwrap();
    router.apply(1, &KvEvent::AllBlocksCleared).unwrap();
    // A store refused for its medium fixes nothing.
    let long = "m".repeat(PrefixIndex::MAX_MEDIUM_NAME + 1);
    assert!(router.apply(1, &stored_on(&[1], Some(&long), 64)).is_err());
    assert_eq!(router.block_size(), None);
    router.apply(2, &stored_on(&[1], None, 32)).unwrap();
    assert_eq!(router.block_size(), Some(32));
    assert_eq!(
        router.apply(1, &stored_on(&[1], None, 16)),
        Err(RouterError::BlockSizeMismatch {
            worker: 1,
            router: 32,
            event: 16
        })
    );
    assert_eq!(router.index().holders(1), [2]);
}

#[test]
fn apply_message_stores_on_its_formats_medium_at_its_block_size() {
    let router = router(&[1]);
    let mut batch = EventBatch::new(1);
    batch.push_stored(None, &[1, 2], &[]);
    batch.push_removed(&[1]);
    let message = EventMessage::Batch(Arc::new(batch));
    let cpu = WireFormat::new(16)
        .with_hash_form(HashForm::Int64)
        .with_medium(Some("CPU".to_owned()));
    router.apply_message(1, &message, &cpu).unwrap();
    assert_eq!(router.index().held_on(1, Some("CPU")), 1);
    assert_eq!(router.index().held_on(1, None), 0);
    // The same pool's messages at another block size are refused, at
    // their first store, with nothing changed.
    let other = WireFormat::new(8).with_hash_form(HashForm::Int64);
    assert_eq!(
        router.apply_message(1, &message, &other),
        Err(RouterError::BlockSizeMismatch {
            worker: 1,
            router: 16,
            event: 8
        })
    );
    assert_eq!(router.index().held(1), 1);
    assert_eq!(router.stats(1).unwrap().block_size_refusals, 1);
    router.audit().unwrap();
}

/// vLLM hashes the adapter into each block's hash, so blocks of two
/// adapters already have different keys: the router ignores `lora_name`
/// (and `lora_id`), and a router fed events with and without them ends
/// the same.
#[test]
fn lora_name_is_ignored_since_adapters_are_in_the_hashes() {
    let plain = router(&[1]);
    let tagged = router(&[1]);
    let with_lora = |event: KvEvent, lora: &str| match event {
        KvEvent::BlockStored(mut stored) => {
            stored.lora_name = Some(lora.to_owned());
            stored.lora_id = Some(7);
            KvEvent::BlockStored(stored)
        }
        other => other,
    };
    for (event, lora) in [
        (stored(&[1, 2]), "adapter-a"),
        (stored(&[1, 3]), "adapter-b"),
        (crate::removed(&[2]), "adapter-a"),
    ] {
        plain.apply(1, &event).unwrap();
        tagged.apply(1, &with_lora(event, lora)).unwrap();
    }
    assert_eq!(tagged.stats(1), plain.stats(1));
    for request in [keys(&[1, 2]), keys(&[1, 3])] {
        assert_eq!(
            tagged.index().overlaps(&request),
            plain.index().overlaps(&request)
        );
    }
    // Same key, other adapter: one block (the engines' hashes would
    // differ if the adapters did).
    assert_eq!(tagged.index().held(1), 2);
}

#[test]
fn errors_are_send_sync_static_and_lowercase() {
    fn is_error<E: std::error::Error + Send + Sync + 'static>() {}
    is_error::<RouterError>();
    let errors = [
        RouterError::UnknownWorker(1),
        RouterError::DuplicateWorker(1),
        RouterError::BlockSizeMismatch {
            worker: 1,
            router: 16,
            event: 32,
        },
        RouterError::TooManyMedia {
            medium: "x".to_owned(),
            max: 8,
        },
        RouterError::MediumNameTooLong { len: 65, max: 64 },
        RouterError::InvariantViolated("x".to_owned()),
    ];
    for error in errors {
        let message = error.to_string();
        let first = message.chars().next().unwrap();
        assert!(first.is_lowercase() && !message.ends_with('.'), "{message}");
    }
}

/// With weights set, a worker holding a request's prefix in a lower tier
/// beats a cold one and loses to one holding it on its device; without
/// them, lower tiers earn nothing (as before).
#[test]
fn lower_tier_hits_are_credited_below_device_hits() {
    use kvbm_router::{KvAware, RouteRequest};
    let stored = |medium: &str, hashes: &[u64]| {
        KvEvent::BlockStored(
            BlockStored::new(
                hashes.iter().map(|&h| BlockHash::Int(h)).collect(),
                None,
                (0..16 * hashes.len() as u32).collect(),
                16,
            )
            .with_medium(medium),
        )
    };
    let request = RouteRequest::new(&[1, 2, 3, 4], 64, 16);
    let build = |weighted: bool| {
        let mut router = Router::new();
        if weighted {
            router = router
                .with_medium_weight("CPU", 0.6)
                .with_medium_weight("DISK", 0.3);
        }
        for worker in [1, 2, 3] {
            router.add_worker(worker).unwrap();
        }
        router.apply(2, &stored("GPU", &[1])).unwrap();
        router.apply(2, &stored("CPU", &[2, 3])).unwrap();
        router.apply(2, &stored("DISK", &[4])).unwrap();
        router.apply(3, &stored("GPU", &[1, 2, 3, 4])).unwrap();
        router
    };
    let router = build(true);
    let candidates = router.candidates(&request);
    assert_eq!(candidates[0].tier_credit, 0.0, "cold");
    assert_eq!(candidates[1].overlap_blocks, 1);
    assert!((candidates[1].tier_credit - (0.6 + 0.6 + 0.3)).abs() < 1e-9);
    assert_eq!(
        (candidates[2].overlap_blocks, candidates[2].tier_credit),
        (4, 0.0)
    );
    let policy = KvAware::new(0);
    let logits: Vec<f64> = candidates
        .iter()
        .map(|c| policy.logit(&request, c))
        .collect();
    assert!(logits[2] < logits[1] && logits[1] < logits[0], "{logits:?}");
    let plain = build(false);
    let candidates = plain.candidates(&request);
    assert_eq!(candidates[1].tier_credit, 0.0, "no weights, no credit");
    assert_eq!(candidates[1].overlap_blocks, 1);
}
