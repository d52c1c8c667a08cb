//! Training-curve plots as PNG images.
//!
//! [`training_curves`] draws one picture with two panels side by side: the training loss per
//! epoch on the left and the test top-1 accuracy per epoch on the right, one line per
//! [`Series`] with a legend. One series per panel plots a single run; several plot a
//! comparison of runs or number formats.
//!
//! Rendering is pure Rust: [`plotters`]' bitmap backend with an embedded DejaVu Sans font
//! drawn through `ab_glyph`, so no system font library is needed. The file is written
//! atomically (see [`crate::io::write_atomically`]).

use std::path::Path;
use std::sync::OnceLock;

use anyhow::{anyhow, Context, Result};
use plotters::prelude::*;

/// Width of the picture [`training_curves`] writes, in pixels.
pub const WIDTH: u32 = 1200;
/// Height of the picture [`training_curves`] writes, in pixels.
pub const HEIGHT: u32 = 500;

/// The font all text is drawn with (DejaVu Sans; see `assets/README.md` for its license).
static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");

/// Line colours, one per series in turn (the "tab10" palette, which stays distinguishable
/// for the common kinds of colour blindness better than pure primaries).
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Series with at most this many points get a marker on every point (so that a short run,
/// or a single epoch, is visible and its epochs can be counted).
const MARKERS_UP_TO: usize = 40;

/// One curve: a label for the legend and its `(epoch, value)` points, in drawing order.
///
/// Points whose coordinates are not finite (NaN, infinity) are skipped and break the line
/// there, so a diverged run shows where it stopped being plottable.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Series {
    /// Legend text; an empty label leaves the series out of the legend.
    pub label: String,
    /// `(x, y)` points: x is the epoch, y the value.
    pub points: Vec<(f64, f64)>,
}

impl Series {
    /// A series from a label and its `(epoch, value)` points.
    pub fn new(label: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Series {
            label: label.into(),
            points,
        }
    }
}

/// Writes a PNG of [`WIDTH`] x [`HEIGHT`] pixels to `path`: `title` across the top, "train
/// loss" against epoch on the left (one line per series in `loss`) and "test top-1 accuracy
/// (%)" against epoch on the right (one line per series in `accuracy`), each with a legend.
///
/// Axis ranges come from the finite points with a small margin; a panel with no finite
/// point, a single point, or all-equal values still gets a usable range. The file is written
/// to a temporary file in the same directory and renamed into place, so `path` is either the
/// complete picture or untouched. Missing parent directories are created, as for the other
/// outputs of this crate (see [`crate::io::write_atomically`]).
///
/// # Errors
/// When the directory cannot be created, or the picture cannot be drawn or written.
pub fn training_curves(
    title: &str,
    loss: &[Series],
    accuracy: &[Series],
    path: &Path,
) -> Result<()> {
    register_font()?;
    crate::io::write_atomically(path, |tmp| {
        render(title, loss, accuracy, tmp)
            .with_context(|| format!("cannot draw the training curves into {}", path.display()))
    })
}

/// Registers the embedded font as plotters' "sans-serif" family (the family its default
/// text styles use), once per process.
fn register_font() -> Result<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, FONT).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(anyhow!("the embedded font cannot be loaded"))
    }
}

/// Draws the picture into `file` (whose extension must be `.png`).
fn render(title: &str, loss: &[Series], accuracy: &[Series], file: &Path) -> Result<()> {
    let root = BitMapBackend::new(file, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let body = if title.is_empty() {
        root.clone()
    } else {
        root.titled(title, ("sans-serif", 22))?
    };
    let (left, right) = body.split_horizontally(WIDTH / 2);
    panel(
        &left,
        "train loss",
        "loss",
        loss,
        SeriesLabelPosition::UpperRight,
    )?;
    panel(
        &right,
        "test top-1 accuracy (%)",
        "accuracy (%)",
        accuracy,
        SeriesLabelPosition::LowerRight,
    )?;
    root.present()?;
    Ok(())
}

/// Draws one panel: axes from the data, one line per series, and a legend at `legend`.
fn panel(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    caption: &str,
    y_desc: &str,
    series: &[Series],
    legend: SeriesLabelPosition,
) -> Result<()> {
    let finite = || {
        series
            .iter()
            .flat_map(|s| s.points.iter().copied())
            .filter(|&(x, y)| x.is_finite() && y.is_finite())
    };
    let x = axis_range(finite().map(|p| p.0), Some(0.5));
    let y = axis_range(finite().map(|p| p.1), None);

    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(x, y)?;
    chart
        .configure_mesh()
        .x_desc("epoch")
        .x_label_formatter(&|x| {
            if x.fract() == 0.0 {
                format!("{x:.0}")
            } else {
                format!("{x}")
            }
        })
        .y_desc(y_desc)
        .light_line_style(RGBColor(235, 235, 235))
        .label_style(("sans-serif", 13))
        .axis_desc_style(("sans-serif", 14))
        .draw()?;

    let mut labelled = false;
    for (i, s) in series.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        let style = colour.stroke_width(2);
        let segments = finite_segments(&s.points);
        // One (possibly empty) series carries the legend entry, so a run without a single
        // finite value is still named in the legend.
        let mut first = true;
        for segment in segments
            .iter()
            .map(Vec::as_slice)
            .chain(std::iter::once(&[][..]).filter(|_| segments.is_empty()))
        {
            let drawn = chart.draw_series(LineSeries::new(segment.iter().copied(), style))?;
            if first && !s.label.is_empty() {
                drawn.label(s.label.as_str()).legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
                });
                labelled = true;
            }
            first = false;
        }
        if s.points.len() <= MARKERS_UP_TO {
            chart.draw_series(
                segments
                    .iter()
                    .flatten()
                    .map(|&p| Circle::new(p, 3, colour.filled())),
            )?;
        }
    }
    if labelled {
        chart
            .configure_series_labels()
            .position(legend)
            .label_font(("sans-serif", 13))
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(160, 160, 160))
            .draw()?;
    }
    Ok(())
}

/// The runs of consecutive finite points of `points` (non-finite points split the line).
fn finite_segments(points: &[(f64, f64)]) -> Vec<Vec<(f64, f64)>> {
    points
        .split(|&(x, y)| !(x.is_finite() && y.is_finite()))
        .filter(|run| !run.is_empty())
        .map(<[_]>::to_vec)
        .collect()
}

/// A plotting range covering `values` (all finite) with a 5% margin on each side; `0..1`
/// for no values. When all are equal the range is the value +- `flat_pad`, or +- 10% of it
/// (+- 0.5 around zero) without one.
fn axis_range(values: impl Iterator<Item = f64>, flat_pad: Option<f64>) -> std::ops::Range<f64> {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if lo > hi {
        return 0.0..1.0;
    }
    let span = hi - lo;
    let pad = if span > 0.0 && span.is_finite() {
        span * 0.05
    } else if let Some(pad) = flat_pad {
        pad
    } else if lo != 0.0 {
        lo.abs() * 0.1
    } else {
        0.5
    };
    // Clamped, as the margin can overflow near the ends of f64.
    let (a, b) = ((lo - pad).max(f64::MIN), (hi + pad).min(f64::MAX));
    if a < b {
        a..b
    } else {
        // The margin vanished (too small for the values' magnitude, or subnormal).
        let pad = lo.abs().max(1.0) * 0.1;
        (lo - pad).max(f64::MIN)..(hi + pad).min(f64::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axis_range_covers_the_values_with_a_margin() {
        let r = axis_range([1.0, 3.0].into_iter(), None);
        assert!(r.start < 1.0 && r.end > 3.0 && r.end - r.start < 2.5);
    }

    #[test]
    fn axis_range_is_nonempty_for_no_one_or_equal_values() {
        for values in [
            vec![],
            vec![0.0],
            vec![2.5, 2.5],
            vec![-1e-9],
            vec![f64::MAX],
        ] {
            for flat_pad in [None, Some(0.5)] {
                let r = axis_range(values.iter().copied(), flat_pad);
                assert!(r.start < r.end, "{values:?} gave {r:?}");
                assert!(
                    r.start.is_finite() && r.end.is_finite(),
                    "{values:?} gave {r:?}"
                );
                for &v in &values {
                    assert!(r.start <= v && v <= r.end, "{v} outside {r:?}");
                }
            }
        }
    }

    #[test]
    fn non_finite_points_split_a_series_into_segments() {
        let nan = f64::NAN;
        let pts = [
            (0.0, 1.0),
            (1.0, nan),
            (2.0, 2.0),
            (3.0, 3.0),
            (f64::INFINITY, 1.0),
        ];
        assert_eq!(
            finite_segments(&pts),
            vec![vec![(0.0, 1.0)], vec![(2.0, 2.0), (3.0, 3.0)]]
        );
        assert!(finite_segments(&[(nan, nan)]).is_empty());
    }
}
