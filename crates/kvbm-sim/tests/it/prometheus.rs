//! `kvbm-sim serve --metrics-out` and `--prometheus`: the exposition's
//! series end equal to the JSON report, and `/metrics` answers over HTTP
//! while the simulator runs. (`cargo xtask prometheus-interop` also has the
//! Prometheus project's own parser read the file.)

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::Scratch;

/// Sample lines of an exposition: `name{labels} value` by `name{labels}`.
/// Fails on a line that is neither a comment nor a sample with a number.
fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|line| {
            let (series, value) = line.rsplit_once(' ').expect("`series value`");
            let value = match value {
                "+Inf" => f64::INFINITY,
                value => value.parse().expect("a number"),
            };
            (series.to_owned(), value)
        })
        .collect()
}

#[test]
fn metrics_out_writes_the_final_exposition_matching_the_report() {
    let scratch = Scratch::new("metrics-out");
    let path = scratch.0.join("metrics.prom");
    let output = Command::new(env!("CARGO_BIN_EXE_kvbm-sim"))
        .args([
            "serve",
            "--limit",
            "80",
            "--capacity-tokens",
            "150000",
            "--json",
        ])
        .arg("--metrics-out")
        .arg(&path)
        .output()
        .expect("run kvbm-sim");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let samples = samples(&text);
    for (series, field) in [
        ("kvbm_prefix_cache_queries_total", "input_tokens"),
        ("kvbm_prefix_cache_hits_total", "hit_tokens"),
        ("kvbm_num_preemptions_total", "preemptions"),
        ("kvbm_evictions_total", "evictions"),
        ("kvbm_request_generation_tokens_total", "output_tokens"),
    ] {
        assert_eq!(
            samples.get(series).copied(),
            report[field].as_f64(),
            "{series} vs {field}"
        );
    }
    assert!(report["hit_tokens"].as_u64() > Some(0));
    assert_eq!(samples["kvbm_requests_running"], 0.0);
    assert_eq!(
        samples["kvbm_time_to_first_token_seconds_count"],
        report["ttft"]["count"].as_f64().unwrap()
    );
    assert_eq!(
        samples["kvbm_time_to_first_token_seconds_bucket{le=\"+Inf\"}"],
        80.0
    );
    assert!(text.contains("# TYPE kvbm_time_to_first_token_seconds histogram"));
    assert!(text.contains("# TYPE kvbm_kv_cache_usage_ratio gauge"));
}

#[test]
fn prometheus_serves_metrics_over_http_while_it_holds() {
    // A free port (released again; the simulator binds it a moment later).
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port();
    let address = format!("127.0.0.1:{port}");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvbm-sim"))
        .args(["serve", "--limit", "20", "--prometheus", &address])
        .args(["--prometheus-hold-s", "20", "--json"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run kvbm-sim");
    let deadline = Instant::now() + Duration::from_secs(15);
    let mut body = String::new();
    while Instant::now() < deadline {
        if let Ok(mut stream) = TcpStream::connect(&address) {
            let request =
                format!("GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
            stream.write_all(request.as_bytes()).unwrap();
            body.clear();
            let _ = stream.read_to_string(&mut body);
            // Served; wait for the replay to finish (20 requests).
            if body.contains("kvbm_request_generation_tokens_total")
                && body.contains("kvbm_time_to_first_token_seconds_count 20")
            {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    assert!(body.starts_with("HTTP/1.1 200"), "{body}");
    assert!(
        body.contains("kvbm_time_to_first_token_seconds_count 20"),
        "{body}"
    );
}
