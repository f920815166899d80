//! The sweep plot: block hit rate against cache capacity in tokens (log
//! scale), one line per eviction policy, the unbounded ceiling dashed.

use plotters::prelude::*;

use crate::format::group;
use crate::{Eviction, SimError, Sweep};

const WIDTH: u32 = 860;
const HEIGHT: u32 = 520;

/// A colour per policy, fixed so plots compare across runs.
fn colour(eviction: Eviction) -> RGBColor {
    match eviction {
        Eviction::Lru => RGBColor(31, 119, 180),
        Eviction::MultiLevel => RGBColor(214, 39, 40),
        Eviction::Lineage => RGBColor(44, 160, 44),
    }
}

/// `3000000` as `3M`, `512000` as `512k`: axis labels that stay short.
fn short_tokens(tokens: f64) -> String {
    let (value, suffix) = if tokens >= 1e9 {
        (tokens / 1e9, "G")
    } else if tokens >= 1e6 {
        (tokens / 1e6, "M")
    } else if tokens >= 1e3 {
        (tokens / 1e3, "k")
    } else {
        (tokens, "")
    };
    let text = format!("{value:.1}");
    format!(
        "{}{suffix}",
        text.trim_end_matches('0').trim_end_matches('.')
    )
}

fn plot_error(err: impl std::fmt::Display) -> SimError {
    SimError::Plot(err.to_string())
}

/// Draws `sweep` into an SVG document.
pub(crate) fn hit_rate_svg(sweep: &Sweep) -> Result<String, SimError> {
    let ceiling = sweep.unbounded.hits.block_hit_rate() * 100.0;
    let tokens: Vec<f64> = sweep
        .runs
        .iter()
        .map(|run| run.capacity_tokens() as f64)
        .chain([sweep.unbounded.capacity_tokens() as f64])
        .collect();
    let lowest = tokens
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min)
        .max(1.0);
    let highest = tokens.iter().copied().fold(1.0, f64::max);
    let top = sweep
        .runs
        .iter()
        .map(|run| run.hits.block_hit_rate() * 100.0)
        .fold(ceiling, f64::max);
    // Headroom above the highest line for the legend, and a little beyond
    // both capacity ends so the end points are not on the frame.
    let y_max = (top * 1.25).clamp(1.0, 100.0);
    let x_range = (lowest / 1.4)..(highest * 1.4);

    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(plot_error)?;
        let title = format!(
            "Prefix-cache hit rate vs capacity ({} requests, block size {})",
            group(sweep.unbounded.hits.requests),
            sweep.unbounded.block_size
        );
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(60)
            .build_cartesian_2d(x_range.log_scale(), 0.0..y_max)
            .map_err(plot_error)?;
        chart
            .configure_mesh()
            .x_desc("cache capacity (tokens, log scale)")
            .y_desc("block hit rate (%)")
            .x_label_formatter(&|tokens| short_tokens(*tokens))
            .y_label_formatter(&|rate| format!("{rate:.0}"))
            .draw()
            .map_err(plot_error)?;

        let grey = RGBColor(110, 110, 110);
        chart
            .draw_series(DashedLineSeries::new(
                [(lowest / 1.4, ceiling), (highest * 1.4, ceiling)],
                8,
                6,
                grey.stroke_width(2),
            ))
            .map_err(plot_error)?
            .label(format!("unbounded ({ceiling:.2}%)"))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], grey.stroke_width(2)));

        // Later lines are drawn thinner on top of earlier ones, so policies
        // with identical results (LRU and lineage often are) stay visible.
        for (index, eviction) in sweep.evictions().into_iter().enumerate() {
            let colour = colour(eviction);
            let width = 5u32.saturating_sub(index as u32).max(2);
            let radius = width + 2;
            let points: Vec<(f64, f64)> = sweep
                .runs
                .iter()
                .filter(|run| run.eviction == eviction)
                .map(|run| {
                    (
                        run.capacity_tokens() as f64,
                        run.hits.block_hit_rate() * 100.0,
                    )
                })
                .collect();
            chart
                .draw_series(LineSeries::new(points.clone(), colour.stroke_width(width)))
                .map_err(plot_error)?
                .label(eviction.name())
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(3))
                });
            chart
                .draw_series(
                    points
                        .into_iter()
                        .map(|point| Circle::new(point, radius, colour.filled())),
                )
                .map_err(plot_error)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()
            .map_err(plot_error)?;
        root.present().map_err(plot_error)?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::short_tokens;

    #[test]
    fn short_token_labels() {
        assert_eq!(short_tokens(512.0), "512");
        assert_eq!(short_tokens(512_000.0), "512k");
        assert_eq!(short_tokens(3_072_000.0), "3.1M");
        assert_eq!(short_tokens(25_600_000.0), "25.6M");
        assert_eq!(short_tokens(2e9), "2G");
    }
}
