//! The layering check: kvbm crates may depend only on crates below them.

use anyhow::{Context, Result};
use serde_json::Value;

/// The kvbm crates from the bottom up. A crate may depend (normal, dev or
/// build) only on crates earlier in this list. A new kvbm crate must be added
/// here, or the check fails.
pub(crate) const LAYERS: &[&str] = &[
    "kvbm-blocks",
    "kvbm-tiers",
    "kvbm-sequence",
    "kvbm-schedule",
    "kvbm-queue",
    "kvbm-events",
    "kvbm-router",
    // The data plane: above every core crate, so none of them can depend on it.
    "kvbm-store",
    // The remote tier: a BlockStore on Redis Cluster, above kvbm-store.
    "kvbm-store-redis",
    "kvbm-sim",
    // The Python bindings: above everything, so nothing depends on them.
    "kvbm-py",
];

/// Workspace members outside the layering: they may depend on anything.
const UNLAYERED: &[&str] = &["kvbm-benches", "xtask"];

/// A dependency between two workspace crates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Edge {
    pub(crate) from: String,
    pub(crate) to: String,
    pub(crate) kind: String,
}

/// Reads `cargo metadata --no-deps` output into the edges between kvbm crates.
pub(crate) fn internal_edges(metadata: &str) -> Result<Vec<Edge>> {
    let metadata: Value = serde_json::from_str(metadata).context("parsing cargo metadata")?;
    let packages = metadata["packages"]
        .as_array()
        .context("cargo metadata has no packages")?;
    let names: Vec<&str> = packages.iter().filter_map(|p| p["name"].as_str()).collect();
    let mut edges = Vec::new();
    for package in packages {
        let from = package["name"].as_str().context("package without a name")?;
        for dep in package["dependencies"].as_array().into_iter().flatten() {
            let to = dep["name"].as_str().context("dependency without a name")?;
            if names.contains(&to) {
                let kind = dep["kind"].as_str().unwrap_or("normal").to_owned();
                edges.push(Edge {
                    from: from.to_owned(),
                    to: to.to_owned(),
                    kind,
                });
            }
        }
    }
    // Members with no edges still must be known to the layering.
    for name in names {
        if !UNLAYERED.contains(&name) && !LAYERS.contains(&name) {
            edges.push(Edge {
                from: name.to_owned(),
                to: name.to_owned(),
                kind: "unknown".to_owned(),
            });
        }
    }
    Ok(edges)
}

/// Every edge that does not point strictly downward, as a message.
pub(crate) fn violations(edges: &[Edge]) -> Vec<String> {
    let rank = |name: &str| LAYERS.iter().position(|layer| *layer == name);
    edges
        .iter()
        .filter(|edge| !UNLAYERED.contains(&edge.from.as_str()))
        .filter_map(|edge| match (rank(&edge.from), rank(&edge.to)) {
            (None, _) => Some(format!("{} is not in xtask's LAYERS list", edge.from)),
            (Some(_), None) => Some(format!("{} depends on unlayered {}", edge.from, edge.to)),
            (Some(from), Some(to)) if to >= from => Some(format!(
                "{} ({} dependency) points up or sideways to {}",
                edge.from, edge.kind, edge.to
            )),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A package name and its dependencies as (name, kind).
    type Package<'a> = (&'a str, &'a [(&'a str, Option<&'a str>)]);

    fn metadata(packages: &[Package<'_>]) -> String {
        let packages: Vec<Value> = packages
            .iter()
            .map(|(name, deps)| {
                let deps: Vec<Value> = deps
                    .iter()
                    .map(|(dep, kind)| serde_json::json!({ "name": dep, "kind": kind }))
                    .collect();
                serde_json::json!({ "name": name, "dependencies": deps })
            })
            .collect();
        serde_json::json!({ "packages": packages }).to_string()
    }

    #[test]
    fn downward_edges_pass() {
        let meta = metadata(&[
            ("kvbm-blocks", &[("thiserror", None)]),
            ("kvbm-sequence", &[("kvbm-blocks", None)]),
            (
                "kvbm-benches",
                &[("kvbm-sequence", None), ("kvbm-blocks", None)],
            ),
        ]);
        let edges = internal_edges(&meta).unwrap();
        assert_eq!(edges.len(), 3, "external deps are ignored");
        assert!(violations(&edges).is_empty());
    }

    #[test]
    fn upward_dev_dependency_fails() {
        let meta = metadata(&[
            ("kvbm-blocks", &[("kvbm-sequence", Some("dev"))]),
            ("kvbm-sequence", &[("kvbm-blocks", None)]),
        ]);
        let found = violations(&internal_edges(&meta).unwrap());
        assert_eq!(found.len(), 1);
        assert!(
            found[0].contains("kvbm-blocks (dev dependency) points up"),
            "{found:?}"
        );
    }

    #[test]
    fn unknown_kvbm_crate_fails() {
        let meta = metadata(&[("kvbm-extra", &[])]);
        let found = violations(&internal_edges(&meta).unwrap());
        assert_eq!(found, ["kvbm-extra is not in xtask's LAYERS list"]);
    }
}
