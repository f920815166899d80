//! Serve mode with tiers below the GPU: a prefix evicted from a small GPU
//! pool comes back from the host tier at the link's cost, the report counts
//! what each tier did, a tier slower than recomputing is not used, and
//! without tiers the report is what it was.

use super::*;
use crate::{Capacity, Link, Offload, TierSetup, Trace, TraceRequest};

pub(super) fn request(timestamp: u64, ids: &[u64], output: u64) -> TraceRequest {
    TraceRequest {
        timestamp,
        input_length: ids.len() as u64 * 512,
        output_length: output,
        hash_ids: ids.to_vec(),
        priority: None,
    }
}

/// The same 4-block (2,048-token) prompt at 0 s and 30 s, with different
/// prompts between them that push it out of a 4,096-token GPU pool.
fn trace() -> Trace {
    Trace::from_requests(vec![
        request(0, &[1, 2, 3, 4], 4),
        request(10_000, &[10, 11, 12, 13], 4),
        request(20_000, &[20, 21, 22, 23], 4),
        request(30_000, &[1, 2, 3, 4], 4),
    ])
    .unwrap()
}

fn config(tiers: TierSetup) -> ServeConfig {
    ServeConfig::new(16, Capacity::Tokens(4_096))
        .with_audit_every(1)
        .with_tiers(tiers)
}

fn run(config: &ServeConfig) -> ServeReport {
    let report = config.run(&trace()).unwrap();
    assert!(report.census.is_balanced(), "{:?}", report.census);
    assert_eq!(report.finished_requests(), 4);
    report
}

#[test]
fn an_evicted_prefix_comes_back_from_the_host_tier() {
    let plain = run(&config(TierSetup::default()));
    let host = run(&config(TierSetup::default().with_host_tokens(1 << 20)));
    let last = |r: &ServeReport| r.requests[3];
    assert_eq!(last(&plain).hit_tokens, 0, "evicted from the GPU");
    // Everything but the block holding the last prompt token.
    assert_eq!(last(&host).hit_tokens, 2048 - 16);
    assert!(last(&host).ttft().unwrap() < last(&plain).ttft().unwrap());
    let tiers = host.tiers.as_ref().unwrap();
    let cpu = &tiers.tiers[0];
    assert_eq!(cpu.medium, "CPU");
    assert_eq!((cpu.loaded_blocks, cpu.hit_tokens), (127, 127 * 16));
    assert!(
        cpu.stored_blocks >= 3 * 128,
        "write-through: every computed block"
    );
    let block_bytes = 16 * 128 * 1024;
    assert_eq!(cpu.bytes_loaded, 127 * block_bytes);
    assert_eq!(cpu.bytes_stored, cpu.stored_blocks * block_bytes);
    assert_eq!(
        (tiers.onboarding.requests, tiers.onboarding.blocks),
        (1, 127)
    );
    assert_eq!(tiers.onboarding.timeouts, 0);
    // The stall is what 127 blocks take over PCIe 5, as one transfer.
    let load = Link::PCIE5_X16.transfer_nanos(127 * block_bytes);
    let stall = tiers.onboarding.mean_stall.as_nanos() as u64;
    assert!(stall >= load, "{stall} < {load}");
    let json = host.to_json();
    assert_eq!(json["tiers"][0]["loaded_blocks"], 127);
    assert_eq!(json["onboarding"]["requests"], 1);
}

#[test]
fn without_tiers_the_report_is_as_before() {
    let plain = run(&config(TierSetup::default()));
    let json = plain.to_json();
    assert!(json.get("tiers").is_none() && json.get("onboarding").is_none());
    assert!(plain.tiers.is_none());
}

#[test]
fn a_disk_slower_than_recomputing_is_not_used() {
    // 1 Gbit/s: a 2 MiB block takes 16.8 ms to load, 0.8 ms to recompute
    // (and only the 5 blocks it moves in 100 ms are stored at a time).
    let mut slow = TierSetup::default().with_disk_tokens(1 << 20);
    slow.disk_link = Link {
        gbps: 1.0,
        setup_us: 0.0,
    };
    let plain = run(&config(TierSetup::default()));
    let disk = run(&config(slow));
    assert_eq!(disk.tiers.as_ref().unwrap().onboarding.declined, 1);
    assert_eq!(disk.tiers.as_ref().unwrap().onboarding.requests, 0);
    assert_eq!(disk.ttft, plain.ttft, "a slow disk makes TTFT no worse");
}

#[test]
fn every_policy_and_a_two_tier_stack_serve_every_request() {
    for offload in [
        Offload::WriteThrough,
        Offload::WriteBack,
        Offload::Selective(1),
    ] {
        let tiers = TierSetup::default()
            .with_host_tokens(4_096)
            .with_disk_tokens(1 << 20)
            .with_offload(offload);
        let report = run(&config(tiers));
        let figures = report.tiers.unwrap();
        assert_eq!(figures.tiers.len(), 2, "{offload}");
        assert_eq!(figures.tiers[1].medium, "DISK");
    }
}

#[test]
fn bad_tier_settings_are_refused() {
    let bad = [
        TierSetup::default().with_host_tokens(0),
        TierSetup::default().with_host_tokens(8),
        TierSetup::default().with_host_tokens(u64::MAX),
        TierSetup {
            kv_bytes_per_token: 0,
            ..TierSetup::default().with_host_tokens(1 << 20)
        },
        TierSetup {
            host_link: Link {
                gbps: f64::NAN,
                setup_us: 0.0,
            },
            ..TierSetup::default().with_host_tokens(1 << 20)
        },
        TierSetup {
            disk_link: Link {
                gbps: 1.0,
                setup_us: f64::INFINITY,
            },
            ..TierSetup::default().with_disk_tokens(1 << 20)
        },
    ];
    for tiers in bad {
        let err = config(tiers).run(&trace()).unwrap_err();
        assert!(matches!(err, SimError::InvalidTiers(_)), "{err}");
    }
}
