//! The tier sweep on a hand-made trace whose outcome can be worked out: a
//! 2,048-token prompt comes back after two others have pushed it out of a
//! 4,096-token GPU pool. A host tier of the GPU's size loses it too (the
//! three prompts are 384 blocks, the tier 256); one twice the GPU's keeps
//! it.

use std::time::Duration;

use super::*;
use crate::{Capacity, TierSetup, TraceRequest};

fn request(timestamp: u64, ids: &[u64]) -> TraceRequest {
    TraceRequest {
        timestamp,
        input_length: ids.len() as u64 * 512,
        output_length: 4,
        hash_ids: ids.to_vec(),
        priority: None,
    }
}

fn trace() -> Trace {
    Trace::from_requests(vec![
        request(0, &[1, 2, 3, 4]),
        request(10_000, &[10, 11, 12, 13]),
        request(20_000, &[20, 21, 22, 23]),
        request(30_000, &[1, 2, 3, 4]),
    ])
    .unwrap()
}

fn engine() -> ServeConfig {
    ServeConfig::new(16, Capacity::Tokens(4_096)).with_audit_every(1)
}

fn sweep(config: &TierSweepConfig) -> Result<TierSweep, SimError> {
    tier_sweep(&trace(), config, &mut crate::NoProgress)
}

fn config(sizes: Vec<HostTierSize>) -> TierSweepConfig {
    TierSweepConfig::new(engine()).with_sizes(sizes)
}

#[test]
fn a_models_groups_sweep_in_tokens_of_its_kv() {
    // A full layer and a 128-token window layer, 2,048 bytes a token each:
    // 32,768-byte blocks, 512 of them in 16 MiB, 256 per group.
    let model = crate::KvModel::parse_layers("full:1,sliding_window:128:1", 2_048).unwrap();
    let engine = engine().with_kv(crate::KvSetup::new(model, 512 * 32_768));
    let config = TierSweepConfig::new(engine).with_sizes(vec![HostTierSize::Multiple(2.0)]);
    let result = sweep(&config).unwrap();
    assert_eq!(result.gpu_tokens, 4_096, "256 blocks of 16 tokens a group");
    let [none, twice] = &result.points[..] else {
        panic!("two runs");
    };
    assert_eq!(twice.host_tokens, 8_192);
    // Twice the GPU's bytes: 1,024 blocks, 512 a group.
    assert_eq!(twice.host_blocks(), 1_024);
    assert_eq!(none.host_blocks(), 0);
    assert_eq!(twice.onboarded_requests(), 1, "the prompt comes back");
    assert_eq!(twice.report.requests[3].hit_tokens, 2_048 - 16);
    for point in &result.points {
        assert_eq!(point.report.finished_requests(), 4);
        assert!(point.report.census.is_balanced());
    }
    assert!(result.to_csv().contains("8192,1024,"));
}

#[test]
fn a_host_tier_twice_the_gpu_brings_the_prefix_back() {
    use HostTierSize::{Multiple, Tokens};
    // 8,192 tokens is 2×: one run, not two.
    let result = sweep(&config(vec![Multiple(2.0), Tokens(8_192), Multiple(1.0)])).unwrap();
    assert_eq!(result.gpu_tokens, 4_096);
    let hosts: Vec<u64> = result.points.iter().map(|p| p.host_tokens).collect();
    assert_eq!(hosts, [0, 4_096, 8_192]);
    let multiples: Vec<f64> = result.points.iter().map(|p| p.multiple).collect();
    assert_eq!(multiples, [0.0, 1.0, 2.0]);
    let labels: Vec<String> = result.points.iter().map(TierPoint::label).collect();
    assert_eq!(labels, ["none", "1×", "2×"]);
    for point in &result.points {
        assert_eq!(point.report.finished_requests(), 4);
        assert!(point.report.census.is_balanced());
    }

    let [none, once, twice] = &result.points[..] else {
        panic!("three runs");
    };
    assert!(none.report.tiers.is_none(), "the baseline has no host tier");
    assert_eq!(none.report.requests[3].hit_tokens, 0);
    assert_eq!(once.tier_hit_tokens(), 0, "the 1× tier lost the prompt");
    // Everything but the block with the prompt's last token, from the host.
    assert_eq!(twice.report.requests[3].hit_tokens, 2_048 - 16);
    assert_eq!(twice.tier_hit_tokens(), 2_048 - 16);
    assert_eq!(twice.onboarded_requests(), 1);
    assert!(twice.mean_stall() > Duration::ZERO);
    assert!(twice.token_hit_rate() > none.token_hit_rate());
    assert!(twice.mean_ttft() < none.mean_ttft());
    assert_eq!(
        twice.report.tiers.as_ref().unwrap().tiers[0].capacity_blocks,
        512
    );

    let (ttft, rate) = result.gain(twice).unwrap();
    assert!(ttft < 0.0, "{ttft}");
    assert!((rate - 2_032.0 / 8_192.0).abs() < 1e-9, "{rate}");
    assert_eq!(result.at_multiple(2.0), Some(twice));
    assert_eq!(result.at_multiple(3.0), None);
    assert_eq!(result.gain(none), Some((0.0, 0.0)));
}

#[test]
fn the_thread_count_does_not_change_the_results() {
    let sizes = vec![
        HostTierSize::Multiple(0.5),
        HostTierSize::Multiple(1.0),
        HostTierSize::Multiple(2.0),
    ];
    let normalized = |threads: usize| {
        let mut result = sweep(&config(sizes.clone()).with_threads(Some(threads))).unwrap();
        assert_eq!(result.threads, threads);
        for point in &mut result.points {
            point.report.clear_wall_times();
        }
        result.points
    };
    assert_eq!(normalized(1), normalized(3));
}

#[test]
fn bad_sizes_are_refused_before_any_replay() {
    use HostTierSize::{Multiple, Tokens};
    let mut bad: Vec<TierSweepConfig> = [
        vec![],
        vec![Multiple(0.0)],
        vec![Multiple(-1.0)],
        vec![Multiple(f64::NAN)],
        vec![Multiple(f64::INFINITY)],
        vec![Multiple(256.5)],
        vec![Multiple(1e-4)], // under one block
        vec![Tokens(0)],
        vec![Tokens(8)], // under one block
        vec![Tokens(256 * 4_096 + 1)],
        vec![Multiple(1.0); TierSweepConfig::MAX_POINTS + 1],
    ]
    .into_iter()
    .map(config)
    .collect();
    bad.push(TierSweepConfig::new(
        engine().with_tiers(TierSetup::default().with_host_tokens(1 << 20)),
    ));
    bad.push(TierSweepConfig::new(engine().with_tiers(TierSetup {
        kv_bytes_per_token: 0,
        ..TierSetup::default()
    })));
    for config in bad {
        let err = sweep(&config).unwrap_err();
        assert!(
            matches!(err, SimError::InvalidTiers(_)),
            "{config:?}: {err}"
        );
    }

    let err = sweep(&TierSweepConfig::new(ServeConfig::new(
        3,
        Capacity::Tokens(4_096),
    )))
    .unwrap_err();
    assert!(matches!(err, SimError::InvalidBlockSize { .. }), "{err}");
    let err = sweep(&TierSweepConfig::new(ServeConfig::new(
        16,
        Capacity::Unbounded,
    )))
    .unwrap_err();
    assert!(matches!(err, SimError::UnboundedServe), "{err}");

    // The largest and the most are accepted.
    let most = vec![Multiple(TierSweepConfig::MAX_MULTIPLE); TierSweepConfig::MAX_POINTS];
    assert_eq!(config(most).host_tokens().unwrap(), [256 * 4_096]);
}

#[test]
fn the_sweep_writes_a_table_a_csv_and_a_plot() {
    let result = sweep(&config(vec![HostTierSize::Multiple(2.0)])).unwrap();

    let csv = result.to_csv();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 3, "{csv}");
    let columns = lines[0].split(',').count();
    assert!(lines.iter().all(|line| line.split(',').count() == columns));
    assert!(
        lines[1].starts_with("0,0,0.000000,4096,16,4,4,"),
        "{}",
        lines[1]
    );
    assert!(
        lines[2].starts_with("8192,512,2.000000,4096,16,4,4,"),
        "{}",
        lines[2]
    );

    let table = result.to_markdown();
    assert_eq!(table.lines().count(), 4, "{table}");
    assert!(table.lines().nth(2).unwrap().starts_with("| none | 0 | "));
    let twice = table.lines().nth(3).unwrap();
    assert!(twice.starts_with("| 2× | 8,192 | "), "{twice}");
    assert!(twice.contains("+24.80 pts"), "{twice}");

    let json = result.to_json();
    assert_eq!(json["mode"], "tier-sweep");
    assert_eq!(json["points"][1]["host_tokens"], 8_192);
    assert_eq!(json["points"][1]["tier_hit_tokens"], 2_032);
    assert_eq!(json["points"][1]["serve"]["onboarding"]["requests"], 1);

    let svg = result.to_svg().unwrap();
    assert!(svg.starts_with("<svg"), "{}", &svg[..40.min(svg.len())]);
    assert!(svg.contains("Mean time to first token"));
    assert!(svg.contains("Token hit rate"));

    let dir = std::env::temp_dir().join(format!("kvbm-sim-tier-sweep-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let files = result.write_to(&dir.join("nested")).unwrap();
    assert_eq!(std::fs::read_to_string(&files.csv).unwrap(), csv);
    assert_eq!(std::fs::read_to_string(&files.markdown).unwrap(), table);
    assert_eq!(std::fs::read_to_string(&files.svg).unwrap(), svg);
    // A directory where a file should be cannot be written.
    let err = result.write_to(&files.csv).unwrap_err();
    assert!(matches!(err, SimError::WriteOutput { .. }), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn numbers_read_short() {
    assert_eq!(short_multiple(4.0), "4");
    assert_eq!(short_multiple(0.5), "0.5");
    assert_eq!(short_multiple(10.0 / 3.0), "3.33");
    assert_eq!(seconds(Duration::from_millis(1_666_100)), "1666.1 s");
    assert_eq!(seconds(Duration::from_millis(1_160)), "1.16 s");
    assert_eq!(seconds(Duration::from_millis(55)), "0.055 s");
    assert_eq!(change(2.0, 1.0), "-50.0%");
    assert_eq!(change(0.0, 1.0), "–");
    assert_eq!(
        HostTierSize::Tokens(12_000_000).to_string(),
        "12,000,000 tokens"
    );
    assert_eq!(HostTierSize::Multiple(4.0).to_string(), "4× the GPU pool");
}
