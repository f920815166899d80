//! kvbm-sim's integration tests: one binary, one module per concern.

mod cli;
mod errors;
#[cfg(not(kvbm_loom))]
mod fuzz;
mod kv_events;
#[cfg(not(kvbm_loom))]
mod model;
// `--prometheus` and `--metrics-out` need the exporter (without it they
// fail, as `cli` checks).
#[cfg(feature = "prometheus")]
mod prometheus;
mod reference;
mod serve;
mod sweep;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fresh, empty directory under the system temp dir for one test; removed
/// on drop.
pub(crate) struct Scratch(pub(crate) PathBuf);

impl Scratch {
    pub(crate) fn new(name: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let unique = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!(
            "kvbm-sim-it-{}-{name}-{unique}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        Self(dir)
    }

    /// Writes `contents` to `name` inside the directory and returns its path.
    pub(crate) fn file(&self, name: &str, contents: &str) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, contents).expect("write temp file");
        path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
