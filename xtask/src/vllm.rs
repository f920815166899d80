//! The vLLM gates, neither part of `ci`.
//!
//! `cargo xtask vllm-groups`: vLLM 0.33's own KV cache manager and kvbm's
//! `GroupedSequence` on the same requests of a trace, for a full-attention
//! group plus a 128-token sliding-window group in 16-token blocks;
//! `xtask/interop/check_vllm_groups.py` fails on the first request whose
//! prefix hit, per-group blocks or blocks in use differ.
//!
//! `cargo xtask vllm-pool [--trace FILE]`: kvbm's drop-in for vLLM's
//! `BlockPool` (`kvbm.vllm.KvbmBlockPool`, the `kvbm` wheel built by maturin
//! and installed into the same virtualenv), proven by vLLM's own code:
//! (a) vLLM's `Scheduler`, built by vLLM's test helper, on the first
//! 500 requests of the trace (all at once, 3,000 blocks, so it evicts and
//! preempts) with kvbm's pool and with its own must agree at every step
//! (scheduled requests and tokens, blocks, prefix-cache hits, finished and
//! preempted requests, free blocks); (b) vLLM 0.33.0's
//! `tests/v1/core/test_prefix_caching.py` and `test_scheduler.py`, from its
//! source distribution on PyPI (sha256-pinned, unpacked under
//! `target/vllm-pool/`), run with vLLM's pool and then with kvbm's
//! (`xtask/interop/vllm_pool_plugin.py` substitutes it and deselects the
//! reviewed list of tests of the Python pool's internals): every test that
//! passes with vLLM's pool must pass with kvbm's; (c) the time of
//! `schedule()` + `update_from_output()` per step on both, interleaved in
//! the run of (a), printed, and then each pool's share of that time (its
//! entry points and the lookup loop, timed in a run of their own): vLLM's
//! share bounds the speed-up any drop-in can give; and the share of vLLM's
//! whole `KVCacheManager`. The tests run offline on the CPU
//! (`VLLM_TARGET_DEVICE=cpu`, `HF_HUB_OFFLINE=1`) with a Hugging Face cache
//! holding only the config.json of the model they name; those needing other
//! models fail with vLLM's own pool too and are counted, not compared.
//! Once vLLM is installed the gate takes about 5 minutes: the wheel's
//! release build, each test run about a minute, the scheduler pair two.
//!
//! vLLM is installed from PyPI into `target/vllm-venv` on first use: its
//! wheel without dependencies, then its requirements as its metadata lists
//! them with the one pin that cannot resolve here (`certifi>=2026.10.19`)
//! relaxed. The stack (torch with its CUDA libraries, run on the CPU) takes
//! about 9.5 GB and several minutes to install, which is why `ci` leaves
//! this gate out.

use std::path::PathBuf;

use anyhow::{Context, Result};
use xshell::{Shell, cmd};

use crate::{cargo, project_root, venv_with};

/// The vLLM release whose manager is the reference.
const VLLM: &str = "vllm==0.33.0";

/// Requests of the trace replayed, and the pool's blocks: small enough that
/// the cache evicts, so eviction order is compared too.
const REQUESTS: &str = "1000";
const BLOCKS: &str = "2200";

/// The virtualenv with vLLM (made on first use); its Python.
fn vllm_python(sh: &Shell) -> Result<PathBuf> {
    let python = venv_with(sh, "vllm-venv", &[])?;
    let venv = project_root().join("target/vllm-venv");
    let ready = venv.join("installed");
    if ready.exists() {
        return Ok(python);
    }
    let pip = ["-m", "pip", "--disable-pip-version-check", "--quiet"];
    cmd!(sh, "{python} {pip...} install --no-deps {VLLM}").run()?;
    // Its requirements, from the installed metadata, certifi unpinned.
    let requirements = venv.join("requirements.txt");
    let listed = cmd!(sh, "{python} xtask/interop/vllm_requirements.py").read()?;
    sh.write_file(&requirements, listed)?;
    cmd!(sh, "{python} {pip...} install -r {requirements}").run()?;
    sh.write_file(&ready, VLLM)?;
    Ok(python)
}

/// The test runner and wheel builder installed beside vLLM for `vllm-pool`
/// (the versions the `python` gate pins).
const POOL_TOOLS: [&str; 2] = [crate::python::PYTEST, crate::python::MATURIN];

/// The environment vLLM runs in here: on the CPU, offline (the Hugging
/// Face cache under `target/vllm-pool/hf` holds the one config its tests
/// name), writing no bytecode into the sdist.
const OFFLINE: [(&str, &str); 3] = [
    ("VLLM_TARGET_DEVICE", "cpu"),
    ("HF_HUB_OFFLINE", "1"),
    ("PYTHONDONTWRITEBYTECODE", "1"),
];

/// The trace requests and blocks of `vllm-pool`'s scheduler comparison.
const POOL_REQUESTS: &str = "500";
const POOL_BLOCKS: &str = "3000";

/// vLLM's test files run with kvbm's pool substituted.
const POOL_TESTS: [&str; 2] = [
    "tests/v1/core/test_prefix_caching.py",
    "tests/v1/core/test_scheduler.py",
];

pub(crate) fn pool(sh: &Shell, trace: Option<&str>) -> Result<()> {
    let root = project_root();
    let python = vllm_python(sh)?;
    let pip = ["-m", "pip", "--disable-pip-version-check", "--quiet"];
    cmd!(sh, "{python} {pip...} install {POOL_TOOLS...}").run()?;

    // The kvbm wheel, built fresh and installed beside vLLM.
    crate::python::install_wheel(sh, &python, &root.join("target/vllm-pool/wheels"))?;

    // vLLM's tests from its sdist, and the offline model config they name.
    let work = root.join("target/vllm-pool");
    cmd!(
        sh,
        "{python} xtask/interop/check_vllm_pool.py prepare {work}"
    )
    .run()?;
    let sdist = work.join("vllm-0.33.0");
    let hf_home = work.join("hf");
    let plugins = root.join("xtask/interop");

    // (b) vLLM's pool, then kvbm's; pytest's own status is not the verdict
    // (tests needing models not available offline fail on both sides).
    let excluded = cmd!(
        sh,
        "{python} -c 'import vllm_pool_plugin as p; print(len(p.EXCLUDED))'"
    )
    .env("PYTHONPATH", &plugins)
    .read()?;
    let mut reports = Vec::new();
    for side in ["vllm", "kvbm"] {
        let report = work.join(format!("{side}.xml"));
        // No stale report: a run that dies before writing one must fail.
        if report.exists() {
            sh.remove_path(&report)?;
        }
        let _dir = sh.push_dir(&sdist);
        let output = cmd!(
            sh,
            "{python} -m pytest -q -p no:cacheprovider --noconftest -p vllm_pool_plugin --junitxml={report} {POOL_TESTS...}"
        )
        .env("PYTHONPATH", &plugins)
        .env("HF_HOME", &hf_home)
        .env("KVBM_VLLM_POOL", side)
        .envs(OFFLINE)
        .ignore_status()
        .quiet()
        .output()?;
        let summary = String::from_utf8_lossy(&output.stdout);
        eprintln!(
            "{side}'s pool: {}",
            summary.lines().last().unwrap_or("(no summary)")
        );
        reports.push(report);
    }
    let [baseline, ours] = reports.as_slice() else {
        unreachable!("two sides")
    };
    let excluded = excluded.trim();
    cmd!(
        sh,
        "{python} xtask/interop/check_vllm_pool.py junit {baseline} {ours} --excluded {excluded}"
    )
    .run()
    .context("a vLLM test that passes with vLLM's pool fails with kvbm's")?;

    // (a) and (c): the Scheduler on the trace, both pools, interleaved.
    let trace = trace.unwrap_or("../shared/traces/conversation_trace.jsonl");
    cmd!(
        sh,
        "{python} xtask/interop/check_vllm_pool.py trace {trace} --tests-root {sdist} --requests {POOL_REQUESTS} --blocks {POOL_BLOCKS}"
    )
    .env("HF_HOME", &hf_home)
    .envs(OFFLINE)
    .run()
        .context("vLLM's Scheduler decided differently with kvbm's pool")?;
    Ok(())
}

pub(crate) fn groups(sh: &Shell, trace: Option<&str>) -> Result<()> {
    let cargo = cargo();
    let python = vllm_python(sh)?;
    cmd!(
        sh,
        "{cargo} build --release --quiet -p kvbm-schedule --example groups_replay"
    )
    .run()?;
    let binary = project_root().join("target/release/examples/groups_replay");
    let trace = trace.unwrap_or("../shared/traces/conversation_trace.jsonl");
    cmd!(
        sh,
        "{python} xtask/interop/check_vllm_groups.py {trace} {binary} --requests {REQUESTS} --blocks {BLOCKS}"
    )
    .run()
    .context("vLLM's KV cache manager and kvbm's grouped sequences disagree")?;
    Ok(())
}

/// `vllm-steps`: vLLM's Scheduler and kvbm's on the README's all-at-once
/// replay, in one run (`xtask/interop/vllm_step_cost.py`): the cost of a
/// scheduled request-step on each side and their ratio, both measured on
/// the same machine in the same hour. `requests` limits the replay to the
/// trace's first requests (the whole trace by default: about 5 minutes and
/// 10 GB of memory on vLLM's side).
pub(crate) fn steps(sh: &Shell, trace: Option<&str>, requests: Option<&str>) -> Result<()> {
    let root = project_root();
    let cargo = cargo();
    let python = vllm_python(sh)?;
    let work = root.join("target/vllm-pool");
    cmd!(
        sh,
        "{python} xtask/interop/check_vllm_pool.py prepare {work}"
    )
    .run()?;
    cmd!(sh, "{cargo} build --release --quiet -p kvbm-sim").run()?;
    cmd!(
        sh,
        "{cargo} build --release --quiet -p kvbm-benches --example memory_latency"
    )
    .run()?;
    let binary = root.join("target/release/kvbm-sim");
    let latency = root.join("target/release/examples/memory_latency");
    let sdist = work.join("vllm-0.33.0");
    let trace = trace.unwrap_or("../shared/traces/conversation_trace.jsonl");
    let requests = requests.unwrap_or("0");
    // The machine's memory latency before and after, to quote beside the
    // figures between.
    cmd!(sh, "{latency}").run()?;
    cmd!(
        sh,
        "{python} xtask/interop/vllm_step_cost.py {trace} --tests-root {sdist} --kvbm-sim {binary} --requests {requests}"
    )
    .env("PYTHONPATH", root.join("xtask/interop"))
    .env("HF_HOME", work.join("hf"))
    .envs(OFFLINE)
    .run()
    .context(
        "vllm_step_cost.py failed: vLLM's Scheduler and kvbm's did different work \
         (printed above), or a side did not run",
    )?;
    cmd!(sh, "{latency}").run()?;
    Ok(())
}
