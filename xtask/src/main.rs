//! `cargo xtask <gate>`: the project's one entry point for checks.
//!
//! `cargo xtask ci` runs every gate in order (all but `bench` and `fuzz`,
//! whose fuzzers the `test` gate runs at CI-sized case counts); each gate is
//! also its own subcommand. Run `cargo xtask help` for the list.

mod layers;
mod mocker;
mod package;
mod python;
mod redis;
mod store_limits;
mod vllm;

use std::env;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use xshell::{Shell, cmd};

/// A named check, run from the workspace root.
struct Gate {
    name: &'static str,
    about: &'static str,
    run: fn(&Shell) -> Result<()>,
}

const GATES: &[Gate] = &[
    Gate {
        name: "fmt",
        about: "rustfmt --check on every crate",
        run: fmt,
    },
    Gate {
        name: "clippy",
        about: "clippy on all targets, warnings are errors",
        run: clippy,
    },
    Gate {
        name: "doc",
        about: "rustdoc with warnings as errors, public items then private ones too",
        run: doc,
    },
    Gate {
        name: "test",
        about: "unit, integration and doc tests of the kvbm crates and of xtask (starts a Redis Cluster)",
        run: test,
    },
    Gate {
        name: "loom",
        about: "loom models (--cfg kvbm_loom, own target dir)",
        run: loom,
    },
    Gate {
        name: "bench-check",
        about: "compile and run every benchmark once",
        run: bench_check,
    },
    Gate {
        name: "prometheus-interop",
        about: "kvbm-sim's exposition parsed by prometheus_client (PyPI, venv under target/)",
        run: prometheus_interop,
    },
    Gate {
        name: "dynamo-interop",
        about: "kvbm-events' publisher read by Dynamo's indexer (ai-dynamo-runtime from PyPI, venv under target/)",
        run: dynamo_interop,
    },
    Gate {
        name: "python",
        about: "the kvbm Python package: a wheel built by maturin, installed into a venv under target/, its pytest suite",
        run: python::run,
    },
    Gate {
        name: "layers",
        about: "fail on any upward dependency between kvbm crates",
        run: layers,
    },
    Gate {
        name: "msrv",
        about: "the pinned toolchain is the one in use",
        run: msrv,
    },
    Gate {
        name: "package",
        about: "cargo package every publishable crate at once, each built from its package",
        run: package::run,
    },
];

/// Loom explores every interleaving up to this many preemptions; 2 keeps the
/// models inside CI's budget while still finding the classic lost wake-ups.
const LOOM_MAX_PREEMPTIONS: &str = "2";

fn main() -> Result<()> {
    let args: Vec<String> = env::args().skip(1).collect();
    let keep_going = args.iter().any(|a| a == "--keep-going");
    let cases = option_value(&args, "--cases")?;
    let task = args
        .iter()
        .enumerate()
        .find(|&(i, a)| {
            !a.starts_with("--")
                && (i == 0 || !["--cases", "--trace"].contains(&args[i - 1].as_str()))
        })
        .map(|(_, a)| a.as_str());

    let sh = Shell::new()?;
    sh.change_dir(project_root());
    match task {
        None | Some("help") => {
            help();
            Ok(())
        }
        Some("ci") => ci(&sh, keep_going),
        Some("bench") => bench(&sh),
        Some("mocker-compare") => mocker::compare(&sh, text_option(&args, "--trace")?),
        Some("store-limits") => store_limits::run(&sh),
        Some("vllm-groups") => vllm::groups(&sh, text_option(&args, "--trace")?),
        Some("vllm-pool") => vllm::pool(&sh, text_option(&args, "--trace")?),
        Some("vllm-steps") => vllm::steps(
            &sh,
            text_option(&args, "--trace")?,
            text_option(&args, "--requests")?,
        ),
        Some("fuzz") => fuzz(&sh, cases.unwrap_or(DEFAULT_FUZZ_CASES)),
        Some(name) => match GATES.iter().find(|gate| gate.name == name) {
            Some(gate) => (gate.run)(&sh),
            None => {
                help();
                bail!("unknown task `{name}`")
            }
        },
    }
}

fn help() {
    eprintln!("usage: cargo xtask <task> [--keep-going]\n\ntasks:");
    eprintln!(
        "  {:<12} every gate below, in order (--keep-going: report all failures)",
        "ci"
    );
    for gate in GATES {
        eprintln!("  {:<12} {}", gate.name, gate.about);
    }
    eprintln!(
        "  {:<12} run the criterion benchmarks (not part of ci)",
        "bench"
    );
    eprintln!(
        "  {:<12} Dynamo's mocker and kvbm-sim cluster on one trace, side by side \
         (--trace FILE, default ../shared/traces/conversation_trace.jsonl; not part of ci)",
        "mocker-compare"
    );
    eprintln!(
        "  {:<12} each block store beside its medium's limit (memcpy, plain file I/O, \
         redis-benchmark), as a ratio table (not part of ci)",
        "store-limits"
    );
    eprintln!(
        "  {:<12} vLLM 0.33's KV cache manager and kvbm's grouped sequences on one trace: \
         the same hits and blocks per group (--trace FILE; installs vLLM into target/vllm-venv, \
         about 9.5 GB; not part of ci)",
        "vllm-groups"
    );
    eprintln!(
        "  {:<12} kvbm's drop-in for vLLM 0.33's BlockPool against vLLM's own: its Scheduler \
         step for step on a trace, its prefix-caching and scheduler tests, per-step time \
         (--trace FILE; uses target/vllm-venv; not part of ci)",
        "vllm-pool"
    );
    eprintln!(
        "  {:<12} vLLM 0.33's Scheduler and kvbm's on the README's all-at-once replay in one \
         run: µs per scheduled request-step each, and their ratio (--trace FILE, --requests N; \
         uses target/vllm-venv; not part of ci)",
        "vllm-steps"
    );
    eprintln!(
        "  {:<12} run every crate's API fuzzers and liveness properties long, in release \
         (--cases N per test, default {DEFAULT_FUZZ_CASES}; ci runs them at CI-sized counts)",
        "fuzz"
    );
}

/// The text after `flag`, if the flag is given.
fn text_option<'a>(args: &'a [String], flag: &str) -> Result<Option<&'a str>> {
    let Some(at) = args.iter().position(|a| a == flag) else {
        return Ok(None);
    };
    let value = args
        .get(at + 1)
        .with_context(|| format!("{flag} needs a value"))?;
    Ok(Some(value))
}

/// The value after `flag`, parsed, if the flag is given.
fn option_value(args: &[String], flag: &str) -> Result<Option<u32>> {
    text_option(args, flag)?
        .map(|value| {
            value
                .parse()
                .with_context(|| format!("{flag} {value}: not a case count"))
        })
        .transpose()
}

fn ci(sh: &Shell, keep_going: bool) -> Result<()> {
    let started = Instant::now();
    let mut failed = Vec::new();
    for gate in GATES {
        eprintln!("\n==> xtask {} ({})", gate.name, gate.about);
        let gate_started = Instant::now();
        match (gate.run)(sh) {
            Ok(()) => eprintln!("<== {} ok in {:.0?}", gate.name, gate_started.elapsed()),
            Err(err) if keep_going => {
                eprintln!("<== {} FAILED: {err:#}", gate.name);
                failed.push(gate.name);
            }
            Err(err) => return Err(err.context(format!("gate `{}` failed", gate.name))),
        }
    }
    if !failed.is_empty() {
        bail!("gates failed: {}", failed.join(", "));
    }
    eprintln!("\nall gates passed in {:.0?}", started.elapsed());
    Ok(())
}

pub(crate) fn cargo() -> String {
    env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}

fn fmt(sh: &Shell) -> Result<()> {
    let cargo = cargo();
    cmd!(sh, "{cargo} fmt --all --check").run()?;
    Ok(())
}

fn clippy(sh: &Shell) -> Result<()> {
    let cargo = cargo();
    cmd!(
        sh,
        "{cargo} clippy --workspace --all-targets --all-features -- -D warnings"
    )
    .run()?;
    // kvbm-sim's default build has none of its features: the code that
    // refuses their flags is compiled only there.
    cmd!(
        sh,
        "{cargo} clippy -p kvbm-sim --all-targets -- -D warnings"
    )
    .run()?;
    Ok(())
}

fn doc(sh: &Shell) -> Result<()> {
    let cargo = cargo();
    cmd!(
        sh,
        "{cargo} doc --workspace --exclude kvbm-benches --exclude xtask --no-deps --all-features"
    )
    .env("RUSTDOCFLAGS", "-D warnings")
    .run()?;
    // The private items too: the comments that say why link to the code
    // they explain, and a link broken by a rename goes unnoticed otherwise.
    cmd!(
        sh,
        "{cargo} doc --workspace --exclude kvbm-benches --exclude xtask --no-deps --all-features --document-private-items"
    )
    .env("RUSTDOCFLAGS", "-D warnings")
    .run()?;
    Ok(())
}

fn test(sh: &Shell) -> Result<()> {
    let cargo = cargo();
    // kvbm-store-redis's tests need a real cluster; the guard shuts it down
    // when this returns, whether the tests passed or not.
    let cluster = redis::start(sh)?;
    // Default members only: the kvbm crates, never the benchmark peers.
    let mut test = cmd!(sh, "{cargo} test --all-features");
    if let Some(cluster) = &cluster {
        test = test.env(redis::CLUSTER_ENV, cluster.nodes());
    }
    test.run()?;
    // kvbm-sim's default build, without its features: their flags fail,
    // naming the feature.
    cmd!(sh, "{cargo} test -p kvbm-sim").run()?;
    // The gates' own arithmetic (package checks, store-limits' ceiling):
    // xtask is no default member, so the run above skips it.
    cmd!(sh, "{cargo} test -p xtask").run()?;
    Ok(())
}

fn loom(sh: &Shell) -> Result<()> {
    let cargo = cargo();
    let flags = "--cfg kvbm_loom -C debug-assertions";
    // Its own target dir: the cfg changes every crate's build, and sharing
    // the normal one would rebuild everything twice per ci run.
    cmd!(
        sh,
        "{cargo} test --release --target-dir target/loom --test loom_*"
    )
    .env("RUSTFLAGS", flags)
    .env("LOOM_MAX_PREEMPTIONS", LOOM_MAX_PREEMPTIONS)
    .run()?;
    Ok(())
}

fn bench_check(sh: &Shell) -> Result<()> {
    let cargo = cargo();
    cmd!(sh, "{cargo} test --benches -p kvbm-benches").run()?;
    Ok(())
}

/// The consumer the exposition is checked against: the Prometheus
/// project's Python client, whose parser reads the text format.
const PROMETHEUS_CLIENT: &str = "prometheus_client==0.26.0";

/// The consumer KV events are checked against: NVIDIA Dynamo's standalone
/// indexer, from its Python package.
pub(crate) const DYNAMO_RUNTIME: &str = "ai-dynamo-runtime==1.6.1";

/// The interop virtualenv (created on first use), with `package` installed;
/// its Python.
pub(crate) fn interop_python(sh: &Shell, package: &str) -> Result<PathBuf> {
    venv_with(sh, "interop-venv", &[package])
}

/// The Python of the virtualenv `target/<name>` (created on first use),
/// with `packages` installed by pip.
pub(crate) fn venv_with(sh: &Shell, name: &str, packages: &[&str]) -> Result<PathBuf> {
    let venv = project_root().join("target").join(name);
    let python = venv.join("bin/python");
    if !python.exists() {
        cmd!(sh, "python3 -m venv {venv}").run()?;
    }
    if !packages.is_empty() {
        cmd!(
            sh,
            "{python} -m pip install --quiet --disable-pip-version-check {packages...}"
        )
        .run()?;
    }
    Ok(python)
}

/// Builds kvbm-events' `publish_stream` example and has
/// `xtask/interop/check_dynamo.py` run Dynamo's indexer against two
/// publishers of it, checking the overlap it reports per worker.
fn dynamo_interop(sh: &Shell) -> Result<()> {
    let cargo = cargo();
    let python = interop_python(sh, DYNAMO_RUNTIME)?;
    cmd!(
        sh,
        "{cargo} build --quiet -p kvbm-events --features zmq --example publish_stream"
    )
    .run()?;
    let binary = project_root().join("target/debug/examples/publish_stream");
    cmd!(sh, "{python} xtask/interop/check_dynamo.py {binary}").run()?;
    Ok(())
}

/// Replays the embedded excerpt with `--metrics-out` and has
/// `xtask/interop/check_prometheus.py` parse the file with
/// `prometheus_client` (installed into `target/interop-venv`, created on
/// first use) and compare every series with the run's JSON report.
fn prometheus_interop(sh: &Shell) -> Result<()> {
    let cargo = cargo();
    let root = project_root();
    let python = interop_python(sh, PROMETHEUS_CLIENT)?;
    let out = root.join("target/interop");
    sh.create_dir(&out)?;
    let metrics = out.join("metrics.prom");
    let report = cmd!(
        sh,
        "{cargo} run --quiet -p kvbm-sim --features prometheus -- serve --capacity-tokens 300000 --metrics-out {metrics} --json"
    )
    .read()?;
    let report_path = out.join("report.json");
    sh.write_file(&report_path, report)?;
    cmd!(
        sh,
        "{python} xtask/interop/check_prometheus.py {metrics} {report_path}"
    )
    .run()?;
    Ok(())
}

/// Cases per fuzz test in `cargo xtask fuzz` (each crate picks a smaller
/// default for the test gate).
const DEFAULT_FUZZ_CASES: u32 = 10_000;

/// The crates whose `tests/it` binary holds `fuzz_*` tests.
const FUZZED_CRATES: &[&str] = &[
    "kvbm-blocks",
    "kvbm-tiers",
    "kvbm-sequence",
    "kvbm-schedule",
    "kvbm-queue",
    "kvbm-events",
    "kvbm-router",
    "kvbm-store",
    "kvbm-sim",
];

fn fuzz(sh: &Shell, cases: u32) -> Result<()> {
    let cargo = cargo();
    let cases = cases.to_string();
    for krate in FUZZED_CRATES {
        let started = Instant::now();
        cmd!(
            sh,
            "{cargo} test --release -p {krate} --lib --test it fuzz_ -- --test-threads 2"
        )
        .env("KVBM_FUZZ_CASES", &cases)
        .run()?;
        eprintln!(
            "fuzzed {krate} at {cases} cases per test in {:.0?}",
            started.elapsed()
        );
    }
    Ok(())
}

fn bench(sh: &Shell) -> Result<()> {
    let cargo = cargo();
    cmd!(sh, "{cargo} bench -p kvbm-benches").run()?;
    Ok(())
}

fn layers(sh: &Shell) -> Result<()> {
    let cargo = cargo();
    let metadata = cmd!(sh, "{cargo} metadata --format-version 1 --no-deps").read()?;
    let edges = layers::internal_edges(&metadata)?;
    let violations = layers::violations(&edges);
    if !violations.is_empty() {
        bail!("layering violated:\n  {}", violations.join("\n  "));
    }
    eprintln!("layers ok: {} internal edges, all downward", edges.len());
    Ok(())
}

fn msrv(sh: &Shell) -> Result<()> {
    let pinned = sh.read_file("rust-toolchain.toml")?;
    let channel = pinned
        .lines()
        .find_map(|line| line.trim().strip_prefix("channel = "))
        .map(|v| v.trim_matches('"').to_owned())
        .context("rust-toolchain.toml has no channel")?;
    let manifest = sh.read_file("Cargo.toml")?;
    let rust_version = manifest
        .lines()
        .find_map(|line| line.trim().strip_prefix("rust-version = "))
        .map(|v| v.trim_matches('"').to_owned())
        .context("Cargo.toml has no workspace rust-version")?;
    if channel != rust_version {
        bail!("rust-toolchain.toml pins {channel} but rust-version is {rust_version}");
    }
    let rustc = cmd!(sh, "rustc --version").read()?;
    if !rustc.starts_with(&format!("rustc {channel} ")) {
        bail!("pinned {channel} but `rustc --version` is `{rustc}`");
    }
    eprintln!("toolchain ok: {rustc}");
    Ok(())
}

pub(crate) fn project_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}
