//! Serve mode with a data plane: the bytes of every transfer really move
//! through host arenas or a disk store, every loaded block is checked, and
//! the replay is otherwise the one without bytes.

use super::tests_tiers::request;
use super::*;
use crate::{Capacity, DataPlaneSpec, NoProgress, TierSetup, Trace};

/// A prompt pushed out of a 4,096-token GPU pool and asked for again.
fn trace() -> Trace {
    Trace::from_requests(vec![
        request(0, &[1, 2, 3, 4], 4),
        request(10_000, &[10, 11, 12, 13], 4),
        request(20_000, &[20, 21, 22, 23], 4),
        request(30_000, &[1, 2, 3, 4], 4),
        request(40_000, &[1, 2, 3, 5], 4),
    ])
    .unwrap()
}

fn config(tiers: TierSetup) -> ServeConfig {
    let mut tiers = tiers;
    tiers.kv_bytes_per_token = 8; // 128-byte blocks
    ServeConfig::new(16, Capacity::Tokens(4_096))
        .with_audit_every(1)
        .with_tiers(tiers)
}

fn run(config: &ServeConfig, spec: Option<&DataPlaneSpec>) -> ServeReport {
    let report = replay_with_data_plane(&trace(), config, &mut NoProgress, None, spec).unwrap();
    assert!(report.census.is_balanced(), "{:?}", report.census);
    assert_eq!(report.finished_requests(), 5);
    report
}

/// The JSON report without the data plane's figures and the wall times.
fn simulated(report: &ServeReport) -> serde_json::Value {
    let mut json = report.to_json();
    let map = json.as_object_mut().unwrap();
    map.remove("data_plane");
    map.remove("replay_ms");
    map.remove("scheduler_ms");
    json
}

#[test]
fn host_arenas_bring_back_every_block_byte_for_byte() {
    let config = config(TierSetup::default().with_host_tokens(1 << 16));
    let plain = run(&config, None);
    let real = run(&config, Some(&DataPlaneSpec::Host));
    assert!(plain.data_plane.is_none());
    assert_eq!(simulated(&plain), simulated(&real));
    let data = real.data_plane.as_ref().unwrap();
    let loaded = real.tiers.as_ref().unwrap().tiers[0].loaded_blocks;
    assert!(loaded >= 127, "{loaded}");
    assert_eq!(data.loaded_blocks, loaded);
    assert_eq!((data.verified_blocks, data.wrong_blocks), (loaded, 0));
    assert_eq!(data.failed_blocks, 0);
    assert_eq!(data.block_bytes, 128);
    assert_eq!(data.bytes_read, loaded * 128);
    let stored = real.tiers.as_ref().unwrap().tiers[0].stored_blocks;
    assert_eq!(data.bytes_written, stored * 128);
    assert!(real.to_json()["data_plane"]["verified_blocks"].is_u64());
}

#[test]
fn a_disk_store_below_the_host_tier_serves_what_the_host_evicted() {
    let dir = tempfile::tempdir().unwrap();
    // A host tier too small to keep the prompt: it comes back from disk.
    let config = config(
        TierSetup::default()
            .with_host_tokens(1_024)
            .with_disk_tokens(1 << 16),
    );
    let spec = DataPlaneSpec::Disk(dir.path().join("g3"));
    let plain = run(&config, None);
    let real = run(&config, Some(&spec));
    assert_eq!(simulated(&plain), simulated(&real));
    let data = real.data_plane.as_ref().unwrap();
    let disk = &real.tiers.as_ref().unwrap().tiers[1];
    assert!(disk.loaded_blocks > 0, "{disk:?}");
    assert!(data.loaded_blocks > 0);
    assert_eq!(
        (data.verified_blocks, data.wrong_blocks),
        (data.loaded_blocks, 0)
    );
    assert!(dir.path().join("g3").is_dir());
}

#[test]
fn a_data_plane_needs_a_lower_tier_and_a_store_it_can_use() {
    let none = config(TierSetup::default());
    let err = replay_with_data_plane(
        &trace(),
        &none,
        &mut NoProgress,
        None,
        Some(&DataPlaneSpec::Host),
    )
    .unwrap_err();
    assert!(matches!(err, SimError::DataPlane { .. }), "{err}");
    // A file where the disk store's directory should be.
    let file = tempfile::NamedTempFile::new().unwrap();
    let disk = config(TierSetup::default().with_disk_tokens(1 << 16));
    let err = replay_with_data_plane(
        &trace(),
        &disk,
        &mut NoProgress,
        None,
        Some(&DataPlaneSpec::Disk(file.path().to_owned())),
    )
    .unwrap_err();
    assert!(matches!(err, SimError::DataPlane { .. }), "{err}");
    // Device memory past the bound is refused before anything is allocated.
    let mut huge = TierSetup::default().with_host_tokens(1 << 16);
    huge.kv_bytes_per_token = 1 << 30;
    let huge = ServeConfig::new(16, Capacity::Tokens(4_096)).with_tiers(huge);
    let err = replay_with_data_plane(
        &trace(),
        &huge,
        &mut NoProgress,
        None,
        Some(&DataPlaneSpec::Host),
    )
    .unwrap_err();
    assert!(err.to_string().contains("--kv-bytes-per-token"), "{err}");
}

#[test]
fn data_plane_specs_parse_and_print() {
    for text in [
        "host",
        "disk:/tmp/kv",
        "redis:redis://127.0.0.1:7001,redis://127.0.0.1:7002",
    ] {
        assert_eq!(text.parse::<DataPlaneSpec>().unwrap().to_string(), text);
    }
    for bad in ["", "disk:", "redis:", "redis:,", "nvme:/x", "hosts"] {
        assert!(bad.parse::<DataPlaneSpec>().is_err(), "{bad}");
    }
}

/// The Redis Cluster `cargo xtask test` starts, as `redis://` URLs; `None`
/// (with a loud message) outside CI without one. In CI it must be there.
#[cfg(feature = "redis")]
fn redis_cluster(test: &str) -> Option<Vec<String>> {
    match std::env::var("KVBM_REDIS_CLUSTER") {
        Ok(nodes) if !nodes.is_empty() => Some(nodes.split(',').map(str::to_owned).collect()),
        _ if std::env::var_os("CI").is_some() => {
            panic!("{test}: CI must start the Redis Cluster (KVBM_REDIS_CLUSTER is not set)")
        }
        _ => {
            eprintln!("*** SKIPPED {test}: no Redis Cluster (run `cargo xtask test`)");
            None
        }
    }
}

#[cfg(feature = "redis")]
#[test]
fn a_redis_cluster_serves_the_lowest_tier() {
    let Some(nodes) = redis_cluster("a_redis_cluster_serves_the_lowest_tier") else {
        return;
    };
    let config = config(TierSetup::default().with_host_tokens(1 << 16));
    let spec = DataPlaneSpec::Redis(nodes.clone());
    let plain = run(&config, None);
    let real = run(&config, Some(&spec));
    assert_eq!(simulated(&plain), simulated(&real));
    let data = real.data_plane.as_ref().unwrap();
    assert!(data.loaded_blocks >= 127);
    assert_eq!(
        (data.verified_blocks, data.wrong_blocks),
        (data.loaded_blocks, 0)
    );
    assert_eq!(data.failed_blocks, 0);
}
