//! The pictures of a run's statistics (PNG, written atomically):
//!
//! - `stats-sqnr-<category>.png`: a heatmap of SQNR (dB, pooled per epoch) with one row per
//!   layer and one column per epoch, for each category recorded;
//! - `stats-hist-<category>.png`: the last epoch's histograms of log2|x| before rounding, one
//!   panel per layer, over the format's grid (in the style of Deep PeNSieve's Fig. 2): grey
//!   columns give the format's values per binade (scaled to the panel), green ones its densest
//!   region, red lines the ends of its range (the binades of its smallest positive and largest
//!   finite value), blue bars the share of the inputs in each binade;
//! - `stats-flush.png`: the percentage of elements flushed to zero, at the largest magnitude,
//!   at the smallest and turned NaN/Inf, per category (pooled over layers) at each sampled
//!   step, against training progress in epochs (series that stay at zero are left out).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use plotters::prelude::*;

use super::log::StatsLog;
use super::summary::{grid_of, pooled};
use crate::plot::{Grid, Series};
use crate::stats::{Log2Histogram, RoundingStats};

/// Writes every picture of `log` into `dir`; returns their paths.
pub fn write_plots(log: &StatsLog, title: &str, dir: &Path) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let pooled = pooled(log);
    let mut categories: Vec<&str> = pooled.iter().map(|p| p.site.category.as_str()).collect();
    categories.sort();
    categories.dedup();
    let epochs = log.epochs();
    let last = epochs.last().copied();
    for category in &categories {
        let mut layers: Vec<&str> = pooled
            .iter()
            .filter(|p| p.site.category == *category)
            .map(|p| p.site.layer.as_str())
            .collect();
        layers.sort();
        layers.dedup();
        let values = layers
            .iter()
            .map(|layer| {
                epochs
                    .iter()
                    .map(|&e| {
                        pooled
                            .iter()
                            .find(|p| {
                                p.epoch == e
                                    && p.site.layer == *layer
                                    && p.site.category == *category
                            })
                            .and_then(|p| p.stats.sqnr_db())
                    })
                    .collect()
            })
            .collect();
        let grid = Grid {
            title: format!("{title}: SQNR (dB) of {category}"),
            row_desc: "layer".into(),
            column_desc: "epoch".into(),
            rows: layers.iter().map(|l| l.to_string()).collect(),
            columns: epochs.iter().map(|e| e.to_string()).collect(),
            values,
        };
        let path = dir.join(format!("stats-sqnr-{category}.png"));
        crate::plot::heatmap(&grid, &path)?;
        written.push(path);

        let panels: Vec<Panel> = pooled
            .iter()
            .filter(|p| Some(p.epoch) == last && p.site.category == *category)
            .map(|p| Panel {
                caption: format!("{} ({})", p.site.layer, p.format),
                histogram: p.stats.histogram.clone(),
                format: p.format.clone(),
            })
            .collect();
        let path = dir.join(format!("stats-hist-{category}.png"));
        let caption = format!(
            "{title}: log2|{category}| before rounding, epoch {}",
            last.unwrap_or(0)
        );
        histograms(&caption, &panels, &path)?;
        written.push(path);
    }
    let path = dir.join("stats-flush.png");
    crate::plot::lines(
        &format!("{title}: flushed, saturated, at minimum, NaN/Inf"),
        "epoch",
        "% of elements",
        &flush_series(log),
        &path,
    )?;
    written.push(path);
    Ok(written)
}

/// One series per category and kind (flushed, at max, at min, NaN/Inf) that is ever nonzero:
/// its percentage at each sampled step, pooled over the category's layers.
fn flush_series(log: &StatsLog) -> Vec<Series> {
    let mut per_step: BTreeMap<(String, usize, usize), (f64, RoundingStats)> = BTreeMap::new();
    for s in &log.samples {
        per_step
            .entry((s.site.category.clone(), s.epoch, s.step))
            .and_modify(|e| e.1.merge(&s.stats))
            .or_insert_with(|| (s.progress(), s.stats.clone()));
    }
    type Kind = (&'static str, fn(&RoundingStats) -> u64);
    let kinds: [Kind; 4] = [
        ("flushed", |s| s.flushed),
        ("at max", |s| s.at_max),
        ("at min", |s| s.at_min),
        ("NaN/Inf", |s| s.became_nonfinite),
    ];
    let mut series = Vec::new();
    let mut categories: Vec<&String> = per_step.keys().map(|k| &k.0).collect();
    categories.dedup();
    for category in categories {
        for (kind, count) in kinds {
            let points: Vec<(f64, f64)> = per_step
                .iter()
                .filter(|(k, _)| &k.0 == category)
                .map(|(_, (x, s))| (*x, 100.0 * s.fraction(count(s))))
                .collect();
            if points.iter().any(|p| p.1 != 0.0) {
                series.push(Series::new(format!("{category} {kind}"), points));
            }
        }
    }
    if series.is_empty() {
        series.push(Series::new("nothing flushed, saturated or NaN", Vec::new()));
    }
    series
}

/// One histogram panel: a caption, the histogram of log2|x| and the format drawn beneath it.
#[derive(Debug, Clone)]
pub struct Panel {
    /// The panel's caption.
    pub caption: String,
    /// The values' histogram.
    pub histogram: Log2Histogram,
    /// The format whose grid is drawn (as it displays; no grid when it has none).
    pub format: String,
}

/// Panels per row of [`histograms`].
const PANELS_PER_ROW: usize = 3;

/// Draws `panels` in rows of three into `path` (PNG, atomically), under
/// `title` (see the [module docs](self) for what a panel shows).
pub fn histograms(title: &str, panels: &[Panel], path: &Path) -> Result<()> {
    crate::plot::register_font()?;
    let rows = panels.len().div_ceil(PANELS_PER_ROW).max(1);
    let size = (1200u32, 60 + 300 * rows as u32);
    crate::io::write_atomically(path, |tmp| {
        let root = BitMapBackend::new(tmp, size).into_drawing_area();
        root.fill(&WHITE)?;
        let body = root.titled(title, ("sans-serif", 20))?;
        let areas = body.split_evenly((rows, PANELS_PER_ROW));
        for (panel, area) in panels.iter().zip(&areas) {
            draw_panel(panel, area)?;
        }
        root.present()?;
        Ok(())
    })
    .with_context(|| format!("cannot draw {}", path.display()))
}

fn draw_panel(
    panel: &Panel,
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
) -> Result<()> {
    let bins = panel.histogram.bins();
    let total = panel.histogram.total().max(1) as f64;
    let grid = grid_of(&panel.format);
    let mut ks: Vec<i32> = bins.iter().map(|b| b.0).collect();
    if let Some(g) = &grid {
        let (lo, hi) = g.range_binades();
        ks.extend([lo, hi]);
    }
    let lo = ks.iter().min().copied().unwrap_or(-1) - 1;
    let hi = ks.iter().max().copied().unwrap_or(1) + 2;
    let top = bins
        .iter()
        .map(|b| b.1 as f64 / total)
        .fold(0.0, f64::max)
        .max(1e-3)
        * 1.1;
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.caption, ("sans-serif", 15))
        .margin(8)
        .x_label_area_size(32)
        .y_label_area_size(48)
        .build_cartesian_2d(f64::from(lo)..f64::from(hi), 0.0..top)?;
    chart
        .configure_mesh()
        .x_desc("log2|x|")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_desc("share")
        .light_line_style(RGBColor(240, 240, 240))
        .label_style(("sans-serif", 12))
        .axis_desc_style(("sans-serif", 12))
        .draw()?;
    if let Some(g) = &grid {
        let most = g.per_binade.iter().map(|p| p.1).max().unwrap_or(1) as f64;
        let (dlo, dhi) = g.densest();
        chart.draw_series(g.per_binade.iter().filter(|p| (lo..hi).contains(&p.0)).map(
            |&(k, n)| {
                let colour = if (dlo..=dhi).contains(&k) {
                    RGBColor(200, 235, 200)
                } else {
                    RGBColor(225, 225, 225)
                };
                let h = top * n as f64 / most;
                Rectangle::new(
                    [(f64::from(k), 0.0), (f64::from(k + 1), h)],
                    colour.filled(),
                )
            },
        ))?;
        let (rlo, rhi) = g.range_binades();
        for x in [f64::from(rlo), f64::from(rhi + 1)] {
            chart.draw_series(LineSeries::new([(x, 0.0), (x, top)], RED.stroke_width(2)))?;
        }
    }
    chart.draw_series(bins.iter().map(|&(k, c)| {
        let x = f64::from(k);
        Rectangle::new(
            [(x + 0.15, 0.0), (x + 0.85, c as f64 / total)],
            RGBColor(31, 119, 180).filled(),
        )
    }))?;
    Ok(())
}
