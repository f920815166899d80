//! `--prometheus` and `--metrics-out`: the binary's metrics recorder.
//!
//! The library crates record through the `metrics` facade; this installs
//! `metrics-exporter-prometheus` as the process's recorder, optionally
//! serving `/metrics` over HTTP (on a one-thread Tokio runtime of its own,
//! as the exporter's `install` does) while the replay runs.
//!
//! Only with the `prometheus` feature: without it, [`Exporter::install`]
//! refuses both flags, naming the feature.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

#[cfg(feature = "prometheus")]
use kvbm_queue::{describe_metrics, metric_names};
use kvbm_sim::SimError;
#[cfg(feature = "prometheus")]
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Without the `prometheus` feature there is no recorder to install.
#[cfg(not(feature = "prometheus"))]
pub(crate) enum Exporter {}

#[cfg(not(feature = "prometheus"))]
impl Exporter {
    /// Refuses: `--prometheus` (when `listen` is given) or `--metrics-out`
    /// needs the `prometheus` feature.
    pub(crate) fn install(listen: Option<SocketAddr>) -> Result<Self, SimError> {
        Err(SimError::FeatureDisabled {
            flag: if listen.is_some() {
                "--prometheus"
            } else {
                "--metrics-out"
            },
            feature: "prometheus",
        })
    }

    /// Never called: there is no exporter.
    pub(crate) fn write(&self, _path: &Path) -> Result<(), SimError> {
        match *self {}
    }

    /// Never called: there is no exporter.
    pub(crate) fn hold(&self, _hold: Duration) {
        match *self {}
    }
}

/// The installed recorder.
#[cfg(feature = "prometheus")]
pub(crate) struct Exporter {
    handle: PrometheusHandle,
    serving: Option<SocketAddr>,
}

#[cfg(feature = "prometheus")]
impl Exporter {
    /// Installs the Prometheus recorder, serving `/metrics` on `listen` if
    /// given. TTFT is a histogram with vLLM's buckets.
    pub(crate) fn install(listen: Option<SocketAddr>) -> Result<Self, SimError> {
        let fail = |error: &dyn std::fmt::Display| SimError::Metrics {
            reason: error.to_string(),
        };
        let builder = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full(metric_names::TIME_TO_FIRST_TOKEN.to_owned()),
                metric_names::TTFT_BUCKETS,
            )
            .map_err(|e| fail(&e))?;
        let handle = match listen {
            None => {
                let recorder = builder.build_recorder();
                let handle = recorder.handle();
                metrics::set_global_recorder(recorder).map_err(|e| fail(&e))?;
                handle
            }
            Some(addr) => {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| fail(&e))?;
                let (recorder, exporter) = {
                    let _entered = runtime.enter();
                    builder
                        .with_http_listener(addr)
                        .build()
                        .map_err(|e| fail(&e))?
                };
                let handle = recorder.handle();
                std::thread::Builder::new()
                    .name("prometheus".to_owned())
                    .spawn(move || runtime.block_on(exporter))
                    .map_err(|e| fail(&e))?;
                metrics::set_global_recorder(recorder).map_err(|e| fail(&e))?;
                handle
            }
        };
        describe_metrics();
        Ok(Self {
            handle,
            serving: listen,
        })
    }

    /// Writes the exposition as it stands to `path`.
    pub(crate) fn write(&self, path: &Path) -> Result<(), SimError> {
        std::fs::write(path, self.handle.render()).map_err(|source| SimError::WriteOutput {
            path: path.to_owned(),
            source,
        })
    }

    /// Keeps serving for `hold` after the replay (nothing to do without a
    /// listener).
    pub(crate) fn hold(&self, hold: Duration) {
        if self.serving.is_some() && !hold.is_zero() {
            std::thread::sleep(hold);
        }
    }
}
