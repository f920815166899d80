//! Serve mode with a model's KV layout ([`ServeConfig::kv`]): presets over
//! the embedded excerpt, `full_attention_only` against today's replay, and
//! every refusal.

use std::num::NonZeroUsize;

use kvbm_queue::SchedulerConfig;
use kvbm_sequence::{AttentionKind, GroupError};

use super::*;
use crate::{Capacity, KvModel, KvSetup};

/// The first `requests` requests of the embedded conversation excerpt.
fn excerpt(requests: usize) -> Trace {
    let mut trace = Trace::conversation_excerpt().unwrap();
    trace.truncate(NonZeroUsize::new(requests).unwrap());
    trace
}

fn setup(model: &str, capacity_bytes: u64) -> KvSetup {
    KvSetup::new(KvModel::preset(model).unwrap(), capacity_bytes)
}

fn run(trace: &Trace, kv: KvSetup) -> ServeReport {
    let config = ServeConfig::default().with_kv(kv).with_audit_every(64);
    let report = config.run(trace).unwrap();
    assert!(report.census.is_balanced(), "{:?}", report.census);
    report
}

fn kv(report: &ServeReport) -> &KvReport {
    report.kv.as_ref().expect("a model's report has kv")
}

#[test]
fn gpt_oss_finishes_every_request_with_hits_and_small_windows() {
    let trace = excerpt(150);
    // 10 GB: 16,954 blocks of 16 tokens × 18 layers × 2 KiB.
    let report = run(&trace, setup("gpt-oss-120b", 10_000_000_000));
    assert_eq!(report.capacity_blocks, 16_954);
    assert_eq!(report.finished_requests(), trace.len() as u64);
    assert!(report.hits.hit_tokens > 0, "{:?}", report.hits);
    let kv = kv(&report);
    assert_eq!((kv.model, kv.full_attention_only), ("gpt-oss-120b", false));
    assert_eq!((kv.layers_per_block, kv.block_bytes), (18, 589_824));
    let [full, window] = kv.groups.as_slice() else {
        panic!("{:?}", kv.groups)
    };
    assert_eq!((full.kind, full.layers), (AttentionKind::Full, 18));
    assert_eq!(
        (window.kind, window.layers),
        (AttentionKind::SlidingWindow { window: 128 }, 18)
    );
    // A 128-token window keeps a few blocks per request, the full layers
    // every block of every prompt.
    assert!(
        window.peak_blocks * 10 < full.peak_blocks,
        "{window:?} vs {full:?}"
    );
    assert!(kv.peak_blocks_in_use <= report.capacity_blocks);
    assert_eq!(
        kv.peak_kv_bytes(),
        kv.peak_blocks_in_use as u64 * kv.block_bytes
    );
    // The JSON carries it all; the text summary too.
    let json = report.to_json();
    assert_eq!(json["model"], "gpt-oss-120b");
    assert_eq!(json["peak_kv_bytes"], kv.peak_kv_bytes());
    let groups = json["kv_groups"].as_array().unwrap();
    assert_eq!(groups.len(), 2);
    assert_eq!(groups[0]["kind"], "full");
    assert!(groups[0]["window"].is_null() && groups[0]["chunk"].is_null());
    assert_eq!(groups[1]["kind"], "sliding_window");
    assert_eq!(groups[1]["window"], 128);
    assert_eq!(groups[1]["peak_blocks"], window.peak_blocks);
    assert!(report.to_string().contains("KV: gpt-oss-120b"));
}

#[test]
fn full_attention_only_keeps_more_bytes_per_token_at_the_same_capacity() {
    let trace = excerpt(150);
    let run_with = |bytes: u64, max_running: usize, full_only: bool| {
        let kv = setup("gpt-oss-120b", bytes).with_full_attention_only(full_only);
        let scheduler = SchedulerConfig::default().with_max_running(max_running);
        let config = (ServeConfig::default().with_kv(kv))
            .with_scheduler(scheduler)
            .with_audit_every(256);
        let report = config.run(&trace).unwrap();
        assert_eq!(report.finished_requests(), trace.len() as u64);
        report
    };
    // Memory to spare (100 GB, at most 16 running): the same schedule,
    // and every token's KV in all 36 layers takes about twice the bytes
    // of 18 full layers and 18 windows.
    let (grouped, full) = (
        run_with(100_000_000_000, 16, false),
        run_with(100_000_000_000, 16, true),
    );
    let (g, f) = (kv(&grouped), kv(&full));
    assert_eq!(f.groups.len(), 1);
    assert_eq!(
        (f.groups[0].kind, f.groups[0].layers),
        (AttentionKind::Full, 36)
    );
    // Half the blocks: each holds all 36 layers.
    assert_eq!(f.block_bytes, 2 * g.block_bytes);
    assert_eq!(full.capacity_blocks, grouped.capacity_blocks / 2);
    assert_eq!(full.requests, grouped.requests);
    assert!(
        f.peak_kv_bytes() as f64 > 1.5 * g.peak_kv_bytes() as f64,
        "{} vs {}",
        f.peak_kv_bytes(),
        g.peak_kv_bytes()
    );
    // Memory short (10 GB): both fill it, and the groups run more
    // requests in it at once.
    let (grouped, full) = (
        run_with(10_000_000_000, 256, false),
        run_with(10_000_000_000, 256, true),
    );
    assert!(
        grouped.max_running > full.max_running,
        "{} vs {}",
        grouped.max_running,
        full.max_running
    );
}

#[test]
fn full_attention_only_is_todays_replay_in_the_same_blocks() {
    let trace = excerpt(120);
    let kv = setup("gemma-3-27b", 8_000_000_000).with_full_attention_only(true);
    let with_model = run(&trace, kv);
    let plain = ServeConfig::new(16, Capacity::Blocks(with_model.capacity_blocks as u64))
        .with_audit_every(64)
        .run(&trace)
        .unwrap();
    assert_eq!(with_model.requests, plain.requests);
    assert_eq!(with_model.hits, plain.hits);
    assert_eq!(
        (with_model.steps, with_model.preemptions),
        (plain.steps, plain.preemptions)
    );
    // Only the model's fields are added.
    let (mut json, plain_json) = (with_model.to_json(), plain.to_json());
    let map = json.as_object_mut().unwrap();
    for key in [
        "model",
        "full_attention_only",
        "capacity_bytes",
        "layers_per_block",
        "kv_block_bytes",
        "kv_groups",
        "peak_blocks_in_use",
        "peak_kv_bytes",
    ] {
        assert!(map.remove(key).is_some(), "{key}");
        assert!(plain_json.get(key).is_none(), "{key}");
    }
    let mut plain_json = plain_json;
    for wall_time in ["replay_ms", "scheduler_ms"] {
        map.remove(wall_time);
        plain_json.as_object_mut().unwrap().remove(wall_time);
    }
    assert_eq!(json, plain_json);
    assert!(plain.kv.is_none());
}

#[test]
fn gemma_and_llama_4_run_their_groups() {
    let trace = excerpt(60);
    let gemma = run(&trace, setup("gemma-3-27b", 10_000_000_000));
    let groups = &kv(&gemma).groups;
    assert_eq!(groups.len(), 7);
    assert_eq!(gemma.finished_requests(), trace.len() as u64);
    // Each 1,024-token window group holds far less than the full group.
    for window in &groups[1..] {
        assert!(window.peak_blocks < groups[0].peak_blocks, "{groups:?}");
    }
    let scout = run(&trace, setup("llama-4-scout", 10_000_000_000));
    let groups = &kv(&scout).groups;
    assert_eq!(groups.len(), 4);
    assert_eq!(scout.finished_requests(), trace.len() as u64);
    for chunk in &groups[1..] {
        assert_eq!(chunk.kind, AttentionKind::ChunkedLocal { chunk: 8192 });
        assert!(chunk.peak_blocks <= groups[0].peak_blocks, "{groups:?}");
    }
}

#[test]
fn gpt_oss_speculates_with_its_groups() {
    // Three drafts a step, 70% accepted: every request finishes in fewer
    // steps than without drafts, and the windows still hold only what
    // they read (plus the drafts' slots).
    let trace = excerpt(60);
    let plain = run(&trace, setup("gpt-oss-120b", 10_000_000_000));
    let config = ServeConfig::default()
        .with_kv(setup("gpt-oss-120b", 10_000_000_000))
        .with_scheduler(SchedulerConfig::default().with_speculative_tokens(3))
        .with_spec_accept(0.7)
        .with_audit_every(16);
    let spec = config.run(&trace).unwrap();
    assert!(spec.census.is_balanced(), "{:?}", spec.census);
    assert_eq!(spec.finished_requests(), plain.finished_requests());
    assert!(spec.spec_accepted_tokens > 0);
    assert!(spec.spec_accepted_tokens < spec.spec_proposed_tokens);
    assert!(
        spec.steps < plain.steps,
        "{} against {}",
        spec.steps,
        plain.steps
    );
    let window = &kv(&spec).groups[1];
    assert_eq!(window.kind, AttentionKind::SlidingWindow { window: 128 });
    assert!(window.peak_blocks < kv(&spec).groups[0].peak_blocks);
}

#[test]
fn a_model_the_replay_cannot_lay_out_is_refused() {
    let trace = excerpt(5);
    let kv = setup("gpt-oss-120b", 10_000_000_000);
    // A window the block size does not divide; memory for no block.
    assert!(matches!(
        ServeConfig::new(256, Capacity::Blocks(1))
            .with_kv(kv)
            .run(&trace),
        Err(SimError::Groups(GroupError::SpanNotBlockMultiple { .. }))
    ));
    assert!(matches!(
        ServeConfig::default()
            .with_kv(setup("gpt-oss-120b", 1000))
            .run(&trace),
        Err(SimError::CapacityBelowBlock {
            capacity_bytes: 1000,
            block_bytes: 589_824
        })
    ));
}
