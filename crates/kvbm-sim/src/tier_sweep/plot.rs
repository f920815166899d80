//! The tier-sweep plot: mean time to first token (left) and token hit rate
//! (right) against the host tier as a multiple of the GPU pool, the run
//! without a host tier at 0 and dashed across each panel.

use plotters::prelude::*;

use super::{TierPoint, TierSweep, short_multiple};
use crate::SimError;
use crate::format::group;

const WIDTH: u32 = 960;
const HEIGHT: u32 = 440;

const TTFT: RGBColor = RGBColor(214, 39, 40);
const HIT_RATE: RGBColor = RGBColor(31, 119, 180);
const GREY: RGBColor = RGBColor(110, 110, 110);

fn plot_error(err: impl std::fmt::Display) -> SimError {
    SimError::Plot(err.to_string())
}

/// One panel: `value` of each run against its multiple, a line with dots,
/// and the baseline's value dashed across.
fn panel(
    area: &DrawingArea<SVGBackend<'_>, plotters::coord::Shift>,
    sweep: &TierSweep,
    caption: &str,
    y_desc: &str,
    colour: RGBColor,
    value: impl Fn(&TierPoint) -> f64,
) -> Result<(), SimError> {
    let points: Vec<(f64, f64)> = (sweep.points.iter())
        .map(|point| (point.multiple, value(point)))
        .collect();
    let top = points.iter().map(|&(_, y)| y).fold(0.0, f64::max);
    let y_max = if top > 0.0 { top * 1.15 } else { 1.0 };
    let x_top = points.iter().map(|&(x, _)| x).fold(0.0, f64::max);
    // A little beyond both ends so the end points are not on the frame.
    let x_pad = (x_top * 0.04).max(0.05);
    let x_range = -x_pad..(x_top + x_pad).max(1.0);
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(14)
        .x_label_area_size(44)
        .y_label_area_size(64)
        .build_cartesian_2d(x_range.clone(), 0.0..y_max)
        .map_err(plot_error)?;
    let gpu = short_tokens(sweep.gpu_tokens);
    chart
        .configure_mesh()
        .x_desc(format!("host tier (× the {gpu}-token GPU pool; 0: none)"))
        .y_desc(y_desc)
        .x_label_formatter(&|x| short_multiple(*x))
        .y_label_formatter(&|y| {
            if y_max >= 10.0 {
                format!("{y:.0}")
            } else {
                format!("{y:.2}")
            }
        })
        .draw()
        .map_err(plot_error)?;
    if let Some(&(_, base)) = points.first() {
        chart
            .draw_series(DashedLineSeries::new(
                [(x_range.start, base), (x_range.end, base)],
                8,
                6,
                GREY.stroke_width(1),
            ))
            .map_err(plot_error)?;
    }
    chart
        .draw_series(LineSeries::new(points.clone(), colour.stroke_width(3)))
        .map_err(plot_error)?;
    chart
        .draw_series(
            points
                .into_iter()
                .map(|p| Circle::new(p, 5, colour.filled())),
        )
        .map_err(plot_error)?;
    Ok(())
}

/// `3000000` as `3M`, `512000` as `512k`.
fn short_tokens(tokens: u64) -> String {
    match tokens {
        t if t >= 1_000_000 && t % 100_000 == 0 => format!("{}M", short_multiple(t as f64 / 1e6)),
        t if t >= 1_000 && t % 100 == 0 => format!("{}k", short_multiple(t as f64 / 1e3)),
        t => group(t),
    }
}

/// Draws `sweep` into an SVG document.
pub(super) fn tier_sweep_svg(sweep: &TierSweep) -> Result<String, SimError> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let requests = sweep.points.first().map_or(0, |p| p.report.hits.requests);
        let root = root
            .titled(
                &format!(
                    "Serving with a host tier: {} requests, block size {}, GPU pool {} tokens",
                    group(requests),
                    sweep.block_size,
                    group(sweep.gpu_tokens)
                ),
                ("sans-serif", 20),
            )
            .map_err(plot_error)?;
        let (left, right) = root.split_horizontally(WIDTH / 2);
        panel(
            &left,
            sweep,
            "Mean time to first token",
            "seconds",
            TTFT,
            |point| point.mean_ttft().as_secs_f64(),
        )?;
        panel(
            &right,
            sweep,
            "Token hit rate (GPU and host tier)",
            "percent of prompt tokens",
            HIT_RATE,
            |point| point.token_hit_rate() * 100.0,
        )?;
        root.present().map_err(plot_error)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::short_tokens;

    #[test]
    fn short_token_labels() {
        assert_eq!(short_tokens(3_000_000), "3M");
        assert_eq!(short_tokens(2_500_000), "2.5M");
        assert_eq!(short_tokens(4_096), "4,096");
        assert_eq!(short_tokens(512_000), "512k");
    }
}
