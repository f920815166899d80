//! Serve mode with a model's KV layout and tiers below the GPU together:
//! every group's blocks go down and come back, the tiers are sized and
//! priced in the model's blocks, and a host tier turns evicted prefixes
//! into hits.

use std::num::NonZeroUsize;

use super::*;
use crate::{KvModel, KvSetup, TierSetup};

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
