//! `cargo xtask vllm-groups` (not part of `ci`): vLLM 0.33's own KV cache
//! manager and kvbm's `GroupedSequence` on the same requests of a trace, for
//! a full-attention group plus a 128-token sliding-window group in 16-token
//! blocks; `xtask/interop/check_vllm_groups.py` fails on the first request
//! whose prefix hit, per-group blocks or blocks in use differ.
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
