//! The `python` gate: the `kvbm` Python package (`crates/kvbm-py`) built
//! into a wheel by maturin, installed from that wheel into a virtualenv
//! under `target/`, and driven by its pytest suite as a user would.
//!
//! The virtualenv (`target/python-venv`) is made on first use and reused;
//! maturin and pytest are pinned. The wheel is a release build of kvbm-py
//! and what it needs, nothing else; the `kvbm-sim` binary the report tests
//! compare against reuses that build (`target/release`), adding only its
//! `main`.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use xshell::{Shell, cmd};

use crate::{cargo, project_root, venv_with};

/// The build backend that makes the wheel (abi3, CPython >= 3.11).
pub(crate) const MATURIN: &str = "maturin==1.16.0";

/// The test runner.
pub(crate) const PYTEST: &str = "pytest==9.2.0";

/// The gate's virtualenv (created on first use) with maturin and pytest;
/// its Python.
fn venv_python(sh: &Shell) -> Result<PathBuf> {
    venv_with(sh, "python-venv", &[MATURIN, PYTEST])
}

/// Builds the `kvbm` wheel with the maturin beside `python` into `wheels`
/// (emptied first, so the one wheel in it is this build's) and installs it
/// into `python`'s environment.
pub(crate) fn install_wheel(sh: &Shell, python: &Path, wheels: &Path) -> Result<()> {
    let maturin = python.with_file_name("maturin");
    if wheels.exists() {
        sh.remove_path(wheels)?;
    }
    cmd!(
        sh,
        "{maturin} build --release --manifest-path crates/kvbm-py/Cargo.toml --interpreter {python} --out {wheels}"
    )
    .run()?;
    let built: Vec<PathBuf> = sh
        .read_dir(wheels)?
        .into_iter()
        .filter(|path| path.extension().is_some_and(|ext| ext == "whl"))
        .collect();
    let [wheel] = built.as_slice() else {
        bail!(
            "expected one wheel in {}, found {built:?}",
            wheels.display()
        );
    };
    cmd!(
        sh,
        "{python} -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps {wheel}"
    )
    .run()?;
    Ok(())
}

pub(crate) fn run(sh: &Shell) -> Result<()> {
    let cargo = cargo();
    let root = project_root();
    let python = venv_python(sh)?;

    install_wheel(sh, &python, &root.join("target/python-wheels"))?;

    // The command line whose `--json` reports the replays must equal.
    // Built beside kvbm-py, so features resolve as for the wheel and the
    // simulator's library is the wheel's build (alone, pyo3's macros would
    // give `syn` other features and every kvbm crate would build twice).
    cmd!(
        sh,
        "{cargo} build --release --quiet -p kvbm-py -p kvbm-sim --bin kvbm-sim"
    )
    .run()?;
    let sim = root.join("target/release/kvbm-sim");
    if !sim.is_file() {
        bail!("no kvbm-sim binary at {}", sim.display());
    }

    // `import kvbm` finds the installed wheel (no directory of that name
    // is on the tests' path); no caches are left in the tree.
    cmd!(
        sh,
        "{python} -m pytest -q -p no:cacheprovider crates/kvbm-py/tests"
    )
    .env("KVBM_SIM", &sim)
    .env("PYTHONDONTWRITEBYTECODE", "1")
    .run()
    .context("the kvbm Python package's tests failed")?;
    Ok(())
}
