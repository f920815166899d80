//! Serve mode with a model's KV layout and tiers below the GPU together:
//! every group's blocks go down and come back, the tiers are sized and
//! priced in the model's blocks, a host tier turns evicted prefixes into
//! hits, and with a data plane every group's loaded bytes are its own.

use std::num::NonZeroUsize;

use super::*;
use crate::{DataPlaneSpec, KvModel, KvSetup, NoProgress, TierSetup};

/// The first `requests` requests of the embedded conversation excerpt.
fn excerpt(requests: usize) -> Trace {
    let mut trace = Trace::conversation_excerpt().unwrap();
    trace.truncate(NonZeroUsize::new(requests).unwrap());
    trace
}

/// gpt-oss-120b in 2 GB of GPU memory (a few requests' worth), so
/// prefixes are evicted and come back only from a lower tier.
fn gpt_oss(full_attention_only: bool) -> KvSetup {
    let mut kv = KvSetup::new(KvModel::preset("gpt-oss-120b").unwrap(), 2_000_000_000);
    kv.full_attention_only = full_attention_only;
    kv
}

const HOST_TOKENS: u64 = 1 << 21;

fn run(trace: &Trace, kv: KvSetup, tiers: TierSetup) -> ServeReport {
    let config = ServeConfig::default()
        .with_kv(kv)
        .with_tiers(tiers)
        .with_audit_every(64);
    let report = config.run(trace).unwrap();
    assert!(report.census.is_balanced(), "{:?}", report.census);
    report
}

#[test]
fn a_host_tier_brings_evicted_prefixes_of_every_group_back() {
    let trace = excerpt(100);
    let without = run(&trace, gpt_oss(false), TierSetup::default());
    let host = TierSetup::default().with_host_tokens(HOST_TOKENS);
    let with = run(&trace, gpt_oss(false), host);
    // The same requests finish (those longer than the GPU end at
    // admission either way).
    assert_eq!(with.finished_requests(), without.finished_requests());
    let tiers = with.tiers.as_ref().expect("a tier report");
    assert!(tiers.onboarding.requests > 0, "{:?}", tiers.onboarding);
    assert!(
        with.hits.token_hit_rate() > without.hits.token_hit_rate(),
        "{} against {}",
        with.hits.token_hit_rate(),
        without.hits.token_hit_rate()
    );
    let cpu = &tiers.tiers[0];
    assert!(cpu.hit_tokens > 0 && cpu.loaded_blocks > 0, "{cpu:?}");
    // The tier holds the model's blocks, two groups' worth per 16 tokens.
    let block_bytes = with.kv.as_ref().unwrap().block_bytes;
    assert_eq!(cpu.capacity_blocks as u64, 2 * HOST_TOKENS / 16);
    assert_eq!(cpu.bytes_stored, cpu.stored_blocks * block_bytes);
    assert_eq!(cpu.bytes_loaded, cpu.loaded_blocks * block_bytes);
}

#[test]
fn a_tier_holds_the_same_bytes_with_or_without_groups() {
    let trace = excerpt(40);
    let host = TierSetup::default().with_host_tokens(HOST_TOKENS);
    let grouped = run(&trace, gpt_oss(false), host);
    let full = run(&trace, gpt_oss(true), host);
    let bytes = |report: &ServeReport| {
        let blocks = report.tiers.as_ref().unwrap().tiers[0].capacity_blocks as u64;
        blocks * report.kv.as_ref().unwrap().block_bytes
    };
    assert_eq!(bytes(&grouped), bytes(&full));
    assert_eq!(bytes(&full), HOST_TOKENS * 36 * 2 * 8 * 64 * 2);
}

#[test]
fn a_tier_the_models_blocks_overflow_is_refused() {
    let host = TierSetup::default().with_host_tokens(u64::MAX);
    let config = ServeConfig::default()
        .with_kv(gpt_oss(false))
        .with_tiers(host);
    assert!(matches!(config.validate(), Err(SimError::InvalidTiers(_))));
}

#[test]
fn a_data_plane_brings_every_groups_blocks_back_byte_for_byte() {
    // Small blocks (two layers of each kind, 64 bytes a token and layer)
    // keep the real bytes few; a GPU of a few requests evicts prefixes.
    let model = KvModel::parse_layers("sliding_window:32:2,full:2", 64).unwrap();
    let kv = KvSetup::new(model, 3_000_000);
    let host = TierSetup::default().with_host_tokens(1 << 17);
    let config = ServeConfig::default()
        .with_kv(kv)
        .with_tiers(host)
        .with_audit_every(64);
    let trace = excerpt(25);
    let replay = |spec: Option<&DataPlaneSpec>| {
        let report = replay_with_data_plane(&trace, &config, &mut NoProgress, None, spec).unwrap();
        assert!(report.census.is_balanced(), "{:?}", report.census);
        report
    };
    let plain = replay(None);
    let real = replay(Some(&DataPlaneSpec::Host));
    let simulated = |report: &ServeReport| {
        let mut json = report.to_json();
        let map = json.as_object_mut().unwrap();
        for wall in ["data_plane", "replay_ms", "scheduler_ms"] {
            map.remove(wall);
        }
        json
    };
    assert_eq!(simulated(&plain), simulated(&real));
    let data = real.data_plane.as_ref().unwrap();
    let cpu = &real.tiers.as_ref().unwrap().tiers[0];
    assert!(cpu.loaded_blocks > 0, "{cpu:?}");
    // Each group's blocks carry their group in their hash, so a window
    // block landing where a full block belongs would not verify.
    assert_eq!(data.loaded_blocks, cpu.loaded_blocks);
    assert_eq!(
        (data.verified_blocks, data.wrong_blocks),
        (cpu.loaded_blocks, 0)
    );
    let block_bytes = real.kv.as_ref().unwrap().block_bytes;
    assert_eq!(data.block_bytes, block_bytes);
    assert_eq!(block_bytes, 16 * 2 * 64);
    assert_eq!(data.bytes_read, cpu.loaded_blocks * block_bytes);
    assert_eq!(data.bytes_written, cpu.stored_blocks * block_bytes);
}
