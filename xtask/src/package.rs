//! The `package` gate: every publishable crate packaged as crates.io would
//! get it, and built from its package.
//!
//! One `cargo package` names all of them at once, so cargo packs each one,
//! puts the packages in a local registry, and builds each crate from its
//! `.crate` against its siblings' packaged sources: a crate that builds only
//! inside the workspace (a file outside its directory, a path dependency
//! without a version, a feature that needs a workspace-only file) fails
//! here. It verifies with `--all-features`, so the feature-gated code
//! (libzmq's transport, the simulator's Redis and Prometheus flags) is
//! built from the packages too.
//!
//! Before that it checks what a user lands on: each crate names its README
//! and license, and carries a `README.md` and a copy of the root `LICENSE`
//! (identical, so the copies cannot drift); after it, that both are in the
//! package.
//!
//! The crates are those `cargo metadata` does not mark `publish = false`,
//! so a new crate is packaged from its first commit. In CI (`CI` set) the
//! clone is clean and the working tree must be too; elsewhere
//! `--allow-dirty` packages uncommitted work, as every other gate checks the
//! working tree (`cargo publish` itself still wants a clean one).

use std::env;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde_json::Value;
use xshell::{Shell, cmd};

use crate::{cargo, project_root};

/// One crate to package, from `cargo metadata`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Publishable {
    pub(crate) name: String,
    pub(crate) version: String,
    /// Its directory (where its `Cargo.toml` is).
    pub(crate) dir: PathBuf,
    /// Its `readme` key, if set.
    pub(crate) readme: Option<String>,
    /// Its `license` key, if set.
    pub(crate) license: Option<String>,
}

/// The workspace members that may be published (`publish` unset or naming
/// a registry), in `cargo metadata`'s order.
pub(crate) fn publishable(metadata: &str) -> Result<Vec<Publishable>> {
    let metadata: Value = serde_json::from_str(metadata).context("parsing cargo metadata")?;
    let packages = metadata["packages"]
        .as_array()
        .context("cargo metadata has no packages")?;
    let mut crates = Vec::new();
    for package in packages {
        let unpublished = package["publish"]
            .as_array()
            .is_some_and(|registries| registries.is_empty());
        if unpublished {
            continue;
        }
        let text = |key: &str| package[key].as_str().map(str::to_owned);
        let name = text("name").context("package without a name")?;
        let manifest = text("manifest_path").context("package without a manifest")?;
        crates.push(Publishable {
            version: text("version").context("package without a version")?,
            dir: Path::new(&manifest)
                .parent()
                .context("manifest path without a directory")?
                .to_path_buf(),
            readme: text("readme"),
            license: text("license"),
            name,
        });
    }
    Ok(crates)
}

/// What is wrong with `krate` before packaging: a missing `readme` or
/// `license` key, a missing README, a `LICENSE` that is not the root's.
fn problems(krate: &Publishable, root_license: &[u8]) -> Vec<String> {
    let mut problems = Vec::new();
    let name = &krate.name;
    if krate.readme.is_none() {
        problems.push(format!("{name}: no `readme` in its Cargo.toml"));
    }
    if krate.license.is_none() {
        problems.push(format!("{name}: no `license` in its Cargo.toml"));
    }
    let readme = krate
        .dir
        .join(krate.readme.as_deref().unwrap_or("README.md"));
    if !readme.is_file() {
        problems.push(format!("{name}: no {}", readme.display()));
    }
    match std::fs::read(krate.dir.join("LICENSE")) {
        Ok(text) if text == root_license => {}
        Ok(_) => problems.push(format!(
            "{name}: LICENSE differs from the root's (copy it again)"
        )),
        Err(_) => problems.push(format!(
            "{name}: no LICENSE (copy the root's into {})",
            krate.dir.display()
        )),
    }
    problems
}

pub(crate) fn run(sh: &Shell) -> Result<()> {
    let cargo = cargo();
    let root = project_root();
    let metadata = cmd!(sh, "{cargo} metadata --format-version 1 --no-deps").read()?;
    let crates = publishable(&metadata)?;
    if crates.is_empty() {
        bail!("no publishable crate in the workspace");
    }
    let root_license = std::fs::read(root.join("LICENSE")).context("reading the root LICENSE")?;
    let problems: Vec<String> = (crates.iter())
        .flat_map(|krate| problems(krate, &root_license))
        .collect();
    if !problems.is_empty() {
        bail!("not ready to package:\n  {}", problems.join("\n  "));
    }

    let mut args: Vec<String> = Vec::new();
    for krate in &crates {
        args.push("-p".to_owned());
        args.push(krate.name.clone());
    }
    if env::var_os("CI").is_none() {
        args.push("--allow-dirty".to_owned());
    }
    forget_unpacked(sh, &crates)?;
    // Verification builds in a target directory of its own, emptied first:
    // cargo does not rebuild a registry dependency whose version it built
    // before, and ours keep their version while their code changes.
    let verify = root.join("target/package-verify");
    if verify.exists() {
        sh.remove_path(&verify)?;
    }
    cmd!(
        sh,
        "{cargo} package --all-features --target-dir {verify} {args...}"
    )
    .run()?;

    // What shipped: each package's README and license, as cargo unpacked
    // them to verify it.
    let unpacked = verify.join("package");
    let mut missing = Vec::new();
    for krate in &crates {
        let dir = unpacked.join(format!("{}-{}", krate.name, krate.version));
        let readme = krate.readme.as_deref().unwrap_or("README.md");
        for file in [readme, "LICENSE"] {
            if !dir.join(file).is_file() {
                missing.push(format!("{}: {file} is not in its package", krate.name));
            }
        }
    }
    if !missing.is_empty() {
        bail!("packages incomplete:\n  {}", missing.join("\n  "));
    }
    let names: Vec<&str> = crates.iter().map(|krate| krate.name.as_str()).collect();
    eprintln!(
        "package ok: {} crates packaged and built from their packages ({})",
        crates.len(),
        names.join(", ")
    );
    Ok(())
}

/// Removes the copies of our packages that an earlier run of this gate
/// left unpacked in cargo's home. Cargo verifies a package against the
/// others through a local registry in its target directory, unpacks each
/// dependency into `$CARGO_HOME/registry/src/-<hash of that path>/` and
/// reuses an unpacked `name-version` it finds there: on a machine that ran
/// the gate before from the same directory, a crate would be verified
/// against an older version of its dependency. Only those local-registry
/// directories (named from a `-`) are touched, never crates.io's.
fn forget_unpacked(sh: &Shell, crates: &[Publishable]) -> Result<()> {
    let home = match env::var_os("CARGO_HOME") {
        Some(home) => PathBuf::from(home),
        None => match env::var_os("HOME") {
            Some(home) => Path::new(&home).join(".cargo"),
            None => return Ok(()),
        },
    };
    let Ok(registries) = std::fs::read_dir(home.join("registry/src")) else {
        return Ok(());
    };
    for registry in registries.flatten() {
        if !registry.file_name().to_string_lossy().starts_with('-') {
            continue;
        }
        for krate in crates {
            let stale = registry
                .path()
                .join(format!("{}-{}", krate.name, krate.version));
            if stale.exists() {
                sh.remove_path(&stale)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metadata(packages: &[(&str, Value)]) -> String {
        let packages: Vec<Value> = (packages.iter())
            .map(|(name, publish)| {
                serde_json::json!({
                    "name": name,
                    "version": "0.1.0",
                    "manifest_path": format!("/ws/crates/{name}/Cargo.toml"),
                    "publish": publish,
                    "readme": "README.md",
                    "license": "Apache-2.0",
                })
            })
            .collect();
        serde_json::json!({ "packages": packages }).to_string()
    }

    #[test]
    fn publish_false_is_left_out_and_a_registry_list_is_kept() {
        let crates = publishable(&metadata(&[
            ("kvbm-blocks", Value::Null),
            ("xtask", serde_json::json!([])),
            ("kvbm-sim", serde_json::json!(["crates-io"])),
        ]))
        .unwrap();
        let names: Vec<&str> = crates.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["kvbm-blocks", "kvbm-sim"]);
        assert_eq!(crates[0].dir, Path::new("/ws/crates/kvbm-blocks"));
        assert_eq!(crates[0].readme.as_deref(), Some("README.md"));
    }

    #[test]
    fn a_crate_without_readme_or_license_text_is_reported() {
        let krate = Publishable {
            name: "nowhere".to_owned(),
            version: "0.1.0".to_owned(),
            dir: PathBuf::from("/nonexistent/nowhere"),
            readme: None,
            license: None,
        };
        let problems = problems(&krate, b"license text");
        assert_eq!(problems.len(), 4, "{problems:?}");
    }
}
