//! `cargo xtask store-limits`: each kvbm-store block store beside the limit
//! of its medium, as a ratio, from one run of `benches/benches/stores.rs`.
//!
//! It starts the Redis Cluster the `test` gate uses (when Redis is
//! installed), runs the `stores` bench with a bounded criterion
//! configuration and the cluster in `KVBM_REDIS_CLUSTER`, reads criterion's
//! estimates (`target/criterion/stores_*/*/new/{benchmark,estimates}.json`,
//! the mean), runs `redis-benchmark` SET/GET at the same value size and
//! pipeline depth against the same cluster, and prints a markdown table
//! (also written to `target/store-limits.md`):
//!
//! | store | its limit | goal |
//! |---|---|---|
//! | host arena put/get | `memcpy` of the same batch | ≥ 90% |
//! | disk put/get | plain `write_all_at`/`read_exact_at` of the same volume, page cache | ≥ 80% |
//! | redis put/get | `redis-benchmark` SET/GET, same value size and pipeline | ≥ 80% |
//!
//! GB/s here are decimal (10^9 bytes per second); criterion prints GiB/s.
//! Not part of `ci`: a 2-core CI machine's numbers are noise.
//!
//! With `KVBM_STORE_LIMITS_REDIS=pinned`, the Redis rows run on one master
//! that holds every slot, pinned to CPU 1, while the bench and
//! `redis-benchmark` (then without `--cluster`, which wants three masters)
//! are pinned to CPU 0: on a 2-core machine, client and server then do not
//! take turns on the same cores, as they do with three masters.

use std::collections::BTreeMap;
use std::env;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::Value;
use xshell::{Shell, cmd};

use crate::{cargo, project_root, redis};

/// Block sizes in tokens, and bytes per token: the scale of
/// `benches/benches/stores.rs` (an 8B model's 128 KiB per token, scaled
/// down 16 times); checked against the bytes each group reports.
const TOKENS: [u64; 2] = [16, 512];
const BYTES_PER_TOKEN: u64 = 8 << 10;
/// Blocks per call, and `redis-benchmark`'s pipeline depth.
const BATCH: u64 = 32;
/// Bytes `redis-benchmark` moves per test (its request count is this over
/// the value size): a few seconds at loopback speeds.
const REDIS_BENCHMARK_BYTES: u64 = 1 << 30;

/// Criterion options for a bounded run.
const CRITERION_ARGS: [&str; 4] = ["--warm-up-time", "1", "--measurement-time", "3"];

/// A store's row: its id in the bench, its limit's, the goal.
struct Pair {
    store: &'static str,
    operation: &'static str,
    id: &'static str,
    limit: Limit,
    goal: f64,
}

/// Where a row's limit comes from.
#[derive(Clone, Copy)]
enum Limit {
    /// Another row of the same criterion group.
    Bench(&'static str),
    /// `redis-benchmark`'s rate of this command.
    RedisBenchmark(&'static str),
}

const PAIRS: [Pair; 7] = [
    Pair {
        store: "host arena",
        operation: "put",
        id: "arena/put",
        limit: Limit::Bench("memcpy"),
        goal: 0.9,
    },
    Pair {
        store: "host arena",
        operation: "get",
        id: "arena/get",
        limit: Limit::Bench("memcpy"),
        goal: 0.9,
    },
    Pair {
        store: "disk",
        operation: "put",
        id: "disk/put",
        limit: Limit::Bench("file/write"),
        goal: 0.8,
    },
    Pair {
        store: "disk",
        operation: "get (verified)",
        id: "disk/get",
        limit: Limit::Bench("file/read"),
        goal: 0.8,
    },
    Pair {
        store: "disk",
        operation: "get (headers only; the engine verifies)",
        id: "disk/get-unverified",
        limit: Limit::Bench("file/read"),
        goal: 0.8,
    },
    Pair {
        store: "redis cluster",
        operation: "put",
        id: "redis/put",
        limit: Limit::RedisBenchmark("SET"),
        goal: 0.8,
    },
    Pair {
        store: "redis cluster",
        operation: "get",
        id: "redis/get",
        limit: Limit::RedisBenchmark("GET"),
        goal: 0.8,
    },
];

/// One criterion row: bytes per iteration and the mean time of one.
#[derive(Clone, Copy, Debug)]
struct Estimate {
    bytes: u64,
    mean_ns: f64,
}

impl Estimate {
    fn bytes_per_second(self) -> f64 {
        self.bytes as f64 / (self.mean_ns * 1e-9)
    }
}

/// The variable that picks the Redis rows' layout (see the module docs).
const REDIS_LAYOUT_ENV: &str = "KVBM_STORE_LIMITS_REDIS";

/// The CPU the bench and `redis-benchmark` run on with a pinned layout (the
/// master runs on [`PINNED_SERVER_CPU`]).
const PINNED_CLIENT_CPU: &str = "0";
const PINNED_SERVER_CPU: &str = "1";

pub(crate) fn run(sh: &Shell) -> Result<()> {
    let pinned = match env::var(REDIS_LAYOUT_ENV).unwrap_or_default().as_str() {
        "" | "cluster" => false,
        "pinned" => true,
        other => bail!("{REDIS_LAYOUT_ENV}={other:?}: `cluster` (the default) or `pinned`"),
    };
    let cluster = if pinned {
        redis::start_with(
            sh,
            redis::Layout {
                masters: 1,
                cpus: Some(PINNED_SERVER_CPU),
            },
        )?
    } else {
        redis::start(sh)?
    };
    let nodes = match &cluster {
        Some(cluster) => Some(cluster.nodes()),
        None => env::var(redis::CLUSTER_ENV).ok().filter(|n| !n.is_empty()),
    };
    let criterion = target_dir().join("criterion");
    // Rows of an earlier run (a Redis row with no cluster now) must not
    // pass for this run's.
    if criterion.exists() {
        for entry in std::fs::read_dir(&criterion)? {
            let path = entry?.path();
            let name = path.file_name().unwrap_or_default().to_string_lossy();
            if name.starts_with("stores_") {
                sh.remove_path(&path)?;
            }
        }
    }

    let cargo = cargo();
    // Built first, so a pinned run pins the bench, not the compiler.
    cmd!(sh, "{cargo} bench -p kvbm-benches --bench stores --no-run").run()?;
    let mut bench = if pinned {
        cmd!(
            sh,
            "taskset -c {PINNED_CLIENT_CPU} {cargo} bench -p kvbm-benches --bench stores -- {CRITERION_ARGS...}"
        )
    } else {
        cmd!(
            sh,
            "{cargo} bench -p kvbm-benches --bench stores -- {CRITERION_ARGS...}"
        )
    };
    if let Some(nodes) = &nodes {
        bench = bench.env(redis::CLUSTER_ENV, nodes);
    }
    bench.run()?;
    let estimates = read_estimates(&criterion)?;

    let mut redis_rates = BTreeMap::new();
    match &nodes {
        Some(nodes) if redis_benchmark_installed(sh) => {
            let (host, port) = first_node(nodes)?;
            for tokens in TOKENS {
                let value = tokens * BYTES_PER_TOKEN;
                for (command, rate) in redis_benchmark(sh, &host, &port, value, pinned)? {
                    redis_rates.insert((tokens, command), rate * value as f64);
                }
            }
        }
        Some(_) => eprintln!("note: redis-benchmark not found: no limit for the Redis rows"),
        None => eprintln!("note: no Redis Cluster: no Redis rows"),
    }

    let mut table = table(&estimates, &redis_rates)?;
    if pinned && !redis_rates.is_empty() {
        table.push_str(&format!(
            "\nRedis rows: one master holding every slot on CPU {PINNED_SERVER_CPU}, \
             the bench and redis-benchmark on CPU {PINNED_CLIENT_CPU} ({REDIS_LAYOUT_ENV}=pinned).\n"
        ));
    }
    let out = target_dir().join("store-limits.md");
    sh.write_file(&out, &table)?;
    eprintln!("\n{table}");
    eprintln!("(written to {})", out.display());
    drop(cluster);
    Ok(())
}

/// The markdown table, one row per store operation and block size.
fn table(
    estimates: &BTreeMap<(u64, String), Estimate>,
    redis_rates: &BTreeMap<(u64, String), f64>,
) -> Result<String> {
    let mut lines = vec![
        format!(
            "Blocks of an 8B model's KV scaled down 16x ({} KiB per token instead of 128 KiB), \
             {BATCH} blocks per call; GB/s = 10^9 bytes/s, mean of criterion's samples.",
            BYTES_PER_TOKEN >> 10
        ),
        String::new(),
        "| store | operation | block | GB/s | blocks/s | limit | limit GB/s | ratio | goal | met? |"
            .to_owned(),
        "|---|---|---|---:|---:|---|---:|---:|---:|---|".to_owned(),
    ];
    let mut checksums = Vec::new();
    for tokens in TOKENS {
        let block_bytes = tokens * BYTES_PER_TOKEN;
        let block = format!("{tokens} tokens ({})", size(block_bytes));
        for pair in &PAIRS {
            let Some(ours) = estimates.get(&(tokens, pair.id.to_owned())) else {
                continue;
            };
            if ours.bytes != BATCH * block_bytes {
                bail!(
                    "stores/{tokens}-tokens moves {} bytes per call, not {BATCH} x {block_bytes}: \
                     benches/benches/stores.rs and xtask/src/store_limits.rs disagree on the scale",
                    ours.bytes
                );
            }
            let rate = ours.bytes_per_second();
            let blocks_per_second = (BATCH as f64) / (ours.mean_ns * 1e-9);
            let (limit_name, limit) = match pair.limit {
                Limit::Bench(id) => (
                    format!("`{id}`"),
                    estimates
                        .get(&(tokens, id.to_owned()))
                        .map(|e| e.bytes_per_second()),
                ),
                Limit::RedisBenchmark(command) => (
                    format!("redis-benchmark {command} -P {BATCH}"),
                    redis_rates.get(&(tokens, command.to_owned())).copied(),
                ),
            };
            let (limit_gbs, ratio, met) = match limit {
                Some(limit) => {
                    let ratio = rate / limit;
                    (
                        format!("{:.2}", limit / 1e9),
                        format!("{:.0}%", ratio * 100.0),
                        if ratio >= pair.goal { "yes" } else { "**no**" },
                    )
                }
                None => ("-".to_owned(), "-".to_owned(), "-"),
            };
            lines.push(format!(
                "| {} | {} | {block} | {:.2} | {:.0} | {limit_name} | {limit_gbs} | {ratio} | ≥ {:.0}% | {met} |",
                pair.store,
                pair.operation,
                rate / 1e9,
                blocks_per_second,
                pair.goal * 100.0,
            ));
        }
        if let Some(xxh3) = estimates.get(&(tokens, "xxh3".to_owned())) {
            checksums.push(format!(
                "{tokens} tokens: {:.2} GB/s",
                xxh3.bytes_per_second() / 1e9
            ));
        }
    }
    if !checksums.is_empty() {
        lines.push(String::new());
        lines.push(format!(
            "Checksum rate (xxh3, what the disk store's verified get pays on top of the read): {}.",
            checksums.join(", ")
        ));
    }
    let bounds = verified_read_bounds(estimates);
    if !bounds.is_empty() {
        lines.push(String::new());
        lines.push(format!(
            "A verified get copies a block out of the page cache and then hashes it, on one \
             core: at best 1 / (1/`file/read` + 1/xxh3 on data in cache), {}.",
            bounds.join("; ")
        ));
    }
    Ok(lines.join("\n") + "\n")
}

/// Per block size, the ceiling of a verified get on one core (the plain
/// read, then the hash of what it just read, at the smallest block's xxh3
/// rate: those blocks are hashed while still in cache) and how close the
/// verified get comes to it.
fn verified_read_bounds(estimates: &BTreeMap<(u64, String), Estimate>) -> Vec<String> {
    let rate = |tokens: u64, id: &str| {
        (estimates.get(&(tokens, id.to_owned()))).map(|e| e.bytes_per_second())
    };
    let Some(hot_hash) = TOKENS.iter().find_map(|&tokens| rate(tokens, "xxh3")) else {
        return Vec::new();
    };
    TOKENS
        .iter()
        .filter_map(|&tokens| {
            let read = rate(tokens, "file/read")?;
            let verified = rate(tokens, "disk/get")?;
            let bound = 1.0 / (1.0 / read + 1.0 / hot_hash);
            Some(format!(
                "{tokens} tokens {:.2} GB/s ({:.0}% of the plain read; the verified get reaches {:.0}% of it)",
                bound / 1e9,
                bound / read * 100.0,
                verified / bound * 100.0
            ))
        })
        .collect()
}

/// `16 KiB`, `4 MiB`.
fn size(bytes: u64) -> String {
    if bytes >= 1 << 20 && bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", bytes >> 20)
    } else {
        format!("{} KiB", bytes >> 10)
    }
}

/// Criterion's output directory.
fn target_dir() -> PathBuf {
    env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|dir| {
            if dir.is_relative() {
                project_root().join(dir)
            } else {
                dir
            }
        })
        .unwrap_or_else(|| project_root().join("target"))
}

/// Every `stores/<tokens>-tokens` row criterion wrote: (tokens, id) to the
/// bytes per iteration and the mean.
fn read_estimates(criterion: &Path) -> Result<BTreeMap<(u64, String), Estimate>> {
    let mut estimates = BTreeMap::new();
    let groups =
        std::fs::read_dir(criterion).with_context(|| format!("reading {}", criterion.display()))?;
    for group in groups {
        let group = group?.path();
        let name = group.file_name().unwrap_or_default().to_string_lossy();
        if !name.starts_with("stores_") || !group.is_dir() {
            continue;
        }
        for row in std::fs::read_dir(&group)? {
            let new = row?.path().join("new");
            let (Ok(benchmark), Ok(estimate)) = (
                std::fs::read_to_string(new.join("benchmark.json")),
                std::fs::read_to_string(new.join("estimates.json")),
            ) else {
                continue;
            };
            let benchmark: Value = serde_json::from_str(&benchmark)
                .with_context(|| format!("{}/benchmark.json", new.display()))?;
            let estimate: Value = serde_json::from_str(&estimate)
                .with_context(|| format!("{}/estimates.json", new.display()))?;
            let group_id = benchmark["group_id"]
                .as_str()
                .context("benchmark.json has no group_id")?;
            let tokens: u64 = group_id
                .strip_prefix("stores/")
                .and_then(|rest| rest.strip_suffix("-tokens"))
                .and_then(|tokens| tokens.parse().ok())
                .with_context(|| format!("unexpected group {group_id:?}"))?;
            let id = benchmark["function_id"]
                .as_str()
                .context("benchmark.json has no function_id")?;
            let bytes = benchmark["throughput"]["Bytes"]
                .as_u64()
                .with_context(|| format!("{group_id}/{id} has no byte throughput"))?;
            let mean_ns = estimate["mean"]["point_estimate"]
                .as_f64()
                .with_context(|| format!("{group_id}/{id} has no mean"))?;
            estimates.insert((tokens, id.to_owned()), Estimate { bytes, mean_ns });
        }
    }
    if estimates.is_empty() {
        bail!(
            "no stores/* results under {} (did the bench run?)",
            criterion.display()
        );
    }
    Ok(estimates)
}

/// Host and port of the first `redis://host:port` node.
fn first_node(nodes: &str) -> Result<(String, String)> {
    let first = nodes.split(',').next().unwrap_or_default().trim();
    let address = first.strip_prefix("redis://").unwrap_or(first);
    let address = address.trim_end_matches('/');
    let (host, port) = address
        .rsplit_once(':')
        .with_context(|| format!("node {first:?} is not redis://host:port"))?;
    Ok((host.to_owned(), port.to_owned()))
}

fn redis_benchmark_installed(sh: &Shell) -> bool {
    cmd!(sh, "redis-benchmark --version")
        .quiet()
        .ignore_stdout()
        .ignore_stderr()
        .run()
        .is_ok()
}

/// `redis-benchmark --cluster` SET and GET of `value` bytes, pipelined
/// [`BATCH`] deep from one client (the store's shape: one caller, one
/// batch in flight): requests per second of each. `pinned`: on
/// [`PINNED_CLIENT_CPU`], against the one master (no `--cluster`).
fn redis_benchmark(
    sh: &Shell,
    host: &str,
    port: &str,
    value: u64,
    pinned: bool,
) -> Result<Vec<(String, f64)>> {
    let requests = (REDIS_BENCHMARK_BYTES / value).max(BATCH * 8).to_string();
    let value = value.to_string();
    let batch = BATCH.to_string();
    eprintln!("redis-benchmark: SET/GET of {value} bytes, -P {batch}, -n {requests} ...");
    let csv = if pinned {
        cmd!(
            sh,
            "taskset -c {PINNED_CLIENT_CPU} redis-benchmark -h {host} -p {port} -t set,get -d {value} -P {batch} -c 1 -n {requests} --csv -q"
        )
    } else {
        cmd!(
            sh,
            "redis-benchmark --cluster -h {host} -p {port} -t set,get -d {value} -P {batch} -c 1 -n {requests} --csv -q"
        )
    }
    .read()?;
    let rates: Vec<(String, f64)> = csv
        .lines()
        .filter_map(|line| {
            let mut fields = line.split(',').map(|field| field.trim_matches('"'));
            let command = fields.next()?;
            let rps: f64 = fields.next()?.parse().ok()?;
            ["SET", "GET"]
                .contains(&command)
                .then(|| (command.to_owned(), rps))
        })
        .collect();
    if rates.len() != 2 {
        bail!("redis-benchmark's CSV has no SET and GET rows:\n{csv}");
    }
    Ok(rates)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn estimate(bytes_per_second: f64) -> Estimate {
        Estimate {
            bytes: 1_000_000_000,
            mean_ns: 1e18 / bytes_per_second,
        }
    }

    #[test]
    fn a_verified_read_is_bounded_by_the_read_then_the_hash() {
        let mut estimates = BTreeMap::new();
        for (id, rate) in [("file/read", 18e9), ("xxh3", 36e9), ("disk/get", 9e9)] {
            estimates.insert((16, id.to_owned()), estimate(rate));
        }
        // 1 / (1/18 + 1/36) = 12 GB/s: two thirds of the read; 9 is 75% of it.
        assert_eq!(
            verified_read_bounds(&estimates),
            ["16 tokens 12.00 GB/s (67% of the plain read; the verified get reaches 75% of it)"]
        );
        estimates.remove(&(16, "xxh3".to_owned()));
        assert!(verified_read_bounds(&estimates).is_empty());
    }
}
