//! The cluster plot: per routing policy, mean and p90 time to first token
//! (left) and token hit rate (right), as bars side by side.

use plotters::prelude::*;

use super::{ClusterReport, PolicyKind};
use crate::SimError;

const WIDTH: u32 = 960;
const HEIGHT: u32 = 440;

/// A colour per policy, fixed so plots compare across runs.
fn colour(policy: PolicyKind) -> RGBColor {
    match policy {
        PolicyKind::Random => RGBColor(127, 127, 127),
        PolicyKind::RoundRobin => RGBColor(31, 119, 180),
        PolicyKind::LeastLoaded => RGBColor(255, 127, 14),
        PolicyKind::KvAware => RGBColor(44, 160, 44),
        PolicyKind::GlobalKv => RGBColor(148, 103, 189),
    }
}

fn plot_error(err: impl std::fmt::Display) -> SimError {
    SimError::Plot(err.to_string())
}

/// One panel: a bar per run of `value`, labelled by policy.
fn panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    report: &ClusterReport,
    caption: &str,
    y_desc: &str,
    value: impl Fn(&super::ClusterRun) -> f64,
) -> Result<(), SimError> {
    let runs = &report.runs;
    let top = runs.iter().map(&value).fold(0.0, f64::max);
    let y_max = if top > 0.0 { top * 1.15 } else { 1.0 };
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(14)
        .x_label_area_size(36)
        .y_label_area_size(56)
        .build_cartesian_2d(0.0..runs.len().max(1) as f64, 0.0..y_max)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(runs.len().max(1) * 2 + 1)
        .x_label_formatter(&|x| {
            let slot = *x - x.floor();
            match runs.get(x.floor() as usize) {
                Some(run) if (slot - 0.5).abs() < 0.01 => run.policy.name().to_owned(),
                _ => String::new(),
            }
        })
        .y_desc(y_desc)
        .draw()
        .map_err(plot_error)?;
    chart
        .draw_series(runs.iter().enumerate().map(|(i, run)| {
            let x = i as f64;
            Rectangle::new(
                [(x + 0.15, 0.0), (x + 0.85, value(run))],
                colour(run.policy).filled(),
            )
        }))
        .map_err(plot_error)?;
    chart
        .draw_series(runs.iter().enumerate().map(|(i, run)| {
            let v = value(run);
            Text::new(
                format!("{v:.2}"),
                (i as f64 + 0.3, v + y_max * 0.02),
                ("sans-serif", 14),
            )
        }))
        .map_err(plot_error)?;
    Ok(())
}

/// Draws `report` into an SVG document.
pub(crate) fn policies_svg(report: &ClusterReport) -> Result<String, SimError> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let requests = report.runs.first().map_or(0, |run| run.hits.requests);
        let root = root
            .titled(
                &format!(
                    "Routing policies: {} engines, {requests} requests, block size {}",
                    report.engines, report.block_size
                ),
                ("sans-serif", 20),
            )
            .map_err(plot_error)?;
        let (left, right) = root.split_horizontally(WIDTH / 2);
        panel(
            &left,
            report,
            "Mean time to first token",
            "seconds",
            |run| run.ttft.mean.as_secs_f64(),
        )?;
        panel(
            &right,
            report,
            "Prefix-cache token hit rate",
            "percent",
            |run| run.hits.token_hit_rate() * 100.0,
        )?;
        root.present().map_err(plot_error)?;
    }
    Ok(svg)
}
