//! The `kvbm-sim` binary end to end: exit codes, stdout, stderr.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::Scratch;

fn kvbm_sim(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvbm-sim"))
        .args(args)
        .output()
        .expect("run kvbm-sim")
}

/// Runs `kvbm-sim` with a watchdog: if it has not exited after `limit`, it
/// is killed and the test fails (a refusal that regressed into an attempt
/// to build the cluster must not hold the machine). On Unix its address
/// space is also capped at 8 GB, so such an attempt fails at once.
fn kvbm_sim_bounded(args: &[&str], limit: Duration) -> Output {
    let mut command = if cfg!(unix) {
        let mut shell = Command::new("sh");
        shell
            .arg("-c")
            .arg("ulimit -v 8000000 && exec \"$0\" \"$@\"")
            .arg(env!("CARGO_BIN_EXE_kvbm-sim"));
        shell
    } else {
        Command::new(env!("CARGO_BIN_EXE_kvbm-sim"))
    };
    let mut child = command
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run kvbm-sim");
    let started = Instant::now();
    while child.try_wait().expect("poll kvbm-sim").is_none() {
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{args:?} still running after {limit:?}: killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("kvbm-sim output")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Runs and expects failure with exit code 1 and `message` on stderr.
fn fails_with(args: &[&str], message: &str) {
    let output = kvbm_sim(args);
    assert_eq!(
        output.status.code(),
        Some(1),
        "{args:?}: {}",
        stderr(&output)
    );
    let err = stderr(&output);
    assert!(err.starts_with("error: "), "{err}");
    assert!(err.contains(message), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{err}");
    assert!(output.stdout.is_empty());
}

#[test]
fn no_arguments_summarize_the_embedded_excerpt() {
    let output = kvbm_sim(&[]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    for expected in [
        "trace: embedded excerpt of the Mooncake conversation trace",
        "500 requests over 165.0 s",
        "capacity unbounded (11,879 blocks), eviction lru",
        "14,162",
        "2,283",
        "1,167,589",
        "16.12%",
        "16.39%",
        "evictions 0, preemptions 0",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in\n{text}");
    }
    // Not a terminal: no progress bar on stderr.
    assert!(output.stderr.is_empty(), "{}", stderr(&output));
}

#[test]
fn cache_json_is_one_object_with_the_documented_fields() {
    let output = kvbm_sim(&[
        "cache",
        "--capacity-blocks",
        "1k",
        "--eviction",
        "lineage",
        "--block-size",
        "256",
        "--json",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    assert_eq!(text.lines().count(), 1);
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["mode"], "cache");
    assert_eq!(json["requests"], 500);
    assert_eq!(json["input_tokens"], 7_124_855);
    assert_eq!(json["preemptions"], 0);
    assert_eq!(json["capacity_blocks"], 1000);
    assert_eq!(json["block_size"], 256);
    assert_eq!(json["eviction"], "lineage");
    for field in ["input_blocks", "hit_blocks", "hit_tokens", "evictions"] {
        assert!(json[field].as_u64().is_some(), "{field}");
    }
    assert!(json["evictions"].as_u64().unwrap() > 0);
    // Same run through the library.
    let trace = kvbm_sim::Trace::conversation_excerpt().unwrap();
    let workload = kvbm_sim::Workload::new(&trace, 256).unwrap();
    let report = kvbm_sim::CacheConfig::new(
        kvbm_sim::Capacity::Blocks(1000),
        kvbm_sim::Eviction::Lineage,
    )
    .run(&workload)
    .unwrap();
    assert_eq!(json["hit_blocks"], report.hits.hit_blocks);
}

#[test]
fn capacity_in_tokens_and_a_trace_file() {
    let scratch = Scratch::new("cli-trace");
    let path = scratch.file(
        "trace.jsonl",
        "{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 1, \"hash_ids\": [1, 2]}\n\
         {\"timestamp\": 1, \"input_length\": 1000, \"output_length\": 1, \"hash_ids\": [1, 2]}\n",
    );
    let path = path.to_str().unwrap();
    let output = kvbm_sim(&[
        "cache",
        "--trace",
        path,
        "--capacity-tokens",
        "1024",
        "--json",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let json: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(json["capacity_blocks"], 2);
    assert_eq!(json["hit_blocks"], 2);
    // Capped at the request's 1000 tokens.
    assert_eq!(json["hit_tokens"], 1000);
    assert_eq!(json["trace"], path);
}

#[test]
fn errors_are_one_clear_line_and_exit_code_1() {
    let scratch = Scratch::new("cli-errors");
    let missing = scratch.0.join("missing.jsonl");
    fails_with(
        &["cache", "--trace", missing.to_str().unwrap()],
        "trace file not found",
    );
    let malformed = scratch.file(
        "bad.jsonl",
        "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n{oops\n",
    );
    fails_with(
        &["cache", "--trace", malformed.to_str().unwrap()],
        "malformed trace line 2",
    );
    let absurd = scratch.file(
        "absurd.jsonl",
        "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [1]}\n{\"timestamp\": 1, \"input_length\": 1, \"output_length\": 18446744073709551615, \"hash_ids\": [1]}\n",
    );
    fails_with(
        &["serve", "--trace", absurd.to_str().unwrap()],
        "trace line 2: output_length 18446744073709551615 exceeds",
    );
    fails_with(
        &["cache", "--capacity-blocks", "0"],
        "cache capacity 0 blocks holds no 512-token block",
    );
    fails_with(
        &["cache", "--capacity-tokens", "100"],
        "cache capacity 100 tokens holds no 512-token block",
    );
    fails_with(
        &["cache", "--block-size", "48"],
        "block size 48 must divide",
    );
    fails_with(
        &["cluster", "--temperature", "NaN"],
        "temperature must be a finite number at least 0, not NaN",
    );
    fails_with(
        &["cluster", "--engines", "0"],
        "a cluster needs at least one engine",
    );
    fails_with(
        &[
            "cluster",
            "--engines",
            "1000000000000",
            "--capacity-blocks",
            "1000",
        ],
        "a cluster of 1000000000000 engines of 1000 blocks is too large",
    );

    fails_with(
        &[
            "sweep",
            "--out",
            scratch.0.to_str().unwrap(),
            "--capacities",
            "0",
        ],
        "holds no 512-token block",
    );
}

#[test]
fn usage_errors_exit_with_code_2() {
    for args in [
        &["cache", "--capacity-blocks", "5", "--unbounded"][..],
        &["cache", "--capacity-blocks", "5", "--capacity-tokens", "5"],
        &["cache", "--eviction", "fifo"],
        &["cache", "--capacity-blocks", "lots"],
        &["sweep"],
        &["frobnicate"],
        &["cluster", "--policies", "fastest"],
        &["cluster", "--engines", "-1"],
        &["cluster", "--threads", "many"],
    ] {
        let output = kvbm_sim(args);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(!stderr(&output).contains("panicked"));
    }
}

#[test]
fn sweep_writes_the_table_and_the_plot() {
    let scratch = Scratch::new("cli-sweep");
    let out = scratch.0.join("results");
    let output = kvbm_sim(&[
        "sweep",
        "--capacities",
        "1k,4k",
        "--evictions",
        "lru,multi-level",
        "--out",
        out.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    assert!(
        text.contains("| capacity (blocks) | capacity (tokens) | lru | multi-level |"),
        "{text}"
    );
    assert!(text.contains("| unbounded (11,879) |"), "{text}");
    assert!(text.contains("5 replays in"), "{text}");
    let csv = std::fs::read_to_string(out.join("sweep.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + 4 + 1);
    assert!(
        std::fs::read_to_string(out.join("sweep.md"))
            .unwrap()
            .contains("| 4,000 |")
    );
    assert!(
        std::fs::read_to_string(out.join("sweep.svg"))
            .unwrap()
            .starts_with("<svg")
    );
}

#[test]
fn tier_sweep_runs_a_models_groups() {
    let scratch = Scratch::new("cli-tier-sweep-model");
    let out = scratch.0.join("results");
    let output = kvbm_sim(&[
        "tier-sweep",
        "--limit",
        "30",
        "--model",
        "gpt-oss-120b",
        "--capacity-bytes",
        "2e9",
        "--host-multiples",
        "2",
        "--out",
        out.to_str().unwrap(),
        "--quiet",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    // 2e9 bytes are 3,390 blocks of 589,824: 1,695 a group, 27,120 tokens.
    assert!(
        text.contains("GPU pool 27120 tokens") && text.contains("gpt-oss-120b ("),
        "{text}"
    );
    let csv = std::fs::read_to_string(out.join("tier_sweep.csv")).unwrap();
    // Twice the GPU's tokens, in two groups' blocks.
    assert!(csv.contains("\n54240,6780,2.000000,27120,16,"), "{csv}");
}

#[test]
fn cluster_runs_a_models_groups() {
    let output = kvbm_sim(&[
        "cluster",
        "--limit",
        "40",
        "--engines",
        "2",
        "--policies",
        "kv-aware",
        "--model",
        "gpt-oss-120b",
        "--capacity-bytes",
        "10e9",
        "--json",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let json: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(json["runs"][0]["finished_requests"], 40);
    fails_with(
        &[
            "cluster",
            "--model",
            "gpt-oss-120b",
            "--capacity-bytes",
            "2e9",
            "--kv-bytes-per-token",
            "4096",
        ],
        "--kv-bytes-per-token cannot be combined with --model or --groups",
    );
}

#[test]
fn serve_prints_a_summary_of_the_excerpt() {
    let output = kvbm_sim(&["serve", "--limit", "40"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    for expected in [
        "trace: embedded excerpt of the Mooncake conversation trace",
        "40 requests over",
        "serve mode: 40 requests, block size 16, pool 187,500 blocks = 3,000,000 tokens, eviction lru",
        "max running 256, token budget 8192, chunk 2048, watermark 1% (1875 blocks)",
        "step time: 5 ms + 0.05 ms/prefill token + 0.1 ms/decoding request",
        "prefix hits",
        "finished 40, rejected 0",
        "preemptions 0",
        "TTFT  p50 ",
        "TPOT  p50 ",
    ] {
        assert!(text.contains(expected), "missing {expected:?} in\n{text}");
    }
    assert!(output.stderr.is_empty(), "{}", stderr(&output));
}

#[test]
fn serve_json_has_the_documented_fields_and_honours_every_option() {
    let scratch = Scratch::new("cli-serve");
    // Two requests sharing their first 512-token block, 10 s apart.
    let path = scratch.file(
        "trace.jsonl",
        "{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 3, \"hash_ids\": [1, 2]}\n\
         {\"timestamp\": 10000, \"input_length\": 1000, \"output_length\": 3, \"hash_ids\": [1, 3]}\n",
    );
    let output = kvbm_sim(&[
        "serve",
        "--trace",
        path.to_str().unwrap(),
        "--block-size",
        "64",
        "--capacity-blocks",
        "100",
        "--eviction",
        "multi-level",
        "--max-running",
        "8",
        "--token-budget",
        "600",
        "--chunk-size",
        "400",
        "--watermark-blocks",
        "2",
        "--reserve",
        "full",
        "--step-ms",
        "1",
        "--prefill-token-ms",
        "0.01",
        "--decode-request-ms",
        "0.5",
        "--audit-every",
        "1",
        "--json",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = stdout(&output);
    assert_eq!(text.lines().count(), 1);
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(json["mode"], "serve");
    assert_eq!(json["requests"], 2);
    assert_eq!(json["capacity_blocks"], 100);
    assert_eq!(json["capacity_tokens"], 6400);
    assert_eq!(json["eviction"], "multi-level");
    assert_eq!(
        (
            &json["token_budget"],
            &json["chunk_size"],
            &json["watermark_blocks"]
        ),
        (&600.into(), &400.into(), &2.into())
    );
    // 1000 tokens in 64-token blocks: 16 each; the second hits block 1's
    // 8 blocks.
    assert_eq!(
        (&json["input_blocks"], &json["hit_blocks"]),
        (&32.into(), &8.into())
    );
    assert_eq!(
        (&json["input_tokens"], &json["hit_tokens"]),
        (&2000.into(), &512.into())
    );
    assert_eq!(json["preemptions"], 0);
    assert_eq!(json["output_tokens"], 6);
    // The first request alone: chunks of 400, 400, 200 tokens
    //   (1 + 4) + (1 + 4) + (1 + 2) = 13 ms to its first token.
    // The second: 488 tokens to prefill, chunks of 400 and 88:
    //   (1 + 4) + (1 + 0.88) = 6.88 ms.
    assert_eq!(json["ttft"]["count"], 2);
    assert_eq!(json["ttft"]["max_ms"], 13.0);
    assert!((json["ttft"]["p50_ms"].as_f64().unwrap() - 6.88).abs() < 1e-9);
    // Two decodes of 1 + 0.5 ms each.
    assert_eq!(json["tpot"]["p50_ms"], 1.5);
    // Five prefill chunks (three and two) and every decode were planned.
    let decodes = json["decode_tokens"].as_u64().unwrap();
    assert_eq!(json["scheduled_requests"].as_u64(), Some(5 + decodes));
    for field in [
        "steps",
        "requests_per_s",
        "output_tokens_per_s",
        "sim_duration_s",
        "replay_ms",
        "scheduler_ms",
    ] {
        assert!(json[field].is_number(), "{field}");
    }
    // The scheduler's calls are timed within the replay.
    let (replay, scheduler) = (json["replay_ms"].as_f64(), json["scheduler_ms"].as_f64());
    assert!(
        scheduler > Some(0.0) && scheduler <= replay,
        "{scheduler:?} of {replay:?}"
    );
    assert_eq!(json["trace"], path.to_str().unwrap());
}

/// `--model`: the report gains the groups and the memory; `--groups`
/// describing the same layers replays the same; without either, none of
/// the new fields appear.
#[test]
fn serve_with_a_model_reports_its_groups_and_memory() {
    let run = |args: &[&str]| {
        let mut all = vec!["serve", "--limit", "40", "--json"];
        all.extend_from_slice(args);
        let output = kvbm_sim(&all);
        assert!(output.status.success(), "{args:?}: {}", stderr(&output));
        serde_json::from_str::<serde_json::Value>(&stdout(&output)).unwrap()
    };
    let gpt = run(&["--model", "gpt-oss-120b", "--capacity-bytes", "10e9"]);
    assert_eq!(gpt["model"], "gpt-oss-120b");
    assert_eq!(gpt["full_attention_only"], false);
    assert_eq!(gpt["capacity_bytes"], 10_000_000_000u64);
    // 16 tokens x 18 layers x 2 KiB a block.
    assert_eq!(gpt["kv_block_bytes"], 589_824);
    assert_eq!(gpt["capacity_blocks"], 16_954);
    assert_eq!(gpt["finished_requests"], 40);
    let groups = gpt["kv_groups"].as_array().unwrap();
    assert_eq!(groups.len(), 2);
    assert_eq!(
        (
            &groups[1]["kind"],
            &groups[1]["window"],
            &groups[1]["layers"]
        ),
        (&"sliding_window".into(), &128.into(), &18.into())
    );
    let peak = gpt["peak_kv_bytes"].as_u64().unwrap();
    assert!(peak > 0 && peak <= 10_000_000_000, "{peak}");

    let custom = run(&[
        "--groups",
        "sliding_window:128:18,full:18",
        "--kv-bytes-per-token-layer",
        "2048",
        "--capacity-bytes",
        "10G",
    ]);
    assert_eq!(custom["model"], "custom");
    for field in ["kv_groups", "peak_kv_bytes", "ttft", "hit_tokens", "steps"] {
        assert_eq!(custom[field], gpt[field], "{field}");
    }

    let full = run(&[
        "--model",
        "gpt-oss-120b",
        "--capacity-bytes",
        "10e9",
        "--full-attention-only",
    ]);
    assert_eq!(full["full_attention_only"], true);
    assert_eq!(full["kv_groups"].as_array().unwrap().len(), 1);
    assert_eq!(full["capacity_blocks"], 8_477);

    // With a host tier: the tier holds the model's blocks, a block per
    // group per 16 tokens, and its bytes are theirs.
    let tiered = run(&[
        "--model",
        "gpt-oss-120b",
        "--capacity-bytes",
        "10e9",
        "--host-tier-tokens",
        "1000000",
    ]);
    let cpu = &tiered["tiers"][0];
    assert_eq!(cpu["medium"], "CPU");
    assert_eq!(cpu["capacity_blocks"], 2 * 1_000_000 / 16);
    let stored = cpu["stored_blocks"].as_u64().unwrap();
    assert!(stored > 0);
    assert_eq!(cpu["bytes_stored"], stored * 589_824);
    assert_eq!(tiered["finished_requests"], 40);

    // And with drafts: the groups verify them too.
    let drafted = run(&[
        "--model",
        "gpt-oss-120b",
        "--capacity-bytes",
        "10e9",
        "--spec-tokens",
        "2",
    ]);
    assert_eq!(drafted["finished_requests"], 40);
    assert!(drafted["spec_accepted_tokens"].as_u64().unwrap() > 0);

    let plain = run(&[]);
    for field in ["model", "kv_groups", "peak_kv_bytes", "capacity_bytes"] {
        assert!(plain.get(field).is_none(), "{field}");
    }
}

#[test]
fn serve_model_flags_that_do_not_fit_are_refused() {
    let gpt = [
        "serve",
        "--model",
        "gpt-oss-120b",
        "--capacity-bytes",
        "10e9",
    ];
    fn with<'a>(gpt: &[&'a str], extra: &[&'a str]) -> Vec<&'a str> {
        let mut args = gpt.to_vec();
        args.extend_from_slice(extra);
        args
    }
    fails_with(
        &["serve", "--model", "gpt-5", "--capacity-bytes", "1G"],
        "unknown model `gpt-5` (expected gpt-oss-120b, gpt-oss-20b, gemma-3-27b",
    );
    fails_with(
        &["serve", "--model", "gpt-oss-120b"],
        "--model needs --capacity-bytes",
    );
    fails_with(
        &with(&gpt, &["--capacity-tokens", "3M"]),
        "--model cannot be combined with --capacity-tokens",
    );
    fails_with(
        &with(&gpt, &["--capacity-blocks", "6000"]),
        "--model cannot be combined with --capacity-blocks",
    );
    fails_with(
        &with(&gpt, &["--groups", "full:4"]),
        "--model cannot be combined with --groups",
    );
    fails_with(
        &with(&gpt, &["--kv-bytes-per-token-layer", "2048"]),
        "--kv-bytes-per-token-layer cannot be combined with --model",
    );
    fails_with(
        &["serve", "--capacity-bytes", "10e9"],
        "--capacity-bytes needs --model or --groups",
    );
    fails_with(
        &["serve", "--full-attention-only"],
        "--full-attention-only needs --model or --groups",
    );
    fails_with(
        &["serve", "--groups", "full:4", "--capacity-bytes", "1G"],
        "--groups needs --kv-bytes-per-token-layer",
    );
    fails_with(
        &[
            "serve",
            "--groups",
            "full:4,window:128:4",
            "--kv-bytes-per-token-layer",
            "2048",
            "--capacity-bytes",
            "1G",
        ],
        "invalid --groups `full:4,window:128:4`: unknown attention kind `window`",
    );
    fails_with(
        &[
            "serve",
            "--groups",
            "full:4",
            "--kv-bytes-per-token-layer",
            "0",
            "--capacity-bytes",
            "1G",
        ],
        "--kv-bytes-per-token-layer `0` must be between 1 and 2^63 bytes",
    );
    fails_with(
        &[
            "serve",
            "--groups",
            "full:4",
            "--kv-bytes-per-token-layer",
            "1G",
            "--capacity-bytes",
            "1G",
        ],
        "--kv-bytes-per-token-layer `1000000000` must be at least 1 and at most 16777216 (16 MiB)",
    );
    for bad in ["0", "NaN", "inf", "-5", "1.5", "1e400"] {
        let flag = format!("--capacity-bytes={bad}");
        fails_with(
            &["serve", "--model", "gpt-oss-120b", &flag],
            &format!("--capacity-bytes `{bad}`"),
        );
    }
    fails_with(
        &[
            "serve",
            "--model",
            "gpt-oss-120b",
            "--capacity-bytes",
            "500000",
        ],
        "--capacity-bytes 500000 holds no block: one block of this model is 589824 bytes",
    );
    fails_with(
        &with(&gpt, &["--block-size", "256"]),
        "KV cache groups: KV cache group 1 (sliding_window:128) is not a multiple of the 256-token block",
    );
    fails_with(
        &with(
            &gpt,
            &[
                "--host-tier-tokens",
                "1000000",
                "--kv-bytes-per-token",
                "4096",
            ],
        ),
        "--kv-bytes-per-token cannot be combined with --model or --groups",
    );
    // A data plane takes a model's blocks, within its memory bound.
    fails_with(
        &with(&gpt, &["--data-plane", "host"]),
        "--data-plane needs a tier below the GPU",
    );
    fails_with(
        &with(
            &gpt,
            &["--host-tier-tokens", "1000000", "--data-plane", "host"],
        ),
        "blocks of 589824 bytes) exceed 8589934592: lower the GPU's or the tiers' size, \
         or --kv-bytes-per-token (with a model, --capacity-bytes)",
    );
}

/// Speculative decoding and priorities on the excerpt: the report's new
/// fields, consistent with each other and with the flags.
#[test]
fn serve_reports_speculation_and_priorities() {
    let output = kvbm_sim(&[
        "serve",
        "--limit",
        "120",
        "--spec-tokens",
        "3",
        "--spec-accept",
        "0.6",
        "--seed",
        "7",
        "--priorities",
        "0:0.2,1:0.8",
        "--priority-preemption",
        "--aging-per-s",
        "0.5",
        "--preemption-boost",
        "1",
        "--capacity-tokens",
        "200000",
        "--json",
    ]);
    assert!(output.status.success(), "{}", stderr(&output));
    let json: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(json["spec_tokens"], 3);
    assert_eq!(json["preemption_boost"], 1);
    let proposed = json["spec_proposed_tokens"].as_u64().unwrap();
    let accepted = json["spec_accepted_tokens"].as_u64().unwrap();
    assert!(proposed > 0 && accepted > 0 && accepted < proposed);
    // 3 drafts at 0.6: about 0.6 + 0.36 + 0.216 accepted per decode.
    let per_step = json["tokens_per_decode_step"].as_f64().unwrap();
    assert!((1.8..2.4).contains(&per_step), "{per_step}");
    // Every request still generates exactly its output length.
    let decodes = json["decode_tokens"].as_u64().unwrap();
    let finished = json["finished_requests"].as_u64().unwrap();
    assert_eq!(finished, 120);
    assert_eq!(
        json["output_tokens"].as_u64().unwrap(),
        decodes + accepted + finished,
        "a first token per request, then one per decode plus the accepted drafts"
    );
    let by_priority = json["ttft_by_priority"].as_object().unwrap();
    let keys: Vec<&str> = by_priority.keys().map(String::as_str).collect();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert!(keys.contains(&"critical") && keys.contains(&"high"));
    let counts: u64 = by_priority
        .values()
        .map(|l| l["count"].as_u64().unwrap())
        .sum();
    assert_eq!(counts, json["ttft"]["count"].as_u64().unwrap());
    assert!(by_priority["high"]["count"].as_u64() > by_priority["critical"]["count"].as_u64());
    assert!(json["priority_preemptions"].is_u64());
}

#[test]
fn serve_errors_are_one_clear_line() {
    fails_with(
        &["serve", "--capacity-tokens", "10"],
        "cache capacity 10 tokens holds no 16-token block",
    );
    fails_with(
        &["serve", "--block-size", "48"],
        "block size 48 must divide",
    );
    fails_with(
        &["serve", "--step-ms=-1"],
        "step time per step must be a finite number of milliseconds",
    );
    fails_with(
        &["serve", "--prefill-token-ms", "NaN"],
        "step time per prefill token must be",
    );
    fails_with(
        &["serve", "--max-running", "0"],
        "scheduler: scheduler config: max_running must be at least 1",
    );
    fails_with(
        &["serve", "--spec-tokens", "2", "--spec-accept", "1.5"],
        "draft acceptance probability must be between 0 and 1, got 1.5",
    );
    fails_with(
        &["serve", "--priorities", "0:0.5,x:1"],
        "invalid priority mix `0:0.5,x:1`: a priority is an integer",
    );
    fails_with(
        &["serve", "--aging-per-s=-2"],
        "aging rate must be a finite number of priority steps per second",
    );
    let scratch = Scratch::new("cli-serve-errors");
    let missing = scratch.0.join("missing.jsonl");
    fails_with(
        &["serve", "--trace", missing.to_str().unwrap()],
        "trace file not found",
    );
    for args in [
        &["serve", "--unbounded"][..],
        &["serve", "--capacity-blocks", "5", "--capacity-tokens", "80"],
        &["serve", "--reserve", "lots"],
        &["serve", "--limit", "0"],
        &["serve", "--eviction", "fifo"],
    ] {
        let output = kvbm_sim(args);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(!stderr(&output).contains("panicked"));
    }
}

#[test]
fn clusters_larger_than_the_memory_budget_fail_fast_with_the_estimate() {
    // `--engines 20000` (a typo for 20) and a million one-block engines on
    // the embedded excerpt: refused before any engine is built, with the
    // estimate, the budget and how to change it.
    for (args, estimate) in [
        (
            &["cluster", "--engines", "20000"][..],
            "20000 engines of 187500 blocks needs an estimated ",
        ),
        (
            &["cluster", "--engines", "1000000", "--capacity-blocks", "1"],
            "1000000 engines of 1 blocks needs an estimated ",
        ),
    ] {
        let output = kvbm_sim_bounded(args, Duration::from_secs(120));
        assert_eq!(
            output.status.code(),
            Some(1),
            "{args:?}: {}",
            stderr(&output)
        );
        let err = stderr(&output);
        assert!(err.starts_with("error: a cluster of "), "{err}");
        for expected in [
            estimate,
            " GB for this trace, over the memory budget of 12.00 GB",
            "raise the budget with --memory-limit-gb",
        ] {
            assert!(err.contains(expected), "missing {expected:?} in {err}");
        }
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(output.stdout.is_empty());
    }
    // The budget is the flag's: the default cluster under 1 MB.
    fails_with(
        &["cluster", "--memory-limit-gb", "0.001"],
        "over the memory budget of 1.00 MB",
    );
    for value in ["0", "-1", "NaN", "inf", "1e300", "1e-10"] {
        fails_with(
            &["cluster", &format!("--memory-limit-gb={value}")],
            "memory limit must be a finite number of gigabytes above 0 and at most 1000000, got ",
        );
    }
    let output = kvbm_sim(&["cluster", "--memory-limit-gb", "lots"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
}

#[test]
fn the_readme_cluster_command_still_runs_under_the_default_budget() {
    // README: `kvbm-sim cluster --engines 16 --out DIR`, the default
    // cluster (16 engines of 3M tokens) on the embedded excerpt; one
    // policy, to keep a debug build quick.
    let scratch = Scratch::new("cli-cluster");
    let out = scratch.0.join("results");
    let output = kvbm_sim_bounded(
        &[
            "cluster",
            "--engines",
            "16",
            "--out",
            out.to_str().unwrap(),
            "--policies",
            "kv-aware",
            "--json",
        ],
        Duration::from_secs(600),
    );
    assert!(output.status.success(), "{}", stderr(&output));
    let json: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
    assert_eq!(
        (json["engines"].as_u64(), json["capacity_blocks"].as_u64()),
        (Some(16), Some(187_500))
    );
    assert_eq!(json["runs"][0]["finished_requests"], 500);
    assert!(out.join("cluster.json").is_file() && out.join("cluster.svg").is_file());
}

/// A trace of two requests, at 0 and at `timestamp` ms.
fn two_requests(scratch: &Scratch, timestamp: u64) -> String {
    let path = scratch.file(
        "trace.jsonl",
        &format!(
            "{{\"timestamp\": 0, \"input_length\": 100, \"output_length\": 4, \"hash_ids\": [1]}}\n\
             {{\"timestamp\": {timestamp}, \"input_length\": 100, \"output_length\": 4, \"hash_ids\": [2]}}\n"
        ),
    );
    path.to_str().unwrap().to_owned()
}

#[test]
fn a_timestamp_past_the_clock_is_refused_in_every_mode() {
    // The trace: two requests, at 0 and at u64::MAX ms.
    let scratch = Scratch::new("cli-timestamp");
    let absurd = two_requests(&scratch, u64::MAX);
    let out = scratch.0.join("sweep");
    for args in [
        &["serve", "--trace", &absurd][..],
        &["cluster", "--trace", &absurd],
        &["cache", "--trace", &absurd],
        &["sweep", "--trace", &absurd, "--out", out.to_str().unwrap()],
    ] {
        fails_with(
            args,
            "trace line 2: timestamp 18446744073709551615 ms exceeds the maximum of 9223372036854 ms",
        );
    }
    let over = two_requests(&scratch, kvbm_sim::MAX_TIMESTAMP_MS + 1);
    fails_with(
        &["serve", "--trace", &over],
        "trace line 2: timestamp 9223372036855 ms exceeds",
    );
}

#[test]
fn the_latest_timestamp_replays_exactly_in_every_mode() {
    // One millisecond earlier than refused: every finished request has its
    // samples, and times are exact (5 + 100 × 0.05 = 10 ms to each first
    // token, three decodes of 5.1 ms after it).
    let scratch = Scratch::new("cli-latest");
    let latest = two_requests(&scratch, kvbm_sim::MAX_TIMESTAMP_MS);
    for mode in ["serve", "cluster"] {
        let output = kvbm_sim(&[mode, "--trace", &latest, "--json"]);
        assert!(output.status.success(), "{mode}: {}", stderr(&output));
        let json: serde_json::Value = serde_json::from_str(&stdout(&output)).unwrap();
        let runs = match mode {
            "serve" => vec![json.clone()],
            _ => json["runs"].as_array().unwrap().clone(),
        };
        assert!(!runs.is_empty());
        for run in runs {
            assert_eq!(run["finished_requests"], 2, "{mode}: {run}");
            assert_eq!(run["ttft"]["count"], 2, "{mode}: {run}");
            assert_eq!(
                (
                    run["ttft"]["p50_ms"].as_f64(),
                    run["ttft"]["max_ms"].as_f64()
                ),
                (Some(10.0), Some(10.0))
            );
            assert_eq!(run["tpot"]["count"], 2);
            assert_eq!(run["e2e"]["max_ms"].as_f64(), Some(25.3));
            // From the first arrival to the last step's end: the whole span.
            let duration = run["sim_duration_s"].as_f64().unwrap();
            assert!((duration - 9_223_372_036.879_3).abs() < 1e-3, "{duration}");
        }
    }
    for args in [
        &["cache", "--trace", &latest, "--json"][..],
        &[
            "sweep",
            "--trace",
            &latest,
            "--out",
            scratch.0.join("sweep").to_str().unwrap(),
            "--capacities",
            "1",
            "--json",
        ],
    ] {
        let output = kvbm_sim(args);
        assert!(output.status.success(), "{args:?}: {}", stderr(&output));
    }
}

#[cfg(feature = "kv-events")]
#[test]
fn serve_waits_for_every_kv_events_subscriber() {
    use kvbm_events::Subscriber;

    // A router and a monitor connect before the replay starts (ZeroMQ
    // retries until the publisher binds); `--kv-events-subscribers 2` waits
    // for both, so both receive the first batch.
    // An ipc endpoint: bound by the binary (vLLM binds ipc endpoints), on
    // this host only, and no port another process could take meanwhile.
    let endpoint = format!(
        "ipc://{}/kvbm-sim-subscribers-{}.sock",
        std::env::temp_dir().display(),
        std::process::id()
    );
    let mut router = Subscriber::new(&endpoint, None, "", None).unwrap();
    let mut monitor = Subscriber::new(&endpoint, None, "", None).unwrap();
    let bound = endpoint.clone();
    let child = std::thread::spawn(move || {
        kvbm_sim_bounded(
            &[
                "serve",
                "--limit",
                "20",
                "--kv-events",
                &bound,
                "--kv-events-wait-ms",
                "20000",
                "--kv-events-subscribers",
                "2",
                "--json",
            ],
            Duration::from_secs(120),
        )
    });
    for (name, subscriber) in [("router", &mut router), ("monitor", &mut monitor)] {
        let received = subscriber
            .recv(Duration::from_secs(60))
            .unwrap()
            .unwrap_or_else(|| panic!("{name} received nothing"));
        let first = received.into_iter().next().map(|(seq, _)| seq);
        assert_eq!(first, Some(0), "{name} missed the first batch");
    }
    let output = child.join().unwrap();
    assert!(output.status.success(), "{}", stderr(&output));
    // Both joined in time: no warning that one did not.
    assert!(output.stderr.is_empty(), "{}", stderr(&output));
}

#[test]
fn kv_events_subscriber_counts_are_checked() {
    fails_with(
        &[
            "serve",
            "--kv-events",
            "tcp://127.0.0.1:1",
            "--kv-events-wait-ms",
            "1",
            "--kv-events-subscribers",
            "1025",
        ],
        "--kv-events-subscribers 1025: cannot wait for more than 1024 KV event subscribers",
    );
    for args in [
        // A count without a time to wait is a mistake, not a wait.
        &[
            "serve",
            "--kv-events",
            "tcp://127.0.0.1:1",
            "--kv-events-subscribers",
            "2",
        ][..],
        &[
            "serve",
            "--kv-events-subscribers",
            "2",
            "--kv-events-wait-ms",
            "10",
        ],
        &[
            "serve",
            "--kv-events",
            "tcp://127.0.0.1:1",
            "--kv-events-wait-ms",
            "1",
            "--kv-events-subscribers=-1",
        ],
    ] {
        let output = kvbm_sim(args);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{args:?}: {}",
            stderr(&output)
        );
        assert!(!stderr(&output).contains("panicked"));
    }
}

/// `json` without its wall-clock fields (`load_ms`, each run's
/// `replay_ms`), to compare two replays.
fn timeless_json(text: &str) -> serde_json::Value {
    let mut json: serde_json::Value = serde_json::from_str(text).expect("JSON report");
    if let Some(report) = json.as_object_mut() {
        report.remove("load_ms");
    }
    for run in json["runs"].as_array_mut().expect("runs") {
        run.as_object_mut().expect("a run").remove("replay_ms");
    }
    json
}

#[test]
fn cluster_replicate_copies_the_trace_and_one_copy_changes_nothing() {
    let base = [
        "cluster",
        "--limit",
        "24",
        "--policies",
        "round-robin",
        "--capacity-tokens",
        "400000",
    ];
    let run = |extra: &[&str]| {
        let args: Vec<&str> = base.iter().chain(extra).copied().collect();
        let output = kvbm_sim(&args);
        assert!(output.status.success(), "{args:?}: {}", stderr(&output));
        stdout(&output)
    };
    // `--replicate 1` is the default: the same report, key for key.
    let plain = timeless_json(&run(&["--engines", "2", "--json"]));
    let one = run(&["--engines", "2", "--replicate", "1", "--json"]);
    assert_eq!(timeless_json(&one), plain);
    assert!(plain.get("replicate").is_none());
    // Two copies on twice the engines: twice the requests, the same hit
    // rate (round-robin gives each copy the engines the trace had alone).
    let doubled = timeless_json(&run(&["--replicate", "2", "--engines", "4", "--json"]));
    assert_eq!(doubled["replicate"], 2);
    assert_eq!(doubled["engines"], 4);
    let (one, two) = (&plain["runs"][0], &doubled["runs"][0]);
    assert_eq!(one["requests"], 24);
    assert_eq!(two["requests"], 48);
    assert_eq!(two["hit_tokens"], 2 * one["hit_tokens"].as_u64().unwrap());
    assert_eq!(two["token_hit_rate"], one["token_hit_rate"]);
    assert_eq!(two["ttft"]["count"], 48);
    assert_eq!(two["ttft"]["p90_ms"], one["ttft"]["p90_ms"]);
    // The table says so.
    let table = run(&["--replicate", "2", "--engines", "4"]);
    assert!(
        table.contains("cluster mode: 4 engines, 48 requests (2 copies of the trace),"),
        "{table}"
    );
}

#[test]
fn cluster_replicate_refuses_counts_it_cannot_make() {
    fails_with(
        &["cluster", "--replicate", "0"],
        "error: --replicate 0: at least one copy is needed",
    );
    // The excerpt's ids run to 2^18 or so: 2^20 copies would pass 2^32.
    fails_with(
        &["cluster", "--replicate", "1048576"],
        "every copy's ids must stay below 2^32",
    );
    for value in ["-1", "many", "1.5"] {
        let output = kvbm_sim(&["cluster", "--replicate", value]);
        assert_eq!(
            output.status.code(),
            Some(2),
            "{value}: {}",
            stderr(&output)
        );
        assert!(!stderr(&output).contains("panicked"));
    }
}

/// Without a feature, its flags fail at once with exit code 1, naming the
/// feature and how to turn it on; `--help` says which are on.
#[test]
fn flags_of_features_left_out_fail_naming_the_feature() {
    let help = stdout(&kvbm_sim(&["--help"]));
    assert!(help.contains("Cargo features"), "{help}");
    let on = |feature: bool| if feature { "on" } else { "off" };
    for (name, enabled) in [
        ("kv-events", cfg!(feature = "kv-events")),
        ("redis", cfg!(feature = "redis")),
        ("prometheus", cfg!(feature = "prometheus")),
    ] {
        let row = help.lines().find(|l| l.trim_start().starts_with(name));
        let row = row.unwrap_or_else(|| panic!("no {name} in {help}"));
        assert!(row.contains(&format!(" {} ", on(enabled))), "{row}");
    }
    let scratch = Scratch::new("features");
    let metrics = scratch.0.join("metrics.prom");
    let mut refused: Vec<(Vec<String>, &str, &str)> = Vec::new();
    if !cfg!(feature = "prometheus") {
        for mode in ["serve", "cluster"] {
            refused.push((
                vec![
                    mode.into(),
                    "--metrics-out".into(),
                    metrics.display().to_string(),
                ],
                "--metrics-out",
                "prometheus",
            ));
            refused.push((
                vec![mode.into(), "--prometheus".into(), "127.0.0.1:1".into()],
                "--prometheus",
                "prometheus",
            ));
        }
    }
    if !cfg!(feature = "kv-events") {
        refused.push((
            vec![
                "serve".into(),
                "--kv-events".into(),
                "tcp://127.0.0.1:1".into(),
            ],
            "--kv-events",
            "kv-events",
        ));
    }
    if !cfg!(feature = "redis") {
        refused.push((
            vec![
                "serve".into(),
                "--data-plane".into(),
                "redis:redis://127.0.0.1:1".into(),
            ],
            "--data-plane redis:URL",
            "redis",
        ));
    }
    for (args, flag, feature) in refused {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        fails_with(
            &args,
            &format!(
                "error: {flag} needs kvbm-sim built with the `{feature}` feature \
                 (cargo run --release -p kvbm-sim --features {feature}, or --features full"
            ),
        );
    }
    assert!(!metrics.exists());
}
